"""The audit on released framework code (issue 17): the wheels of OpenRLHF 0.11.2, verl 0.9.1,
TRL 1.16.0 and AReaL 1.0.4 are downloaded from PyPI at test time (`pip download --no-deps` into a temp dir; nothing
is installed and nothing of theirs is in this repository) and audited with the commands of
examples/audit/released.py, each in its own `is-study audit` process, as a user runs them, and with
only is-study's own dependencies importable (tests/helpers/only_own_dependencies.py hides every other
installed distribution): a target that imports what this machine happens to have and a fresh venv
lacks fails here as it would for the user, instead of passing by luck (verl's `orjson` did).

What this covers: every known bug is found, each as one line (0.11.2's −inf on an accepted
overflow; verl's ZeroDivisionError, once, with its file:line; bc71bb19's −inf, NaN and 0·inf, and
its unclamped weight 10 by the reference comparison), nothing else is reported but the findings
listed for each target, nothing comes from the all-masked batch or from verl's documented
ValueError. OpenRLHF at bc71bb19 is not on PyPI: its targets run the adapter
examples/audit/openrlhf_bc71bb1.py, built on our faithful presets; set IS_STUDY_OPENRLHF_BC71BB1 to
a checkout of that commit to audit its own loss.py as well (skipped otherwise, saying so).

The tests skip, saying why, only when the package index cannot be reached (no answer at all, or
the download timing out); any other download failure fails them, and so does an index that answers
with an HTTP error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # pip-downloads four released frameworks and audits them in subprocesses

REPO = Path(__file__).resolve().parent.parent
# `python ONLY_OWN ARGS` is `is-study ARGS` with only is-study's dependencies importable
ONLY_OWN = REPO / "tests" / "helpers" / "only_own_dependencies.py"
spec = importlib.util.spec_from_file_location("released", REPO / "examples" / "audit" / "released.py")
released = sys.modules.setdefault("released", importlib.util.module_from_spec(spec))
spec.loader.exec_module(released)

VERL_STUBS = "tensordict,transformers,ray,codetiming,orjson"  # what verl imports at module level and never calls
TIME_LIMIT_S = 60  # a sanity bound for a shared CI box; the measured times are in docs/performance.md


def _index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
        )
        url = got.stdout.strip() if got.returncode == 0 and got.stdout.strip() else "https://pypi.org/simple"
    return url.rstrip("/") + "/"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    try:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *released.PACKAGES],
            capture_output=True,
            text=True,
            timeout=600,
        )
        failure = got.stderr[-2000:] if got.returncode != 0 else None
    except subprocess.TimeoutExpired:
        failure = "pip download did not finish in 600 s"
    if failure is not None:
        index = _index_url()
        try:
            urllib.request.urlopen(index, timeout=15).close()
        except urllib.error.HTTPError:
            pass  # it answered: the failure is not one of reaching it
        except OSError as exc:
            pytest.skip(
                f"the package index {index} cannot be reached ({exc}); the audit of released code "
                f"needs `pip download --no-deps {' '.join(released.PACKAGES)}`"
            )
        pytest.fail(f"pip download failed although {index} answers:\n{failure}")
    return released.unpack(wheels)


_RUNS: dict[tuple, tuple] = {}


def _audit_once(target, site: Path, tmp_factory, *extra: str) -> tuple[int, list[dict], float, str]:
    """One run per target and options in this module: several tests read the same audit."""
    key = (target.name, *extra)
    if key not in _RUNS:
        _RUNS[key] = _audit(target, site, tmp_factory.mktemp(target.name), *extra)
    return _RUNS[key]


def _audit(target, site: Path, out: Path, *extra: str) -> tuple[int, list[dict], float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    start = time.perf_counter()
    got = subprocess.run(
        [sys.executable, str(ONLY_OWN), "audit", "--json", "--out", str(out), *target.argv(site), *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - start
    assert got.returncode in (0, 1), got.stderr
    return got.returncode, json.loads(got.stdout), seconds, got.stderr


def _line(cell: dict) -> str:
    return (
        f"{cell['invariant'] if isinstance(cell['invariant'], str) else _label(cell['invariant'])}: {cell['violation']}"
    )


def _label(n: int) -> str:
    from runner.audit.invariants import INVARIANTS

    return f"{n} {INVARIANTS[n].short}"


@pytest.mark.parametrize("profile", ["adversarial", "realistic"])
@pytest.mark.parametrize("target", released.TARGETS, ids=[t.name for t in released.TARGETS])
def test_released_code_gives_every_known_bug_and_nothing_else(site, tmp_path_factory, target, profile):
    """Under the realistic profile only the known bugs remain: the others need input no trainer feeds."""
    code, cells, seconds, err = _audit_once(target, site, tmp_path_factory, "--profile", profile)
    findings = [_line(c) for c in cells if c["status"] == "fail"]
    expected = (*target.known, *target.other) if profile == "adversarial" else target.known
    assert code == (1 if findings else 0), err
    # each expected finding exactly once, each a single line, and no other finding but one the target lists as
    # one a search may or may not reach (as tests/test_audit_checkouts.py reads `maybe`)
    for start in expected:
        assert sum(f.startswith(start) for f in findings) == 1, (start, findings)
    others = [f for f in findings if not any(f.startswith(s) for s in expected)]
    assert all(any(f.startswith(s) for s in target.maybe) for f in others), others
    assert len(others) <= len(target.maybe), findings
    assert all("\n" not in f for f in findings)
    assert all(c["profile"] == profile for c in cells if c["status"] == "fail" and c["invariant"] != "reference")
    # the all-masked batch and documented refusals give no finding
    empty = next(c for c in cells if c["invariant"] == "all-masked")
    assert empty["status"] == "pass", empty
    # every finding's case file replays it
    for cell in (c for c in cells if c["status"] == "fail"):
        text = Path(cell["counterexample"]).read_text()
        assert text.startswith(f"# is-study audit: {cell['preset']} ") and "\ntarget:\n" in text
        assert f"\naudit:\n  check: {cell['invariant']}\n" in text  # and the check `is-study case` runs again
    assert seconds < TIME_LIMIT_S, seconds
    print(f"{target.name}: {seconds:.1f} s, {len(findings)} findings")


def test_verl_zero_division_is_reported_once_with_its_line(site, tmp_path_factory):
    verl = next(t for t in released.TARGETS if t.name.startswith("verl"))
    code, cells, _, _ = _audit_once(verl, site, tmp_path_factory, "--profile", "adversarial")
    crashes = [c for c in cells if c["invariant"] == "raises" and c["status"] == "fail"]
    assert len(crashes) == 1
    (crash,) = crashes
    source = (site / "verl" / "trainer" / "ppo" / "rollout_corr_helper.py").read_text().splitlines()
    line = int(crash["violation"].rsplit(":", 1)[1])
    assert "1.0 / verl_F.masked_mean(is_weights_normalized.square(), response_mask).item()" in source[line - 1]
    # found by invariant 1 first, and hit by others too, yet reported once
    assert crash["found_by"].startswith("the 1 finite check (also hit by: ")
    refusals = [c for c in cells if c["invariant"] == "raises" and c["status"] == "pass"]
    assert refusals and "refused with ValueError, allowed by --allow-raise" in refusals[0]["note"]
    empty = next(c for c in cells if c["invariant"] == "all-masked")
    assert empty["note"].startswith("refused with ValueError (allowed): response_mask must contain")
    # the counterexample: every token outside [0.5, 5], so IcePop filters them all
    from runner.audit.case_files import load_case_file

    (case,) = load_case_file(crash["counterexample"]).cases
    import math

    ratios = [math.exp(max(-20, min(20, o - r))) for o, r in zip(case.old_log_probs[0], case.rollout_log_probs[0])]
    assert all(not 0.5 <= x <= 5.0 for x in ratios), ratios
    code, out, err = _case(crash["counterexample"])  # it still raises: exit 1
    assert code == 1 and json.loads(out)[0]["raised"] == crash["violation"], err
    assert f"FAIL raises (an exception the audit found) on {crash['preset']}: {crash['violation']}" in err


def _case(path: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run(
        [sys.executable, str(ONLY_OWN), "case", path, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return got.returncode, got.stdout, got.stderr


def test_openrlhf_0112_minus_inf_is_an_accepted_overflow(site, tmp_path_factory):
    """The sequence is kept (geometric mean in band), one token ratio overflows float32: −inf."""
    target = next(t for t in released.TARGETS if t.name == "openrlhf-0.11.2")
    _, cells, _, _ = _audit_once(target, site, tmp_path_factory, "--profile", "adversarial")
    cell = next(c for c in cells if c["invariant"] == 1)
    from runner.audit.case_files import load_case_file

    (case,) = load_case_file(cell["counterexample"]).cases
    lr = [o - r for o, r in zip(case.old_log_probs[0], case.rollout_log_probs[0])]
    assert max(lr) > 88.8 and -0.7 < sum(lr) / len(lr) < 1.61  # ρ_t = inf, ρ_geo ∈ [0.5, 5]
    code, out, err = _case(cell["counterexample"])  # the file names its target and check: it fails again
    assert code == 1 and json.loads(out)[0]["loss"] == "-inf", err
    assert (
        "FAIL invariant 1 (finite inputs give a finite loss and gradient) on "
        f"{cell['preset']}: {cell['violation']}" in err
    )


def test_the_audit_here_sees_only_is_study_and_its_dependencies(tmp_path):
    """What makes these tests independent of the machine: pytest is installed wherever they run and
    is no dependency of is-study, so a target importing it fails, as where it is not installed;
    torch and typer's own dependency pydantic stay importable."""
    spec = importlib.util.spec_from_file_location("only_own_dependencies", ONLY_OWN)
    only_own = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(only_own)
    hidden = only_own.hidden_modules()
    assert "pytest" in hidden and not {"torch", "typer", "pydantic", "omegaconf", "hydra", "yaml"} & hidden
    loss = tmp_path / "loss_importing_pytest.py"
    loss.write_text(
        "import pytest\n\ndef loss(log_probs, old_log_probs, advantages, action_mask=None, "
        "rollout_log_probs=None):\n    return (log_probs * advantages).mean()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run(
        [sys.executable, str(ONLY_OWN), "audit", "--target", f"{loss}:loss", "--out", str(tmp_path / "cases")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip().endswith(
        "(ModuleNotFoundError: No module named 'pytest'); stub what the loss does not need with --stub pytest"
    ), got.stderr


def test_the_audit_docs_show_the_commands_this_test_runs():
    doc = (REPO / "docs" / "audit.md").read_text()
    for target in released.TARGETS:
        assert target.command() in doc, target.name
    assert f"pip download --no-deps {' '.join(released.PACKAGES)} -d wheels" in doc


@pytest.mark.skipif(
    not os.environ.get("IS_STUDY_OPENRLHF_BC71BB1"),
    reason="IS_STUDY_OPENRLHF_BC71BB1 is not set: bc71bb19 is audited through its adapter only "
    "(point the variable at a checkout of OpenRLHF at that commit to audit its loss.py)",
)
def test_openrlhf_bc71bb1_itself_matches_its_adapter(tmp_path):
    checkout = Path(os.environ["IS_STUDY_OPENRLHF_BC71BB1"])
    adapter = next(t for t in released.TARGETS if t.name == "openrlhf-bc71bb1-seq-mask-tis")
    real = released.Target(
        "bc71bb19",
        "",
        ("--target", f"{checkout}/openrlhf/models/loss.py:PolicyLoss", "--stub", "deepspeed", *adapter.args[2:]),
        adapter.known,
        adapter.other,
    )
    _, mine, _, _ = _audit(adapter, Path("."), tmp_path / "adapter")
    _, theirs, _, err = _audit(real, Path("."), tmp_path / "real")

    def bodies(cells):
        return {
            c["invariant"]: (
                c["violation"],
                Path(c["counterexample"]).read_text().split("\ncases:", 1)[1].split("\ntarget:", 1)[0],
            )
            for c in cells
            if c["status"] == "fail"
        }

    assert bodies(mine) == bodies(theirs), err
    print(shlex.join(real.argv(".")))


def _assert_case_replays(case: str, entry: dict, *target: str) -> None:
    """`is-study case CASE` on a released-code target gives the entry's recorded results, NaN included."""
    from runner.audit.case_study import compare

    got = subprocess.run(
        [sys.executable, str(ONLY_OWN), "case", case, *target, "--json"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr
    assert compare(json.loads(got.stdout), entry["results"]) == []


@pytest.mark.parametrize(
    "entry",
    yaml.safe_load((REPO / "conf" / "cases" / "areal.yaml").read_text())["expect"],
    ids=lambda e: f"{e['preset']}{e['overrides']}",
)
def test_areal_cases_are_what_its_released_loss_gives(site, entry):
    """conf/cases/areal.yaml's numbers are AReaL 1.0.4's own: each expectation, replayed on the downloaded
    ppo_actor_loss_fn with its recorded RejectionSamplingConfig, gives them again (NaN included)."""
    kwargs = json.dumps({"areal": str(site / "areal"), **entry["areal"]})
    target = ("--target", "examples/audit/areal.py:PPOActorLoss", "--target-kwargs", kwargs)
    _assert_case_replays("areal", entry, *target)


@pytest.mark.parametrize(
    "entry",
    yaml.safe_load((REPO / "conf" / "cases" / "verl-rs-batch-norm.yaml").read_text())["expect"],
    ids=lambda e: e["preset"],
)
def test_verl_rollout_correction_cases_are_what_its_released_code_gives(site, entry):
    """conf/cases/verl-rs-batch-norm.yaml's numbers are verl 0.9.1's own: its IS weights (batch-normalised) and
    rejection mask (seq_max_k2 / k3) from the downloaded rollout_corr_helper, through compute_policy_loss_vanilla
    (examples/audit/verl_rollout_corr.py), with each entry's recorded settings, give them again."""
    kwargs = json.dumps({"verl": str(site / "verl"), **entry["verl"]})
    target = ("--target", "examples/audit/verl_rollout_corr.py:RolloutCorrectedLoss", "--target-kwargs", kwargs)
    _assert_case_replays("verl-rs-batch-norm", entry, "--stub", VERL_STUBS, *target)


@pytest.mark.parametrize(
    "entry",
    yaml.safe_load((REPO / "conf" / "cases" / "trl-off-policy-mask.yaml").read_text())["expect"],
    ids=lambda e: f"{e['preset']}{e['overrides']}",
)
def test_trl_off_policy_mask_cases_are_what_its_released_loss_gives(site, entry):
    """conf/cases/trl-off-policy-mask.yaml's numbers are TRL 1.16.0's own: GRPOTrainer._compute_loss with its
    get_off_policy_mask, compiled from the downloaded wheel (examples/audit/trl_grpo.py) with each entry's
    off_policy_mask_threshold, gives them again."""
    kwargs = json.dumps({"trl": str(site / "trl"), **entry["trl"]})
    target = ("--convention", "trl", "--target", "examples/audit/trl_grpo.py:GRPOLoss", "--target-kwargs", kwargs)
    _assert_case_replays("trl-off-policy-mask", entry, *target)
