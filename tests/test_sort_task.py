"""task=sort: prompts, the answer, the reward and the noisy teacher, with real numbers."""

from __future__ import annotations

import pytest
import torch

from runner.errors import UserError
from runner.tasks import make_task
from runner.tasks.sorting import Sort

ROLLOUT = {"seq_len": 8}


def test_vocabulary_prompts_and_answer():
    task = Sort(length=5, values=10)
    assert (task.bos, task.sep, task.eos, task.vocab_size) == (10, 11, 12, 13)
    prompts = torch.tensor([[10, 3, 1, 3, 0, 9, 11]])
    assert task.answer(prompts).tolist() == [[0, 1, 3, 3, 9, 12]]
    drawn = task.sample_prompts(1000, torch.Generator().manual_seed(0))
    assert drawn.shape == (1000, 7)
    assert (drawn[:, 0] == 10).all() and (drawn[:, -1] == 11).all()
    items = drawn[:, 1:-1]
    assert items.min() == 0 and items.max() == 9
    # uniform items: each value's share within 5 SE of 1/10 (5000 draws)
    share = torch.bincount(items.flatten(), minlength=10).float() / items.numel()
    assert (share - 0.1).abs().max() < 5 * (0.1 * 0.9 / items.numel()) ** 0.5


def test_sample_prompts_is_seeded():
    task = Sort(length=6, values=20)
    a = task.sample_prompts(4, torch.Generator().manual_seed(3))
    b = task.sample_prompts(4, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def _reward(task, prompts, response, partial=False):
    task.partial_credit = partial
    tokens = torch.tensor([response])
    is_eos = (tokens == task.eos).long()
    mask = ((is_eos.cumsum(-1) - is_eos) == 0).float()
    return task.reward(prompts, tokens, mask).item()


def test_reward_exact_match_and_partial_credit():
    task = Sort(length=4, values=10)
    prompts = torch.tensor([[10, 5, 2, 7, 2, 11]])  # answer 2 2 5 7 EOS
    E = task.eos
    assert _reward(task, prompts, [2, 2, 5, 7, E, E]) == 1.0
    assert _reward(task, prompts, [2, 5, 7, E, E, E]) == 0.0  # dropped a copy (the teacher's mistake)
    assert _reward(task, prompts, [2, 2, 5, 7, 7, E]) == 0.0  # no EOS where the answer ends
    assert _reward(task, prompts, [2, 2, 5, E, E, E]) == 0.0  # ended early
    assert _reward(task, prompts, [2, 2, 5, 7, E, E], partial=True) == 1.0
    assert _reward(task, prompts, [2, 5, 7, E, E, E], partial=True) == pytest.approx(1 / 5)
    assert _reward(task, prompts, [2, 2, 5, 9, E, E], partial=True) == pytest.approx(3 / 5)


def test_padding_after_eos_does_not_count_as_the_answer():
    # A response that ends at EOS early is padded with EOS; the answer's later tokens are values,
    # so a padded position can never match. A masked-out position never counts even if it matches.
    task = Sort(length=2, values=4)
    prompts = torch.tensor([[4, 1, 0, 5]])  # answer 0 1 EOS
    tokens = torch.tensor([[0, 1, 6]])
    assert task.reward(prompts, tokens, torch.tensor([[1.0, 1.0, 1.0]])).item() == 1.0
    assert task.reward(prompts, tokens, torch.tensor([[1.0, 1.0, 0.0]])).item() == 0.0


def test_teacher_without_mistakes_writes_the_answer():
    task = Sort(length=12, values=8)
    gen = torch.Generator().manual_seed(1)
    prompts = task.sample_prompts(256, gen)
    tokens, mask = task.teacher(prompts, gen, fork_error=0.0, width=16)
    assert torch.equal(tokens[:, :13], task.answer(prompts))
    assert (tokens[:, 13:] == task.eos).all()
    assert (mask.sum(1) == 13).all()
    ones = torch.ones_like(mask)
    assert task.reward(prompts, tokens, mask).mean().item() == 1.0
    assert task.reward(prompts, tokens, ones).mean().item() == 1.0  # padding is EOS anyway


def test_teacher_always_wrong_at_forks_deduplicates():
    task = Sort(length=12, values=8)
    gen = torch.Generator().manual_seed(2)
    prompts = task.sample_prompts(64, gen)
    tokens, mask = task.teacher(prompts, gen, fork_error=1.0, width=13)
    for i in range(64):
        unique = sorted(set(prompts[i, 1:-1].tolist()))
        n = int(mask[i].sum())
        assert tokens[i, :n].tolist() == unique + [task.eos]
        assert (tokens[i, n:] == task.eos).all()


def test_teacher_accuracy_is_one_minus_fork_error_per_fork():
    # P(correct) = E[(1 − r)^R] with R the number of repeated items; checked within 4 SE on 20k lists.
    task = Sort(length=10, values=16)
    gen = torch.Generator().manual_seed(3)
    prompts = task.sample_prompts(20_000, gen)
    r = 0.3
    tokens, mask = task.teacher(prompts, gen, fork_error=r, width=11)
    correct = task.reward(prompts, tokens, mask)
    repeats = task.forks(prompts).sum(1).double()
    expected = ((1 - r) ** repeats).mean().item()
    se = (expected * (1 - expected) / len(correct)) ** 0.5
    assert abs(correct.double().mean().item() - expected) < 4 * se
    # a mistake only ever drops copies: the written tokens are the answer's unique values in order
    for i in range(200):
        n = int(mask[i].sum())
        written = tokens[i, :n].tolist()
        assert written == sorted(written[:-1]) + [task.eos]
        assert set(written[:-1]) == set(prompts[i, 1:-1].tolist())


@pytest.mark.parametrize(
    "cfg,rollout,message",
    [
        ({"values": 1}, ROLLOUT, "task.values must be >= 2"),
        ({"values": 10, "length": 8}, ROLLOUT, "task.length=8 needs rollout.seq_len >= 9"),
        ({"values": 10, "length": 0}, ROLLOUT, "task.length must be >= 1"),
        ({"values": 10, "partial_credit": "yes"}, ROLLOUT, "task.partial_credit must be true or false"),
        ({"values": 10, "lenght": 3}, ROLLOUT, "did you mean task.length"),
        ({"values": 10}, {"seq_len": 300}, "rollout.seq_len must be <= 256"),
    ],
)
def test_bad_task_values_are_one_line_errors(cfg, rollout, message):
    with pytest.raises(UserError) as err:
        make_task({"name": "sort", **cfg}, rollout)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_length_null_fills_the_response():
    task = make_task({"name": "sort", "values": 10, "length": None}, {"seq_len": 32})
    assert task.length == 31 and task.response_len == 32 and task.prompt_len == 33
