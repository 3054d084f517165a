"""runner/hydra_app/joblib_transport.py: what a joblib sweep sends its workers once instead of per job.
(That a joblib sweep composes every job exactly as the basic launcher does is in test_sweep.py.)"""

from __future__ import annotations

import pickle

import pytest

from runner.hydra_app import joblib_transport as transport


class Counted:
    """Counts its unpickles, in this process."""

    loads = 0

    def __init__(self, value: int) -> None:
        self.value = value

    def __setstate__(self, state: dict) -> None:
        Counted.loads += 1
        self.__dict__.update(state)


@pytest.fixture(autouse=True)
def _fresh():
    transport._received.clear()
    Counted.loads = 0
    yield
    transport._received.clear()


def test_an_argument_sent_once_is_unpickled_once_per_process_and_shared_by_its_jobs():
    once = transport._Once("sweepA:0", pickle.dumps(Counted(7)), None)
    jobs = [pickle.loads(pickle.dumps(once)) for _ in range(5)]  # five jobs' payloads reach one worker
    assert Counted.loads == 1
    assert all(job is jobs[0] for job in jobs) and jobs[0].value == 7


def test_a_new_sweep_drops_the_last_sweeps_objects_from_the_worker():
    pickle.loads(pickle.dumps(transport._Once("sweepA:0", pickle.dumps(Counted(1)), None)))
    pickle.loads(pickle.dumps(transport._Once("sweepA:1", pickle.dumps(Counted(2)), None)))
    assert sorted(transport._received) == ["sweepA:0", "sweepA:1"]
    got = pickle.loads(pickle.dumps(transport._Once("sweepB:0", pickle.dumps(Counted(3)), None)))
    assert sorted(transport._received) == ["sweepB:0"] and got.value == 3 and Counted.loads == 3


def test_the_launch_sends_the_context_config_and_singletons_once_and_leaves_other_calls_alone():
    core = pytest.importorskip("hydra_plugins.hydra_joblib_launcher._core")
    real_delayed = core.delayed
    context, config, state = object(), {"master": 1}, {"instances": {}}
    with transport.sent_once():
        assert core.delayed is not real_delayed
        calls = [core.delayed(core.execute_job)(i, [f"seed={i}"], context, config, print, state) for i in range(3)]
        other = core.delayed(print)("x")
    assert core.delayed is real_delayed  # restored
    assert all(fn is transport.execute_job_lean for fn, _, _ in calls)
    first = calls[0][1]
    assert [c[1][0] for c in calls] == [0, 1, 2] and [c[1][1] for c in calls] == [["seed=0"], ["seed=1"], ["seed=2"]]
    for position in (2, 3, 5):  # one blob per object, shared by every job's call
        assert isinstance(first[position], transport._Once)
        assert all(c[1][position] is first[position] for c in calls)
    assert len({first[2].key, first[3].key, first[5].key}) == 3
    assert first[4] is print
    assert pickle.loads(first[3].blob) == config and other[0] is print


def test_one_joblib_worker_runs_in_the_sweeping_process_with_the_objects_themselves(tmp_path, cli):
    """joblib runs n_jobs=1 sequentially in the sweeping process, pickling nothing: the jobs get the
    context, config and singletons themselves, not their stand-ins."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    d = tmp_path / "one"
    code, _, err = cli("sweep", "seed=0,1", "train.steps=2", "rollout.batch_size=2", "rollout.group_size=2",
                       "log.quiet=true", "--launcher", "joblib", "--jobs", "1", f"hydra.sweep.dir={d}")
    assert code == 0, err
    assert sorted(p.parent.name for p in d.glob("*/DONE")) == ["00", "01"] and not list(d.glob("*/ERROR"))
