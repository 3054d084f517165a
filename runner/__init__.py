"""is-study: an experiment runner for off-policy importance-sampling corrections.

Importing the package is cheap on purpose: torch, Hydra and matplotlib are imported only by the
modules that compute, so `is-study --help` and `is-study list` answer at once.
"""

__version__ = "0.1.0"
