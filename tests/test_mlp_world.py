"""policy=mlp: the sampler against teacher forcing, the exact J and ∇J against brute force and Monte
Carlo, precision and experts as the source of the mismatch, and the config checks. θ is either the
seeded initialisation or the result of a few steps of Adam ascent on the exact J (`ascend`): a θ
that training reaches, with sharpened logits."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from runner.errors import UserError
from runner.tasks import make_task
from runner.tasks.base import Task
from runner.worlds.mlp.world import MLPWorld
from runner.worlds.precision import FP32, Precision
from runner.worlds.protocol import exact_gradient, flat
from runner.worlds.registry import make_world

pytestmark = pytest.mark.usefixtures("one_thread")  # small tensors: see conftest.py

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")


def _world(seq_len=32, k=3, experts=0, eos=None, prompt_len=1, vocab=16, targets=(0,), **policy) -> MLPWorld:
    rollout = {"vocab_size": vocab, "seq_len": seq_len, "prompt_len": prompt_len, "eos_token": eos}
    task = make_task({"name": "count-exact", "targets": list(targets), "k": k}, rollout)
    return make_world({"name": "mlp", "experts": experts, **policy}, rollout, task)


def _init(world: MLPWorld, seed: int = 0):
    return world.init_params(torch.Generator().manual_seed(seed))


def _ascend(world: MLPWorld, params, steps: int, lr: float = 0.01):
    """`steps` of Adam ascent on the exact J (float64 gradient, fp32 parameters)."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.Adam(leaves.values(), lr=lr)
    for _ in range(steps):
        _, grad = exact_gradient(world.exact, leaves)
        for k, v in leaves.items():
            v.grad = -grad[k].float()
        opt.step()
    return {k: v.detach() for k, v in leaves.items()}


def _rollout(world: MLPWorld, params, n: int, precision: Precision, generator: torch.Generator):
    """n responses sampled as the engine samples them: the world's sampler in `precision`, the
    log-softmax in its compute dtype, a response ending after its first EOS. Returns (prompts,
    tokens [n, T], mask [n, T], the engine's fp32 log-probs of the sampled tokens [n, T])."""
    prompts = world.sample_prompts(n, generator)
    sampler = world.sampler(params, prompts, precision)
    tokens, logps = [], []
    logits = sampler.start()
    for t in range(world.seq_len):
        logp = torch.log_softmax(logits, dim=-1).float()  # [n, V]
        tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)  # [n]
        tokens.append(tok)
        logps.append(logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
        if t < world.seq_len - 1:
            logits = sampler.step(tok)
    tokens, logp = torch.stack(tokens, 1), torch.stack(logps, 1)
    mask = torch.ones(n, world.seq_len)
    if world.eos_token is not None:
        is_eos = (tokens == world.eos_token).long()
        mask = ((is_eos.cumsum(-1) - is_eos) == 0).float()
    return prompts, tokens, mask, logp


# --------------------------------------------------------------------- the forward pass, twice
@pytest.mark.parametrize("experts", [0, 4])
@pytest.mark.parametrize("replay", [False, True], ids=["own-router", "router-replay"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_sampler_logits_equal_teacher_forced_logits_bit_for_bit(precision, replay, experts):
    """The sampler's [N, V] logits at every position are the teacher-forced logits of the tokens it
    produced, exactly, in every precision: the same arithmetic row by row. (fp32 holds on one thread;
    with two, MKL splits a GEMM's rows by batch size and fp32 agrees to ~2e-7. The router is a
    product-sum rather than a GEMM for this reason: see model.py.)"""
    world = _world(experts=experts, eos=3, prompt_len=2, targets=(0, 5), init_std=1.0)
    params, gen = _init(world, 1), torch.Generator().manual_seed(2)
    prec = Precision(precision, router_fp32=replay)
    prompts = world.sample_prompts(64, gen)
    sampler = world.sampler(params, prompts, prec)
    step_logits, tokens = [sampler.start()], []
    for t in range(world.seq_len):
        tokens.append(torch.multinomial(step_logits[-1].float().softmax(-1), 1, generator=gen).squeeze(-1))
        if t < world.seq_len - 1:
            step_logits.append(sampler.step(tokens[-1]))
    sampled = torch.stack(step_logits, 1)  # [N, T, V]
    teacher = world.logits(params, prompts, torch.stack(tokens, 1), prec)
    assert sampled.dtype == teacher.dtype == prec.compute
    assert torch.equal(sampled, teacher)
    # Equality that means something: logits far from uniform, and rounded differently from fp32's.
    assert sampled.float().std() > 0.1
    assert prec.exact or not torch.equal(teacher.float(), world.logits(params, prompts, torch.stack(tokens, 1)))


def test_token_stats_are_the_fp32_log_softmax_and_carry_the_gradient():
    world = _world(eos=3)
    params = {k: v.requires_grad_(True) for k, v in _init(world).items()}
    prompts, tokens, _, _ = _rollout(world, params, 32, FP32, torch.Generator().manual_seed(0))
    stats = world.token_stats(params, prompts, tokens)
    logp_all = torch.log_softmax(world.logits(params, prompts, tokens, FP32), -1)
    assert torch.equal(stats.logp, logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
    assert torch.equal(stats.entropy, -(logp_all.exp() * logp_all).sum(-1))
    stats.logp.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())


def test_initial_policy_is_near_uniform():
    """Default init (init_std 0.02): entropy within 0.1% of log V in every state of a T = 64 world,
    and the default count-exact task starts in its 0.05–0.2 band (measured J₀ = 0.1084; Binomial(64, 1/16) at 6 gives 0.1058)."""
    world = _world(seq_len=64, k=6)
    params = _init(world)
    prev, count, position, _ = world.exact.states(params)
    logp = torch.log_softmax(world.state_logits(params, params, prev, count, position, FP32), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert float(entropy.min()) > 0.999 * math.log(16)
    assert float(world.exact.objective(params)) == pytest.approx(0.1084, abs=5e-4)


# ----------------------------------------------------------------------------------- exact J
def test_exact_J_equals_brute_force_enumeration():
    """A world small enough to enumerate (V = 3, T = 5, both prompts, EOS, 2 experts): J from the
    recursion equals Σ over all 3⁵ responses of P(response)·R, computed from the teacher-forced
    float64 logits, to 1e-12."""
    world = _world(seq_len=5, k=2, experts=2, eos=2, prompt_len=2, vocab=3, hidden=8, init_std=1.0)
    params = {k: v.double() for k, v in _init(world).items()}
    V, T = 3, 5
    responses = torch.tensor(list(itertools.product(range(V), repeat=T)))  # [243, 5]
    total = 0.0
    for prompt_token in range(V):  # prompt_len 2: BOS and a uniform token
        prompts = torch.tensor([[V, prompt_token]]).expand(len(responses), 2)
        logp = torch.log_softmax(world.logits(params, prompts, responses, FP32), -1)
        seq_prob = logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1).sum(-1).exp()  # [243]
        is_eos = (responses == 2).long()
        mask = ((is_eos.cumsum(-1) - is_eos) == 0).double()
        total += float((seq_prob * world.task.reward(prompts, responses, mask)).sum()) / V
    J = float(world.exact.objective(params))
    assert 0.05 < J < 0.95
    assert J == pytest.approx(total, abs=1e-12)


@pytest.fixture(scope="module")
def small_world_samples():
    """T = 16, k = 2: θ₀ and θ after 5 ascent steps, each with 100k fp32 on-policy responses."""
    torch.set_num_threads(1)
    world = _world(seq_len=16, k=2)
    theta0 = _init(world)
    out = {}
    for name, theta in (("init", theta0), ("trained", _ascend(world, theta0, 5))):
        out[name] = (theta, _rollout(world, theta, 100_000, FP32, torch.Generator().manual_seed(7)))
    return world, out


@pytest.mark.slow
@pytest.mark.parametrize("which", ["init", "trained"])
def test_exact_J_matches_monte_carlo(small_world_samples, which):
    """J within 3 standard errors of the mean reward of 100k responses (observed: J = 0.192 and
    0.502, z = −0.85 and −1.20)."""
    world, samples = small_world_samples
    theta, (prompts, tokens, mask, _) = samples[which]
    rewards = world.task.reward(prompts, tokens, mask).double()
    J = float(world.exact.objective(theta))
    se = float(rewards.std()) / math.sqrt(len(rewards))
    assert 0.1 < J < 0.9
    assert abs(float(rewards.mean()) - J) < 3 * se


@pytest.mark.slow
def test_exact_gradient_matches_reinforce(small_world_samples):
    """At the trained θ: ∇J from autograd through the recursion against mean((R − J)·Σ_t ∇log π)
    over the same 100k responses: cosine > 0.99 and relative error < 0.15 (observed 0.9998, 0.022)."""
    world, samples = small_world_samples
    theta, (prompts, tokens, mask, _) = samples["trained"]
    J, grad = exact_gradient(world.exact, theta)
    advantage = (world.task.reward(prompts, tokens, mask) - float(J)).unsqueeze(-1)  # [n, 1]
    leaves = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    estimate = torch.zeros(sum(p.numel() for p in theta.values()), dtype=torch.float64)
    for chunk in torch.arange(len(tokens)).split(25_000):
        logp = world.token_stats(leaves, prompts[chunk], tokens[chunk], entropy=False).logp
        objective = (advantage[chunk] * logp * mask[chunk]).sum() / len(tokens)
        estimate += torch.cat([g.flatten() for g in torch.autograd.grad(objective, list(leaves.values()))]).double()
    exact = flat(grad)
    cos = float(torch.nn.functional.cosine_similarity(estimate, exact, dim=0))
    assert cos > 0.99
    assert float((estimate - exact).norm() / exact.norm()) < 0.15


# --------------------------------------------------------------------------------- precision
def _kl_k3(world, theta, precision: str, n: int = 4096, seed: int = 3) -> float:
    """Mean per-token k3 = ρ − 1 − log ρ, log ρ = logp_fp32 − logp_engine, on engine samples."""
    prompts, tokens, mask, engine = _rollout(world, theta, n, Precision(precision), torch.Generator().manual_seed(seed))
    log_ratio = world.token_stats(theta, prompts, tokens, entropy=False).logp.detach() - engine
    return float(((log_ratio.exp() - 1 - log_ratio) * mask).sum() / mask.sum())


@pytest.fixture(scope="module")
def sharpened():
    """The T = 32, k = 3 dense world after 40 ascent steps (J ≈ 1: the target/non-target choice is
    near-deterministic in the states the policy visits)."""
    torch.set_num_threads(1)
    world = _world()
    theta0 = _init(world)
    return world, theta0, _ascend(world, theta0, 40)


@pytest.mark.slow
def test_precision_is_ordered_and_mismatch_grows_as_logits_sharpen(sharpened):
    """At the same sharpened θ: kl_k3(bf16) ≥ 10× kl_k3(fp16) and kl_k3(fp8) > kl_k3(bf16); and
    bf16's kl_k3 is ≥ 10× what it is at θ₀ (observed 2.7e-4, 5.3e-6, 4.8e-3; bf16 at θ₀ 1.9e-5, most
    of it the bf16 log-softmax rounding log π ≈ log(1/16) to a spacing of 2⁻⁶)."""
    world, theta0, theta = sharpened
    assert float(world.exact.objective(theta)) > 0.99
    k3 = {name: _kl_k3(world, theta, name) for name in ("bf16", "fp16", "fp8")}
    assert k3["bf16"] >= 10 * k3["fp16"] > 0
    assert k3["fp8"] > k3["bf16"]
    assert k3["bf16"] >= 10 * _kl_k3(world, theta0, "bf16")


# ----------------------------------------------------------------------------------- experts
@pytest.mark.slow
def test_expert_routing_flips_give_large_probability_gaps_and_replay_removes_them():
    """experts = 4, after 25 ascent steps (T = 32, k = 3; found by scanning every state along a
    100-step ascent, where a gap ≥ 0.5 appears from step 20 on). Over every state of the recursion:
    bf16 with its own router has some token with |p_fp32 − p_bf16| ≥ 0.5 in a state that a response
    reaches with probability ≥ 1e-3 (observed 0.91, in state prev = 12, count = 2, t = 11, which
    4.0e-3 of responses pass through); routing replay (router_fp32) brings the largest gap over all
    reachable states down ≥ 10× (observed 0.012)."""
    world = _world(experts=4)
    theta = _ascend(world, _init(world), 25)
    prev, count, position, occupancy = world.exact.states(theta)
    reachable = occupancy > 0
    p_fp32 = torch.softmax(world.state_logits(theta, theta, prev, count, position, FP32), -1)
    gap = {}
    for replay in (False, True):
        prec = Precision("bf16", router_fp32=replay)
        logits = world.state_logits(world.net.cast(theta, prec), theta, prev, count, position, prec)
        gap[replay] = (p_fp32 - torch.log_softmax(logits, -1).float().exp()).abs().amax(-1)  # [M]
    assert float(gap[False][occupancy >= 1e-3].max()) >= 0.5
    assert float(gap[False][reachable].max()) >= 10 * float(gap[True][reachable].max())


# ------------------------------------------------------------------------------------ config
def test_count_exact_reward_and_expected():
    task = make_task({"name": "count-exact", "targets": [0, 1], "k": 2}, {"vocab_size": 4, "seq_len": 4})
    tokens = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 2], [0, 1, 0, 3]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])  # the third ended after 2 tokens
    assert task.reward(None, tokens, mask).tolist() == [1.0, 0.0, 1.0]
    assert float(task.expected(torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0]))) == pytest.approx(0.3)


def test_a_task_without_targets_leaves_the_count_at_zero_and_has_no_exact_J():
    class Constant(Task):
        name = "constant"

        def reward(self, prompts, tokens, mask):
            return torch.ones(len(tokens))

    rollout = {"vocab_size": 16, "seq_len": 8}
    world = make_world({"name": "mlp", "init_std": 1.0}, rollout, Constant())
    assert world.exact is None
    params = _init(world)
    tokens = torch.zeros(4, 8, dtype=torch.long)  # token 0 would be a target of the count tasks above
    prompts = world.sample_prompts(4, torch.Generator().manual_seed(0))
    position = torch.arange(8).repeat(4)
    prev = torch.cat([prompts[:, -1:], tokens[:, :-1]], 1).reshape(-1)
    at_zero = world.state_logits(params, params, prev, torch.zeros_like(prev), position, FP32)
    assert torch.equal(world.logits(params, prompts, tokens).reshape(-1, 16), at_zero)


@pytest.mark.parametrize(
    "policy,message",
    [
        ({"layers": 0}, "policy.layers must be >= 1"),
        ({"hidden": 0}, "policy.hidden must be >= 1"),
        ({"experts": -1}, "policy.experts must be >= 0"),
        ({"experts": 1}, "policy.experts must be 0 (dense) or >= 2"),
        ({"init_std": -0.1}, "policy.init_std must be >= 0"),
        ({"hidden": 1.5}, "policy.hidden must be an integer"),
        ({"widht": 3}, "policy: unknown key(s) widht"),
    ],
)
def test_bad_policy_values_are_one_line_errors(policy, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        _world(**policy)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "task,rollout,message",
    [
        ({"k": 33}, {}, r"task.k \(33\) > rollout.seq_len \(32\)"),
        ({"k": -1}, {}, "task.k must be >= 0"),
        ({"targets": [16]}, {}, "task.targets: 16 is not a token id"),
        ({"k": 2, "min_count": 1}, {}, "task: unknown key"),
        ({}, {"eos_token": 16}, "rollout.eos_token must be <= 15"),
    ],
)
def test_bad_task_and_rollout_values_are_one_line_errors(task, rollout, message):
    rollout = {"vocab_size": 16, "seq_len": 32, **rollout}
    with pytest.raises(UserError, match=message) as info:
        world_task = make_task({"name": "count-exact", "targets": [0], "k": 3, **task}, rollout)
        make_world({"name": "mlp"}, rollout, world_task)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------ summary
@pytest.mark.parametrize("experts,parameters", [(0, 7760), (4, 28332)])
def test_summary_reports_the_shape_and_counts_the_parameters(experts, parameters):
    """V = 16, T = 32: J = ⌊log₂ 16⌋ + 1 = 5 frequencies, D = 17 + 2·(1 + 2·5) = 39 features.
    Dense, hidden 64: 64·39 + 64 + 64·64 + 64 + 16·64 + 16 = 7760. Four experts: each layer adds a
    router [4, D_in] and holds 4 weight sets, 4·39 + 4·64·39 + 4·64 + 4·64 + 4·64·64 + 4·64 + 1040 = 28332."""
    world = _world(experts=experts, eos=3, prompt_len=2, init_std=0.5)
    assert world.summary() == {
        "policy": "mlp",
        "vocab_size": 16,
        "seq_len": 32,
        "prompt_len": 2,
        "eos_token": 3,
        "layers": 2,
        "hidden": 64,
        "experts": experts,
        "init_std": 0.5,
        "state": ["previous", "count", "position"],
        "features": 39,
        "parameters": parameters,
    }


def test_own_expert_path_takes_an_empty_batch_and_agrees_with_every_expert():
    """The exact solver's grouped path (batch_invariant=False) on no rows gives [0, V] logits, and on
    rows that leave the last expert unused gives the batch-invariant path's logits (float64, 1e-12)."""
    world = _world(experts=4, init_std=1.0)
    params = {k: v.double() for k, v in _init(world, 3).items()}
    feats = torch.randn(64, world.net.feature_dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    empty, routes = world.net.forward(params, feats[:0], FP32, batch_invariant=False)
    assert empty.shape == (0, 16) and [r.expert.numel() for r in routes] == [0, 0]
    full, full_routes = world.net.forward(params, feats, FP32)
    rows = full_routes[0].expert < 3
    assert 0 < int(rows.sum()) < 64
    grouped, _ = world.net.forward(params, feats[rows], FP32, batch_invariant=False)
    torch.testing.assert_close(grouped, full[rows], atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_router_scores_are_the_exact_product_sum_rounded_once(dtype):
    """The batch-invariant router in a low-precision engine: scores = Σ_d x_d·R_ed with the products
    and the sum in fp32 and one rounding to the compute dtype, so on 512 random rows (D = 39, E = 4)
    they equal the float64 product-sum rounded to that dtype, bit for bit; the expert is their argmax
    and the gate, in the compute dtype, softmax(scores)[expert]. (Products rounded to bf16 first
    change 109 of the 512 bf16 gates.)"""
    from runner.worlds.mlp.model import Net

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 39, generator=g).to(dtype)
    router = (torch.randn(4, 39, generator=g) / 39**0.5).to(dtype)
    route = Net._route(x, router, True)
    scores = (x.double().unsqueeze(1) * router.double()).sum(-1).to(dtype)  # [N, E]
    expert = scores.argmax(-1)
    assert len(set(expert.tolist())) == 4
    assert route.gate.dtype == dtype
    assert torch.equal(route.expert, expert)
    assert torch.equal(route.gate, torch.softmax(scores, -1).gather(-1, expert.unsqueeze(-1)).squeeze(-1))


@pytest.mark.parametrize("experts", [0, 4])
def test_init_draws_each_weight_at_its_scale(experts):
    """W_l and R_l ~ N(0, 1/fan_in), biases 0, W_out ~ N(0, init_std²) (V = 16, T = 32: D = 39, hidden
    64, init_std 0.05). The sample std of n draws has a relative sd of 1/√(2n); each is held within 5 of
    those (the smallest tensor, a router of 4·39 draws, to ±28%), and the mean within 5 sd of 0."""
    world = _world(experts=experts, init_std=0.05)
    params = _init(world, 4)
    E = (experts,) if experts else ()
    expected = {
        "layer0.weight": (E + (64, 39), 39**-0.5),
        "layer1.weight": (E + (64, 64), 64**-0.5),
        "out.weight": ((16, 64), 0.05),
    }
    if experts:
        expected.update({"layer0.router": ((4, 39), 39**-0.5), "layer1.router": ((4, 64), 64**-0.5)})
    for name, (shape, std) in expected.items():
        w = params[name]
        assert tuple(w.shape) == shape, name
        assert abs(float(w.std()) / std - 1) < 5 / math.sqrt(2 * w.numel()), name
        assert abs(float(w.mean())) < 5 * std / math.sqrt(w.numel()), name
    for name in ("layer0.bias", "layer1.bias", "out.bias"):
        assert tuple(params[name].shape) == {"out.bias": (16,)}.get(name, E + (64,)) and not params[name].any(), name
    assert sorted(params) == sorted(["out.bias", *expected, "layer0.bias", "layer1.bias"])


def test_exact_J_starts_from_bos_when_the_prompt_is_bos_alone():
    """prompt_len 1: every response starts after BOS (not after a uniform token). V = 3, T = 4, EOS 2,
    2 experts: J from the recursion equals Σ over all 3⁴ responses of P(response | BOS)·R, to 1e-12."""
    world = _world(seq_len=4, k=1, experts=2, eos=2, prompt_len=1, vocab=3, hidden=8, init_std=1.0)
    params = {k: v.double() for k, v in _init(world, 5).items()}
    responses = torch.tensor(list(itertools.product(range(3), repeat=4)))  # [81, 4]
    prompts = torch.full((81, 1), 3)
    logp = torch.log_softmax(world.logits(params, prompts, responses, FP32), -1)
    seq_prob = logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1).sum(-1).exp()
    is_eos = (responses == 2).long()
    mask = ((is_eos.cumsum(-1) - is_eos) == 0).double()
    total = float((seq_prob * world.task.reward(prompts, responses, mask)).sum())
    uniform_start = MLPWorld(world.net, prompt_len=2, eos_token=2, task=world.task)
    assert abs(float(uniform_start.exact.objective(params)) - total) > 1e-3  # the start state matters here
    assert float(world.exact.objective(params)) == pytest.approx(total, abs=1e-12)


@pytest.mark.parametrize(
    "rollout,message",
    [
        ({"vocab_size": 1}, r"rollout.vocab_size must be >= 2, got 1"),
        ({"seq_len": 0}, r"rollout.seq_len must be >= 1, got 0"),
        ({"eos_token": -1}, r"rollout.eos_token must be >= 0, got -1"),
        ({"eos_token": 8}, r"rollout.eos_token must be <= 7, got 8"),
        ({"prompt_len": 0}, r"rollout.prompt_len must be >= 1, got 0"),
    ],
)
def test_bad_rollout_values_are_one_line_errors(rollout, message):
    with pytest.raises(UserError, match=message):
        make_world({"name": "mlp"}, {"vocab_size": 8, "seq_len": 4, **rollout}, None)


def test_rollout_edges_are_accepted_and_a_task_vocabulary_must_match():
    world = make_world({"name": "mlp"}, {"vocab_size": 2, "seq_len": 1, "eos_token": 0}, None)
    assert (world.vocab_size, world.seq_len, world.eos_token, world.prompt_len, world.exact) == (2, 1, 0, 1, None)
    sort = make_task({"name": "sort", "values": 5}, {"seq_len": 8})  # 5 values, BOS, SEP and EOS: 8 tokens
    with pytest.raises(UserError, match=r"task sort has 8 tokens but rollout.vocab_size is 16"):
        make_world({"name": "mlp"}, {"vocab_size": 16, "seq_len": 8}, sort)
    assert make_world({"name": "mlp"}, {"vocab_size": 8, "seq_len": 8}, sort).vocab_size == 8
    from runner.worlds.mlp.model import Net

    direct = MLPWorld(Net(vocab_size=4, seq_len=3))  # the constructor's defaults: a BOS prompt, no EOS
    assert (direct.prompt_len, direct.eos_token, direct.exact) == (1, None, None)


def test_the_maths_runs_on_the_params_device():
    """PyTorch's meta device (shapes and devices, no data) stands in for a GPU: with the parameters
    there, the teacher-forced logits, the sampler's and the exact objective come out there too; a
    tensor the world made on the CPU instead would be refused next to them or surface in the result.
    (The exact solver's grouped experts need data to group by: its world is dense.)"""
    prompts = torch.full((4, 2), 5, device="meta")
    tokens = torch.zeros(4, 6, dtype=torch.long, device="meta")
    for experts in (2, 0):
        world = _world(seq_len=6, experts=experts, eos=3, prompt_len=2, vocab=5, hidden=8)
        params = {k: v.to("meta") for k, v in _init(world).items()}
        assert world.logits(params, prompts, tokens).device.type == "meta"
        sampler = world.sampler(params, prompts, Precision("bf16", router_fp32=True))
        assert sampler.start().device.type == "meta" and sampler.step(tokens[:, 0]).device.type == "meta"
    assert world.exact.objective(params).device.type == "meta"
    assert all(column.device.type == "meta" for column in world.exact.states(params))


def test_exact_objective_in_the_dtype_asked_for(monkeypatch):
    """J in the dtype asked for: a float32 J within 1e-5 of float64's (J = 0.2115), a float16 one within
    1e-3 (its spacing at 0.2 is 2⁻¹³ and every step of the recursion rounds). The solver computes only
    each row's own expert: the every-expert path of the sampler and trainer is never taken."""
    from runner.worlds.mlp.model import Net

    world = _world(seq_len=8, k=1, experts=2, eos=3, init_std=1.0)
    params = _init(world, 2)

    def refuse(*args):
        raise AssertionError("the exact solver took the batch-invariant path")

    monkeypatch.setattr(Net, "_every_expert", staticmethod(refuse))
    J16, J32, J64 = (world.exact.objective(params, dtype) for dtype in (torch.float16, torch.float32, torch.float64))
    assert (J16.dtype, J32.dtype, J64.dtype) == (torch.float16, torch.float32, torch.float64)
    assert float(J64) == pytest.approx(0.2115, abs=1e-4)
    assert abs(float(J32) - float(J64)) < 1e-5 and abs(float(J16) - float(J64)) < 1e-3


def test_encoding_table_golden_values():
    """T = 8: J = ⌊log₂ 4⌋ + 1 = 3 frequencies ω = π/8, π/4, π/2, so enc(x) = [x/8, sin(ω·x), cos(ω·x)]:
    at x = 2, [0.25, sin π/4, 1, 0, cos π/4, 0, −1]; rows for x = 0..8, on the CPU by default."""
    from runner.worlds.mlp.model import Net

    net = Net(vocab_size=4, seq_len=8)
    table = net.encoding_table(torch.float64)
    assert table.shape == (9, 7) and table.dtype == torch.float64 and table.device.type == "cpu"
    r = math.sqrt(0.5)
    assert table[2].tolist() == pytest.approx([0.25, r, 1.0, 0.0, r, 0.0, -1.0], abs=1e-15)
    assert table[0].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert table[8, 0] == 1.0 and net.feature_dim == 5 + 14
    assert torch.equal(net.encoding_table(torch.float32), table.float())  # computed in float64, rounded once
    twelve = Net(vocab_size=4, seq_len=12).encoding_table(torch.float64)  # x/12 is not a float32 number
    assert twelve[:, 0].tolist() == [x / 12 for x in range(13)]


@pytest.mark.parametrize("experts", [0, 3])
def test_forward_is_the_documented_network(experts):
    """float64, random non-zero weights and biases: h_l = silu(W_l h + b_l) (experts: softmax(R_l h)[e*] ·
    silu(W_{l,e*} h + b_{l,e*}), e* = argmax R_l h), logits = W_out h_L + b_out, row by row, to 1e-12;
    both the batch-invariant path and the exact solver's grouped one."""
    world = _world(experts=experts, hidden=8)
    g = torch.Generator().manual_seed(0)
    params = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in _init(world).items()}
    feats = torch.randn(32, world.net.feature_dim, generator=g, dtype=torch.float64)
    h = feats
    for layer in range(2):
        W, b = params[f"layer{layer}.weight"], params[f"layer{layer}.bias"]
        if experts:
            scores = h @ params[f"layer{layer}.router"].T  # [N, E]
            e = scores.argmax(-1)
            gate = torch.softmax(scores, -1).gather(-1, e.unsqueeze(-1))
            h = gate * torch.nn.functional.silu(torch.einsum("nd,nhd->nh", h, W[e]) + b[e])
        else:
            h = torch.nn.functional.silu(h @ W.T + b)
    expected = h @ params["out.weight"].T + params["out.bias"]
    for batch_invariant in (True, False):
        logits, routes = world.net.forward(params, feats, FP32, batch_invariant=batch_invariant)
        torch.testing.assert_close(logits, expected, atol=1e-12, rtol=0)
        assert len(routes) == (2 if experts else 0)


def test_a_replayed_gate_is_applied_in_the_compute_dtype():
    """Routing replay hands the bf16 engine the fp32 pass's gates; the layer multiplies by the gate
    rounded to bf16, so two fp32 gates with the same bf16 rounding give the same logits, bit for bit."""
    from runner.worlds.mlp.model import Route

    world = _world(experts=4, init_std=1.0)
    params = _init(world, 1)
    prec = Precision("bf16", router_fp32=True)
    feats = torch.randn(64, world.net.feature_dim, generator=torch.Generator().manual_seed(0))
    _, routes = world.net.forward(params, feats, FP32)
    nudged = []
    for r in routes:
        rounded = r.gate.bfloat16().float()
        assert r.gate.dtype == torch.float32 and not torch.equal(rounded, r.gate)
        nudged.append(Route(expert=r.expert, gate=rounded))
    engine = world.net.cast(params, prec)
    feats16 = feats.bfloat16()
    a, _ = world.net.forward(engine, feats16, prec, routes)
    b, _ = world.net.forward(engine, feats16, prec, nudged)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
