#!/usr/bin/env bash
# bash scripts/figures.sh [--full] [--regime]
# The literature's claims as shipped experiments, in three worlds: conf/experiment/WORLD/NAME.yaml (bigram, mlp,
# transformer: runner/worlds/registry.py's list). Runs each one, then draws figures/WORLD/NAME.png + .pdf,
# writes figures/WORLD/verdicts.json and figures/VERDICTS.md: one table, claim × world → holds / does not hold /
# inconclusive / untestable here with n and the key numbers, then every verdict in full (rules: analysis/claims/).
#
#   bash scripts/figures.sh          default size: 808 s measured on the 2-core machine, idle but for its own
#                                    2 workers (2026-12-01, AMD EPYC, load average 1.3–2.1 at the end), with the
#                                    fp32, chaos-floor and M2PO arms the verdict rules use and the transformer's
#                                    SFT warm start trained first in a fresh cache (1.5–3 min of it).
#   bash scripts/figures.sh --full   paper size (figures/full/WORLD/): more seeds, steps, lengths, repeats. Measured
#                                    2026-12-01 on the same machine, its cores shared with a mutation-testing run:
#                                    bigram ≈ 9 min, mlp 41 min, transformer 54 min (about 1 h 45 min in all).
#   bash scripts/figures.sh --regime  the claims in the field's regime (docs/regime.md): the worlds that have
#                                    conf/experiment/WORLD/regime/ (mlp, transformer), into figures/regime/WORLD/;
#                                    with --full, at paper size (T = 1024) into figures/regime-full/WORLD/. Times:
#                                    docs/claims.md and docs/regime.md.
#
# Environment: FIGURES_WORLDS (space-separated worlds, default "bigram mlp transformer"), FIGURES_ONLY (space-
# separated experiment names, default all), FIGURES_WORK (the experiments' output, default multirun/figures;
# WORK/[full/]WORLD/NAME is replaced), FIGURES_OUT (default figures), FIGURES_JOBS (parallel jobs with the
# joblib launcher, default 2), FIGURES_DEVICE (device= for the mlp and transformer worlds, e.g. cuda; default
# each world's own). Worlds or claims not run keep their earlier verdicts in VERDICTS.md.
# Any failed job or analysis stops the script with a non-zero exit code.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

SIZE=default
REGIME=
for arg in "$@"; do
  case "$arg" in
    --full) SIZE=full ;;
    --regime) REGIME=regime ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "figures.sh: unknown argument: $arg (usage: bash scripts/figures.sh [--full] [--regime])" >&2; exit 2 ;;
  esac
done
# The column's name (analysis/claims/verdicts.py's SIZES): default | full | regime | regime-full
COLUMN="$SIZE"
[[ -n "$REGIME" ]] && COLUMN=$([[ "$SIZE" == full ]] && echo regime-full || echo regime)

WORK="${FIGURES_WORK:-multirun/figures}"
OUT="${FIGURES_OUT:-figures}"
PYTHON="${PYTHON:-python}"
EXPERIMENTS=(tis-tames-mismatch bias-variance-by-level mismatch-low-prob-tokens precision-vs-algorithm
             staleness-breaks-tis seed-bug-end-to-end)
if [[ -n "${FIGURES_ONLY:-}" ]]; then
  read -r -a EXPERIMENTS <<< "$FIGURES_ONLY"
fi
# The worlds: runner/worlds/registry.py's list, the one the claims registry reads too.
read -r -a KNOWN_WORLDS <<< "$("$PYTHON" -c 'from runner.worlds.registry import WORLDS; print(*WORLDS)')"
WORLDS=("${KNOWN_WORLDS[@]}")
if [[ -n "$REGIME" ]]; then  # only the worlds rebuilt to the field's regime
  WORLDS=()
  for w in "${KNOWN_WORLDS[@]}"; do [[ -d "conf/experiment/$w/regime" ]] && WORLDS+=("$w"); done
fi
if [[ -n "${FIGURES_WORLDS:-}" ]]; then
  read -r -a WORLDS <<< "$FIGURES_WORLDS"
fi

# The experiment file of a claim in a world (in the field regime, WORLD/regime/NAME).
experiment() { echo "$1/${REGIME:+regime/}$2"; }

# Paper size: overrides on top of each experiment's own sweep (the command line wins over the file).
full_overrides() {
  if [[ -n "$REGIME" ]]; then  # paper size in the regime: docs/regime.md's T = 1024 world, 500 steps
    [[ "$2" == bias-variance-by-level ]] && { echo "probe.repeats=400"; return; }  # its sweep is over T already
    local paper="rollout.seq_len=1024 task.k=[32,40,48,56,64,72,80,88,96] task.tolerance=4 train.steps=500"
    [[ "$1" == transformer ]] && paper+=" policy.context=1026"  # BOS, ASK and 1024 words
    # Claim 5 counts collapses: with 2 seeds a Fisher test cannot reach p < 0.05 (4 against 0 needs 4 seeds)
    [[ "$2" == staleness-breaks-tis ]] && paper+=" seed=range(0,4)"
    echo "$paper"
    return
  fi
  case "$1/$2" in
    bigram/tis-tames-mismatch)            echo "seed=range(0,10) train.steps=300" ;;
    bigram/bias-variance-by-level)        echo "probe.repeats=5000" ;;
    bigram/mismatch-low-prob-tokens)      echo "seed=range(0,10) train.steps=300" ;;
    bigram/precision-vs-algorithm)        echo "seed=range(0,10) train.steps=300" ;;
    bigram/staleness-breaks-tis)          echo "seed=range(0,5) train.steps=300" ;;
    bigram/seed-bug-end-to-end)           echo "seed=range(0,10) train.steps=200" ;;
    mlp/tis-tames-mismatch)               echo "seed=range(0,5) train.steps=300" ;;
    mlp/bias-variance-by-level)           echo "rollout.seq_len=32,64,128,256 probe.repeats=1000" ;;
    mlp/mismatch-low-prob-tokens)         echo "seed=range(0,3) train.steps=200" ;;
    mlp/precision-vs-algorithm)           echo "seed=range(0,4) train.steps=200" ;;
    mlp/staleness-breaks-tis)             echo "seed=range(0,3) train.steps=300" ;;
    mlp/seed-bug-end-to-end)              echo "seed=range(0,3) train.steps=201" ;;
    transformer/tis-tames-mismatch)       echo "mismatch.precision=fp32,fp16,bf16,fp8 seed=range(0,3) train.steps=101" ;;
    transformer/bias-variance-by-level)   echo "probe.repeats=400" ;;
    transformer/mismatch-low-prob-tokens) echo "seed=range(0,3) train.steps=21" ;;
    transformer/precision-vs-algorithm)   echo "correction=none,tis,icepop,seq-mis,geo-mask seed=range(0,3) train.steps=51" ;;
    transformer/staleness-breaks-tis)     echo "seed=range(0,2) train.steps=101" ;;
    transformer/seed-bug-end-to-end)      echo "seed=range(0,3) train.steps=31" ;;
    *) echo "figures.sh: no experiment $1/$2" >&2; return 1 ;;
  esac
}

# Two jobs at a time when the joblib launcher is installed (pip install 'is-study[parallel]').
LAUNCH=()
if "$PYTHON" -c "import hydra_plugins.hydra_joblib_launcher" 2>/dev/null; then
  LAUNCH=(--launcher joblib --jobs "${FIGURES_JOBS:-2}")
fi

for world in "${WORLDS[@]}"; do
  [[ " ${KNOWN_WORLDS[*]} " == *" $world "* ]] || {
    echo "figures.sh: unknown world $world in FIGURES_WORLDS (valid: ${KNOWN_WORLDS[*]})" >&2; exit 2; }
  for name in "${EXPERIMENTS[@]}"; do
    [[ -f "conf/experiment/$(experiment "$world" "$name").yaml" ]] || {
      echo "figures.sh: no conf/experiment/$(experiment "$world" "$name").yaml" >&2; exit 2; }
  done
done

start=$(date +%s)
ROOT="$WORK"
[[ "$COLUMN" != default ]] && ROOT="$WORK/$COLUMN"
mkdir -p "$ROOT" "$OUT"
for world in "${WORLDS[@]}"; do
  t_world=$(date +%s)
  for name in "${EXPERIMENTS[@]}"; do
    extra=()
    if [[ "$SIZE" == full ]]; then
      read -r -a extra <<< "$(full_overrides "$world" "$name")"
    fi
    if [[ "$world" != bigram && -n "${FIGURES_DEVICE:-}" ]]; then
      extra+=("device=$FIGURES_DEVICE")
    fi
    dir="$ROOT/$world/$name"
    rm -rf -- "$dir"
    t0=$(date +%s)
    echo "== $(experiment "$world" "$name") ($COLUMN)" >&2
    if ! "$PYTHON" -m runner sweep "experiment=$(experiment "$world" "$name")" "hydra.sweep.dir=$dir" "${LAUNCH[@]}" \
        "${extra[@]}" >/dev/null; then
      echo "figures.sh: experiment $world/$name failed (see $dir/*/ERROR)" >&2
      exit 1
    fi
    echo "   $(( $(date +%s) - t0 )) s" >&2
  done
  echo "== $world: $(( $(date +%s) - t_world )) s" >&2
done

# One process draws every figure and writes VERDICTS.md (is-study claims; exit 2 if a claim cannot be evaluated).
"$PYTHON" -m runner claims --all "$ROOT" --out "$OUT" --size "$COLUMN" --worlds "${WORLDS[*]}" --only "${EXPERIMENTS[*]}"

# In the regime, the dose-response figure: final J and collapses against the measured T·k3, over T
# (conf/experiment/WORLD/regime/dose-response.yaml), beside the claims' figures.
if [[ -n "$REGIME" && -z "${FIGURES_ONLY:-}" ]]; then
  for world in "${WORLDS[@]}"; do
    [[ -f "conf/experiment/$(experiment "$world" dose-response).yaml" ]] || continue
    dir="$ROOT/$world/dose-response"
    rm -rf -- "$dir"
    t0=$(date +%s)
    echo "== $(experiment "$world" dose-response) ($COLUMN)" >&2
    extra=()
    [[ "$SIZE" == full ]] && extra=("train.steps=500" "arm=length/t128,length/t256,length/t512,length/t1024")
    "$PYTHON" -m runner sweep "experiment=$(experiment "$world" dose-response)" "hydra.sweep.dir=$dir" "${LAUNCH[@]}" \
      "${extra[@]}" >/dev/null || { echo "figures.sh: experiment $world dose-response failed (see $dir/*/ERROR)" >&2; exit 1; }
    echo "   $(( $(date +%s) - t0 )) s" >&2
    drawn="$dir/figure"  # OUT/COLUMN/WORLD/dose-response.{png,pdf}, and -paper.{png,pdf} in the paper style
    for style in default paper; do
      "$PYTHON" -m runner plot "$dir" --kind dose-response --style "$style" --out "$drawn/$style" >/dev/null
      suffix=$([[ "$style" == paper ]] && echo -paper || true)
      for ext in png pdf; do cp "$drawn/$style/dose-response.$ext" "$OUT/$COLUMN/$world/dose-response$suffix.$ext"; done
      "$PYTHON" -c "import sys; from analysis.claims.verdicts import shrink_png; shrink_png(sys.argv[1])" \
        "$OUT/$COLUMN/$world/dose-response$suffix.png"
    done
  done
fi
echo "figures.sh: $(( $(date +%s) - start )) s in all (load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo n/a)); figures and VERDICTS.md in $OUT/" >&2
