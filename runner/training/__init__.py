"""The training library: everything a study needs to train a policy in any world, and no I/O.

    config.py      the validated run: world, task, engine mismatch, correction, loss, train.*
    advantages.py  GRPO and leave-one-out advantages over groups of responses to one prompt
    optim.py       Adam / SGD over a dict of parameter tensors
    faults.py      what a NaN/inf does (train.on_nonfinite) and when a run has collapsed
    loop.py        Trainer.step(): sample, recompute `old`, correct, update; returns a record of tensors

The train study (runner/studies/train.py) turns the records into metrics.csv, events.csv,
tokens.csv and summary.json; the probe study uses the same Trainer to pretrain θ.
"""
