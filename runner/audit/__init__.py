"""`is-study audit`: find correction bugs automatically, in our presets and in external code.

Seven invariants (runner/audit/invariants.py) are checked on every preset, under `loss=ppo` and
`loss=reinforce`, first on hand-written cases and then by a property-based search with hypothesis
(runner/audit/generators.py), always derandomized, so two runs give the same table. Besides them:

- the all-masked check (runner/audit/all_masked.py): a batch with no token must give a finite
  result or an allowed refusal; such batches never reach the invariants;
- exceptions (runner/audit/crashes.py): each distinct one is a single finding, with its type,
  message and the file:line that raised it;
- the reference (runner/audit/reference.py, `--reference correction=PRESET`): differential testing
  against one of our presets on ordinary inputs.

A failure is shrunk (hypothesis, then a greedy row/column pass), always keeping its kind, and saved
as a case file that `is-study case` replays (runner/audit/counterexamples.py). The orchestration
and the JSON live in runner/audit/command.py, the table in runner/audit/table.py. Inputs follow a profile: `adversarial` (default) or `realistic`.

External code (`--target`, runner/audit/external.py):

- `--target module:attr` imports a module (the current directory is on sys.path, so
  `tests.helpers.external_loss_planted_bug:PlantedLoss` works from the repo root); `--target
  path/to/file.py:attr` loads a file without running its package's `__init__` (runner/audit/
  loading.py), and `--stub NAME,...` replaces heavy imports the loss never uses. `attr` may be
  dotted.
- A class is constructed once as `attr(**target_kwargs)`; a function gets the kwargs added.
  `--target-kwargs`, `--call-kwargs` and `--weights-kwargs` are JSON objects; a value
  `{"_target_": "pkg.Class", ...}` is built with Hydra's instantiate.
- It is called under a convention (runner/audit/conventions.py): `openrlhf` (default)
  `loss_fn(log_probs, old_log_probs, advantages, action_mask=..., rollout_log_probs=...)`, or
  `verl`, `trl`, `plain`; `--arg-map` renames single roles and `--loss-key` picks the loss out of
  a tuple or dict. Tensors are [B, T], float32, or float64 for the checks that say so; the
  gradient is taken with respect to the log-probs under π_θ.
- `--weights-fn` names a function that turns (old, roll, mask) into the correction's coefficients
  (and optionally a keep mask): fed to the target as its `weights` role, or, without a target,
  composed with our losses. With it, invariant 2 reads the keep mask (a weight of exactly 0 is a
  rejection) and invariant 3 checks the coefficients against `--band LOW,HIGH`.

Without a weights function, invariant 3 is n/a, and invariant 2 calls a unit rejected when the
target gives it exactly zero gradient in float64 (where ratios up to e^709 are finite) while plain
PPO does not (so a token PPO's clip silenced is not taken for one); the same input in float32 must
then give it zero too, not 0·inf. For invariant 5 the target's loss is compared with our `none`
preset under the reduction it is found to use on a calibration batch.
"""

from __future__ import annotations
