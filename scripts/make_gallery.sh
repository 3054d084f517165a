#!/usr/bin/env bash
# bash scripts/make_gallery.sh [--transformer]   (about 4 minutes on 2 idle cores; +4 with --transformer)
#
# Regenerates docs/gallery/*.png and docs/gallery.md from real data: a small sweep (the shipped
# staleness-ladder experiment with the as-shipped OpenRLHF seq-mask-tis added: 5 corrections × 4
# staleness values × 2 seeds = 40 jobs of 60 steps, 1% of rollout log-probs 1000 nats off), the
# default probe (all 22 presets at their own bands) and a threshold probe (4 presets × 9 upper
# thresholds at staleness 16); for the field's figures, a collapse sweep (4 corrections × response
# length 8, 16, 32 × 4 seeds, staleness 8, 1 in 20,000 rollout log-probs 1000 nats off with NaN/inf
# updates applied), an mlp sweep over the engine's precision (bf16, fp16, fp8 × 2 seeds, 100 steps,
# no staleness) and the shipped bias-variance-by-level probe (T = 2 … 64). Every figure kind in both
# styles, PNG only (quantised to 256 colours to keep the repository small), plus the reports'
# verdicts. The claims' figures are figures/*.png, written by scripts/figures.sh; this page links them.
#
# --transformer also (re)draws the transformer world's figures (docs/gallery/transformer-*.png) from
# a default-size sweep, `is-study sweep policy=transformer mismatch.precision=bf16,fp16
# mismatch.staleness=0 log.tokens_every=20` (2 runs of 200 steps, ~4 minutes on 2 cores with the
# SFT warm start cached; a finished sweep in $GALLERY_WORK/transformer is reused). Without it those
# figures and their paragraph are kept as they are.
#
#   GALLERY_WORK=/tmp/g bash scripts/make_gallery.sh   # keep the runs (default: a temp dir, removed)
#   GALLERY_WORK=/tmp/g bash scripts/make_gallery.sh --reuse   # redraw figures and page from the kept runs
set -euo pipefail
TRANSFORMER=0
REUSE=0
for arg in "$@"; do
  case "$arg" in
    --transformer) TRANSFORMER=1 ;;
    --reuse) REUSE=1 ;;
    *) echo "usage: bash scripts/make_gallery.sh [--transformer] [--reuse]" >&2; exit 2 ;;
  esac
done
if [ "$REUSE" = 1 ] && [ ! -f "${GALLERY_WORK:-/nonexistent}/field/sweep.csv" ]; then
  echo "make_gallery.sh: --reuse needs GALLERY_WORK pointing at the runs of an earlier run of this script" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python}
IS="$PY -m runner"
WORK=${GALLERY_WORK:-}
if [ -z "$WORK" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
fi
OUT="$REPO/docs/gallery"
mkdir -p "$OUT" "$WORK"

SWEEP_ARGS=(experiment=bigram/staleness-ladder
            "correction=none,tis,seq-mask-tis,seq-tis,openrlhf-bc71bb1/seq-mask-tis"
            "mismatch.staleness=0,2,8,16" "seed=range(0,2)")
PROBE_ARGS=(study=probe "probe.presets=[tis,icepop,seq-tis,seq-mask-tis]"
            "probe.bands=[[null,1.1],[null,1.25],[null,1.5],[null,2],[null,3],[null,5],[null,10],[null,30],[null,100]]"
            mismatch.staleness=16 rollout.seq_len=24 probe.batch_size=1024 probe.repeats=200)
DEFAULT_PROBE_ARGS=(study=probe)
FIELD_ARGS=("correction=tis,seq-mask-tis,seq-tis,openrlhf-bc71bb1/seq-mask-tis" "rollout.seq_len=8,16,32"
            mismatch.staleness=8 mismatch.outlier_rate=0.00005 train.on_nonfinite=apply "seed=range(0,4)"
            train.steps=60 log.tokens_every=0)
PRECISION_ARGS=(policy=mlp "mismatch.precision=bf16,fp16,fp8" mismatch.staleness=0 "seed=range(0,2)" train.steps=100)
LENGTH_PROBE_ARGS=(experiment=bigram/bias-variance-by-level)
TRANSFORMER_ARGS=(policy=transformer "mismatch.precision=bf16,fp16" mismatch.staleness=0 log.tokens_every=20)

if [ "$REUSE" = 0 ]; then
echo "== sweep (40 jobs)" >&2
rm -rf "$WORK/sweep"
$IS sweep "${SWEEP_ARGS[@]}" "hydra.sweep.dir=$WORK/sweep" >/dev/null
echo "== probes" >&2
rm -rf "$WORK/probe" "$WORK/probe-default"
$IS run "${PROBE_ARGS[@]}" log.quiet=true "hydra.run.dir=$WORK/probe" >/dev/null
$IS run "${DEFAULT_PROBE_ARGS[@]}" log.quiet=true "hydra.run.dir=$WORK/probe-default" >/dev/null
echo "== the field's figures: collapse sweep (48 jobs), mlp precision sweep (6 jobs), probe over T (6 jobs)" >&2
rm -rf "$WORK/field" "$WORK/precision" "$WORK/lengths"
$IS sweep "${FIELD_ARGS[@]}" log.quiet=true "hydra.sweep.dir=$WORK/field" >/dev/null
$IS sweep "${PRECISION_ARGS[@]}" log.quiet=true "hydra.sweep.dir=$WORK/precision" >/dev/null
$IS sweep "${LENGTH_PROBE_ARGS[@]}" log.quiet=true "hydra.sweep.dir=$WORK/lengths" >/dev/null
if [ "$TRANSFORMER" = 1 ]; then
  echo "== transformer world (2 runs of 200 steps)" >&2
  RESUME=()
  [ -f "$WORK/transformer/sweep.json" ] && RESUME=(--resume)
  $IS sweep "${TRANSFORMER_ARGS[@]}" "hydra.sweep.dir=$WORK/transformer" "${RESUME[@]}" >/dev/null
fi
fi

echo "== figures" >&2
rm -rf "$WORK/fig" "$WORK/fig-paper"
for style in default paper; do
  dir="$WORK/fig"
  [ "$style" = paper ] && dir="$WORK/fig-paper"
  $IS plot "$WORK/sweep" -k training,grad-norm,stability,masking,mismatch --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/probe" -k threshold --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/probe-default" -k presets --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/field" -k survival,length-heatmap --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/precision" -k mismatch-over-training --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/lengths" -k bias-split --style "$style" -o "$dir" >/dev/null
  if [ "$TRANSFORMER" = 1 ]; then
    $IS plot "$WORK/transformer" -k mismatch,mismatch-over-training,training --style "$style" -o "$dir/transformer" >/dev/null
  fi
done
$IS report "$WORK/sweep" --out "$WORK/report.md" >/dev/null
$IS report "$WORK/field" --out "$WORK/field-report.md" >/dev/null
$IS report "$WORK/precision" --out "$WORK/precision-report.md" >/dev/null
$IS report "$WORK/probe-default" --out "$WORK/probe-report.md" >/dev/null
$IS report openrlhf-seq-mask-tis correction=openrlhf-bc71bb1/seq-mask-tis --out "$WORK/card.md" >/dev/null
$IS report openrlhf-seq-mask-tis --out "$WORK/cards.md" >/dev/null

# The transformer world's figures are kept unless --transformer redrew them.
find "$OUT" -maxdepth 1 -name '*.png' ! -name 'transformer-*' -delete
for f in "$WORK"/fig/*.png; do cp "$f" "$OUT/"; done
for f in "$WORK"/fig-paper/*.png; do cp "$f" "$OUT/$(basename "$f" .png)-paper.png"; done
if [ "$TRANSFORMER" = 1 ]; then
  rm -f "$OUT"/transformer-*.png
  for f in "$WORK"/fig/transformer/*.png; do cp "$f" "$OUT/transformer-$(basename "$f")"; done
  for f in "$WORK"/fig-paper/transformer/*.png; do cp "$f" "$OUT/transformer-$(basename "$f" .png)-paper.png"; done
fi

FIGURES_SECONDS=$(sed -n 's/.*default size: \([0-9]*\) s measured on the 2-core machine.*/\1/p' scripts/figures.sh)

$PY - "$OUT" "$WORK" "${SWEEP_ARGS[*]}" "${PROBE_ARGS[*]}" "$FIGURES_SECONDS" "${FIELD_ARGS[*]}" \
    "${PRECISION_ARGS[*]}" "${LENGTH_PROBE_ARGS[*]}" "${TRANSFORMER_ARGS[*]}" "$TRANSFORMER" <<'EOF'
"""Quantise the PNGs and write docs/gallery.md."""
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

out, work = Path(sys.argv[1]), Path(sys.argv[2])
sweep_args, probe_args, figures_seconds, field_args, precision_args, length_args, transformer_args, redrawn = sys.argv[3:]
for png in sorted(out.glob("*.png")):
    if png.name.startswith("transformer-") and redrawn != "1":
        continue  # kept as they were (already quantised)
    with Image.open(png) as im:
        dpi = im.info.get("dpi", (150, 150))
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    q.save(png, optimize=True, dpi=dpi)


def section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0].strip()


verdict = section((work / "report.md").read_text(), "## Verdict")
probe_verdict = "\n".join(section((work / "probe-report.md").read_text(), "## Verdict").splitlines()[:4])
card = (work / "card.md").read_text()
card_verdict = card.split("\n", 2)[2].split("\n## ", 1)[0].strip()
cards = (work / "cards.md").read_text()
cards_table = cards.split("\n\n| preset", 1)[1].split("\n\n", 1)[0]
drop_field = section((work / "field-report.md").read_text(), "## Peak-to-final drop of J")
drop_precision = section((work / "precision-report.md").read_text(), "## Peak-to-final drop of J")


def sh(args: str) -> str:
    return " ".join(f"'{a}'" if re.search(r"[\[\](),]", a) else a for a in args.split(" "))


FIGS = [
    ("training", "Training curves",
     "Objective J(θ) (the exact expected reward) and the batch reward per step, one line per correction, mean ± 1 "
     "s.d. over seeds (shaded), one panel per staleness; the × marks under the data are updates with a NaN/inf loss "
     "or gradient. The as-shipped OpenRLHF seq-mask-tis (dashed) meets an outlier in every mini-batch, so every "
     "update is skipped and it never learns; the fixed seq-mask-tis learns like the others."),
    ("grad-norm", "Gradient-norm traces",
     "‖∇L‖ before clipping on a log scale: median over seeds, shaded min–max, open circles where an update's norm "
     "jumps above 5× its trailing median, ticks along the top edge where it is NaN/inf (here: every update of the "
     "as-shipped preset); an update whose gradient is exactly 0 (every token rejected; none here) would get a "
     "triangle on the bottom edge instead of a silent gap."),
    ("stability", "Stability against staleness",
     "Per correction and staleness k: the fraction of updates with a NaN/inf loss or gradient, and the fraction of "
     "seeds that collapsed by the relative rules of `train.collapse.*` (J 30% below its running peak for 20 steps, "
     "gradient-norm spikes, or NaN parameters); points are dodged sideways so that equal values stay visible. The "
     "title names the runs that never learned: they did not collapse either, and the collapse panel alone would "
     "call them stable."),
    ("masking", "Masking over time",
     "Fraction of tokens the correction rejected, fraction it clamped, and Kish's effective sample size as a "
     "fraction of the tokens, per step: seq-mask-tis drops the sequences that hold an outlier, tis clamps instead. "
     "Where the weights are NaN/inf the ESS is undefined: a gap, with × marks under the data (the as-shipped "
     "preset). A line that lies exactly on another carries markers, and the title says which (here the as-shipped "
     "and the fixed seq-mask-tis mask the same tokens)."),
    ("mismatch", "Training–inference mismatch",
     "From tokens.csv: the log-ratio log π_train − log π_rollout of every sampled token (grouped by staleness, on "
     "the staleness colour ramp, never a correction's colours), p_rollout against p_train, and |Δp| binned by "
     "token probability (median, 90th percentile dotted). Tokens beyond the histogram's range are drawn as "
     "triangles at its edges at their count, and the injected −1000-nat outliers are counted in the note: the "
     "mismatch grows with staleness."),
    ("presets", "Bias, variance and MSE per preset (the default probe)",
     "`is-study run study=probe` with its defaults: all 22 presets, each at its own band, 500 batches. The bias "
     "‖E ĝ − ∇J‖ with its 95% CI, the variance, and the MSE relative to ‖∇J‖² (1, dotted, is the MSE of a zero "
     "update). Every preset that learns has a relative MSE near 2: one batch's variance exceeds ‖∇J‖². geo-mask "
     "and verl/geo-rs mask 96% of the tokens (their ±0.1% band is narrower than bf16's rounding): their MSE is the "
     "lowest because they barely update, so they are drawn hollow and named degenerate, never best."),
    ("threshold", "Threshold trade-off (probe)",
     "The probe's exact bias (shaded: its 95% CI), variance and relative MSE of each correction's gradient "
     "estimate against the band's upper threshold; the star marks each preset's lowest relative MSE among the "
     "bands that are not degenerate (hollow points would be). Tight bands bias token TIS, loose ones cost "
     "sequence-level IS variance; tis and seq-mask-tis coincide here (the title says so)."),
]

old_gallery = (out.parent / "gallery.md").read_text() if (out.parent / "gallery.md").is_file() else ""


# ----------------------------------------------------------------------------------------- the field's figures
# Every number below is read off the runs just made, so the text cannot drift from the figures.
from analysis import load_dataset
from analysis.figures.collapse import job_lengths
from analysis.tables import per_job

BUG = "openrlhf-bc71bb1/seq-mask-tis"


def g2(v: float) -> str:
    return f"{v:.2g}"


def step_medians(ds, metric: str, how: str = "mean"):
    """precision -> per-step median over seeds of each run's per-step mean (max) of the metric."""
    m = ds.metrics
    per = m.groupby(["job", "step"]).agg(precision=("precision", "first"), v=(metric, how)).reset_index()
    return {p: g.groupby("step")["v"].median() for p, g in per.groupby("precision")}


def mot_text(ds, order, what: str) -> str:
    kl, ent = step_medians(ds, "kl_k3"), step_medians(ds, "entropy")
    order = [p for p in order if p in kl]
    tenth = max(len(kl[order[0]]) // 10, 1)
    start = ", ".join(f"{p} {g2(kl[p].iloc[0])}" for p in order)
    head = {p: kl[p].iloc[:tenth].mean() for p in order}
    tail = {p: kl[p].iloc[-tenth:].mean() for p in order}
    rise = {p: tail[p] / head[p] for p in order}
    e0 = min(ent[p].iloc[0] for p in order)
    e1 = sorted({f"{ent[p].iloc[-tenth:].mean():.2f}" for p in order}, key=float)
    e1 = [e1[0], e1[-1]] if len(e1) > 1 else e1
    grows = min(rise.values()) >= 2
    chi = ds.metrics.groupby("precision")["chi2_token"].apply(lambda c: float((c < 0).mean()))
    noisy = [p for p in order if chi.get(p, 0) > 0.2]
    return (f"{what} mean kl_k3 per token at step 0: {start}; over the first and last {tenth} steps: "
            + ", ".join(f"{p} {g2(head[p])} → {g2(tail[p])} ({rise[p]:.1f}×)" for p in order)
            + f", while the entropy falls from {e0:.2f} to {'–'.join(e1)} nats: "
            + ("the mismatch grows as the policy sharpens, and the precisions keep their order throughout. "
               if grows else "the precisions keep their order, but the mismatch does not grow (the policy barely "
               "sharpens). ")
            + (f"χ² per token is negative in {', '.join(f'{100 * chi[p]:.0f}%' for p in noisy)} of the "
               f"{'/'.join(noisy)} updates: at that size its sampling noise exceeds it, and its panel is symlog."
               if noisy else ""))


precision_ds = load_dataset(work / "precision")
MOT_TEXT = mot_text(precision_ds, ["fp16", "bf16", "fp8"],
                    "In the mlp world (100 steps, 2 seeds each, median over seeds), the precisions sit decades apart:")

field_ds = load_dataset(work / "field")
fper = per_job(field_ds)
fper["T"] = fper["job"].map(job_lengths(field_ds))
bug = fper[fper["correction"] == BUG]
others = fper[fper["correction"] != BUG]
cstep = bug[bug["collapsed"] == 1].groupby("T")["collapse_step"].apply(lambda s: s.astype(float).median())
ccount = bug.groupby("T")["collapsed"].agg(["sum", "size"])
# The lead–lag: ESS and grad norm of each collapsed run in the 20 steps before its collapse step.
m = field_ds.metrics
ess_pre, gn_ratio = [], []
for _, r in bug[bug["collapsed"] == 1].iterrows():
    rows = m[(m["job"] == r["job"]) & (m["step"] < r["collapse_step"]) & (m["step"] >= r["collapse_step"] - 20)]
    ess_pre += list(rows["ess"].dropna())
    late = rows[rows["step"] >= r["collapse_step"] - 5]["grad_norm"]
    early = rows[rows["step"] < r["collapse_step"] - 5]["grad_norm"]
    if len(late) and len(early):
        gn_ratio.append(float(late.max() / early.median()))
nan_update = sum(bool(((m["job"] == r["job"]) & (m["step"] == int(r["collapse_step"]))
                        & (m["nonfinite_grad"] == 1)).any()) for _, r in bug[bug["collapsed"] == 1].iterrows())
reasons = bug.loc[bug["collapsed"] == 1, "collapse_reason"].astype(str)
all_nan = reasons.str.startswith("non-finite parameters").all()
SURVIVAL_TEXT = (
    "Kaplan–Meier: the fraction of seeds not yet collapsed (summary.json's `collapse_step`, by the relative rules "
    "of `train.collapse.*`) against step, one line per correction, one panel per response length; each legend "
    "label counts its collapses. Beneath, the lead–lag: ESS and gradient norm aligned on each collapse step "
    "(median over a correction's collapsed seeds, each seed thin), NaN/inf gradients ticked on the top edge. "
    f"Here only the as-shipped OpenRLHF preset collapses, {int(bug['collapsed'].sum())} of {len(bug)} runs"
    + (", all by NaN parameters" if all_nan else "")
    + ", more of them at longer T (outliers come per token: a longer response is likelier to hold one): "
    + ", ".join(f"T = {int(T)}: {int(ccount.loc[T, 'sum'])}/{int(ccount.loc[T, 'size'])}, median step "
                f"{cstep.get(T, float('nan')):.0f}" for T in ccount.index)
    + f"; tis, seq-mask-tis and seq-tis: {int(others['collapsed'].sum())} of {len(others)}. The lead–lag gives no "
    f"warning: in the 20 steps before, the ESS stays at {min(ess_pre):.2f}–{max(ess_pre):.2f} and the largest "
    f"gradient norm of the last 5 steps is {min(gn_ratio):.1f}–{max(gn_ratio):.1f}× the median of the 15 before; "
    + (f"{nan_update} of the {int(bug['collapsed'].sum())} collapse steps hold an update whose loss and gradient "
       "are NaN/inf (the seed bug's unclamped weight on a −1000-nat outlier, applied by "
       "`train.on_nonfinite=apply`): a single step, not a drift.")
)
fin = fper[fper["nonfinite_params"] != 1].groupby(["correction", "T"])["final_objective"].mean()
Ts = sorted(fper["T"].unique())
HEATMAP_TEXT = (
    "The same sweep as a grid: response length T × correction, coloured by the final J (mean over the seeds whose "
    "parameters stayed finite; NaN where none did, ‡ where only some did) and by the fraction of seeds that "
    "collapsed, with collapsed/seeds written in each cell. J's scale changes with T (the task does), so compare "
    "within a column. seq-tis's final J falls with T ("
    + ", ".join(f"{fin[('seq-tis', T)]:.2f}" for T in Ts) + " at T = " + ", ".join(f"{int(T)}" for T in Ts)
    + ") while tis stays at " + "–".join(f"{v:.2f}" for v in (min(fin['tis']), max(fin['tis'])))
    + ": its clamped sequence weight min(ρ_seq, 5) shrinks the update more as T grows (bias-split below shows the "
    "same shrinkage in the probe); the as-shipped preset's collapse rate is "
    + ", ".join(f"{int(ccount.loc[T, 'sum'])}/{int(ccount.loc[T, 'size'])}" for T in Ts) + "."
)
pr = pd.concat([pd.read_csv(p) for p in sorted((work / "lengths").glob("*/probe.csv"))])
pr = pr.set_index(["preset", "seq_len"])
lo_T, hi_T = int(pr.index.get_level_values(1).min()), int(pr.index.get_level_values(1).max())


def at(preset, T, col):
    return float(pr.loc[(preset, T), col])


def signed(v: float) -> str:
    return f"{v:.2f}".replace("-", "−")


geo_rej = float(pr.xs("geo-mask", level=0)["mean_masked_fraction"].min())
BIAS_TEXT = (
    "A probe sweep over the response length: for each arm the direction of its mean gradient (the cosine of E ĝ to "
    "the exact ∇J), its size (‖E ĝ‖ / ‖∇J‖) and the relative bias ‖E ĝ − ∇J‖ / ‖∇J‖ with its 95% CI, against T "
    "(log 2 axis). A shrunken gradient is not a wrong one, and the split tells them apart: at T = "
    f"{hi_T} seq-tis shrinks to {at('seq-tis', hi_T, 'norm_ratio'):.2f} of ∇J with a cosine of "
    f"{at('seq-tis', hi_T, 'cosine'):.2f}, whereas seq-mis's mean gradient turns away from ∇J (cosine "
    f"{signed(at('seq-mis', lo_T, 'cosine'))} at T = {lo_T}, {signed(at('seq-mis', hi_T, 'cosine'))} at T = {hi_T}; size "
    f"{at('seq-mis', hi_T, 'norm_ratio'):.2f}); untruncated token IS stays on course (cosine "
    f"{at('token-is', hi_T, 'cosine'):.2f}, size {at('token-is', hi_T, 'norm_ratio'):.2f}) and sequence IS "
    f"overshoots (size {at('seq-is', hi_T, 'norm_ratio'):.2f}). geo-mask is hollow at every T: its [0.999, 1.001] "
    "band" f" rejects ≥ {100 * geo_rej:.0f}% of the tokens at this mismatch (4 steps stale in bf16), so its mean "
    f"gradient is about 0 (size ≤ {float(pr.xs('geo-mask', level=0)['norm_ratio'].max()):.2f} of ∇J) and its "
    "cosine says little: a degenerate arm."
)

FIELD_FIGS = [
    ("mismatch-over-training", "Mismatch over training",
     [f"is-study sweep {sh(precision_args)}", "is-study plot multirun/NAME --kind mismatch-over-training"],
     "kl_k3, χ² per token, max|Δp| and the policy's entropy against step, one line per engine precision (median "
     "over seeds, min–max shaded; a run longer than 40 steps is drawn as a centred mean over ~n/20 steps, the "
     "per-step values faint beneath): the analogue of Qi et al. 2025, Fig. 3. " + MOT_TEXT),
    ("survival", "Survival: seeds not yet collapsed",
     [f"is-study sweep {sh(field_args)}", "is-study plot multirun/NAME --kind survival"], SURVIVAL_TEXT),
    ("length-heatmap", "Response length × correction",
     ["is-study plot multirun/NAME --kind length-heatmap   # the survival figure's sweep"], HEATMAP_TEXT),
    ("bias-split", "Bias split into direction and size",
     [f"is-study sweep {sh(length_args)}", "is-study plot multirun/NAME --kind bias-split"], BIAS_TEXT),
]

TRANSFORMER_SECTION = None
if redrawn == "1":
    tds = load_dataset(work / "transformer")
    tper = per_job(tds)
    j = ", ".join(f"{r['precision']} {r['initial_objective']:.2f} → {r['final_objective']:.2f} (peak "
                  f"{r['best_objective']:.2f})" for _, r in tper.sort_values("precision", key=lambda s: s.map(
                      {"fp16": 0, "bf16": 1, "fp8": 2})).iterrows())
    se = tds.metrics["objective_se"].dropna().mean()
    cmd = [f"is-study sweep {sh(transformer_args)}",
           "is-study plot multirun/NAME --kind mismatch,mismatch-over-training,training"]
    text = ("The transformer world's signature, drawn by the same kinds from a default-size sweep (2 runs of 200 "
            "steps from the cached SFT warm start, one seed each: ~4 minutes on 2 cores). "
            + mot_text(tds, ["fp16", "bf16"], "Here too the precisions sit apart:")
            + f" J (Monte Carlo, s.e. ≈ {se:.3f} per evaluation): {j}.")
    body = [text, "", "```bash", *cmd, "```", ""]
    for name, title in (("mismatch-over-training", "mismatch over training"), ("mismatch", "the mismatch"),
                        ("training", "training curves")):
        body += [f"![Transformer world: {title}](gallery/transformer-{name}.png)", "",
                 f"![Transformer world: {title}, paper style](gallery/transformer-{name}-paper.png)", ""]
    TRANSFORMER_SECTION = "\n".join(["## The transformer world", "", *body])
elif old_gallery and "\n## The transformer world" in old_gallery:  # kept as drawn last time
    TRANSFORMER_SECTION = "## The transformer world" + old_gallery.split("\n## The transformer world", 1)[1].split("\n## ", 1)[0].rstrip() + "\n"

lines = [
    "# Figure gallery",
    "",
    "Every figure kind that `is-study plot` draws, from real data, in both styles, regenerated by "
    "[`scripts/make_gallery.sh`](../scripts/make_gallery.sh). Every figure is written as PNG (150 dpi) and PDF; the "
    "same correction has the same colour and line style in every figure (Okabe–Ito for our presets, Paul Tol's "
    "muted palette with one line style per framework for the faithful reproductions); staleness and the other "
    "dimensions have colour ramps of their own. `--style paper` gives figures one column (3.3 in) or two columns "
    "(7 in) wide with at most three rows of panels, STIX (Times) text and Type 42 fonts in the PDF; their title keeps "
    "only what is needed to read the panels, and the config goes into the files' metadata.",
    "",
    "The data:",
    "",
    "```bash",
    f"is-study sweep {sh(sweep_args)}",
    "is-study run study=probe",
    f"is-study run {sh(probe_args)}",
    "is-study plot multirun/NAME            # training, grad-norm, stability, masking, mismatch",
    "is-study plot runs/PROBE               # presets (one band each) or threshold (several bands)",
    "is-study plot multirun/NAME --style paper",
    "is-study report multirun/NAME          # Markdown: verdict, command, config diff, table, figures",
    "```",
    "",
    "The field's figures (mismatch over training, survival, the length heatmap, the bias split), the transformer "
    "world's and the report's peak-to-final table come from runs of their own: each section gives its command.",
    "",
]
for name, title, text in FIGS:
    lines += [f"## {title}", "", text, "", f"![{title}](gallery/{name}.png)", "",
              f"With `--style paper`:", "", f"![{title}, paper style](gallery/{name}-paper.png)", ""]
for name, title, cmds, text in FIELD_FIGS:
    lines += [f"## {title}", "", text, "", "```bash", *cmds, "```", "", f"![{title}](gallery/{name}.png)", "",
              f"With `--style paper`:", "", f"![{title}, paper style](gallery/{name}-paper.png)", ""]
if TRANSFORMER_SECTION:
    lines += [TRANSFORMER_SECTION]
lines += [
    "## The reports' verdicts",
    "",
    "`is-study report multirun/NAME` opens with one line per correction:",
    "",
    verdict,
    "",
    "`is-study report runs/PROBE` on the default probe opens with the best arm that learns and flags the "
    "degenerate ones (the first lines):",
    "",
    probe_verdict,
    "",
    "`is-study report openrlhf-seq-mask-tis correction=openrlhf-bc71bb1/seq-mask-tis` turns the seed bug's "
    "case file into a repro card (inputs, expected vs actual, the invariant that broke):",
    "",
    "> " + card_verdict.replace("\n\n", "\n>\n> ").replace("\n", "\n> ").replace("> >", ">"),
    "",
    "and without `correction=` it covers every preset of the file's `expect:` list "
    "(`openrlhf-seq-mask-tis-report.md`):",
    "",
    "| preset" + cards_table,
    "",
    "### Peak-to-final drop of J",
    "",
    "`is-study report multirun/NAME` on a train sweep over precision, staleness or correction adds a table: "
    "precision × staleness × correction (× any other swept key) → the drop from J's peak to its final value, mean ± "
    "s.d. over seeds, the worst seed, and the runs that ended with NaN parameters counted apart (they have no "
    "final J). On the survival figure's sweep:",
    "",
    drop_field,
    "",
    "On the mlp precision sweep (the mismatch-over-training figure's), where J is exact:",
    "",
    drop_precision,
    "",
]
if old_gallery and "\n## The literature's claims" in old_gallery:
    # Kept as it stands: that section is edited with the claims (scripts/figures.sh), not here.
    lines += ["## The literature's claims" + old_gallery.split("\n## The literature's claims", 1)[1].rstrip(), ""]
else:
    lines += [
    "## The literature's claims (`scripts/figures.sh`)",
    "",
    "Six shipped experiments per world (`conf/experiment/WORLD/NAME.yaml`), one figure each (`figures/WORLD/NAME.png`), "
    "with the verdicts and the numbers behind them in [figures/VERDICTS.md](../figures/VERDICTS.md). "
    f"`bash scripts/figures.sh` rebuilds them at the default size in about {figures_seconds} s on the 2-core machine; "
    "`--full` gives the paper size.",
    "",
    "| claim | bigram | mlp | transformer |",
    "|---|---|---|---|",
    *[f"| {title} | " + " | ".join(f"![](../figures/{w}/{n}.png)" for w in ("bigram", "mlp", "transformer")) + " |"
      for title, n in (
          ("1. Token TIS recovers the training–inference mismatch's cost (Yao et al. 2025; FlashRL)", "tis-tames-mismatch"),
          ("2. Bias–variance by level: token vs sequence IS (Liu, Li et al. 2025)", "bias-variance-by-level"),
          ("3. The mismatch lives on low-probability tokens (Liu, Li et al. 2025)", "mismatch-low-prob-tokens"),
          ("4. Precision matters more than the algorithm (Qi et al. 2025)", "precision-vs-algorithm"),
          ("5. Staleness: sequence TIS, token-MIS and untrusted updates collapse (VCPO, M2PO, AReaL)",
           "staleness-breaks-tis"),
          ("6. The seed bug, end to end (OpenRLHF bc71bb1)", "seed-bug-end-to-end"))],
    "",
    "Which of them hold in which world, and why the others do not, is in "
    "[figures/VERDICTS.md](../figures/VERDICTS.md) and [claims.md](claims.md).",
    "",
]
(out.parent / "gallery.md").write_text("\n".join(lines))
print(f"wrote {out.parent / 'gallery.md'} and {len(list(out.glob('*.png')))} figures", file=sys.stderr)
EOF
du -sh "$OUT" >&2
