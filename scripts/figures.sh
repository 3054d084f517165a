#!/usr/bin/env bash
# bash scripts/figures.sh [--full]
# The literature's claims as shipped experiments (conf/experiment/*.yaml, one per claim): runs each one, then draws
# figures/<name>.png + .pdf and writes figures/VERDICTS.md (one line per claim: holds / does not hold /
# inconclusive, with the numbers; the rules are in analysis/claims/).
#
#   bash scripts/figures.sh          default size: 75 s measured on an idle 2-core machine (~3 min when busy)
#   bash scripts/figures.sh --full   paper size: more seeds, steps and probe repeats (overrides below), ~9 min
#
# Environment: FIGURES_WORK (the experiments' output, default multirun/figures; each experiment's dir there is
# replaced), FIGURES_OUT (default figures), FIGURES_ONLY (space-separated experiment names, default all),
# FIGURES_JOBS (parallel jobs with the joblib launcher, default 2).
# Any failed job or analysis stops the script with a non-zero exit code.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

SIZE=default
for arg in "$@"; do
  case "$arg" in
    --full) SIZE=full ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "figures.sh: unknown argument: $arg (usage: bash scripts/figures.sh [--full])" >&2; exit 2 ;;
  esac
done

WORK="${FIGURES_WORK:-multirun/figures}"
OUT="${FIGURES_OUT:-figures}"
PYTHON="${PYTHON:-python}"
EXPERIMENTS=(tis-tames-mismatch bias-variance-by-level mismatch-low-prob-tokens precision-vs-algorithm
             staleness-breaks-tis seed-bug-end-to-end)
if [[ -n "${FIGURES_ONLY:-}" ]]; then
  read -r -a EXPERIMENTS <<< "$FIGURES_ONLY"
fi

# Paper size: overrides on top of each experiment's own sweep (the command line wins over the file).
full_overrides() {
  case "$1" in
    tis-tames-mismatch)       echo "seed=range(0,10) train.steps=300" ;;
    bias-variance-by-level)   echo "probe.repeats=5000" ;;
    mismatch-low-prob-tokens) echo "seed=range(0,10) train.steps=300" ;;
    precision-vs-algorithm)   echo "seed=range(0,10) train.steps=300" ;;
    staleness-breaks-tis)     echo "seed=range(0,10) train.steps=200" ;;
    seed-bug-end-to-end)      echo "seed=range(0,10) train.steps=200" ;;
    *) echo "figures.sh: no experiment $1" >&2; return 1 ;;
  esac
}

# Two jobs at a time when the joblib launcher is installed (pip install 'is-study[parallel]').
LAUNCH=()
if "$PYTHON" -c "import hydra_plugins.hydra_joblib_launcher" 2>/dev/null; then
  LAUNCH=(--launcher joblib --jobs "${FIGURES_JOBS:-2}")
fi

for name in "${EXPERIMENTS[@]}"; do
  [[ -f "conf/experiment/$name.yaml" ]] || { echo "figures.sh: no conf/experiment/$name.yaml" >&2; exit 2; }
done

start=$(date +%s)
mkdir -p "$WORK" "$OUT"
for name in "${EXPERIMENTS[@]}"; do
  extra=()
  if [[ "$SIZE" == full ]]; then
    read -r -a extra <<< "$(full_overrides "$name")"
  fi
  dir="$WORK/$name"
  rm -rf -- "$dir"
  t0=$(date +%s)
  echo "== $name ($SIZE size)" >&2
  if ! "$PYTHON" -m runner sweep "experiment=$name" "hydra.sweep.dir=$dir" "${LAUNCH[@]}" "${extra[@]}" >/dev/null; then
    echo "figures.sh: experiment $name failed (see $dir/*/ERROR)" >&2
    exit 1
  fi
  echo "   $(( $(date +%s) - t0 )) s" >&2
done

# One process draws every figure and writes VERDICTS.md (is-study claims; exit 2 if a claim cannot be evaluated).
"$PYTHON" -m runner claims --all "$WORK" --out "$OUT" --size "$SIZE" --only "${EXPERIMENTS[*]}"
echo "figures.sh: $(( $(date +%s) - start )) s in all; figures and VERDICTS.md in $OUT/" >&2
