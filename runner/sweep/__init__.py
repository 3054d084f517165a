"""`is-study sweep`: a grid of runs, resumable, with one sweep.csv.

command (what the command does: launch, progress, resume), job (one job's resume and failure
isolation), aggregate (sweep.csv from the jobs' dirs), locks (one writer per directory: the sweep's
and each job's lock) and integrity (is a run dir whole, before a sweep counts it). Hydra-free: the launch goes
through runner/hydra_app/.
"""
