"""The probe study's machinery (`is-study run study=probe`; the entry point is runner/studies/probe.py).

- settings.py   the `probe:` config section, validated into `ProbeSettings` and the list of arms
                (preset × band) before any file is written
- world.py      θ (initial or pretrained with the train study's Trainer), the stale engine policy
                θ' (k optimizer steps of exact-gradient drift), the exact ∇J(θ) and the batches
- estimator.py  every arm's gradient estimate of one batch: the vectorised fast path (one batched
                coefficient evaluation per preset over its bands, one scatter of all arms' weights
                into the score matrix) and the slow reference path (policy_loss + backward per arm)
- stats.py      bias, CI, variance, MSE, cosine, ... over the R repeats, all arms at once
"""
