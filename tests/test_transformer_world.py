"""policy=transformer: cached sampling against the teacher-forced trainer, the precision mismatch,
routing replay, the SFT warm start and its cache, and config validation, with real numbers.

The SFT tests use a small world (8-token responses, 16 values) whose warm start trains in seconds;
the default world's numbers are measured by scripts/bench_transformer.py and
scripts/calibrate_transformer.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from runner.errors import UserError
from runner.tasks import make_task
from runner.worlds.precision import FP32, Precision
from runner.worlds.registry import make_world
from runner.worlds.transformer import mismatch, sft
from runner.worlds.transformer.kv_cache import KVCache
from tests.helpers.repo import REPO

SMALL_TASK = {"name": "sort", "values": 16, "length": None}
SMALL_ROLLOUT = {"seq_len": 8}
SMALL_SFT = {"steps": 400, "batch_size": 64, "lr": 0.003, "warmup": 50, "fork_error": 0.4, "eval_samples": 512}


def small_world(cache_dir, policy=None, sft_cfg=None, rollout=SMALL_ROLLOUT, task=SMALL_TASK):
    policy = {
        "name": "transformer",
        **(policy or {}),
        "sft": {**SMALL_SFT, **(sft_cfg or {}), "cache_dir": str(cache_dir)},
    }
    return make_world(policy, rollout, make_task(task, rollout))


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """The small world's warm start (sft.seed 0): (world, params), trained once for this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    world = small_world(tmp_path_factory.mktemp("sft-cache"))
    params = world.init_params(torch.Generator().manual_seed(0))
    yield world, params
    torch.set_num_threads(before)


def _sampled_logits(world, params, prompts, tokens, precision):
    """The cached sampler's [N, T, V] logits when fed `tokens` (teacher forcing through the cache)."""
    s = world.sampler(params, prompts, precision)
    out = [s.start()]
    for t in range(tokens.shape[1] - 1):
        out.append(s.step(tokens[:, t]))
    return torch.stack(out, dim=1)


# ------------------------------------------------------------------ cached == teacher-forced in fp32
def _both_routes(world, params, n=16, seed=1):
    """(teacher-forced, cached) [N, T, V] log-probs and (old, roll, mask) [N, T] on the cached
    sampler's own fp32 samples."""
    gen = torch.Generator().manual_seed(seed)
    prompts = world.sample_prompts(n, gen)
    tokens, mask, roll = sft.sample(world, params, prompts, gen, FP32)
    teacher = torch.log_softmax(world.logits(params, prompts, tokens, FP32), dim=-1)
    cached = torch.log_softmax(_sampled_logits(world, params, prompts, tokens, FP32), dim=-1)
    old = world.token_stats(params, prompts, tokens).logp
    return teacher, cached, old, roll, mask


@pytest.mark.parametrize("experts", [0, 4])
def test_cached_sampling_matches_teacher_forced_in_fp32(one_thread, tmp_path, experts):
    # The default initialisation on 32-token responses, every log-prob of the vocabulary.
    world = small_world(
        tmp_path,
        policy={"experts": experts},
        sft_cfg={"steps": 0},
        rollout={"seq_len": 32},
        task={"name": "sort", "values": 64},
    )
    params = world.init_params(torch.Generator().manual_seed(0))
    teacher, cached, old, roll, mask = _both_routes(world, params)
    assert (cached - teacher).abs().max().item() < 1e-5
    assert ((old - roll) * mask).abs().max().item() < 1e-5


@pytest.mark.slow
def test_cached_sampling_matches_teacher_forced_at_the_warm_start(one_thread, warm):
    # A trained θ: the sampled tokens span p ≈ 1 down to p < 0.01.
    teacher, cached, old, roll, mask = _both_routes(*warm, n=256)
    assert old[mask > 0].min() < -5
    assert (cached - teacher).abs().max().item() < 1e-5
    assert ((old - roll) * mask).abs().max().item() < 1e-5


@pytest.mark.parametrize("experts", [0, 4])
def test_cached_and_teacher_forced_are_the_same_arithmetic(one_thread, tmp_path, experts):
    # In float64 the two routes agree to 1e-10 even at a sharp θ (init_std 0.3: log-probs down to
    # about −20), so what separates them in fp32 is rounding alone. (At the default warm start the
    # fp32 routes differ by up to 1.4e-5 on sampled tokens with p ≈ 0.01–0.4, each being within
    # 1.3e-5 of a float64 forward: that is the fp32 noise floor there, measured in the report.)
    world = small_world(
        tmp_path,
        policy={"experts": experts, "init_std": 0.3},
        sft_cfg={"steps": 0},
        rollout={"seq_len": 32},
        task={"name": "sort", "values": 64},
    )
    params = {k: v.double() for k, v in world.init_params(torch.Generator().manual_seed(0)).items()}
    teacher, cached, _, _, _ = _both_routes(world, params)
    assert teacher.dtype == torch.float64 and teacher.min() < -10
    assert (cached - teacher).abs().max().item() < 1e-10


def test_trainer_logits_carry_the_gradient(one_thread, tmp_path):
    world = small_world(tmp_path, sft_cfg={"steps": 0})
    gen = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_(True) for k, v in world.init_params(gen).items()}
    prompts = world.sample_prompts(4, gen)
    tokens, _, _ = sft.sample(world, params, prompts, gen)
    world.token_stats(params, prompts, tokens).logp.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())


@pytest.mark.slow
def test_low_precision_logits_come_in_the_compute_dtype(one_thread, warm):
    world, params = warm
    prompts = world.sample_prompts(4, torch.Generator().manual_seed(3))
    for name, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp8", torch.bfloat16)]:
        s = world.sampler(params, prompts, Precision(name))
        assert s.start().dtype == dtype
        tokens = torch.zeros(4, 8, dtype=torch.long)
        assert world.logits(params, prompts, tokens, Precision(name)).dtype == dtype


# ----------------------------------------------------------------------------- the precision ladder
@pytest.mark.slow
def test_bf16_mismatch_is_ten_times_fp16_and_fp8_exceeds_bf16(one_thread, warm):
    # At the same θ (the warm start), on the engine's own samples (2048 responses each).
    world, params = warm
    prompts = world.sample_prompts(2048, torch.Generator().manual_seed(11))
    k3 = {}
    for name in ("bf16", "fp16", "fp8"):
        tok = mismatch.token_mismatch(world, params, prompts, Precision(name), torch.Generator().manual_seed(12))
        k3[name] = mismatch.summarize(tok)["kl_k3"]
    assert k3["fp16"] > 0
    assert k3["bf16"] / k3["fp16"] >= 10, k3
    assert k3["fp8"] > k3["bf16"], k3


@pytest.mark.slow
def test_mismatch_concentrates_on_low_probability_tokens(one_thread, warm):
    world, params = warm
    prompts = world.sample_prompts(2048, torch.Generator().manual_seed(13))
    tok = mismatch.token_mismatch(world, params, prompts, Precision("bf16"), torch.Generator().manual_seed(14))
    low = tok["p_old"] < 0.5
    high = tok["p_old"] > 0.99
    assert low.sum() > 50 and high.sum() > 50
    # per-token k3 on tokens the trainer gives p < 0.5 is at least 10x that on p > 0.99
    assert tok["k3"][low].mean() > 10 * tok["k3"][high].mean()


def test_routing_replay_removes_expert_flips(one_thread, tmp_path):
    # Near-tie routers (router weights 1e-3 × N(0,1), the rest N(0, 0.1²)): bf16 flips experts and a
    # flip changes the token's distribution; replaying the fp32 choices leaves only the rounding.
    world = small_world(
        tmp_path,
        policy={"experts": 4, "init_std": 0.1},
        sft_cfg={"steps": 0},
        rollout={"seq_len": 32},
        task={"name": "sort", "values": 64},
    )
    gen = torch.Generator().manual_seed(4)
    params = world.init_params(gen)
    for name in params:
        if name.endswith("mlp.router"):
            params[name] = params[name] * 1e-3 / 0.1
    prompts = world.sample_prompts(64, gen)
    tokens, _, _ = sft.sample(world, params, prompts, gen)
    p32 = torch.softmax(world.logits(params, prompts, tokens, FP32), -1)

    def max_dp(precision):
        return (torch.softmax(world.logits(params, prompts, tokens, precision).float(), -1) - p32).abs().max().item()

    free, replay = max_dp(Precision("bf16")), max_dp(Precision("bf16", router_fp32=True))
    assert free > 10 * replay, (free, replay)
    # the sampler (KV cache) replays the same choices as the teacher-forced pass
    cached = torch.softmax(
        _sampled_logits(world, params, prompts, tokens, Precision("bf16", router_fp32=True)).float(), -1
    )
    assert (cached - p32).abs().max().item() < 10 * replay + 0.05


# ------------------------------------------------------------------------------------ SFT warm start
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_sft_reaches_the_accuracy_band(one_thread, warm, tmp_path, seed):
    # 20–60% exact-match accuracy (512 samples: SE ≈ 0.022), most tokens sure, a minority of forks.
    if seed == 0:
        record = warm[0].warm_start
    else:
        world = small_world(tmp_path, sft_cfg={"seed": seed})
        world.init_params(torch.Generator().manual_seed(0))
        record = world.warm_start
    assert 0.2 <= record["accuracy"] <= 0.6, record
    assert record["confident_fraction"] >= 0.6, record
    assert 0.02 <= record["fork_fraction"] <= 0.4, record
    assert record["mean_entropy"] < 0.5, record


@pytest.mark.slow
def test_sft_is_deterministic(one_thread, tmp_path):
    world = small_world(tmp_path, sft_cfg={"steps": 20})
    a, b = sft.train(world), sft.train(world)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_second_run_loads_the_cached_warm_start(one_thread, warm):
    world, params = warm
    assert world.warm_start["cache"] in ("trained", "hit")
    again = small_world(os.path.dirname(os.path.dirname(world.warm_start["checkpoint"])))
    start = time.perf_counter()
    loaded = again.init_params(torch.Generator().manual_seed(123))
    assert time.perf_counter() - start < 5  # a load, not 400 SFT steps
    assert again.warm_start["cache"] == "hit"
    assert again.warm_start["accuracy"] == world.warm_start["accuracy"]
    assert all(torch.equal(loaded[k], params[k]) for k in params)


def test_the_cache_key_follows_what_determines_the_checkpoint(tmp_path):
    base = small_world(tmp_path)
    key = sft.cache_key(sft.cache_identity(base, torch.device("cpu")))
    same = small_world(tmp_path / "elsewhere")  # the cache folder is not part of the key
    assert sft.cache_key(sft.cache_identity(same, torch.device("cpu"))) == key
    for other in (
        small_world(tmp_path, sft_cfg={"fork_error": 0.3}),
        small_world(tmp_path, policy={"d_model": 32}),
        small_world(tmp_path, task={**SMALL_TASK, "values": 17}),
    ):
        assert sft.cache_key(sft.cache_identity(other, torch.device("cpu"))) != key


_WARM_START_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from runner.tasks import make_task
    from runner.worlds.registry import make_world
    steps, cache = int(sys.argv[1]), sys.argv[2]
    rollout = {"seq_len": 8}
    world = make_world({"name": "transformer", "sft": {"steps": steps, "eval_samples": 64, "cache_dir": cache}},
                       rollout, make_task({"name": "sort", "values": 16}, rollout))
    print("started", flush=True)
    params = world.init_params(torch.Generator())
    print(json.dumps({"cache": world.warm_start["cache"], "sum": sum(v.double().sum().item() for v in params.values())}))
""")


def _spawn(steps, cache_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", _WARM_START_SCRIPT, str(steps), str(cache_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


@pytest.mark.slow
def test_racing_jobs_train_the_warm_start_once(tmp_path):
    jobs = [_spawn(60, tmp_path), _spawn(60, tmp_path)]
    results = []
    for job in jobs:
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["cache"] for r in results) == ["hit", "trained"]
    assert results[0]["sum"] == results[1]["sum"]
    folder = tmp_path / "transformer-sft"
    assert len(list(folder.glob("*.pt"))) == 1 and len(list(folder.glob("*.json"))) == 1
    assert not list(folder.glob(".*.tmp"))


@pytest.mark.slow
def test_killed_sft_leaves_no_checkpoint(tmp_path):
    job = _spawn(1_000_000, tmp_path)
    assert job.stdout.readline().strip() == "started"
    folder = tmp_path / "transformer-sft"
    deadline = time.time() + 60
    while not list(folder.glob("*.lock")) and time.time() < deadline:  # SFT holds the lock
        time.sleep(0.1)
    time.sleep(1.0)
    job.send_signal(signal.SIGKILL)
    job.communicate(timeout=60)
    assert job.returncode == -signal.SIGKILL
    assert list(folder.glob("*.lock"))
    assert not list(folder.glob("*.pt")) and not list(folder.glob("*.json"))
    # a job killed while writing leaves its temporary file (never the checkpoint's name); plant one
    # for the next job's checkpoint, which must remove it once it holds that checkpoint's lock
    rollout = {"seq_len": 8}
    nxt = make_world(
        {"name": "transformer", "sft": {"steps": 20, "eval_samples": 64, "cache_dir": str(tmp_path)}},
        rollout,
        make_task({"name": "sort", "values": 16}, rollout),
    )
    stale = folder / f".{sft.cache_key(sft.cache_identity(nxt, torch.device('cpu')))}.pt.99999.tmp"
    stale.write_bytes(b"half a checkpoint")
    # the next job takes the (released) lock, removes the stale file and trains
    job = _spawn(20, tmp_path)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["cache"] == "trained"
    assert len(list(folder.glob("*.pt"))) == 1 and not stale.exists()


def test_a_write_that_fails_leaves_no_file(tmp_path):
    target = tmp_path / "ckpt.pt"

    def half_then_fail(f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sft._atomic_write(target, half_then_fail)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------- shape
def test_default_world_from_the_config():
    from runner.hydra_app import app as hydra_app

    cfg = hydra_app.to_container(hydra_app.compose(["policy=transformer"]))
    assert cfg["task"]["name"] == "sort" and cfg["rollout"]["seq_len"] == 32
    world = make_world(cfg["policy"], cfg["rollout"], make_task(cfg["task"], cfg["rollout"]))
    assert (world.vocab_size, world.seq_len, world.eos_token, world.prompt_len) == (67, 32, 66, 33)
    assert world.exact is None
    summary = world.summary()
    # wte 67·64 + wpe 512·64 + 2 layers × (2 norms 4·64, qkv 64·192 + 192, out 64·64 + 64,
    # mlp 64·256 + 256 + 256·64 + 64) + ln_f 2·64
    assert summary["policy"] == "transformer" and summary["n_params"] == 137_152


def test_kv_cache_memory_is_linear_in_length():
    sizes = [KVCache(2, 8, 4, T, 16, torch.float32, torch.device("cpu")).nbytes() for T in (64, 128, 256)]
    assert sizes[1] == 2 * sizes[0] and sizes[2] == 4 * sizes[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(tmp_path):
    world = small_world(tmp_path, sft_cfg={"steps": 0}, policy={"init_std": 0.3})
    params = world.init_params(torch.Generator().manual_seed(0))
    prompts = world.sample_prompts(8, torch.Generator().manual_seed(1))
    tokens = torch.randint(world.vocab_size, (8, 8), generator=torch.Generator().manual_seed(2))
    cpu = world.logits(params, prompts, tokens)
    gpu = world.logits({k: v.cuda() for k, v in params.items()}, prompts, tokens)
    assert gpu.device.type == "cuda"
    assert (gpu.cpu() - cpu).abs().max().item() < 1e-4
    s = world.sampler({k: v.cuda() for k, v in params.items()}, prompts, Precision("bf16"))
    assert s.start().device.type == "cuda"


# ------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "policy,rollout,task,message",
    [
        (
            {"d_model": 60, "n_head": 8},
            SMALL_ROLLOUT,
            SMALL_TASK,
            "policy.d_model (60) must be divisible by policy.n_head (8)",
        ),
        ({"n_layer": 0}, SMALL_ROLLOUT, SMALL_TASK, "policy.n_layer must be >= 1"),
        ({"experts": 1}, SMALL_ROLLOUT, SMALL_TASK, "policy.experts must be 0"),
        ({"experts": -2}, SMALL_ROLLOUT, SMALL_TASK, "policy.experts must be >= 0"),
        ({"context": 12}, SMALL_ROLLOUT, SMALL_TASK, "exceeds policy.context (12)"),
        ({"d_modl": 64}, SMALL_ROLLOUT, SMALL_TASK, "did you mean policy.d_model"),
        ({"init_std": -1}, SMALL_ROLLOUT, SMALL_TASK, "policy.init_std must be >= 0"),
        ({"sft": {"fork_error": 1.5}}, SMALL_ROLLOUT, SMALL_TASK, "policy.sft.fork_error must be <= 1"),
        ({"sft": {"steps": -1}}, SMALL_ROLLOUT, SMALL_TASK, "policy.sft.steps must be >= 0"),
        ({"sft": {"lr": 0}}, SMALL_ROLLOUT, SMALL_TASK, "policy.sft.lr must be > 0"),
        ({"sft": {"cache_dir": 3}}, SMALL_ROLLOUT, SMALL_TASK, "policy.sft.cache_dir must be a path or null"),
        ({"sft": {"stepz": 3}}, SMALL_ROLLOUT, SMALL_TASK, "did you mean policy.sft.steps"),
        ({}, {"seq_len": 8}, {**SMALL_TASK, "length": 3}, None),
        (
            {},
            {"seq_len": 16, "vocab_size": 16},
            {"name": "target-count", "targets": [0]},
            "needs a task with its own vocabulary",
        ),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, policy, rollout, task, message):
    policy = {"name": "transformer", **policy}
    policy["sft"] = {"cache_dir": str(tmp_path), **policy.get("sft", {})}
    if message is None:  # a valid corner: a budget longer than the answer
        assert make_world(policy, rollout, make_task(task, rollout)).seq_len == 8
        return
    with pytest.raises(UserError) as err:
        make_world(policy, rollout, make_task(task, rollout))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_rollout_shorter_than_the_answer_is_an_error(tmp_path):
    task = make_task({**SMALL_TASK, "length": 7}, {"seq_len": 8})
    with pytest.raises(UserError, match=r"rollout.seq_len \(6\) is shorter than task=sort's answer \(8 tokens\)"):
        make_world({"name": "transformer"}, {"seq_len": 6}, task)


@pytest.mark.slow
def test_bench_runs_at_tiny_size(tmp_path):
    # CI proves the bench runs; its figures are measured by `python scripts/bench_transformer.py`.
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, "scripts/bench_transformer.py", "--tiny", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())
    names = " | ".join(r["name"] for r in rows)
    for part in ("KV-cache sampling speedup", "KV cache bytes", "peak memory", "SFT warm start", "forward+backward"):
        assert part in names
    for row in rows:
        assert set(row) == {"name", "value", "target", "pass", "detail"}
        assert row["pass"] is not None or row["target"] == "info", row
        # an info row at the tiny size may read the allocator's noise: the T=32 peak is under 1 MiB, so its
        # growth over the process's baseline can come out negative (measured: -44.8x with CI and a second
        # suite sharing the 2 cores); a judged row is a real figure
        assert math.isfinite(row["value"]) and (row["value"] > 0 or row["target"] == "info"), row


@pytest.mark.slow
def test_a_joblib_sweep_trains_one_shared_warm_start_once(tmp_path):
    """4 jobs on 2 joblib workers, all needing the same warm start: one job trains it (under the lock),
    the others wait and load it; the cache holds one checkpoint and no temporary file."""
    from tests.helpers.cli import run_cli

    cache = tmp_path / "cache"
    sweep_dir = tmp_path / "sweep"
    code, _, err = run_cli(
        "sweep",
        "policy=transformer",
        "seed=0,1,2,3",
        "policy.n_layer=1",
        "policy.d_model=16",
        "policy.n_head=2",
        "task.values=8",
        "rollout.seq_len=6",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "train.steps=2",
        "train.objective_samples=16",
        "policy.sft.steps=30",
        "policy.sft.eval_samples=32",
        f"policy.sft.cache_dir={cache}",
        "device=cpu",
        f"hydra.sweep.dir={sweep_dir}",
        "--launcher",
        "joblib",
        "--jobs",
        "2",
    )
    assert code == 0, err
    summaries = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))]
    assert len(summaries) == 4
    caches = sorted(s["world"]["warm_start"]["cache"] for s in summaries)
    assert caches == ["hit", "hit", "hit", "trained"], caches
    checkpoints = list((cache / "transformer-sft").glob("*.pt"))
    assert len(checkpoints) == 1 and not list((cache / "transformer-sft").glob("*.tmp*"))
    assert len({s["world"]["warm_start"]["checkpoint"] for s in summaries}) == 1


# ------------------------------------------------------------------------------ by hand: the pieces
def test_mismatch_summary_and_probability_bins_golden_values():
    """Five tokens with p_old 0.05, 0.1, 0.3, 0.5, 1 (a bin holds its lower edge; p = 1 falls in the
    last bin, reported as ending at 1), k3 = 0, 1, 2, 4, 3: mean k3 2, its standard error
    sd/√5 = √2.5/√5 = √0.5; |Δp| 0.5, 0.1, 0.3, 0.2, 0.3: max 0.5, mean 0.28; |Δ log p| = |old − roll|."""
    p_old = torch.tensor([0.05, 0.1, 0.3, 0.5, 1.0], dtype=torch.float64)
    shift = torch.tensor([0.5, -0.25, 0.75, 0.125, -1.0], dtype=torch.float64)
    tok = {
        "p_old": p_old,
        "old": p_old.log(),
        "roll": p_old.log() + shift,
        "k3": torch.tensor([0.0, 1, 2, 4, 3], dtype=torch.float64),
        "abs_dp": torch.tensor([0.5, 0.1, 0.3, 0.2, 0.3], dtype=torch.float64),
        "entropy": torch.tensor([1.0, 2, 3, 4, 5], dtype=torch.float64),
    }
    assert mismatch.summarize(tok) == pytest.approx(
        {
            "tokens": 5,
            "kl_k3": 2.0,
            "kl_k3_se": math.sqrt(0.5),
            "max_abs_prob_diff": 0.5,
            "mean_abs_prob_diff": 0.28,
            "mean_entropy": 3.0,
        },
        abs=1e-12,
    )
    rows = mismatch.by_probability(tok)
    assert [(r["p_low"], r["p_high"]) for r in rows] == [(0.0, 0.1), (0.1, 0.5), (0.5, 0.9), (0.9, 0.99), (0.99, 1.0)]
    assert [r["share"] for r in rows] == [0.2, 0.4, 0.2, 0.0, 0.2]
    assert "kl_k3" not in rows[3]  # an empty bin reports its share only
    filled = [rows[i] for i in (0, 1, 2, 4)]
    assert [r["kl_k3"] for r in filled] == pytest.approx([0.0, 1.5, 4.0, 3.0], abs=1e-12)
    assert [r["mean_abs_dp"] for r in filled] == pytest.approx([0.5, 0.2, 0.2, 0.3], abs=1e-12)
    assert [r["max_abs_dp"] for r in filled] == pytest.approx([0.5, 0.3, 0.2, 0.3], abs=1e-12)
    assert [r["mean_abs_dlogp"] for r in filled] == pytest.approx([0.5, 0.5, 0.125, 1.0], abs=1e-12)
    assert mismatch.by_probability({**tok, "p_old": p_old[:0]})[0]["share"] == 0.0  # no tokens: no 0/0
    one = {k: v[2:3] for k, v in tok.items()}  # a single token, p_old 0.3: all of it in the second bin
    assert [r["share"] for r in mismatch.by_probability(one)] == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_token_mismatch_is_k3_and_the_probability_gap_of_the_engine_samples(one_thread, tmp_path):
    """Over the masked-in tokens of the engine's own bf16 samples: old is the fp32 trainer's log-prob,
    roll the engine's; k3 = e^(old−roll) − 1 − (old−roll) ≥ 0, |Δp| = |e^old − e^roll|."""
    world = small_world(tmp_path, sft_cfg={"steps": 0}, policy={"init_std": 0.5})
    params = world.init_params(torch.Generator().manual_seed(0))
    prompts = world.sample_prompts(16, torch.Generator().manual_seed(1))
    tok = mismatch.token_mismatch(world, params, prompts, Precision("bf16"), torch.Generator().manual_seed(2))
    tokens, mask, roll = sft.sample(world, params, prompts, torch.Generator().manual_seed(2), Precision("bf16"))
    stats = world.token_stats(params, prompts, tokens)
    on = mask > 0
    assert int(on.sum()) == tok["k3"].numel() > 16
    assert torch.equal(tok["old"], stats.logp[on].double()) and torch.equal(tok["roll"], roll[on].double())
    lr = tok["old"] - tok["roll"]
    assert float(lr.abs().max()) > 1e-3
    torch.testing.assert_close(tok["k3"], lr.exp() - 1 - lr, atol=1e-12, rtol=0)
    assert torch.equal(tok["p_old"], tok["old"].exp())
    torch.testing.assert_close(tok["abs_dp"], (tok["old"].exp() - tok["roll"].exp()).abs(), atol=1e-15, rtol=0)
    assert torch.equal(tok["entropy"], stats.entropy[on].double())


def test_learning_rate_warms_up_linearly_then_decays_by_a_cosine():
    """lr 0.01, warm-up 4 of 12 steps: (s + 1)/4 · 0.01 for s < 4, then 0.005·(1 + cos(π(s − 4)/8))."""
    cfg = sft.SFTConfig(steps=12, lr=0.01, warmup=4)
    assert [sft._lr(cfg, s) for s in range(4)] == pytest.approx([0.0025, 0.005, 0.0075, 0.01], abs=1e-15)
    assert [sft._lr(cfg, s) for s in (4, 8, 11)] == pytest.approx(
        [0.01, 0.005, 0.005 * (1 + math.cos(7 * math.pi / 8))], abs=1e-15
    )
    assert sft._lr(sft.SFTConfig(steps=5, lr=0.01, warmup=0), 0) == 0.01  # no warm-up: the decay from the start
    assert sft._lr(sft.SFTConfig(steps=3, lr=0.01, warmup=3), 3) == 0.01  # a warm-up as long as the run


def test_kv_cache_writes_each_layer_and_refuses_past_its_length():
    """2 layers, room for 5 positions: a prefill of 3 then single steps. Every layer's write returns all
    positions so far; only the last layer's advances `length`; a sixth position is refused."""
    cache = KVCache(2, 1, 1, 5, 2, torch.float32, torch.device("cpu"))
    assert cache.nbytes() == 2 * (2 * 1 * 1 * 5 * 2) * 4
    k, v = torch.arange(6.0).view(1, 1, 3, 2), -torch.arange(6.0).view(1, 1, 3, 2)
    k0, v0 = cache.update(0, k, v)
    assert cache.length == 0 and torch.equal(k0, k) and torch.equal(v0, v)
    cache.update(1, k + 100, v)
    assert cache.length == 3
    for step in (3, 4):
        new = torch.full((1, 1, 1, 2), float(step))
        k0, _ = cache.update(0, new, new)
        k1, v1 = cache.update(1, new, -new)
        assert k0.shape == (1, 1, step + 1, 2) and torch.equal(k1[:, :, :3], k + 100) and v1[0, 0, step, 0] == -step
    assert cache.length == 5
    with pytest.raises(ValueError, match="KV cache full"):
        cache.update(0, new, new)


def test_sft_config_defaults_edges_and_errors(tmp_path, monkeypatch):
    """Defaults as documented; each bound's edge accepted, one past it refused; the cache folder."""
    d = sft.SFTConfig.from_config({})
    assert d == sft.SFTConfig(
        steps=1000, batch_size=64, lr=3e-3, warmup=100, fork_error=0.1, seed=0, eval_samples=512, cache_dir=None
    )
    edge = sft.SFTConfig.from_config(
        {
            "steps": 0,
            "batch_size": 1,
            "lr": 1e-9,
            "warmup": 0,
            "fork_error": 1.0,
            "seed": 0,
            "eval_samples": 1,
            "cache_dir": "~/sft",
        }
    )
    assert edge == sft.SFTConfig(0, 1, 1e-9, 0, 1.0, 0, 1, "~/sft")
    assert sft.SFTConfig.from_config({"fork_error": 0.0}).fork_error == 0.0
    for key, value, message in [
        ("batch_size", 0, "policy.sft.batch_size must be >= 1"),
        ("warmup", -1, "policy.sft.warmup must be >= 0"),
        ("seed", -1, "policy.sft.seed must be >= 0"),
        ("eval_samples", 0, "policy.sft.eval_samples must be >= 1"),
        ("fork_error", -0.1, "policy.sft.fork_error must be >= 0"),
        ("lr", -1.0, "policy.sft.lr must be > 0"),
        ("cache_dir", "", "policy.sft.cache_dir must be a path or null"),
    ]:
        with pytest.raises(UserError, match=message.replace(".", r"\.")):
            sft.SFTConfig.from_config({key: value})
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sft.cache_root(edge) == tmp_path / "home" / "sft"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert sft.cache_root(d) == tmp_path / "xdg" / "is-study"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert sft.cache_root(d) == tmp_path / "home" / ".cache" / "is-study"


def test_summary_reports_the_shape_and_counts_the_parameters(tmp_path):
    """task=sort with 16 values: V = 19 (BOS, SEP, EOS = 18), prompts of 9 tokens. 1 layer, d 16, 2 heads,
    2 experts of width 32, context 40: wte 19·16 + wpe 40·16 + ln1 32 + qkv 16·48 + 48 + out 16·16 + 16
    + ln2 32 + router 16·2 + w_in 2·16·32 + b_in 64 + w_out 2·32·16 + b_out 32 + ln_f 32 = 4304."""
    world = small_world(
        tmp_path,
        sft_cfg={"steps": 0},
        policy={"n_layer": 1, "d_model": 16, "n_head": 2, "experts": 2, "context": 40, "mlp_ratio": 2},
    )
    world.warm_start = {"cache": "hit"}  # left from an earlier init with a warm start: a random init clears it
    world.init_params(torch.Generator().manual_seed(0))
    assert world.warm_start == {}
    assert world.summary() == {
        "policy": "transformer",
        "vocab_size": 19,
        "seq_len": 8,
        "prompt_len": 9,
        "eos_token": 18,
        "n_layer": 1,
        "n_head": 2,
        "d_model": 16,
        "mlp_ratio": 2,
        "context": 40,
        "experts": 2,
        "task": "sort",
        "n_params": 4304,
    }
    world.warm_start = {"cache": "hit"}  # what init_params records after an SFT warm start
    assert world.summary()["warm_start"] == {"cache": "hit"}


def test_policy_defaults_and_edges_are_accepted(tmp_path):
    """The defaults (nanoGPT-small-ish: 2 layers, 4 heads, d 64, ratio 4, context 512, dense, init 0.02,
    1000 SFT steps); every lower bound at its edge (a context of exactly prompt + response, 9 + 8 = 17)
    and the largest context; one past each edge is refused."""
    from runner.worlds.transformer.model import Shape
    from runner.worlds.transformer.world import TransformerWorld

    task = make_task(SMALL_TASK, SMALL_ROLLOUT)
    default = make_world({"name": "transformer", "sft": {"cache_dir": str(tmp_path)}}, SMALL_ROLLOUT, task)
    assert default.shape == Shape(vocab_size=19, context=512, n_layer=2, n_head=4, d_model=64, mlp_ratio=4, experts=0)
    assert default.init_std == 0.02 and default.sft.steps == 1000 and default.warm_start == {}
    edge = make_world(
        {
            "name": "transformer",
            "n_layer": 1,
            "n_head": 1,
            "d_model": 1,
            "mlp_ratio": 1,
            "context": 17,
            "experts": 0,
            "init_std": 0.0,
            "sft": {"steps": 0},
        },
        SMALL_ROLLOUT,
        task,
    )
    assert edge.shape == Shape(vocab_size=19, context=17, n_layer=1, n_head=1, d_model=1, mlp_ratio=1, experts=0)
    assert edge.init_std == 0.0
    assert (
        make_world(
            {"name": "transformer", "context": 65536, "experts": 2, "sft": {"steps": 0}}, SMALL_ROLLOUT, task
        ).shape.context
        == 65536
    )
    for policy, message in [
        ({"context": 16}, r"prompt \(9\) \+ rollout.seq_len \(8\) exceeds policy.context \(16\)"),
        ({"context": 65537}, "policy.context must be <= 65536, got 65537"),
        ({"context": 1}, "policy.context must be >= 2, got 1"),
        ({"mlp_ratio": 0}, "policy.mlp_ratio must be >= 1, got 0"),
        ({"d_model": 0}, "policy.d_model must be >= 1, got 0"),
        ({"n_head": 0}, "policy.n_head must be >= 1, got 0"),
    ]:
        with pytest.raises(UserError, match=message):
            make_world({"name": "transformer", "sft": {"steps": 0}, **policy}, SMALL_ROLLOUT, task)
    direct = TransformerWorld(edge.shape, 8, task)  # built without an SFT config: no warm start
    assert direct.sft.steps == 0 and direct.init_std == 0.02 and (direct.eos_token, direct.prompt_len) == (18, 9)


def _reference_logits(shape, p, idx):
    """nanoGPT's forward written independently with torch.nn.functional (no rounding, no cache)."""
    F = torch.nn.functional
    N, t = idx.shape
    d, H = shape.d_model, shape.n_head
    x = p["wte"][idx] + p["wpe"][:t]
    for i in range(shape.n_layer):
        h = f"h{i}."
        a = F.layer_norm(x, (d,), p[h + "ln1.w"], p[h + "ln1.b"])
        q, k, v = (a @ p[h + "attn.w_qkv"] + p[h + "attn.b_qkv"]).split(d, dim=-1)
        q, k, v = (z.reshape(N, t, H, d // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(N, t, d)
        x = x + y @ p[h + "attn.w_out"] + p[h + "attn.b_out"]
        m = F.layer_norm(x, (d,), p[h + "ln2.w"], p[h + "ln2.b"])
        if shape.experts == 0:
            x = x + F.gelu(m @ p[h + "mlp.w_in"] + p[h + "mlp.b_in"]) @ p[h + "mlp.w_out"] + p[h + "mlp.b_out"]
        else:
            gates = torch.softmax(m @ p[h + "mlp.router"], -1)  # [N, t, E]
            e = gates.argmax(-1)  # [N, t]
            u = F.gelu(torch.einsum("ntd,ntdf->ntf", m, p[h + "mlp.w_in"][e]) + p[h + "mlp.b_in"][e])
            out = torch.einsum("ntf,ntfd->ntd", u, p[h + "mlp.w_out"][e]) + p[h + "mlp.b_out"][e]
            x = x + out * gates.gather(-1, e.unsqueeze(-1))
    return F.layer_norm(x, (d,), p["ln_f.w"], p["ln_f.b"]) @ p["wte"].T


@pytest.mark.parametrize("experts", [0, 4])
def test_fp32_forward_is_nanogpt(one_thread, tmp_path, experts):
    """The trainer's float64 teacher-forced logits against nanoGPT's forward written independently
    (scaled dot-product attention, causal; pre-norm blocks; GELU MLP or top-1 experts scaled by their
    gate; tied LM head), on random non-zero biases and norms: equal to 1e-10."""
    world = small_world(tmp_path, sft_cfg={"steps": 0}, policy={"experts": experts, "init_std": 0.5, "n_layer": 2})
    g = torch.Generator().manual_seed(0)
    params = {k: (v + 0.3 * torch.randn(v.shape, generator=g)).double() for k, v in world.init_params(g).items()}
    prompts = world.sample_prompts(8, g)
    tokens = torch.randint(world.vocab_size, (8, world.seq_len), generator=g)
    idx = torch.cat([prompts, tokens[:, :-1]], 1)
    expected = _reference_logits(world.shape, params, idx)[:, prompts.shape[1] - 1 :]
    got = world.logits(params, prompts, tokens)
    assert got.dtype == torch.float64 and float(got.std()) > 1.0
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("experts", [0, 4])
def test_init_is_nanogpts(experts):
    """nanoGPT's init at std 0.05, 2 layers: N(0, 0.05²) weights, the residual projections (attention
    and MLP outputs) at 0.05/√(2·2) = 0.025, zero biases, unit norm gains. The sample std of n draws has a
    relative sd of 1/√(2n): each within 5 of those, each mean within 5 sd of 0."""
    from runner.worlds.transformer.model import Shape, init_params

    shape = Shape(vocab_size=19, context=40, n_layer=2, n_head=2, d_model=16, mlp_ratio=4, experts=experts)
    p = init_params(shape, torch.Generator().manual_seed(1), std=0.05)
    E = (experts,) if experts else ()
    stds = {"wte": ((19, 16), 0.05), "wpe": ((40, 16), 0.05)}
    for i in range(2):
        h = f"h{i}."
        stds.update(
            {
                h + "attn.w_qkv": ((16, 48), 0.05),
                h + "attn.w_out": ((16, 16), 0.025),
                h + "mlp.w_in": (E + (16, 64), 0.05),
                h + "mlp.w_out": (E + (64, 16), 0.025),
            }
        )
        if experts:
            stds[h + "mlp.router"] = ((16, experts), 0.05)
        for name, size in (("ln1.b", 16), ("attn.b_qkv", 48), ("attn.b_out", 16), ("ln2.b", 16)):
            assert p[h + name].shape == (size,) and not p[h + name].any(), h + name
        assert p[h + "mlp.b_in"].shape == E + (64,) and p[h + "mlp.b_out"].shape == E + (16,)
        assert not p[h + "mlp.b_in"].any() and not p[h + "mlp.b_out"].any()
        assert torch.equal(p[h + "ln1.w"], torch.ones(16)) and torch.equal(p[h + "ln2.w"], torch.ones(16))
    assert torch.equal(p["ln_f.w"], torch.ones(16)) and not p["ln_f.b"].any() and p["ln_f.b"].shape == (16,)
    for name, (size, std) in stds.items():
        w = p[name]
        assert tuple(w.shape) == size, name
        assert abs(float(w.std()) / std - 1) < 5 / math.sqrt(2 * w.numel()), name
        assert abs(float(w.mean())) < 5 * std / math.sqrt(w.numel()), name
    default = init_params(shape, torch.Generator().manual_seed(1))  # nanoGPT's std 0.02 unless told
    assert abs(float(default["wte"].std()) / 0.02 - 1) < 5 / math.sqrt(2 * 19 * 16)
    assert len(p) == 2 + 2 * (12 + bool(experts)) + 2  # wte, wpe; per layer 12 tensors (+ a router); ln_f


def test_a_trained_warm_start_records_its_cost_and_writes_checkpoint_and_sidecar(one_thread, tmp_path):
    """_train_and_save: SFT's wall and CPU seconds (rounded to 0.01 s, within what the call took), its
    steps and the measurements; the checkpoint holds the detached params, the record and the identity,
    and the JSON sidecar the same record and identity."""
    world = small_world(tmp_path, sft_cfg={"steps": 5, "eval_samples": 16})
    identity = sft.cache_identity(world, torch.device("cpu"))
    path = tmp_path / "ckpt.pt"
    start, cpu_start = time.perf_counter(), time.process_time()
    params, record = sft._train_and_save(world, torch.device("cpu"), identity, path)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    assert set(record) == {
        "sft_seconds",
        "sft_cpu_seconds",
        "sft_steps",
        "accuracy",
        "accuracy_se",
        "confident_fraction",
        "low_probability_fraction",
        "mean_entropy",
        "fork_fraction",
        "mean_response_len",
        "eval_samples",
    }
    assert record["sft_steps"] == 5 and record["eval_samples"] == 16
    for key, bound in (("sft_seconds", wall), ("sft_cpu_seconds", cpu)):
        assert type(record[key]) is float and 0 <= record[key] <= bound + 0.01, (key, record[key], bound)
        assert record[key] == round(record[key], 2)
    assert record["sft_seconds"] > 0.01
    blob = torch.load(path, weights_only=True)
    assert blob["record"] == record and blob["identity"] == identity
    assert all(torch.equal(blob["params"][k], params[k]) and not params[k].requires_grad for k in params)
    sidecar = path.with_suffix(".json").read_text()  # for a reader: indented by 2
    assert json.loads(sidecar) == {"record": record, "identity": identity}
    assert sidecar == json.dumps({"record": record, "identity": identity}, indent=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".pt", ".json")) == ["ckpt.json", "ckpt.pt"]


def test_sft_progress_bar_only_on_a_terminal(monkeypatch):
    """On a terminal: a transient rich bar on stderr, "SFT warm start", steps done of the total, the
    loss when one is given (every 50th step), stopped on exit. Otherwise no bar and advance does nothing."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    with sft._progress(3) as advance:
        advance(0.5)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    progress = sft._progress(3)
    assert progress.bar is None and progress.total == 3
    advance = progress.__enter__()
    bar = progress.bar
    assert bar.live.is_started and bar.live.transient and bar.console.stderr
    assert [type(c).__name__ for c in bar.columns] == [
        "TextColumn",
        "BarColumn",
        "MofNCompleteColumn",
        "TextColumn",
        "TimeRemainingColumn",
    ]
    assert bar.columns[0].text_format == "SFT warm start" and bar.columns[3].text_format == "{task.fields[loss]}"
    task = bar.tasks[0]
    assert (task.description, task.total, task.completed, task.fields) == ("sft", 3, 0, {"loss": ""})
    advance(0.5)
    assert task.completed == 1 and task.fields == {"loss": "loss 0.500"}
    advance(None)  # a step without a loss keeps the last one shown
    assert task.completed == 2 and task.fields == {"loss": "loss 0.500"}
    assert progress.__exit__(None, None, None) is False  # an exception inside propagates
    assert not bar.live.is_started


def test_warm_start_cache_layout(one_thread, tmp_path):
    """In <cache_dir>/transformer-sft (made with its parents): <key>.pt, <key>.json and <key>.lock, the key
    the hash of the identity; a stale temporary file of that key is removed before training; the next
    world with the same identity loads the checkpoint ("hit"). A cache folder that cannot be made is a
    one-line error."""
    cache = tmp_path / "a" / "b"
    world = small_world(cache, sft_cfg={"steps": 3, "eval_samples": 8})
    key = sft.cache_key(sft.cache_identity(world, torch.device("cpu")))
    folder = cache / "transformer-sft"
    folder.mkdir(parents=True)
    stale = folder / f".{key}.pt.99999.tmp"
    stale.write_bytes(b"half a checkpoint")
    other = folder / ".0123456789abcdef0123.pt.99999.tmp"  # another checkpoint's: left alone
    other.write_bytes(b"half of another")
    params = world.init_params(torch.Generator().manual_seed(0))
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{key}.pt", f"{key}.json", f"{key}.lock", other.name])
    assert world.warm_start["cache"] == "trained" and world.warm_start["checkpoint"] == str(folder / f"{key}.pt")
    assert world.warm_start["sft_steps"] == 3
    again = small_world(cache, sft_cfg={"steps": 3, "eval_samples": 8})
    # a hit loads without waiting for the lock (held here as by a job that is training): a checkpoint is
    # only ever renamed into place whole, so one that exists can be read
    from filelock import FileLock

    out = []
    with FileLock(str(folder / f"{key}.lock")):
        job = threading.Thread(
            target=lambda: out.append(again.init_params(torch.Generator().manual_seed(1))), daemon=True
        )
        job.start()
        job.join(timeout=10)
        waited = job.is_alive()
    job.join()
    assert not waited
    loaded = out[0]
    assert again.warm_start == {**world.warm_start, "cache": "hit"}
    assert all(torch.equal(loaded[k], params[k]) for k in params)
    fresh = small_world(tmp_path / "c" / "d", sft_cfg={"steps": 3, "eval_samples": 8})
    fresh.init_params(torch.Generator())
    assert (tmp_path / "c" / "d" / "transformer-sft" / f"{key}.pt").is_file()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(UserError, match=r"policy.sft.cache_dir: cannot create .*transformer-sft: ") as err:
        small_world(blocked, sft_cfg={"steps": 3, "eval_samples": 8}).init_params(torch.Generator())
    assert "\n" not in str(err.value)


def test_a_job_that_waited_for_the_lock_loads_what_the_holder_trained(one_thread, tmp_path):
    """Two jobs need the same checkpoint: the second finds none, waits for the lock the first holds
    while training, and then loads the first's checkpoint ("hit") instead of training again."""
    from filelock import FileLock

    world = small_world(tmp_path, sft_cfg={"steps": 3, "eval_samples": 8})
    identity = sft.cache_identity(world, torch.device("cpu"))
    key = sft.cache_key(identity)
    folder = tmp_path / "transformer-sft"
    folder.mkdir()
    waiting = small_world(tmp_path, sft_cfg={"steps": 3, "eval_samples": 8})
    out = []
    with FileLock(str(folder / f"{key}.lock")):
        job = threading.Thread(target=lambda: out.append(waiting.init_params(torch.Generator())), daemon=True)
        job.start()
        time.sleep(0.5)  # the job finds no checkpoint and waits for the lock
        params, _ = sft._train_and_save(world, torch.device("cpu"), identity, folder / f"{key}.pt")
    job.join(timeout=60)
    assert out and waiting.warm_start["cache"] == "hit"
    assert all(torch.equal(out[0][k], params[k]) for k in params)


def test_a_checkpoint_loads_onto_the_device_asked_for_and_only_as_weights(tmp_path):
    """_load maps the tensors to the device asked for (meta here, standing in for a GPU) and reads with
    weights_only: a file that holds other pickled objects is refused, not executed. No file: None."""
    import datetime
    import pickle

    path = tmp_path / "ckpt.pt"
    assert sft._load(path, torch.device("cpu")) is None
    torch.save({"params": {"w": torch.ones(2)}, "record": {"accuracy": 0.5}}, path)
    params, record = sft._load(path, torch.device("meta"))
    assert params["w"].device.type == "meta" and params["w"].shape == (2,) and record == {"accuracy": 0.5}
    torch.save({"params": {"w": torch.ones(2)}, "record": {"when": datetime.date(2026, 1, 1)}}, path)
    with pytest.raises(pickle.UnpicklingError):
        sft._load(path, torch.device("cpu"))


def test_cache_key_golden_value():
    """The first 20 hex digits of the SHA-256 of the identity as JSON with sorted keys, so the order the
    identity was built in does not matter."""
    key = sft.cache_key({"b": {"d": [3], "c": 1}, "a": 2})
    assert (
        key == sft.cache_key({"a": 2, "b": {"c": 1, "d": [3]}}) == "e8a2879119dac3bd7595"
    )  # sha256('{"a": 2, "b": {"c": 1, "d": [3]}}')


def test_cache_identity_holds_what_determines_the_checkpoint(tmp_path, monkeypatch):
    """Everything that determines SFT's result and nothing else: CACHE_VERSION, torch's major.minor
    (a local build suffix and the patch level dropped), the device type (not its index), the model's
    shape, init_std, the task, seq_len and the SFT settings but not the cache folder."""
    monkeypatch.setattr(torch, "__version__", "2.13.1+cu128")
    world = small_world(tmp_path)
    assert sft.cache_identity(world, torch.device("cuda", 1)) == {
        "version": 1,
        "torch": "2.13",
        "device": "cuda",
        "shape": {
            "vocab_size": 19,
            "context": 512,
            "n_layer": 2,
            "n_head": 4,
            "d_model": 64,
            "mlp_ratio": 4,
            "experts": 0,
        },
        "init_std": 0.02,
        "task": {"name": "sort", "length": 7, "values": 16},
        "seq_len": 8,
        "sft": {
            "steps": 400,
            "batch_size": 64,
            "lr": 0.003,
            "warmup": 50,
            "fork_error": 0.4,
            "seed": 0,
            "eval_samples": 512,
        },
    }
    assert world.sft.cache_dir == str(tmp_path)  # popped from the identity's copy only
    assert sft.cache_identity(world, "cpu")["device"] == "cpu"
    monkeypatch.setattr(torch, "__version__", "2.14+cpu")  # a build suffix right after the minor version
    assert sft.cache_identity(world, "cpu")["torch"] == "2.14"


def test_sft_is_adamw_on_the_masked_mean_cross_entropy(one_thread, tmp_path, monkeypatch):
    """sft.train against the recipe written out: θ₀ from init_params at the world's init_std and SFT's seed,
    AdamW (β 0.9, 0.99, no weight decay) at the warm-up/cosine lr, fresh teacher data every step, the fp32
    teacher-forced cross-entropy averaged over the teacher's response tokens (mask 1), the gradient
    clipped to norm 1 (here it is above 2 at every step), to 1e-6. The progress bar is given the step
    count and the loss at steps 0, 50, 100, ... (52 steps: 0 and 50)."""
    from runner.worlds.transformer.model import init_params

    world = small_world(
        tmp_path,
        policy={"n_layer": 1, "d_model": 16, "n_head": 2, "init_std": 0.5},
        sft_cfg={"steps": 3, "batch_size": 8, "lr": 0.05, "warmup": 2, "fork_error": 0.4, "seed": 3},
    )
    got = sft.train(world)
    cfg, task = world.sft, world.task
    gen = torch.Generator().manual_seed(3)
    params = {k: v.requires_grad_(True) for k, v in init_params(world.shape, gen, 0.5).items()}
    opt = torch.optim.AdamW(params.values(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    for _step, lr in enumerate([0.025, 0.05, 0.05]):  # warm-up (s + 1)/2 · lr, then the cosine's first value
        for group in opt.param_groups:
            group["lr"] = lr
        prompts = task.sample_prompts(8, gen)
        tokens, mask = task.teacher(prompts, gen, 0.4, world.seq_len)
        logits = world.logits(params, prompts, tokens)
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="none")
        loss = (nll * mask.flatten()).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        assert float(torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)) > 2.0
        opt.step()
    for k in params:
        torch.testing.assert_close(got[k], params[k].detach(), atol=1e-6, rtol=0)
    calls = []

    class Recorder:
        def __init__(self, total):
            calls.append(("total", total))

        def __enter__(self):
            return lambda loss: calls.append(loss is not None)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(sft, "_progress", Recorder)
    tiny = small_world(
        tmp_path, policy={"n_layer": 1, "d_model": 8, "n_head": 1}, sft_cfg={"steps": 52, "batch_size": 1}
    )
    sft.train(tiny)
    assert calls[0] == ("total", 52) and [i for i, shown in enumerate(calls[1:]) if shown] == [0, 50]
    assert len(calls) == 53


def test_the_task_must_bring_vocabulary_and_eos_and_the_rollout_a_length(tmp_path):
    """A task without a vocabulary, or with one but no EOS, is a one-line UserError (not an
    AttributeError later); so is a rollout.seq_len below 1."""
    from types import SimpleNamespace

    for task in (SimpleNamespace(name="bare"), SimpleNamespace(name="no-eos", vocab_size=8)):
        with pytest.raises(
            UserError,
            match=f"policy=transformer needs a task with its own vocabulary, prompts and EOS "
            f"\\(e.g. task=sort\\); task='{task.name}' has none",
        ):
            make_world({"name": "transformer", "sft": {"steps": 0}}, SMALL_ROLLOUT, task)
    task = make_task(SMALL_TASK, SMALL_ROLLOUT)
    with pytest.raises(UserError, match=r"^rollout.seq_len must be >= 1, got 0$"):
        make_world({"name": "transformer", "sft": {"steps": 0}}, {"seq_len": 0}, task)
    one = SimpleNamespace(name="one-token", vocab_size=4, eos=3, prompt_len=1, response_len=1)  # answers in 1 token
    assert make_world({"name": "transformer", "sft": {"steps": 0}}, {"seq_len": 1}, one).seq_len == 1
    with pytest.raises(
        UserError,
        match=r"policy.sft.steps > 0 needs a task with a teacher \(e.g. task=sort\); "
        r"task='one-token' has none \(set policy.sft.steps=0\)",
    ):
        make_world({"name": "transformer", "sft": {"steps": 1}}, {"seq_len": 1}, one)


def test_the_engine_and_the_trainer_run_on_the_params_device(tmp_path):
    """PyTorch's meta device (shapes and devices, no data) stands in for a GPU: with the parameters there
    and the prompts and tokens on the CPU, the sampler (and its KV cache) and the teacher-forced logits run
    there and answer there. (Dense: the experts' routing needs data.)"""
    world = small_world(tmp_path, sft_cfg={"steps": 0}, policy={"n_layer": 1, "d_model": 16, "n_head": 2})
    params = {k: v.to("meta") for k, v in world.init_params(torch.Generator().manual_seed(0)).items()}
    prompts = world.sample_prompts(4, torch.Generator().manual_seed(1))
    tokens = torch.zeros(4, world.seq_len, dtype=torch.long)
    for precision in (FP32, Precision("bf16")):
        sampler = world.sampler(params, prompts, precision)
        assert sampler.start().device.type == "meta" and sampler.step(tokens[:, 0]).device.type == "meta"
        assert sampler.cache.k.device.type == "meta"
        assert world.logits(params, prompts, tokens, precision).device.type == "meta"


def test_the_engine_rounding_golden_values():
    """fp8 serving: Linear weights go through Precision.weights (0.3 in a tensor of amax 1 → 0.28515625),
    the embeddings, norms and biases only to the compute dtype (bf16: 0.3 → 0.30078125); every float32
    storage, detached; fp32 hands back the params themselves. _Round: an op's output to bf16 (1/3 →
    0.333984375); a Linear's input through the per-token fp8 activations (0.3 → 0.28515625), the router's
    (quantized=False) only to bf16; the output rounded once."""
    from runner.worlds.transformer.model import _Round, engine_weights

    w = torch.tensor([[1.0, 0.3], [0.5, -0.3]], requires_grad=True)
    params = {"h0.attn.w_qkv": w, "wte": w, "h0.ln1.b": w}
    fp8 = engine_weights(params, Precision("fp8"))
    assert fp8["h0.attn.w_qkv"].tolist() == [[1.0, 0.28515625], [0.5, -0.28515625]]
    assert fp8["wte"].tolist() == fp8["h0.ln1.b"].tolist() == [[1.0, 0.30078125], [0.5, -0.30078125]]
    assert all(t.dtype == torch.float32 and not t.requires_grad for t in fp8.values())
    assert engine_weights(params, FP32) is params
    rnd = _Round(Precision("fp8"))
    assert rnd(torch.tensor([1 / 3])).tolist() == [0.333984375] and rnd(torch.tensor([1 / 3])).dtype == torch.float32
    x = torch.tensor([[1.0, 0.3]])
    assert rnd.act(x).tolist() == [[1.0, 0.28515625]] and rnd.act(x).dtype == torch.float32
    assert rnd.linear(x, torch.eye(2)).tolist() == [[1.0, 0.28515625]]
    assert rnd.linear(x, torch.eye(2), quantized=False).tolist() == [[1.0, 0.30078125]]
    assert rnd.linear(x, torch.eye(2), torch.tensor([0.0, 1 / 3])).tolist() == [[1.0, 0.6171875]]  # 0.6185 → bf16
    exact = _Round(FP32)
    assert exact(torch.tensor([1 / 3])).item() == torch.tensor(1 / 3).item()


@pytest.mark.parametrize("experts", [0, 4])
def test_the_engine_rounds_the_residual_stream_after_every_add(one_thread, tmp_path, monkeypatch, experts):
    """The model docstring's rule, pinned where it bites: the residual stream and every add are
    rounded to the compute dtype after each op. Every LayerNorm sees the residual stream (the
    embedding sum, then the stream after each attention and MLP add), so in a bf16, fp16 or fp8
    pass, teacher-forced and cached alike, every LayerNorm input must be exactly representable in
    the compute dtype. An add left unrounded (bf16 + bf16 is rarely a bf16) breaks it, which the
    precision-ratio tests above do not see. The control: the same inputs in fp32 are not
    representable in bf16, so the check can fail."""
    from runner.worlds.transformer import model

    world = small_world(tmp_path, sft_cfg={"steps": 0}, policy={"experts": experts, "init_std": 0.5, "n_layer": 2})
    g = torch.Generator().manual_seed(3)
    params = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in world.init_params(g).items()}
    prompts = world.sample_prompts(4, g)
    tokens = torch.randint(world.vocab_size, (4, world.seq_len), generator=g)
    seen: list[torch.Tensor] = []
    layer_norm = model._Round.layer_norm

    def recording(self, x, w, b):
        seen.append(x.detach().clone())
        return layer_norm(self, x, w, b)

    monkeypatch.setattr(model._Round, "layer_norm", recording)
    per_pass = 2 * world.shape.n_layer + 1  # ln1 and ln2 of each block, then ln_f

    def not_representable(x: torch.Tensor, dtype: torch.dtype) -> int:
        return int((x != x.to(dtype).float()).sum())

    for name in ("bf16", "fp16", "fp8"):
        precision = Precision(name)
        for route in ("teacher-forced", "cached"):
            seen.clear()
            if route == "teacher-forced":
                world.logits(params, prompts, tokens, precision)
                assert len(seen) == per_pass
            else:
                _sampled_logits(world, params, prompts, tokens, precision)
                assert len(seen) == per_pass * world.seq_len  # the prefill, then one step per token
            bad = [(i % per_pass, not_representable(x, precision.compute)) for i, x in enumerate(seen)]
            assert all(n == 0 for _, n in bad), (name, route, [b for b in bad if b[1]])
    seen.clear()
    world.logits(params, prompts, tokens, FP32)
    assert all(not_representable(x, torch.bfloat16) > x.numel() // 2 for x in seen)
