"""`is-study audit`: find correction bugs automatically, in our presets and in external losses.

Seven invariants (runner/audit/invariants.py) are checked on every preset, under `loss=ppo` and
`loss=reinforce`, first on hand-written adversarial cases and then by a property-based search with
hypothesis (runner/audit/generators.py), always derandomized, so two runs give the same table. A
failure is shrunk (hypothesis, then a greedy row/column pass) and saved as a case file that
`is-study case` reads. The orchestration, the table and the JSON live in runner/studies/audit.py.

External implementations (`is-study audit --target module:attr [--target-kwargs JSON]`) follow
OpenRLHF's PolicyLoss convention:

- `module:attr` names a class or a function. `module` is imported with the current directory on
  sys.path (so `tests.external_loss_planted_bug:PlantedLoss` works from the repo root); `attr` may
  be dotted (`module:Outer.Inner`).
- A class is constructed once as `attr(**kwargs)`; a function is called with the kwargs added as
  keyword arguments. `--target-kwargs` is a JSON object (default `{}`).
- It is called as `loss_fn(log_probs, old_log_probs, advantages, action_mask=...,
  rollout_log_probs=...)` with [B, T] tensors: `log_probs` (π_θ, requires grad), `old_log_probs`
  (π_old), `advantages`, `action_mask` (0/1 in the same float dtype), `rollout_log_probs`
  (π_rollout). Tensors are float32, or float64 for the checks that say so (6 and 7, and the
  float64 reference of 2).
- It returns the scalar loss, or a tuple/list whose first item is the loss (OpenRLHF returns
  `(loss, clip_ratio, ppo_kl, vllm_kl)`). The gradient is taken with `loss.backward()`.

Invariants that need our coefficients (3, and the "coefficient 1" half of 5) are n/a for an
external target. For 5 its loss is compared with our `none` preset under the reduction the target
is found to use on a calibration batch (token-mean, seq-mean-token-mean or seq-mean-token-sum).
For 2 a unit counts as rejected when the target gives it exactly zero gradient in float64, where
ratios up to e^709 are finite; the same input in float32 must then give it zero too, not 0·inf.
"""

from __future__ import annotations
