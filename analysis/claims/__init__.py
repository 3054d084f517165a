"""The literature's claims, checked on the shipped experiments (conf/experiment/<world>/<name>.yaml): a verdict and a
figure per claim. `scripts/figures.sh` runs the experiments and then `is-study claims`:

    is-study claims multirun/figures/tis-tames-mismatch --claim tis-tames-mismatch --out figures
    is-study claims --all multirun/figures --out figures     # every claim, and figures/VERDICTS.md

One module per claim, each read top to bottom:
  - a *reducer* from the experiment's output dir (via `analysis.load_dataset`) to a small tidy DataFrame (one
    row per run, per probe arm or per token);
  - a *rule*: a pure function of that frame returning a `Verdict` ("holds" | "does not hold" |
    "inconclusive" | "untestable here" when the claim's positive control failed, a one-line statement with the
    numbers and n, and the numbers themselves in `parts`). The rules
    were fixed before the experiments ran; each is written out in its docstring and in the experiment's
    header, and the tests pin each one on hand-made frames;
  - a *figure* (a matplotlib Figure, no pyplot), in the colours of `analysis.style`;
  - `evaluate(ds, style)`, all three in turn.

Shared by all of them: stats.py (the verdict words, mean ± SE, Student-t intervals and the paired effect test,
exact tests on collapse counts, survival curves and the log-rank test, the run summaries),
frames.py (dataset → frame helpers) and figures.py (panels, headline, legend). registry.py names the claims;
verdicts.py writes what `is-study claims` writes.

Nothing here tunes a world: a claim the synthetic world does not reproduce is reported as such.
"""
