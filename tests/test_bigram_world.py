"""The bigram world (the exact unit-test world): exact J and ∇J against Monte Carlo, the engine's
staleness and precision, and the config checks. Every test asserts numbers a stub could not produce."""

from __future__ import annotations

import math

import pytest
import torch

from runner.errors import UserError
from runner.tasks import make_task
from runner.training.advantages import grpo_advantages
from runner.worlds.bigram.world import BigramWorld
from runner.worlds.engine import Engine, Mismatch, ParamHistory
from runner.worlds.precision import Precision
from runner.worlds.protocol import exact_gradient

COUNT = {"name": "target-count", "targets": [0, 1, 2, 3]}
THRESHOLD = {"name": "target-threshold", "targets": [0, 1, 2, 3], "min_count": 6}
# A small, non-uniform world (random θ, a 2-token prompt) so nothing is true by symmetry.
WORLDS = [
    pytest.param(COUNT, None, id="target-count"),
    pytest.param(COUNT, 5, id="target-count-eos"),
    pytest.param(THRESHOLD, None, id="target-threshold"),
    pytest.param(THRESHOLD, 5, id="target-threshold-eos"),
]
N_MC = 200_000


pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: see conftest.py


def Bigram(task_cfg=COUNT, **kw) -> BigramWorld:
    """A bigram world of the given shape, with its task (the task decides the exact solver)."""
    world = BigramWorld(**kw)
    world.task = make_task(task_cfg, {"vocab_size": world.vocab_size, "seq_len": world.seq_len})
    return world


def _world(eos=None, task_cfg=COUNT, **kw) -> BigramWorld:
    return Bigram(task_cfg, **{"vocab_size": 8, "seq_len": 8, "prompt_len": 2, "eos_token": eos, "init_std": 1.0, **kw})


def _lp(theta: torch.Tensor, ro) -> torch.Tensor:
    """The trainer's log π_θ(y_t | y_{t−1}) of a rollout, written out: a row of log_softmax(θ) per state."""
    prev = BigramWorld.states(ro.prompts, ro.tokens)
    return torch.log_softmax(theta, -1)[prev, ro.tokens]


def _on_policy(world: BigramWorld, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    params = world.init_params(g)
    ro = Engine(world, Mismatch()).sample(params, world.sample_prompts(n, g), g)
    return params, world.task, ro


def _table(engine: Engine, theta: torch.Tensor) -> torch.Tensor:
    """The engine's processed [V+1, V] log-prob table: what it samples from in each state."""
    return engine.process(engine.precision.cast(theta))


@pytest.mark.parametrize("task_cfg,eos", WORLDS)
def test_exact_objective_and_gradient_match_monte_carlo(task_cfg, eos):
    """On 200k on-policy samples of a random θ:
    - J from the recursion is within 5 standard errors of the mean reward;
    - ∇J from the recursion against the REINFORCE estimate mean((R − J)·Σ_t ∇log π): relative
      error < 0.1 and cosine > 0.99 (observed: 0.013–0.04 and > 0.999)."""
    world = _world(eos, task_cfg)
    params, task, ro = _on_policy(world, N_MC)
    theta = params["theta"]
    rewards = task.reward(ro.prompts, ro.tokens, ro.mask).double()
    J, grads = exact_gradient(world.exact, params)
    grad = grads["theta"]
    se = float(rewards.std()) / math.sqrt(N_MC)
    assert 0.01 < float(J) < 0.99  # a non-degenerate world
    assert abs(float(rewards.mean()) - float(J)) < 5 * se

    th = theta.double().requires_grad_(True)
    lp = _lp(th, ro)
    ((rewards - J).unsqueeze(-1) * lp * ro.mask).sum(-1).mean().backward()
    est = th.grad
    rel = float((est - grad).norm() / grad.norm())
    cos = float(torch.nn.functional.cosine_similarity(est.flatten(), grad.flatten(), dim=0))
    assert float(grad.norm()) > 1e-2
    assert rel < 0.1, rel
    assert cos > 0.99, cos


def test_exact_objective_closed_form_uniform():
    """Uniform policy, no EOS: J = |targets| / V for target-count, and a binomial tail for
    target-threshold."""
    params = {"theta": torch.zeros(17, 16, dtype=torch.float64)}
    assert float(Bigram(COUNT, vocab_size=16, seq_len=16).exact.objective(params)) == pytest.approx(0.25, abs=1e-12)
    tail = sum(math.comb(16, k) * 0.25**k * 0.75 ** (16 - k) for k in range(6, 17))
    assert float(Bigram(THRESHOLD, vocab_size=16, seq_len=16).exact.objective(params)) == pytest.approx(tail, abs=1e-12)


def test_score_gradient_matches_autograd():
    """The closed-form Σ w ∇log π (the probe's vectorised core) equals autograd, batched over K."""
    world = _world(5)
    params, _, ro = _on_policy(world, 512)
    theta = params["theta"]
    weights = torch.randn(3, *ro.mask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights = weights * ro.mask
    closed = world.score_sums({"theta": theta.double()}, ro.prompts, ro.tokens, weights)
    for k in range(3):
        th = theta.double().requires_grad_(True)
        (weights[k] * _lp(th, ro)).sum().backward()
        torch.testing.assert_close(closed[k], th.grad.flatten(), atol=1e-10, rtol=1e-10)
    # fp32 θ (the trainer's), float64 weights (the probe's): the softmax runs in the weights' dtype
    from_fp32 = world.score_sums({"theta": theta.float()}, ro.prompts, ro.tokens, weights)
    assert from_fp32.dtype == torch.float64
    torch.testing.assert_close(
        from_fp32,
        world.score_sums({"theta": theta.float().double()}, ro.prompts, ro.tokens, weights),
        atol=1e-13,
        rtol=0,
    )


def test_the_fp32_table_is_theta_itself_and_entropy_is_optional():
    """At fp32 (no mismatch) the world's logits are θ's own rows: differentiable and in θ's dtype, not
    a detached fp32 copy. token_stats leaves the entropy out (None) when it is not asked for."""
    world = _world(5)
    params, _, ro = _on_policy(world, 16)
    theta = params["theta"].double().requires_grad_(True)
    logits = world.logits({"theta": theta}, ro.prompts, ro.tokens)
    assert logits.dtype == torch.float64 and logits.requires_grad
    prev = BigramWorld.states(ro.prompts, ro.tokens)
    assert torch.equal(logits.detach(), theta.detach()[prev])
    assert world.token_stats(params, ro.prompts, ro.tokens, entropy=False).entropy is None
    with_entropy = world.token_stats(params, ro.prompts, ro.tokens).entropy
    table = torch.log_softmax(params["theta"], -1)
    torch.testing.assert_close(with_entropy, -(table.exp() * table).sum(-1)[prev])


def test_synchronous_fp32_engine_reports_old_exactly_and_stale_one_does_not():
    world = Bigram(vocab_size=16, seq_len=16, init_std=1.0)
    g = torch.Generator().manual_seed(0)
    theta0 = world.init_params(g)["theta"]
    theta1 = theta0 + 0.3 * torch.randn(theta0.shape, generator=g)
    prompts = world.sample_prompts(64, g)

    sync = Engine(
        world,
        Mismatch.from_config(
            {
                "staleness": 0,
                "precision": "fp32",
                "logit_noise": 0.0,
                "temperature": 1.0,
                "top_p": 1.0,
                "outlier_rate": 0.0,
                "outlier_shift": -1000.0,
            }
        ),
    )
    assert sync.mismatch.exact
    history = ParamHistory(0)
    history.push({"theta": theta1})
    ro = sync.sample(history.engine_params(), prompts, g)
    old = world.token_stats({"theta": theta1}, ro.prompts, ro.tokens).logp
    assert torch.equal(ro.roll, old)
    assert torch.equal(old, _lp(theta1, ro))

    stale = ParamHistory(1)
    stale.push({"theta": theta0})
    stale.push({"theta": theta1})  # step 1 with k = 1 samples from θ₀
    assert torch.equal(stale.engine_params()["theta"], theta0)
    ro = Engine(world, Mismatch(staleness=1)).sample(stale.engine_params(), prompts, g)
    old = _lp(theta1, ro)
    assert float((ro.roll - old).abs().max()) > 0.05

    ring = ParamHistory(2)
    for i in range(5):
        ring.push({"a": torch.full((2,), float(i)), "b": torch.full((1,), -float(i))})
        assert float(ring.engine_params()["a"][0]) == max(0, i - 2)  # θ_{t−k}, θ₀ while t < k
        assert float(ring.engine_params()["b"][0]) == -max(0, i - 2)


def test_precision_mismatch_is_plausible_and_ordered():
    """Engine log-probs against the trainer's fp32: bf16 differs by more than 1e-4 and less than
    0.1 nats; fp16 (10 mantissa bits) is closer than bf16 (7); fp8 is the furthest."""
    world = Bigram(vocab_size=16, seq_len=16, init_std=1.0)
    g = torch.Generator().manual_seed(0)
    params = world.init_params(g)
    ro = Engine(world, Mismatch()).sample(params, world.sample_prompts(256, g), g)
    old = _lp(params["theta"], ro)
    err = {
        p: float((Engine(world, Mismatch(precision=p)).score(params, ro.prompts, ro.tokens) - old).abs().max())
        for p in ("fp32", "bf16", "fp16", "fp8")
    }
    assert err["fp32"] == 0.0
    assert 1e-4 < err["bf16"] < 0.1, err
    assert 0 < err["fp16"] < err["bf16"] < err["fp8"], err


def test_engine_processing_noise_temperature_top_p_outliers():
    world = Bigram(vocab_size=16, seq_len=16, init_std=1.0)
    g = torch.Generator().manual_seed(0)
    params = world.init_params(g)
    theta = params["theta"]
    prompts = world.sample_prompts(512, g)

    # top_p: the engine samples only inside the nucleus and reports the renormalised log-probs.
    eng = Engine(world, Mismatch(top_p=0.5))
    table = _table(eng, theta)
    kept = torch.isfinite(table)
    assert torch.all(kept.sum(-1) < 16) and torch.all(kept.sum(-1) >= 1)
    torch.testing.assert_close(torch.logsumexp(table, -1), torch.zeros(17), atol=1e-5, rtol=0)
    ro = eng.sample(params, prompts, g)
    prev = BigramWorld.states(ro.prompts, ro.tokens)
    assert torch.isfinite(ro.roll).all()
    assert kept[prev, ro.tokens].all()
    assert float((ro.roll - _lp(theta, ro)).min()) > 0  # renormalised: larger

    # temperature < 1 sharpens: the engine's reported log-probs of likely tokens rise.
    cold = _table(Engine(world, Mismatch(temperature=0.5)), theta)
    torch.testing.assert_close(cold, torch.log_softmax(theta / 0.5, -1))

    # logit noise: the reported log-probs move by about σ.
    ro_noisy = Engine(world, Mismatch(logit_noise=0.1)).sample(params, prompts, g)
    diff = (ro_noisy.roll - _lp(theta, ro_noisy)).abs()
    assert 0.01 < float(diff.mean()) < 0.3

    # outliers: about p of the tokens reported Δ lower, the sampled tokens unaffected.
    ro_out = Engine(world, Mismatch(outlier_rate=0.05, outlier_shift=-1000.0)).sample(params, prompts, g)
    shift = ro_out.roll - _lp(theta, ro_out)
    assert torch.equal(shift < -900, ro_out.outliers)
    assert 0.03 < float(ro_out.outliers.float().mean()) < 0.07


def test_eos_gives_padding_and_mask():
    world = Bigram(vocab_size=4, seq_len=12, eos_token=0)
    g = torch.Generator().manual_seed(0)
    ro = Engine(world, Mismatch()).sample(world.init_params(g), world.sample_prompts(256, g), g)
    lengths = ro.mask.sum(-1)
    assert 1 <= float(lengths.min()) < float(lengths.max()) == 12
    for i in range(256):
        n = int(lengths[i])
        assert torch.all(ro.mask[i, :n] == 1) and torch.all(ro.mask[i, n:] == 0)
        assert (ro.tokens[i, : n - 1] != 0).all()  # the first EOS ends the response...
        if n < 12:
            assert ro.tokens[i, n - 1] == 0  # ...and is itself a generated token
        assert torch.all(ro.roll[i, n:] == 0)


def test_grpo_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    adv = grpo_advantages(rewards, group_size=4)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]))
    normed = grpo_advantages(rewards, group_size=4, std_norm=True)
    torch.testing.assert_close(normed[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6))
    assert torch.equal(normed[4:], torch.zeros(4))  # a uniform group: no signal, not 0/0


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"staleness": -1}, "staleness"),
        ({"precision": "fp4"}, "precision"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": 0.0}, "temperature"),
        ({"logit_noise": -0.1}, "logit_noise"),
        ({"outlier_rate": 2.0}, "outlier_rate"),
        ({"outlier_rate": -0.1}, "outlier_rate"),
        ({"outlier_shift": float("nan")}, "outlier_shift"),
        ({"router_replay": "yes"}, "router_replay"),
        ({"logprobs": "fp16"}, "logprobs"),
        ({"staleness": 1.5}, "staleness"),
        ({"stalenes": 1}, "unknown key"),
    ],
)
def test_mismatch_config_errors(cfg, match):
    base = {
        "staleness": 0,
        "precision": "fp32",
        "logit_noise": 0.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "outlier_rate": 0.0,
        "outlier_shift": -1000.0,
    }
    with pytest.raises(UserError, match=match) as err:
        Mismatch.from_config({**base, **cfg})
    # the message names its section: mismatch.KEY for a bad value, mismatch for an unknown key
    assert str(err.value).startswith("mismatch" + ("" if match == "unknown key" else f".{match}")), str(err.value)


def test_mismatch_config_edges_are_accepted_and_read_field_by_field():
    """Each field from its own key, at the edges of its range: staleness 0, σ 0, top_p 1, outlier_rate 0
    and 1, an infinite outlier shift, a small temperature; logprobs and router_replay default to
    compute and false when absent. Just past each open edge is rejected (top_p 0, temperature 0)."""
    cfg = {
        "staleness": 3,
        "precision": "fp16",
        "logit_noise": 0.25,
        "temperature": 0.01,
        "top_p": 1.0,
        "outlier_rate": 1.0,
        "outlier_shift": -math.inf,
    }
    m = Mismatch.from_config(cfg)
    assert m == Mismatch(
        staleness=3,
        precision="fp16",
        logit_noise=0.25,
        temperature=0.01,
        top_p=1.0,
        outlier_rate=1.0,
        outlier_shift=-math.inf,
        router_replay=False,
        logprobs="compute",
    )
    edges = {
        **cfg,
        "staleness": 0,
        "logit_noise": 0.0,
        "top_p": 0.001,
        "outlier_rate": 0.0,
        "outlier_shift": 5.0,
        "router_replay": True,
        "logprobs": "fp32",
    }
    assert Mismatch.from_config(edges) == Mismatch(
        staleness=0,
        precision="fp16",
        logit_noise=0.0,
        temperature=0.01,
        top_p=0.001,
        outlier_rate=0.0,
        outlier_shift=5.0,
        router_replay=True,
        logprobs="fp32",
    )
    assert Mismatch.from_config(edges).compute_precision == Precision("fp16", router_fp32=True)
    for key, value in (("top_p", 0.0), ("temperature", 0.0), ("outlier_shift", math.nan), ("logprobs", "fp16")):
        with pytest.raises(UserError, match=key):
            Mismatch.from_config({**cfg, key: value})


@pytest.mark.parametrize(
    "rollout,task,match",
    [
        ({"seq_len": 0}, COUNT, "seq_len"),
        ({"vocab_size": 1}, COUNT, "vocab_size"),
        ({"eos_token": 16}, COUNT, "eos_token"),
        ({"prompt_len": 0}, COUNT, "prompt_len"),
        ({}, {"name": "target-count", "targets": [16]}, "targets"),
        ({}, {"name": "target-count", "targets": []}, "targets"),
        ({}, {"name": "nope"}, "task.name"),
        ({}, {**THRESHOLD, "min_count": 17}, "min_count"),
    ],
)
def test_world_config_errors(rollout, task, match):
    rollout = {"vocab_size": 16, "seq_len": 16, "prompt_len": 1, "eos_token": None, **rollout}
    with pytest.raises(UserError, match=match):
        BigramWorld.from_config({"name": "bigram", "init_std": 0.0}, rollout, make_task(task, rollout))


GOOD_ROLLOUT = {"vocab_size": 16, "seq_len": 16, "prompt_len": 1, "eos_token": None}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"vocab_size": 1}, "rollout.vocab_size must be >= 2, got 1"),
        ({"seq_len": 0}, "rollout.seq_len must be >= 1, got 0"),
        ({"prompt_len": 0}, "rollout.prompt_len must be >= 1, got 0"),
        ({"eos_token": -1}, "rollout.eos_token must be >= 0, got -1"),
        ({"eos_token": 16}, "rollout.eos_token must be a token id in [0, 15] or null, got 16"),
    ],
)
def test_the_world_checks_its_own_rollout_keys_with_their_section_and_bound(change, message):
    """The world's own checks, reached with a task built from a valid rollout (make_task checks some of
    the same keys first, which hid these): the whole message, section and bound included."""
    task = make_task(COUNT, GOOD_ROLLOUT)
    with pytest.raises(UserError) as err:
        BigramWorld.from_config({"name": "bigram", "init_std": 0.0}, {**GOOD_ROLLOUT, **change}, task)
    assert str(err.value) == message


def test_the_world_reads_its_policy_section_and_accepts_the_smallest_shape():
    task = make_task(COUNT, GOOD_ROLLOUT)
    assert BigramWorld.from_config({"init_std": 0.5}, GOOD_ROLLOUT, task).init_std == 0.5
    assert BigramWorld.from_config(None, GOOD_ROLLOUT, task).init_std == 0.0  # no policy section: uniform θ₀
    with pytest.raises(UserError) as err:
        BigramWorld.from_config({"init_sd": 1.0}, GOOD_ROLLOUT, task)
    assert str(err.value) == (
        "policy: unknown key(s) init_sd (did you mean policy.init_std?); valid: description, init_std, name"
    )
    smallest = {"vocab_size": 2, "seq_len": 1, "prompt_len": 1, "eos_token": 0}
    world = BigramWorld.from_config({}, smallest, make_task({"name": "target-count", "targets": [1]}, smallest))
    assert (world.vocab_size, world.seq_len, world.prompt_len, world.eos_token) == (2, 1, 1, 0)


def test_the_world_defaults_and_bounds_of_prompt_len_and_init_std():
    task = make_task(COUNT, GOOD_ROLLOUT)
    no_prompt_len = {k: v for k, v in GOOD_ROLLOUT.items() if k != "prompt_len"}
    assert BigramWorld.from_config({}, no_prompt_len, task).prompt_len == 1  # a BOS-only prompt
    with pytest.raises(UserError) as err:
        BigramWorld.from_config({"init_std": -1.0}, GOOD_ROLLOUT, task)
    assert str(err.value) == "policy.init_std must be >= 0, got -1"
    assert BigramWorld.from_config({"init_std": 0.0}, GOOD_ROLLOUT, task).init_std == 0.0


def test_a_uniform_start_draws_nothing_from_the_generator():
    """init_std=0 gives θ₀ = 0 without drawing: the seed's stream is left whole for the rollouts, so
    a run at init_std=0 samples exactly what it would have with no initialisation step at all."""
    world = _world(init_std=0.0)
    g = torch.Generator().manual_seed(5)
    before = g.get_state().clone()
    theta = world.init_params(g)["theta"]
    assert torch.equal(g.get_state(), before)
    assert theta.shape == (9, 8) and torch.equal(theta, torch.zeros(9, 8)) and not theta.signbit().any()
    drawn = _world(init_std=0.5).init_params(torch.Generator().manual_seed(5))["theta"]
    torch.testing.assert_close(drawn, 0.5 * torch.randn(9, 8, generator=torch.Generator().manual_seed(5)))


def test_each_task_gets_its_exact_solver():
    """target-count is additive (a sum over tokens): the matrix-power solver, O(log T) products. A
    threshold needs the count's whole law: the forward recursion. Both give J; the first is the fast one."""
    from runner.worlds.bigram.exact import AdditiveObjective, CountLawObjective

    assert type(_world(task_cfg=COUNT).exact) is AdditiveObjective
    assert type(_world(task_cfg=THRESHOLD).exact) is CountLawObjective


@pytest.mark.parametrize("task_cfg", [COUNT, THRESHOLD], ids=["additive", "count-law"])
def test_the_maths_runs_on_the_params_device(task_cfg):
    """PyTorch's meta device (shapes and devices, no data) stands in for a GPU: with θ there, the
    logits (exact and cast), the token stats, the score sums and both exact solvers come out there
    too; a constant the world made on the CPU instead would be refused next to them."""
    world = _world(eos=5, task_cfg=task_cfg)
    params = {"theta": torch.zeros(world.num_states, 8, device="meta")}
    prompts = torch.full((4, 2), world.bos, device="meta")
    tokens = torch.zeros(4, 8, dtype=torch.long, device="meta")
    assert world.logits(params, prompts, tokens).device.type == "meta"
    assert world.logits(params, prompts, tokens, Precision("bf16")).device.type == "meta"
    stats = world.token_stats(params, prompts, tokens)
    assert stats.logp.device.type == "meta" and stats.entropy.device.type == "meta"
    weights = torch.zeros(2, 4, 8, dtype=torch.float64, device="meta")
    assert world.score_sums(params, prompts, tokens, weights).device.type == "meta"
    assert world.start_distribution(device="meta").device.type == "meta"
    assert world.exact.objective(params).device.type == "meta"


@pytest.mark.parametrize("task_cfg", [COUNT, THRESHOLD], ids=["additive", "count-law"])
def test_exact_objective_computes_in_the_asked_dtype_whatever_the_parameters_dtype(task_cfg):
    """fp32 θ, J asked in float64: softmax, start law and recursion all run in float64, so J equals
    J of the same θ already in float64 to float64 rounding (fp32 arithmetic anywhere would be off by
    ~1e-8). V=6 and a 2-token prompt make the start law 1/6, which fp32 cannot hold exactly."""
    rollout = {"vocab_size": 6, "seq_len": 5, "prompt_len": 2, "eos_token": None}
    task = make_task({**task_cfg, "targets": [0, 1], **({"min_count": 2} if "min_count" in task_cfg else {})}, rollout)
    world = BigramWorld.from_config({"init_std": 1.0}, rollout, task)
    theta32 = torch.randn(world.num_states, 6, generator=torch.Generator().manual_seed(3))
    j32 = world.exact.objective({"theta": theta32}, dtype=torch.float64)
    j64 = world.exact.objective({"theta": theta32.double()}, dtype=torch.float64)
    assert j32.dtype == torch.float64 and 0.05 < float(j64) < 0.95
    assert abs(float(j32) - float(j64)) < 1e-15
    for low in (torch.float16, torch.bfloat16):  # and in a low precision when asked: J stays in it
        j_low = world.exact.objective({"theta": theta32}, dtype=low)
        assert j_low.dtype == low and abs(float(j_low) - float(j64)) < 2e-3


@pytest.mark.parametrize("eos", [None, 2])
def test_the_count_law_is_a_probability_law_in_float64(eos):
    """With min_count=0 every response earns the reward, so J is the count law's total mass: 1 to
    float64 rounding, EOS or not (a start law of 1/6 held in fp32 would sum to 1 + 3e-8)."""
    rollout = {"vocab_size": 6, "seq_len": 5, "prompt_len": 2, "eos_token": eos}
    world = BigramWorld.from_config(
        {"init_std": 1.0}, rollout, make_task({**THRESHOLD, "targets": [0, 1], "min_count": 0}, rollout)
    )
    theta = torch.randn(world.num_states, 6, generator=torch.Generator().manual_seed(4))
    assert abs(float(world.exact.objective({"theta": theta})) - 1.0) < 1e-15


@pytest.mark.parametrize("eos,prompt_len", [(None, 1), (None, 3), (3, 1), (3, 3)])
def test_target_count_objective_matches_the_forward_recursion(eos, prompt_len):
    """The matrix-power objective equals Σ_t q_t[targets] / T of the plain forward recursion
    (q_t = d_t @ softmax(θ), d_{t+1} = q_t without EOS, BOS never re-entered), to float64 rounding."""
    rollout = {
        "vocab_size": 8,
        "seq_len": 6,
        "batch_size": 2,
        "group_size": 2,
        "prompt_len": prompt_len,
        "eos_token": eos,
        "adv_std_norm": False,
    }
    task = make_task({"name": "target-count", "targets": [0, 1, 5]}, rollout)
    world = BigramWorld.from_config({"name": "bigram", "init_std": 1.0}, rollout, task)
    theta = torch.randn(world.num_states, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(theta, -1)
    d, reference = world.start_distribution(), 0.0
    for _ in range(world.seq_len):
        q = d @ probs
        reference = reference + q[[0, 1, 5]].sum() / world.seq_len
        alive = q if eos is None else q.index_fill(0, torch.tensor([eos]), 0.0)
        d = torch.cat([alive, alive.new_zeros(1)])
    assert float(world.exact.objective({"theta": theta})) == pytest.approx(float(reference), abs=1e-14)


def test_fp32_logprobs_take_the_log_softmax_of_the_rounded_logits_in_fp32():
    """mismatch.logprobs=fp32 (vLLM's and SGLang's way): the engine upcasts its bf16 logits before the
    log-softmax, so its report is exactly log_softmax(bf16(θ).float()); the compute-dtype log-softmax
    adds its own rounding on top (a 2⁻⁶-spaced grid near log(1/16)), several times the logits' alone."""
    world = Bigram(vocab_size=16, seq_len=8, init_std=1.0)
    g = torch.Generator().manual_seed(0)
    params = world.init_params(g)
    ro = Engine(world, Mismatch()).sample(params, world.sample_prompts(256, g), g)
    theta = params["theta"]
    upcast = Engine(world, Mismatch(precision="bf16", logprobs="fp32")).score(params, ro.prompts, ro.tokens)
    prev = BigramWorld.states(ro.prompts, ro.tokens)
    expected = torch.log_softmax(theta.to(torch.bfloat16).float(), -1)[prev, ro.tokens]
    assert torch.equal(upcast, expected)
    old = _lp(theta, ro)
    in_compute = Engine(world, Mismatch(precision="bf16")).score(params, ro.prompts, ro.tokens)
    err_upcast, err_compute = float((upcast - old).abs().mean()), float((in_compute - old).abs().mean())
    assert 0 < err_upcast < err_compute / 2, (err_upcast, err_compute)
