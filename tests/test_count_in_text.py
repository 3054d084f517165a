"""task=count-in-text (the transformer's field regime) and mismatch.kv_cache, with real numbers: the corpus's
tilted chains against their stationary laws and against Monte Carlo, the reward by hand, the vocabulary's
layout, the fp8 KV cache's rounding, and the one-line errors."""

from __future__ import annotations

import math

import pytest
import torch

from runner.errors import UserError
from runner.tasks import make_task
from runner.worlds.engine import Mismatch
from runner.worlds.precision import Precision
from runner.worlds.registry import make_world
from runner.worlds.transformer import sft

TASK = {
    "name": "count-in-text",
    "words": 64,
    "targets": [0, 1, 2, 3],
    "k": [4, 8, 12],
    "tolerance": 1,
    "successors": 4,
    "zipf": 2.5,
    "corpus_follows": 1.0,
    "corpus_seed": 0,
}
ROLLOUT = {"seq_len": 128}


def task(**changes):
    return make_task({**TASK, **changes}, ROLLOUT)


def test_vocabulary_and_prompts():
    t = task()
    assert (t.vocab_size, t.bos, t.ask0, t.eos) == (64 + 3 + 2, 64, 65, 68)
    prompts = t.sample_prompts(300, torch.Generator().manual_seed(0))
    assert prompts.shape == (300, 2) and (prompts[:, 0] == 64).all()
    assert set(prompts[:, 1].tolist()) == {65, 66, 67}  # each ask drawn, and only asks
    assert (t.prompt_len, t.response_len) == (2, 1)


def test_reward_counts_target_words_before_eos_within_the_tolerance():
    t = task()
    prompts = torch.tensor([[64, 65], [64, 65], [64, 66], [64, 67], [64, 67]])  # asks for 4, 4, 8, 12, 12
    tokens = torch.full((5, 16), 10)
    tokens[0, :5] = 0  # 5 targets: 4 ± 1 holds
    tokens[1, :6] = 1  # 6: misses
    tokens[2, :7] = 3  # 7 for 8: holds
    tokens[3, :12] = 2  # 12 targets, but the response ends at its EOS after 9 of them
    tokens[4, :11] = 2  # 11 for 12: holds
    mask = torch.ones(5, 16)
    mask[3, 10:] = 0  # what the engine masks after an EOS at position 9
    assert t.reward(prompts, tokens, mask).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_base_chain_has_the_zipf_law_and_its_entropy():
    t = task(corpus_follows=0.0)
    ranks = torch.arange(1, 5, dtype=torch.float64)
    law = ranks**-2.5 / (ranks**-2.5).sum()  # 1, 0.1768, 0.0642, 0.0313 over their sum 1.2722
    assert law.tolist() == pytest.approx([0.78605, 0.13896, 0.05043, 0.02456], abs=1e-5)
    for ask in range(3):  # no tilt: every ask's chain is the base chain
        assert torch.allclose(t.next_probs[ask].double(), law.expand(64, -1), atol=1e-7)
    # the default corpus: 8 successors, exponent 2.5, 0.8668 nats a word, 10.5% of the mass below p = 0.1
    r8 = torch.arange(1, 9, dtype=torch.float64)
    p8 = r8**-2.5 / (r8**-2.5).sum()
    assert -(p8 * p8.log()).sum().item() == pytest.approx(0.8668, abs=1e-4)
    assert p8[p8 < 0.1].sum().item() == pytest.approx(0.1049, abs=1e-4)


def test_stationary_law_solves_the_balance_equations():
    t = task(corpus_follows=0.0)
    share, law = t._stationary_share(t.next_probs[0].double())
    dense = torch.zeros(64, 64, dtype=torch.float64).scatter_add_(1, t.next_words, t.next_probs[0].double())
    assert law.sum().item() == pytest.approx(1.0, abs=1e-12) and (law >= 0).all()
    assert torch.allclose(law @ dense, law, atol=1e-12)
    assert share == pytest.approx(law[:4].sum().item(), abs=1e-15)


@pytest.mark.parametrize("follows", [1.0, 0.5])
def test_each_asks_chain_is_tilted_to_its_expected_count(follows):
    """The stationary count of ASK_i's chain is chain_count + follows · (k_i − chain_count), to the bisection's
    precision; λ > 1 above the chain's own count and < 1 below."""
    t = task(corpus_follows=follows)
    for i, k in enumerate(t.k):
        wanted = t.chain_count + follows * (k - t.chain_count)
        assert 128 * t._stationary_share(t.next_probs[i].double())[0] == pytest.approx(wanted, abs=1e-4)


def test_teacher_counts_match_the_tilted_chains_by_monte_carlo():
    """4096 corpus texts of 128 words (the first word from the ask's stationary law, so the mean count is exactly
    T × the share): each ask's mean count within 4 standard errors of k."""
    t = task()
    gen = torch.Generator().manual_seed(3)
    prompts = t.sample_prompts(4096, gen)
    tokens, mask = t.teacher(prompts, gen, 0.0, 128)
    assert tokens.shape == (4096, 128) and (mask == 1).all() and tokens.max() < 64  # words only, no EOS
    counts = t.count(tokens, mask)
    for i, k in enumerate(t.k):
        c = counts[prompts[:, 1] == t.ask0 + i].double()
        assert abs(c.mean().item() - k) < 4 * c.std().item() / math.sqrt(len(c)), (k, c.mean().item())
    # each step follows the chain: every next word is one of the current word's successors
    nxt = t.next_words[tokens[:, :-1]]  # [n, T-1, successors]
    assert (nxt == tokens[:, 1:, None]).any(-1).all()


def test_identity_names_what_the_warm_start_depends_on():
    t = task()
    assert t.identity() == {
        "name": "count-in-text",
        "words": 64,
        "asks": 3,
        "successors": 4,
        "zipf": 2.5,
        "k": [4, 8, 12],
        "corpus_follows": 1.0,
        "corpus_seed": 0,
    }
    assert task(corpus_seed=1).next_words.tolist() != t.next_words.tolist()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"successors": 65}, "task.successors (65) must be <= task.words (64)"),
        ({"targets": [64]}, "task.targets: 64 is not a token id in [0, 63]"),
        ({"k": [129]}, "task.k: 129 is not a count in [0, rollout.seq_len = 128]"),
        ({"corpus_follows": 1.5}, "task.corpus_follows"),
        ({"colour": 1}, "colour"),
    ],
)
def test_bad_values_are_one_line_errors(changes, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        task(**changes)


# ------------------------------------------------------------------------------------- the KV cache
def test_fp8_kv_cache_rounds_to_e4m3_with_scale_one():
    p = Precision("bf16", kv_cache="fp8")
    x = torch.tensor([0.3, -1.1, 1000.0, 0.004, 17.0])
    # 0.3 = 1.2·2^-2 → 1.25·2^-2; −1.1 → −1.125; 1000 clamps to 448; 0.004 is a subnormal (steps of 2^-9): 2·2^-9;
    # 17 = 1.0625·2^4 → 1.0·2^4 (ties to even)
    assert p.cached(x).tolist() == [0.3125, -1.125, 448.0, 0.00390625, 16.0]
    assert Precision("bf16").cached(x) is x  # without a KV cache dtype: as the GEMM rounded it
    assert Precision("fp8", kv_cache="fp16").cached(torch.tensor([0.1])).item() == pytest.approx(0.0999755859375)


def test_kv_cache_needs_a_low_precision_engine_and_a_world_with_a_cache(tmp_path):
    with pytest.raises(ValueError, match="needs a low-precision engine"):
        Precision("fp32", kv_cache="fp8")
    base = {"staleness": 0, "logit_noise": 0.0, "temperature": 1.0, "top_p": 1.0, "outlier_rate": 0.0}
    base |= {"outlier_shift": -1000.0}
    with pytest.raises(UserError, match="needs a low-precision engine"):
        Mismatch.from_config({**base, "precision": "fp32", "kv_cache": "fp8"})
    with pytest.raises(UserError, match="mismatch.kv_cache"):
        Mismatch.from_config({**base, "precision": "bf16", "kv_cache": "int4"})
    assert Mismatch.from_config({**base, "precision": "bf16", "kv_cache": None}).compute_precision.kv_cache is None
    assert Mismatch.from_config({**base, "precision": "bf16", "kv_cache": "fp8"}).compute_precision.kv_cache == "fp8"


def test_kv_cache_on_a_world_without_one_is_a_one_line_error(cli, tmp_path):
    code, out, err = cli("run", "mismatch.kv_cache=fp8", f"hydra.run.dir={tmp_path / 'r'}")
    assert code == 2 and out == ""
    assert err == (
        "is-study: error: mismatch.kv_cache needs a world with a KV cache (policy=transformer); bigram has none\n"
    )


def _world(tmp_path, **policy):
    rollout = {"seq_len": 48}
    task_cfg = {**TASK, "k": [4, 6, 8]}
    cfg = {
        "name": "transformer",
        "context": 50,
        "init_std": 0.3,
        **policy,
        "sft": {"steps": 0, "cache_dir": str(tmp_path)},
    }
    return make_world(cfg, rollout, make_task(task_cfg, rollout))


def test_fp8_kv_cache_is_the_same_arithmetic_cached_and_teacher_forced(one_thread, tmp_path):
    """The engine's K and V pass through its cache's dtype on both of its routes, so decoding with the cache and
    one teacher-forced engine pass agree to fp32 summation order; and the fp8 cache moves the engine's log-probs
    further from the fp32 trainer's than bf16 keys and values do."""
    world = _world(tmp_path)
    params = world.init_params(torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    prompts = world.sample_prompts(8, gen)
    tokens, _, _ = sft.sample(world, params, prompts, gen)
    fp32 = torch.log_softmax(world.logits(params, prompts, tokens), -1)
    gaps = {}
    for kv in (None, "fp8"):
        precision = Precision("bf16", kv_cache=kv)
        teacher = torch.log_softmax(world.logits(params, prompts, tokens, precision).float(), -1)
        s = world.sampler(params, prompts, precision)
        cached = [s.start()] + [s.step(tokens[:, t]) for t in range(tokens.shape[1] - 1)]
        cached = torch.log_softmax(torch.stack(cached, 1).float(), -1)
        assert (cached - teacher).abs().max().item() < 0.05  # bf16 logits: one rounding step apart at most
        gaps[kv] = (teacher - fp32).abs().mean().item()
    assert gaps["fp8"] > 3 * gaps[None] > 0, gaps


@pytest.mark.slow
def test_the_warm_start_reads_the_question_and_answers_it_on_average(one_thread, tmp_path):
    """The mechanism of experiment=transformer/field-regime at a small size (32 words, 32-word texts, asks for
    1, 4 and 7 targets where the chain alone writes 4.5): 300 SFT steps on the tilted corpus give a policy
    whose mean count follows each ask (within 0.35 of k over 1000 texts each: a few standard errors), with the
    chain's spread, so the far asks are not all answered; 1.11, 3.97, 6.87 here, and 0.92, 0.60, 0.43 right."""
    rollout = {"seq_len": 32}
    t = make_task({**TASK, "words": 32, "k": [1, 4, 7]}, rollout)
    sft_cfg = {
        "steps": 300,
        "batch_size": 64,
        "lr": 0.003,
        "warmup": 20,
        "cache_dir": str(tmp_path),
        "eval_samples": 64,
    }
    world = make_world({"name": "transformer", "context": 34, "sft": sft_cfg}, rollout, t)
    assert 4 < t.chain_count < 5
    params = world.init_params(torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(5)
    prompts = t.sample_prompts(3000, gen)
    tokens, mask, _ = sft.sample(world, params, prompts, gen)
    counts, rewards = t.count(tokens, mask), t.reward(prompts, tokens, mask)
    right = []
    for i, k in enumerate(t.k):
        mine = prompts[:, 1] == t.ask0 + i
        assert counts[mine].float().mean().item() == pytest.approx(k, abs=0.35), (k, counts[mine].float().mean())
        right.append(rewards[mine].mean().item())
    assert right[0] > right[1] > right[2] > 0.3, right  # the spread grows with the count: harder asks
    assert 0.05 < world.warm_start["low_probability_fraction"] < 0.2 and world.warm_start["mean_entropy"] < 1.0
