"""Every world is held to the protocol (runner/worlds/protocol.py) by the same tests.

A world joins WORLD_CONFIGS with a small config; a registered world without one fails the first test.
For each world:
- the sampler, fed a response token by token, gives the teacher-forced `logits` (fp32: to 1e-5);
- `token_stats` is the log-softmax of the fp32 logits (the trainer's route may be faster, not different);
- at staleness 0 in fp32 with no noise the engine reports the trainer's log-probs;
- a low-precision engine differs from fp32, but by a plausible amount;
- where the world has an exact objective, J matches Monte Carlo and ∇J matches REINFORCE;
- where it has a closed-form score, it matches autograd.
"""

from __future__ import annotations

import math

import pytest
import torch

from runner.tasks import make_task
from runner.worlds.engine import Engine, Mismatch
from runner.worlds.precision import FP32, Precision
from runner.worlds.protocol import exact_gradient, flat, unflat
from runner.worlds.registry import WORLDS, make_world

pytestmark = pytest.mark.usefixtures("one_thread")

ROLLOUT = {"vocab_size": 8, "seq_len": 6, "prompt_len": 2, "eos_token": None, "batch_size": 4, "group_size": 4}
WORLD_CONFIGS = {
    "bigram": (
        {"name": "bigram", "init_std": 1.0},
        {**ROLLOUT, "eos_token": 5},
        {"name": "target-threshold", "targets": [0, 1, 2], "min_count": 2},
    ),
    "mlp": (
        {"name": "mlp", "layers": 2, "hidden": 16, "experts": 2, "init_std": 0.5},
        {**ROLLOUT, "eos_token": 5},
        {"name": "count-exact", "targets": [0, 1], "k": 2},
    ),
    "transformer": (
        {
            "name": "transformer",
            "n_layer": 1,
            "n_head": 2,
            "d_model": 16,
            "experts": 2,
            "init_std": 0.5,
            "sft": {"steps": 0},
        },
        ROLLOUT,
        {"name": "sort", "values": 6},
    ),
}


def build(name: str):
    policy, rollout, task_cfg = WORLD_CONFIGS[name]
    task = make_task(task_cfg, rollout)
    world = make_world(policy, rollout, task)
    g = torch.Generator().manual_seed(3)
    return world, task, world.init_params(g), g


def test_every_registered_world_is_tested():
    assert sorted(WORLD_CONFIGS) == WORLDS.names()


@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_prompts_come_from_the_generator_alone(name):
    """The same generator seed gives the same prompts whatever the global RNG holds, another seed
    others. bigram and mlp (prompt_len 2 here): BOS, then a token uniform over the V ids: 4000
    draws put 500 on each of the 8, sd √(4000·(1/8)·(7/8)) = 20.9; each count within 5 sd."""
    world = build(name)[0]
    torch.manual_seed(0)
    a = world.sample_prompts(4000, torch.Generator().manual_seed(5))
    torch.manual_seed(1)
    b = world.sample_prompts(4000, torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    c = world.sample_prompts(4000, torch.Generator().manual_seed(6))
    assert a.dtype == torch.long and a.shape == (4000, world.prompt_len)
    assert torch.equal(a, b) and not torch.equal(a, c)
    if name in ("bigram", "mlp"):
        V = world.vocab_size
        assert world.prompt_len == 2 and V == 8
        assert bool((a[:, 0] == V).all())
        counts = torch.bincount(a[:, 1], minlength=V + 1)
        assert int(counts[V]) == 0 and int(counts.sum()) == 4000
        assert float((counts[:V] - 500).abs().max()) < 5 * 20.9


@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_sampler_gives_the_teacher_forced_logits(name):
    world, _, params, g = build(name)
    prompts = world.sample_prompts(16, g)
    ro = Engine(world, Mismatch()).sample(params, prompts, g)
    for precision in (FP32, Precision("bf16")):
        forced = world.logits(params, prompts, ro.tokens, precision)  # [N, T, V]
        sampler = world.sampler(params, prompts, precision)
        stepped = [sampler.start()]
        for t in range(world.seq_len - 1):
            stepped.append(sampler.step(ro.tokens[:, t]))
        stepped = torch.stack(stepped, 1)
        assert stepped.shape == forced.shape == (16, world.seq_len, world.vocab_size)
        assert stepped.dtype == forced.dtype == precision.compute
        tol = 1e-5 if precision.exact else 0.05  # low precision: cached and full passes may round apart
        torch.testing.assert_close(stepped.float(), forced.float(), atol=tol, rtol=0)


@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_token_stats_are_the_log_softmax_of_the_fp32_logits(name):
    world, _, params, g = build(name)
    prompts = world.sample_prompts(16, g)
    ro = Engine(world, Mismatch()).sample(params, prompts, g)
    stats = world.token_stats(params, prompts, ro.tokens)
    logp_all = torch.log_softmax(world.logits(params, prompts, ro.tokens).float(), -1)
    torch.testing.assert_close(stats.logp, logp_all.gather(-1, ro.tokens.unsqueeze(-1)).squeeze(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(stats.entropy, -(logp_all.exp() * logp_all).sum(-1), atol=1e-5, rtol=0)
    assert float(stats.entropy.min()) > 0 and float(stats.entropy.max()) <= math.log(world.vocab_size) + 1e-5
    # and the log-probs carry the gradient to every parameter tensor
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    (world.token_stats(leaves, prompts, ro.tokens, entropy=False).logp * ro.mask).sum().backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in leaves.values())
    back = unflat(flat(params), params)
    assert list(back) == list(params) and all(torch.equal(back[k], params[k]) for k in params)


@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_on_policy_fp32_engine_reports_old_and_bf16_differs_plausibly(name):
    world, _, params, g = build(name)
    prompts = world.sample_prompts(64, g)
    ro = Engine(world, Mismatch()).sample(params, prompts, g)
    old = world.token_stats(params, prompts, ro.tokens, entropy=False).logp
    inside = ro.mask > 0
    assert float((ro.roll - old)[inside].abs().max()) <= 1e-5
    # the router in fp32 (routing replay), so a mixture of experts' flipped routes do not hide the arithmetic
    bf16 = Engine(world, Mismatch(precision="bf16", router_replay=True)).score(params, prompts, ro.tokens)
    err = (bf16 - old)[inside].abs()
    assert 1e-4 < float(err.max()) < 0.5, float(err.max())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_exact_objective_matches_monte_carlo(name):
    """J within 4 standard errors of the mean reward of 100k on-policy samples; ∇J against the
    REINFORCE estimate mean((R − J)·Σ_t ∇log π): cosine > 0.99."""
    world, task, params, g = build(name)
    if world.exact is None:
        pytest.skip(f"{name} has no exact objective")
    n = 100_000
    ro = Engine(world, Mismatch()).sample(params, world.sample_prompts(n, g), g)
    rewards = task.reward(ro.prompts, ro.tokens, ro.mask).double()
    J, grads = exact_gradient(world.exact, params)
    se = float(rewards.std()) / math.sqrt(n)
    assert 0.01 < float(J) < 0.99
    assert abs(float(rewards.mean()) - float(J)) < 4 * se
    leaves = {k: v.double().requires_grad_(True) for k, v in params.items()}
    lp = world.token_stats(leaves, ro.prompts, ro.tokens, entropy=False).logp
    ((rewards - J).unsqueeze(-1) * lp * ro.mask).sum(-1).mean().backward()
    est, exact = flat({k: p.grad for k, p in leaves.items()}), flat(grads)
    assert float(torch.nn.functional.cosine_similarity(est, exact, dim=0)) > 0.99


@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_closed_form_score_matches_autograd(name):
    world, _, params, g = build(name)
    prompts = world.sample_prompts(32, g)
    ro = Engine(world, Mismatch()).sample(params, prompts, g)
    weights = torch.randn(3, *ro.mask.shape, generator=g) * ro.mask
    closed = world.score_sums(params, prompts, ro.tokens, weights)
    if closed is None:
        pytest.skip(f"{name} has no closed-form score (the probe uses autograd)")
    from runner.probe.estimator import score_sums

    class NoClosedForm:  # the probe's general path: one batched vector-Jacobian product
        def __getattr__(self, attr):
            return getattr(world, attr)

        def score_sums(self, *args):
            return None

    batch = type("Batch", (), {"prompts": prompts, "tokens": ro.tokens})
    torch.testing.assert_close(closed, score_sums(NoClosedForm(), params, batch, weights), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(WORLD_CONFIGS))
def test_outliers_are_injected_on_generated_tokens_only(name):
    """outlier_rate = 1 shifts every generated token's reported log-prob by Δ and nothing else: the
    outliers are exactly the masked-in positions, padding still reports 0, and the sampled tokens
    are those of the same seed without outliers (the fault draws after the sampling)."""
    world, _, params, _ = build(name)
    assert world.eos_token is not None
    prompts = world.sample_prompts(64, torch.Generator().manual_seed(5))
    clean = Engine(world, Mismatch()).sample(params, prompts, torch.Generator().manual_seed(6))
    faulty = Engine(world, Mismatch(outlier_rate=1.0, outlier_shift=-7.0)).sample(
        params, prompts, torch.Generator().manual_seed(6)
    )
    padding = faulty.mask == 0
    assert padding.any() and (~padding).any()  # EOS made some padding, and not only padding
    assert torch.equal(faulty.tokens, clean.tokens) and torch.equal(faulty.mask, clean.mask)
    assert torch.equal(faulty.outliers, faulty.mask > 0)
    assert torch.equal(faulty.roll[padding], torch.zeros(int(padding.sum())))
    assert torch.equal(faulty.roll[~padding], clean.roll[~padding] - 7.0)


# ------------------------------------------------------------------------------ precision, by hand
def test_precision_rounding_golden_values():
    """What each precision makes of a few numbers, worked out by hand from the formats.
    fp8 (e4m3, 3 mantissa bits) weights, one scale amax/448 per tensor: 0.3 → 0.3·448 = 134.4, which
    e4m3 rounds to 128 (steps of 16 in [128, 256)), → 128/448 = 0.2857, then bfloat16 0.28515625.
    Activations: one scale per token, so a row that is 64× another (exact in binary) rounds to 64× it;
    a scale over the whole tensor would round the small row on a 64× coarser grid. cast: unscaled,
    0.3 → 0.3125 (steps of 1/32), 1/3 → 0.34375, 500 → 448 (e4m3's largest finite)."""
    fp8 = Precision("fp8")
    assert fp8.weights(torch.tensor([1.0, 0.5, 0.3, -0.3])).tolist() == [1.0, 0.5, 0.28515625, -0.28515625]
    assert fp8.weights(torch.zeros(3)).tolist() == [0.0, 0.0, 0.0]  # amax 0: scale 1, not 0/0
    act = fp8.activations(torch.tensor([[1.0, 0.3], [64.0, 19.2]]))
    assert act.dtype == torch.bfloat16 and act.tolist() == [[1.0, 0.28515625], [64.0, 18.25]]
    assert fp8.activations(torch.zeros(1, 2)).tolist() == [[0.0, 0.0]]
    # activations of [batch, token, feature]: still one scale per token (the last dim), not per feature
    assert fp8.activations(torch.tensor([[[1.0, 0.3], [64.0, 19.2]]])).tolist() == [[[1.0, 0.28515625], [64.0, 18.25]]]
    cast = fp8.cast(torch.tensor([0.3, 1 / 3, 500.0]))
    assert cast.dtype == torch.bfloat16 and cast.tolist() == [0.3125, 0.34375, 448.0]  # fp8 values, bf16 compute
    assert Precision("bf16").cast(torch.tensor([1 / 3])).tolist() == [0.333984375]  # 8 mantissa bits
    assert Precision("bf16").activations(torch.tensor([1 / 3])).tolist() == [0.333984375]
    assert Precision("fp16").weights(torch.tensor([1 / 3])).tolist() == [0.333251953125]  # 11 bits
    assert Precision("fp32").weights(torch.tensor([1 / 3])).item() == torch.tensor(1 / 3).item()
    assert [Precision(p).exact for p in ("fp32", "bf16", "fp16", "fp8")] == [True, False, False, False]
    with pytest.raises(ValueError, match="fp4"):
        Precision("fp4")


def test_engine_processing_golden_values():
    """Engine.process on p = [1/8, 1/8, 1/4, 1/2] (exact in binary). top_p = 0.75 drops the tokens whose
    ascending cumulative mass is ≤ 0.25, the boundary included: 1/8 and the second 1/8 (cumulative
    exactly 0.25) go, and [1/4, 1/2] renormalise to [1/3, 2/3]. top_p = 0.01 keeps the most likely token
    alone. Temperature 2 is the softmax of logits/2. Noise σ = 0.5 adds 0.5·z, z from the generator."""
    logits = torch.log(torch.tensor([0.125, 0.125, 0.25, 0.5]))
    inf = math.inf

    def process(generator=None, **mismatch):
        engine = Engine.__new__(Engine)  # process needs only the mismatch and the log-softmax dtype
        engine.mismatch, engine.dtype = Mismatch(**mismatch), torch.float32
        return engine.process(logits, generator).tolist()

    assert process(top_p=0.75) == [
        -inf,
        -inf,
        pytest.approx(math.log(1 / 3), abs=1e-6),
        pytest.approx(math.log(2 / 3), abs=1e-6),
    ]
    assert process(top_p=0.01) == [-inf, -inf, -inf, 0.0]
    assert process(temperature=2.0) == pytest.approx(torch.log_softmax(logits / 2, -1).tolist(), abs=1e-6)
    assert process(temperature=2.0)[3] == pytest.approx(
        math.log(math.sqrt(0.5) / (2 * math.sqrt(0.125) + 0.5 + math.sqrt(0.5))), abs=1e-6
    )
    z = torch.randn(4, generator=torch.Generator().manual_seed(0))
    assert process(torch.Generator().manual_seed(0), logit_noise=0.5) == pytest.approx(
        torch.log_softmax(logits + 0.5 * z, -1).tolist(), abs=1e-6
    )
    assert process(top_p=1.0, temperature=1.0) == pytest.approx(torch.log_softmax(logits, -1).tolist(), abs=0)
    # top_p = 1 drops nothing, not even a token whose probability underflows to 0 in float32 (e^−200)
    engine = Engine.__new__(Engine)
    engine.mismatch, engine.dtype = Mismatch(top_p=1.0), torch.float32
    assert engine.process(torch.tensor([0.0, -200.0])).tolist() == [0.0, -200.0]
    # the noise is added in the engine's dtype: a bf16 engine's log-probs stay bf16
    engine.mismatch, engine.dtype = Mismatch(logit_noise=0.5), torch.bfloat16
    assert engine.process(logits, torch.Generator().manual_seed(0)).dtype == torch.bfloat16
    # σ = 0 draws nothing: the generator's stream (which also samples the tokens) is left untouched
    g = torch.Generator().manual_seed(4)
    process(g, logit_noise=0.0)
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=torch.Generator().manual_seed(4)))
