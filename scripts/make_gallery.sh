#!/usr/bin/env bash
# bash scripts/make_gallery.sh        (about 2 minutes on 2 idle cores)
#
# Regenerates docs/gallery/*.png and docs/gallery.md from real data: a small sweep (the shipped
# staleness-ladder experiment with the as-shipped OpenRLHF seq-mask-tis added: 5 corrections × 4
# staleness values × 2 seeds = 40 jobs of 60 steps, 1% of rollout log-probs 1000 nats off), the
# default probe (all 22 presets at their own bands) and a threshold probe (4 presets × 9 upper
# thresholds at staleness 16). Every figure kind in both styles, PNG only (quantised to 256
# colours to keep the repository small), plus the reports' verdicts. The claims' figures are
# figures/*.png, written by scripts/figures.sh; this page links them.
#
#   GALLERY_WORK=/tmp/g bash scripts/make_gallery.sh   # keep the runs (default: a temp dir, removed)
set -euo pipefail
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

SWEEP_ARGS=(experiment=staleness-ladder
            "correction=none,tis,seq-mask-tis,seq-tis,openrlhf-bc71bb1/seq-mask-tis"
            "mismatch.staleness=0,2,8,16" "seed=range(0,2)")
PROBE_ARGS=(study=probe "probe.presets=[tis,icepop,seq-tis,seq-mask-tis]"
            "probe.bands=[[null,1.1],[null,1.25],[null,1.5],[null,2],[null,3],[null,5],[null,10],[null,30],[null,100]]"
            mismatch.staleness=16 rollout.seq_len=24 probe.batch_size=1024 probe.repeats=200)
DEFAULT_PROBE_ARGS=(study=probe)

echo "== sweep (40 jobs)" >&2
rm -rf "$WORK/sweep"
$IS sweep "${SWEEP_ARGS[@]}" "hydra.sweep.dir=$WORK/sweep" >/dev/null
echo "== probes" >&2
rm -rf "$WORK/probe" "$WORK/probe-default"
$IS run "${PROBE_ARGS[@]}" log.quiet=true "hydra.run.dir=$WORK/probe" >/dev/null
$IS run "${DEFAULT_PROBE_ARGS[@]}" log.quiet=true "hydra.run.dir=$WORK/probe-default" >/dev/null

echo "== figures" >&2
rm -rf "$WORK/fig" "$WORK/fig-paper"
for style in default paper; do
  dir="$WORK/fig"
  [ "$style" = paper ] && dir="$WORK/fig-paper"
  $IS plot "$WORK/sweep" -k training,grad-norm,stability,masking,mismatch --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/probe" -k threshold --style "$style" -o "$dir" >/dev/null
  $IS plot "$WORK/probe-default" -k presets --style "$style" -o "$dir" >/dev/null
done
$IS report "$WORK/sweep" --out "$WORK/report.md" >/dev/null
$IS report "$WORK/probe-default" --out "$WORK/probe-report.md" >/dev/null
$IS report openrlhf-seq-mask-tis correction=openrlhf-bc71bb1/seq-mask-tis --out "$WORK/card.md" >/dev/null
$IS report openrlhf-seq-mask-tis --out "$WORK/cards.md" >/dev/null

rm -f "$OUT"/*.png
for f in "$WORK"/fig/*.png; do cp "$f" "$OUT/"; done
for f in "$WORK"/fig-paper/*.png; do cp "$f" "$OUT/$(basename "$f" .png)-paper.png"; done

FIGURES_SECONDS=$(sed -n 's/.*default size: \([0-9]*\) s measured on an idle 2-core machine.*/\1/p' scripts/figures.sh)

$PY - "$OUT" "$WORK" "${SWEEP_ARGS[*]}" "${PROBE_ARGS[*]}" "$FIGURES_SECONDS" <<'EOF'
"""Quantise the PNGs and write docs/gallery.md."""
import re
import sys
from pathlib import Path

from PIL import Image

out, work, sweep_args, probe_args, figures_seconds = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
for png in sorted(out.glob("*.png")):
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
]
for name, title, text in FIGS:
    lines += [f"## {title}", "", text, "", f"![{title}](gallery/{name}.png)", "",
              f"With `--style paper`:", "", f"![{title}, paper style](gallery/{name}-paper.png)", ""]
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
    "## The literature's claims (`scripts/figures.sh`)",
    "",
    "Six shipped experiments (`conf/experiment/`), one figure each, with the verdicts and the numbers behind them "
    f"in [figures/VERDICTS.md](../figures/VERDICTS.md). `bash scripts/figures.sh` rebuilds them at the default size "
    f"in about {figures_seconds} s on 2 idle cores; `--full` gives the paper size.",
    "",
    "| claim | figure |",
    "|---|---|",
    "| 1. Token TIS tames the training–inference mismatch (Yao et al. 2025) | ![](../figures/tis-tames-mismatch.png) |",
    "| 2. Bias–variance by level: token vs sequence IS (Liu, Li et al. 2025) | ![](../figures/bias-variance-by-level.png) |",
    "| 3. The mismatch lives on low-probability tokens (Liu, Li et al. 2025) | ![](../figures/mismatch-low-prob-tokens.png) |",
    "| 4. Precision matters more than the algorithm (Qi et al. 2025) | ![](../figures/precision-vs-algorithm.png) |",
    "| 5. Staleness breaks token TIS before sequence masking (async RL) | ![](../figures/staleness-breaks-tis.png) |",
    "| 6. The seed bug, end to end (OpenRLHF bc71bb1) | ![](../figures/seed-bug-end-to-end.png) |",
    "",
    "Which of them hold, and why the others do not here, is in [figures/VERDICTS.md](../figures/VERDICTS.md) and the "
    "README.",
    "",
]
(out.parent / "gallery.md").write_text("\n".join(lines))
print(f"wrote {out.parent / 'gallery.md'} and {len(list(out.glob('*.png')))} figures", file=sys.stderr)
EOF
du -sh "$OUT" >&2
