"""rollout.dynamic_sampling (DAPO): all-same groups replaced by mixed ones from extra draws, the batch
kept full, the draws bounded, and a run with the option off unchanged."""

from __future__ import annotations

import pytest
import torch

from runner.training.dynamic_sampling import mixed_groups, refill
from runner.worlds.engine import Rollout

G = 2


def _batch(rewards: list[float], tag: int) -> tuple[Rollout, torch.Tensor]:
    """A fake rollout whose tokens record (tag, row) so the test can see which rows were kept."""
    n = len(rewards)
    tokens = torch.tensor([[tag, row] for row in range(n)])
    ro = Rollout(
        prompts=torch.full((n, 1), tag),
        tokens=tokens,
        mask=torch.ones(n, 2),
        roll=torch.zeros(n, 2),
        outliers=torch.zeros(n, 2, dtype=torch.bool),
    )
    return ro, torch.tensor(rewards)


def test_mixed_groups():
    assert mixed_groups(torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0]), 2).tolist() == [True, False, False]


def test_all_same_groups_are_replaced_in_order_until_the_batch_is_full():
    first = _batch([0, 1, 1, 1, 0, 0, 1, 0], tag=0)  # groups: mixed, same, same, mixed
    extra = iter([_batch([0, 0, 1, 0, 1, 1, 1, 1], tag=1), _batch([1, 0, 0, 1, 0, 0, 0, 0], tag=2)])
    ro, rewards, drawn = refill(*first, G, 5, lambda: next(extra))
    assert drawn == 2  # the first extra batch brings one mixed group, the second the last one needed
    assert ro.tokens.tolist() == [[0, 0], [0, 1], [0, 6], [0, 7], [1, 2], [1, 3], [2, 0], [2, 1]]
    assert rewards.tolist() == [0, 1, 1, 0, 1, 0, 1, 0]
    assert mixed_groups(rewards, G).all() and torch.equal(ro.prompts[:, 0], ro.tokens[:, 0])


def test_a_batch_left_short_is_filled_with_the_first_batchs_all_same_groups():
    first = _batch([0, 1, 1, 1, 0, 0, 1, 0], tag=0)
    ro, rewards, drawn = refill(*first, G, 1, lambda: _batch([1, 1, 0, 0, 1, 1, 0, 0], tag=1))
    assert drawn == 1
    assert ro.tokens[:, 0].tolist() == [0] * 8
    assert ro.tokens[:, 1].tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert rewards.tolist() == [0, 1, 1, 0, 1, 1, 0, 0]


def test_a_full_batch_draws_nothing():
    first = _batch([0, 1, 1, 0], tag=0)
    ro, rewards, drawn = refill(*first, G, 3, lambda: pytest.fail("drew"))
    assert drawn == 0 and torch.equal(ro.tokens, first[0].tokens) and torch.equal(rewards, first[1])


def test_training_with_dynamic_sampling_trains_on_mixed_groups_only():
    """The field regime at T = 64 from seed 1000 (its first steps are mostly all-fail groups): with
    up to 8 extra batches a step, the trained batches' all-same share falls from what plain sampling
    gives (observed: 0.36 → 0.00 over 6 steps, 10 extra batches), and the extra draws are counted."""
    from runner.hydra_app.app import compose
    from runner.studies.train import load
    from runner.training.loop import Trainer

    def share(extra: int) -> tuple[float, int]:
        overrides = ["experiment=mlp/field-regime", "mismatch=none", "log.quiet=true", "rollout.seq_len=64"]
        overrides += ["rollout.vocab_size=64", "task.targets=[0,1,2,3]", "task.k=[2,3,4,5,6]", "task.tolerance=1"]
        overrides += ["train.objective_every=1000000", "seed=1000", f"rollout.dynamic_sampling={extra}"]
        trainer = Trainer(load(compose(overrides)))
        same = []
        for step in range(6):
            rec = trainer.step(step)
            rewards = trainer.s.task.reward(rec.rollout.prompts, rec.rollout.tokens, rec.rollout.mask)
            assert rec.rollout.tokens.shape[0] == 64 and float(rec.reward) == pytest.approx(float(rewards.mean()))
            same.append(float((~mixed_groups(rewards, 8)).double().mean()))
        return sum(same) / len(same), trainer.extra_batches

    plain, none_drawn = share(0)
    dapo, drawn = share(8)
    assert none_drawn == 0 and drawn > 0
    assert dapo < plain - 0.2, (dapo, plain)
