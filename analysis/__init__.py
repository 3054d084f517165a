"""Analysis of is-study outputs: tidy tables (`load`), figures (`analysis.figures`) and Markdown
reports (`analysis.reports`). Reads only what the studies wrote; never imports torch.

    from analysis import load, load_dataset
    df = load("runs/2025-01-01/12-00-00-abc123")   # one row per optimizer update
    ds = load_dataset("multirun/ladder")           # .metrics .events .summary .probe .tokens .swept

pandas is imported on first use, matplotlib only by `analysis.figures` (and the claims).
"""

from analysis.load import Dataset, load, load_dataset

__all__ = ["Dataset", "load", "load_dataset"]
