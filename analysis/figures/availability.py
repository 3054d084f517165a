"""Which figure kinds a dataset allows: for each kind, None when it can be drawn, else the reason it
cannot (no metrics, one staleness value, no probe, ...), and for the drawable ones the reason they
would show only flat lines (left out of `is-study plot`'s default choice, drawn when named).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from analysis.figures.collapse import job_lengths
from analysis.figures.threshold_training import band_frame
from analysis.figures.training import FLAT_FRACTION
from analysis.load import Dataset, fmt_value
from analysis.tables import per_job, update_rows


# ----------------------------------------------------------------------------------------- the base kinds
def _need_metrics(ds: Dataset, cols: Sequence[str]) -> str | None:
    df = ds.metrics
    if df is None:
        return "no training metrics here (metrics.csv / sweep.csv): it is not a train run or sweep"
    missing = [c for c in cols if c not in df.columns]
    if missing:
        return f"the metrics lack {', '.join(missing)} (log.metrics=false?)"
    return None


def _bands_per_preset(pr) -> object:
    """Distinct upper thresholds per preset and facet-free (a sweep of probes: per job)."""
    return pr.dropna(subset=["high"]).groupby(["job", "preset"])["high"].nunique()


def base_availability(ds: Dataset) -> dict[str, str | None]:
    """kind -> None when the figure can be drawn from `ds`, else the reason it cannot."""
    out: dict[str, str | None] = {}
    out["training"] = _need_metrics(ds, ("step", "objective", "reward"))
    out["grad-norm"] = _need_metrics(ds, ("step", "grad_norm"))
    out["masking"] = _need_metrics(ds, ("step", "token_masked_fraction", "clamped_fraction", "ess"))
    reason = _need_metrics(ds, ("staleness", "nonfinite_loss", "nonfinite_grad"))
    if reason is None and ds.metrics["staleness"].nunique() < 2:
        reason = (
            f"needs runs at ≥ 2 staleness values (a sweep over mismatch.staleness); "
            f"{ds.path} has only k={fmt_value(ds.metrics['staleness'].iloc[0])}"
        )
    out["stability"] = reason
    pr = ds.probe
    if pr is None:
        out["threshold"] = out["presets"] = "no probe results here (probe.csv): run `is-study run study=probe`"
        if ds.metrics is not None:
            out["threshold"] += " (training runs against the band: --kind threshold-training)"
    elif not {"preset", "bias_norm"} <= set(pr.columns):
        out["threshold"] = out["presets"] = "probe.csv lacks preset / bias_norm"
    else:
        rows = pr.groupby(["job", "preset"]).size()
        out["presets"] = (
            None
            if len(rows) and rows.max() == 1
            else ("some preset was probed at several bands in one run: see --kind threshold")
        )
        highs = _bands_per_preset(pr) if "high" in pr.columns else None
        out["threshold"] = (
            None
            if highs is not None and len(highs) and highs.max() >= 2
            else (
                "needs several upper thresholds per preset (probe.bands with several [low, high] pairs); "
                "one band per preset: see --kind presets"
            )
        )
    out["mismatch"] = (
        None
        if ds.tokens is not None
        else ("no tokens.csv here (per-token trainer and rollout log-probs, written by the train study)")
    )
    return out


def base_flat_reasons(ds: Dataset, avail: dict[str, str | None]) -> dict[str, str]:
    """kind -> why, for the kinds that can be drawn (`avail`) but would show only flat lines: left out
    of the default choice with that reason, drawn when asked for by name."""
    out = {}
    if avail.get("masking") is None:
        df = update_rows(ds.metrics)  # the final row (J after the last update) has no weights
        per = df.groupby(["job", "step"]).agg(
            masked=("token_masked_fraction", "mean"),
            clamped=("clamped_fraction", "mean"),
            ess=("ess", "mean"),
            bad=("is_weight_mean", lambda v: bool((~np.isfinite(v.astype(float))).any()))
            if "is_weight_mean" in df.columns
            else ("ess", lambda v: False),
        )
        if (
            per["masked"].fillna(0).max() <= FLAT_FRACTION
            and per["clamped"].fillna(0).max() <= FLAT_FRACTION
            and per["ess"].min() >= 1 - FLAT_FRACTION
            and not per["bad"].any()
        ):
            out["masking"] = (
                f"flat in every run: masked and clamped fractions ≤ {FLAT_FRACTION:g}, ESS ≥ "
                f"{per['ess'].min():.3g} in every step (--kind masking draws it anyway)"
            )
    if avail.get("stability") is None:
        per = per_job(ds)
        if per["nonfinite"].fillna(0).eq(0).all() and per["collapsed"].fillna(0).eq(0).all():
            out["stability"] = (
                f"no NaN/inf update and no collapse in any of the {len(per)} runs: every line "
                "would be flat at 0 (--kind stability draws it anyway)"
            )
    return out


# ----------------------------------------------------------------------------------------- the field's kinds
def field_availability(ds: Dataset, base: dict[str, str | None]) -> dict[str, str | None]:
    """kind -> None when it can be drawn, else the reason (base: base_availability's answers)."""
    out: dict[str, str | None] = {}
    df = ds.metrics
    out["mismatch-over-training"] = base["training"]
    if out["mismatch-over-training"] is None:
        missing = [c for c in ("kl_k3", "max_abs_prob_diff", "entropy", "precision") if c not in df.columns]
        if missing:
            out["mismatch-over-training"] = f"the metrics lack {', '.join(missing)} (log.metrics=false?)"
    out["survival"] = _survival_reason(ds, base["training"])
    out["length-heatmap"] = base["training"] or _lengths_reason(ds)
    out["dose-response"] = out["length-heatmap"] or (
        None if "kl_k3" in df.columns else "the metrics lack kl_k3 (log.metrics=false?)"
    )
    out["bias-split"] = _bias_split_reason(ds)
    out["threshold-training"] = _band_reason(ds, base["training"])
    return out


def _survival_reason(ds: Dataset, base: str | None) -> str | None:
    if base is not None:
        return base
    summaries = [j.summary for j in ds.jobs]
    if not summaries or any(s is None or "collapsed" not in s for s in summaries):
        return "needs every run's summary.json (collapsed, collapse_step): an unfinished or older run lacks it"
    if len(summaries) < 2 and not any(s["collapsed"] for s in summaries):
        return "one run that did not collapse: a survival curve needs a sweep (several seeds) or a collapse"
    return None


def field_flat_reasons(ds: Dataset, avail: dict[str, str | None]) -> dict[str, str]:
    """kind -> why, for the field's kinds that can be drawn but would show only flat lines."""
    out = {}
    if avail.get("survival") is None:
        summaries = [j.summary for j in ds.jobs]
        if not any(s["collapsed"] for s in summaries):
            out["survival"] = (
                f"no run collapsed (of {len(summaries)}): every survival line would be flat at 1 "
                "(--kind survival draws it anyway)"
            )
    return out


def _lengths_reason(ds: Dataset) -> str | None:
    lengths = set(job_lengths(ds).values())
    if len(lengths) < 2:
        return (
            "needs train runs at ≥ 2 response lengths (a sweep over rollout.seq_len); "
            f"{ds.path} has {'T=' + fmt_value(lengths.pop()) if lengths else 'no rollout.seq_len'}"
        )
    return None


def _bias_split_reason(ds: Dataset) -> str | None:
    pr = ds.probe
    if pr is None:
        return "no probe results here (probe.csv): run a probe sweep over rollout.seq_len"
    missing = [c for c in ("preset", "seq_len", "cosine", "norm_ratio") if c not in pr.columns]
    if missing:
        return f"probe.csv lacks {', '.join(missing)} (written before the probe logged them)"
    if pr["seq_len"].nunique() < 2:
        return (
            f"needs probes at ≥ 2 response lengths (e.g. `is-study sweep experiment=bigram/bias-variance-by-level`); "
            f"{ds.path} has only T={fmt_value(pr['seq_len'].iloc[0])}"
        )
    if pr.groupby(["job", "preset"]).size().max() > 1:
        return "some preset was probed at several bands in one run: one band per preset, please (see --kind threshold)"
    return None


def _band_reason(ds: Dataset, base: str | None) -> str | None:
    if base is not None:
        return base
    per = band_frame(ds)
    if per[["low", "high"]].isna().all().all():
        return "the runs record no correction.low / correction.high (a correction without a band)"
    bands = per.groupby("correction")[["low", "high"]].apply(lambda g: len(g.drop_duplicates()))
    if not len(bands) or bands.max() < 2:
        return (
            "needs train runs at ≥ 2 bands of one correction (a sweep over correction.high, correction.low or "
            "an experiment's band key, e.g. experiment=bigram/threshold-tradeoff)"
        )
    return None


def availability(ds: Dataset, flat: bool = True) -> dict[str, str | None]:
    """kind -> None when the figure can be drawn from `ds`, else the reason it cannot (or, with
    `flat`, the reason it would show nothing: every line flat, e.g. no run collapsed)."""
    out = base_availability(ds)
    out.update(field_availability(ds, out))
    if flat:
        out.update(base_flat_reasons(ds, out))
        out.update(field_flat_reasons(ds, out))
    return out
