"""`is-study replay PATH`: a framework's dumped training batches through every correction preset.

schema.py holds the common in-memory batch, one reader per file format reads into it (own.py, tokens_csv.py,
slime.py, nemo_rl.py, skyrl.py, prime_rl.py; safe_load.py is what the pickle-based ones load through),
evaluate.py runs the presets on one step, command.py writes the files. docs/replay.md is the user's page.
"""
