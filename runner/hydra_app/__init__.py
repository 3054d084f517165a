"""Every touch of Hydra's and OmegaConf's internals, split by job:

  app.py        initialise Hydra (a context manager, never at import time, never @hydra.main), compose,
                one run, and Hydra's/OmegaConf's exceptions turned into one-line UserErrors
  overrides.py  override strings: quoting a value, parsing a job's overrides with Hydra's grammar
  launch.py     `is-study sweep`'s multirun: expanding the jobs, the dry run's validation, launching
  sweeper.py    the project's Hydra sweeper: BasicSweeper's jobs, each composed once (hydra/sweeper=is-study)
  worker.py     the task function every sweep job runs, and the tuning of a launcher's worker process
  launchers.py  the plugins' launcher configs, registered again under the names our presets extend
  job_config.py values of a finished job's saved config, resolved (for aggregation)

Nothing outside this package imports hydra; importing the package itself imports nothing.
"""
