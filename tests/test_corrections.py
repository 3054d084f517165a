"""Golden values for every preset on hand-made padded inputs (two cases per preset, plus
asymmetric bands where the convention matters). The numbers were derived from the spec's formulas
by tests/helpers/naive_corrections.py, a naive scalar restatement of the preset table, and are pinned here: the
test checks the implementation against the pinned numbers and the reference against them too."""

from __future__ import annotations

import functools

import pytest
import torch

from runner.hydra_app import app as hydra_app
from runner.corrections import Correction, apply_correction
from runner.losses import LossSpec, policy_loss
from tests.helpers.naive_corrections import ppo_token_mean

GOLDEN = [
    ('none', None, None, 'padded-mixed', -0.3612356, [[-0.2210342, -0.1809675, -0.2210342, 0.0], [0.1146223, 0.147178, 0.0, 0.0]]),
    ('none', None, None, 'short-and-empty-rows', -0.0654475, [[0.0, -0.125, -0.0758163], [0.2853688, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('tis', 0.5, 5.0, 'padded-mixed', -1.2760532, [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]]),
    ('tis', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('icepop', 0.5, 5.0, 'padded-mixed', -0.2281934, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]]),
    ('icepop', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('seq-mask-tis', 0.5, 5.0, 'padded-mixed', -1.2760532, [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]]),
    ('seq-mask-tis', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('seq-tis', None, 5.0, 'padded-mixed', -3.0262731, [[-1.1051709, -0.9048374, -1.1051709, 0.0], [0.0389252, 0.049981, 0.0, 0.0]]),
    ('seq-tis', None, 5.0, 'short-and-empty-rows', 0.1670718, [[0.0, -0.1452293, -0.088086], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('seq-mis', 0.5, 2.0, 'padded-mixed', 0.0, [[-0.0, -0.0, -0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ('seq-mis', 0.5, 2.0, 'short-and-empty-rows', -0.4075904, [[0.0, -0.1452293, -0.088086], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('geo-mask', 0.999, 1.001, 'padded-mixed', 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ('geo-mask', 0.999, 1.001, 'short-and-empty-rows', 0.0, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('openrlhf-bc71bb1/tis', 0.5, 5.0, 'padded-mixed', -1.2760532, [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]]),
    ('openrlhf-bc71bb1/tis', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('openrlhf-bc71bb1/icepop', 0.5, 5.0, 'padded-mixed', -0.2281934, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]]),
    ('openrlhf-bc71bb1/icepop', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('openrlhf-bc71bb1/seq-mask-tis', 0.5, 5.0, 'padded-mixed', -1.6678502, [[-1.4778112, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]]),
    ('openrlhf-bc71bb1/seq-mask-tis', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('openrlhf-0.11/token-clip', 0.5, 5.0, 'padded-mixed', -1.2760532, [[-1.1051709, -0.134064, -0.2442806, 0.0], [0.0573112, 0.1501511, 0.0, 0.0]]),
    ('openrlhf-0.11/token-clip', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('openrlhf-0.11/token-mask', 0.5, 5.0, 'padded-mixed', -0.2281934, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]]),
    ('openrlhf-0.11/token-mask', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('openrlhf-0.11/seq-mask', 0.5, 5.0, 'padded-mixed', -1.6678502, [[-1.4778112, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]]),
    ('openrlhf-0.11/seq-mask', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('trl/token-truncate', None, 3.0, 'padded-mixed', -0.8531415, [[-0.6631026, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]]),
    ('trl/token-truncate', None, 3.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('trl/token-mask', None, 3.0, 'padded-mixed', -0.190039, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]]),
    ('trl/token-mask', None, 3.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('trl/sequence-truncate', None, 3.0, 'padded-mixed', -1.7802014, [[-0.6631026, -0.5429025, -0.6631026, 0.0], [0.0389252, 0.049981, 0.0, 0.0]]),
    ('trl/sequence-truncate', None, 3.0, 'short-and-empty-rows', 0.1670718, [[0.0, -0.1452293, -0.088086], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('trl/sequence-mask', None, 3.0, 'padded-mixed', 0.0889062, [[-0.0, -0.0, -0.0, 0.0], [0.0389252, 0.049981, 0.0, 0.0]]),
    ('trl/sequence-mask', None, 3.0, 'short-and-empty-rows', 0.1670718, [[0.0, -0.1452293, -0.088086], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/token-tis', None, 2.0, 'padded-mixed', -0.6321073, [[-0.4420684, -0.134064, -0.2442806, 0.0], [0.0381545, 0.1501511, 0.0, 0.0]]),
    ('verl/token-tis', None, 2.0, 'short-and-empty-rows', 0.1907194, [[0.0, -0.1687324, -0.0686015], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/seq-tis', None, 2.0, 'padded-mixed', -1.1571655, [[-0.4420684, -0.361935, -0.4420684, 0.0], [0.0389252, 0.049981, 0.0, 0.0]]),
    ('verl/seq-tis', None, 2.0, 'short-and-empty-rows', 0.1631472, [[0.0, -0.1452293, -0.088086], [0.5707377, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/icepop', 0.5, 5.0, 'padded-mixed', -0.2281934, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]]),
    ('verl/icepop', 0.5, 5.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/geo-rs', 0.999, 1.001, 'padded-mixed', 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ('verl/geo-rs', 0.999, 1.001, 'short-and-empty-rows', 0.0, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/seq-mis', 0.5, 2.0, 'padded-mixed', 0.0, [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ('verl/seq-mis', 0.5, 2.0, 'short-and-empty-rows', -0.5434539, [[0.0, -0.193639, -0.117448], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('geo-mask', 0.9, 1.8, 'padded-mixed', -1.0383931, [[-0.3683903, -0.3016125, -0.3683903, 0.0], [0.0, 0.0, 0.0, 0.0]]),
    ('geo-mask', 0.9, 1.8, 'short-and-empty-rows', -0.4677551, [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/geo-rs', 0.9, 1.8, 'padded-mixed', 0.6545006, [[0.0, 0.0, 0.0, 0.0], [0.2865558, 0.3679449, 0.0, 0.0]]),
    ('verl/geo-rs', 0.9, 1.8, 'short-and-empty-rows', -0.4677551, [[0.0, -0.1666667, -0.1010884], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('trl/token-mask', 0.5, 3.0, 'padded-mixed', -0.2281934, [[-0.0, -0.134064, -0.2442806, 0.0], [0.0, 0.1501511, 0.0, 0.0]]),
    ('trl/token-mask', 0.5, 3.0, 'short-and-empty-rows', 0.194644, [[0.0, -0.1687324, -0.0686015], [0.5746622, 0.0, 0.0], [0.0, 0.0, 0.0]]),
    ('verl/seq-mis', 0.5, 3.0, 'padded-mixed', 0.2222655, [[0.0, 0.0, 0.0, 0.0], [0.0973131, 0.1249524, 0.0, 0.0]]),
    ('verl/seq-mis', 0.5, 3.0, 'short-and-empty-rows', -0.5434539, [[0.0, -0.193639, -0.117448], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
]
CASES = {
 "padded-mixed": {
  "log_probs": [
   [
    -0.9,
    -1.6,
    -0.3,
    7.0
   ],
   [
    -2.2,
    -0.05,
    3.0,
    -9.0
   ]
  ],
  "old_log_probs": [
   [
    -1.0,
    -1.5,
    -0.4,
    2.0
   ],
   [
    -2.0,
    -0.1,
    -1.0,
    4.0
   ]
  ],
  "rollout_log_probs": [
   [
    -2.9,
    -1.2,
    -0.5,
    -6.0
   ],
   [
    -0.9,
    -0.12,
    5.0,
    -3.0
   ]
  ],
  "advantages": [
   [
    1.0,
    1.0,
    1.0,
    1.0
   ],
   [
    -0.7,
    -0.7,
    -0.7,
    -0.7
   ]
  ],
  "action_mask": [
   [
    1,
    1,
    1,
    0
   ],
   [
    1,
    1,
    0,
    0
   ]
  ]
 },
 "short-and-empty-rows": {
  "log_probs": [
   [
    -0.1,
    -1.0,
    -2.5
   ],
   [
    -0.25,
    5.0,
    0.0
   ],
   [
    2.0,
    2.0,
    2.0
   ]
  ],
  "old_log_probs": [
   [
    -0.5,
    -1.0,
    -2.0
   ],
   [
    -0.2,
    -0.3,
    -0.4
   ],
   [
    -1.0,
    -1.0,
    -1.0
   ]
  ],
  "rollout_log_probs": [
   [
    -0.45,
    -1.3,
    -1.9
   ],
   [
    -0.9,
    -0.3,
    -0.4
   ],
   [
    -1.0,
    -1.0,
    -1.0
   ]
  ],
  "advantages": [
   [
    0.5,
    0.5,
    0.5
   ],
   [
    -1.2,
    -1.2,
    -1.2
   ],
   [
    1.0,
    1.0,
    1.0
   ]
  ],
  "action_mask": [
   [
    1,
    1,
    1
   ],
   [
    1,
    0,
    0
   ],
   [
    0,
    0,
    0
   ]
  ]
 }
}


@functools.lru_cache(maxsize=None)
def _composed(name: str) -> Correction:
    """The preset as conf/ defines it, composed once per process (a Correction is frozen)."""
    return Correction.from_config(hydra_app.to_container(hydra_app.compose([f"correction={name}"]).correction))


def _preset(name, low, high) -> Correction:
    return _composed(name).with_band(low, high)


def _tensors(case):
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in case.items()}


@pytest.mark.parametrize("preset,low,high,case_name,loss,grad", GOLDEN,
                         ids=[f"{g[0]}[{g[1]},{g[2]}]:{g[3]}" for g in GOLDEN])
def test_golden(preset, low, high, case_name, loss, grad):
    t = _tensors(CASES[case_name])
    lp = t["log_probs"].clone().requires_grad_(True)
    out = policy_loss(LossSpec(), _preset(preset, low, high), lp, t["old_log_probs"], t["rollout_log_probs"],
                      t["advantages"], t["action_mask"])
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss, abs=1e-5)
    assert torch.allclose(lp.grad, torch.tensor(grad), atol=1e-5)
    # the reference restatement agrees with the pinned numbers (it is what derived them)
    ref_loss, ref_grad = ppo_token_mean(preset, CASES[case_name], low, high)
    assert ref_loss == pytest.approx(loss, abs=1e-6)
    assert torch.allclose(torch.tensor(ref_grad), torch.tensor(grad), atol=1e-6)


def test_golden_covers_every_preset():
    from runner import registry

    assert {g[0] for g in GOLDEN} == {e.name for e in registry.presets()}
    per_preset = {}
    for g in GOLDEN:
        per_preset[g[0]] = per_preset.get(g[0], 0) + 1
    assert min(per_preset.values()) >= 2


def test_padding_values_cannot_leak_into_our_presets():
    """NaN and inf at masked positions change nothing for our presets (they are sanitised first)."""
    t = _tensors(CASES["padded-mixed"])
    poisoned = {k: v.clone() for k, v in t.items()}
    pad = t["action_mask"] == 0
    for key, value in (("log_probs", float("nan")), ("old_log_probs", float("inf")),
                       ("rollout_log_probs", float("-inf")), ("advantages", float("nan"))):
        poisoned[key][pad] = value
    for name in ("tis", "icepop", "seq-mask-tis", "seq-tis", "seq-mis", "geo-mask"):
        corr = _preset(name, *{"seq-tis": (None, 5.0), "seq-mis": (0.5, 2.0), "geo-mask": (0.9, 1.8)}.get(name, (0.5, 5.0)))
        grads = []
        losses = []
        for tens in (t, poisoned):
            lp = tens["log_probs"].clone().requires_grad_(True)
            out = policy_loss(LossSpec(), corr, lp, tens["old_log_probs"], tens["rollout_log_probs"],
                              tens["advantages"], tens["action_mask"])
            out.loss.backward()
            losses.append(out.loss.item())
            grads.append(lp.grad)
        assert losses[0] == pytest.approx(losses[1], abs=0), name
        assert torch.equal(grads[0], grads[1]), name


def test_faithful_padding_multiplies_like_released_code():
    """OpenRLHF's masked mean multiplies by the mask: NaN padding leaks into the loss."""
    t = _tensors(CASES["padded-mixed"])
    t["log_probs"][t["action_mask"] == 0] = float("nan")
    out = policy_loss(LossSpec(), _preset("openrlhf-0.11/token-clip", 0.5, 5.0), t["log_probs"], t["old_log_probs"],
                      t["rollout_log_probs"], t["advantages"], t["action_mask"])
    assert torch.isnan(out.loss)


def test_veto_rejects_whole_sequence():
    t = _tensors(CASES["padded-mixed"])  # sequence 2 has ρ_t = e^-1.1 ≈ 0.333 on its first token
    corr = _preset("tis", 0.5, 5.0)
    from dataclasses import replace

    vetoed = replace(corr, veto=0.4)
    res = apply_correction(vetoed, t["old_log_probs"], t["rollout_log_probs"], t["action_mask"])
    assert res.coef[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert res.coef[0, :3].tolist() == pytest.approx([5.0, 0.7408182, 1.1051709], abs=1e-6)
    assert res.metrics["seq_masked_fraction"] == pytest.approx(0.5)
