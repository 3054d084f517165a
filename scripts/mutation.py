"""Mutation testing of the maths, the worlds, the probe statistics and the claim rules (`make mutation`).

    python scripts/mutation.py run [GROUP ...]   # mutmut on those groups (all by default), then the scores
    python scripts/mutation.py score             # the scores of what has been run so far

mutmut (the `mutation` extra) plants one small bug at a time (an operator, a constant, a comparison)
and runs the tests that call the mutated function, taken from the fast subset in pyproject.toml's
[tool.mutmut]. A mutant the tests let through "survived". The score of a module is

    killed / (mutants checked − equivalent mutants)

with timeouts counted as killed. Equivalent mutants behave exactly like the real code (no test can
kill them); each is listed, with why, in tests/mutation_equivalents.md. Every other survivor needs a
test. Results are kept in mutants/ and reused: after a change, only the changed functions run again.
Slow on a shared machine: run a group at a time (`python scripts/mutation.py run corrections`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EQUIVALENTS = REPO / "tests" / "mutation_equivalents.md"

# group → (mutant-name pattern, the files it covers, target % killed)
GROUPS = {
    "corrections": ("runner.core.corrections.*", ["runner/core/corrections.py"], 90),
    "losses": ("runner.core.losses.*", ["runner/core/losses.py"], 90),
    "metrics": ("runner.core.metrics.*", ["runner/core/metrics.py"], 90),
    "worlds": ("runner.worlds.*", ["runner/worlds/"], 80),
    "probe-stats": ("runner.probe.stats.*", ["runner/probe/stats.py"], 80),
    "claims-stats": ("analysis.claims.stats.*", ["analysis/claims/stats.py"], 80),
}
# Parts of `worlds` that can be run (and scored) alone: the whole group is ~3300 mutants, hours on a
# shared machine. Not in the default list, so `run` with no group names does not count them twice.
PARTS = {
    "worlds-engine": ("runner.worlds.engine.*", ["runner/worlds/engine.py"], 80),
    "worlds-precision": ("runner.worlds.precision.*", ["runner/worlds/precision.py"], 80),
    "worlds-bigram": ("runner.worlds.bigram.*", ["runner/worlds/bigram/"], 80),
    "worlds-mlp": ("runner.worlds.mlp.*", ["runner/worlds/mlp/"], 80),
    "worlds-transformer": ("runner.worlds.transformer.*", ["runner/worlds/transformer/"], 80),
}
GROUPS_AND_PARTS = {**GROUPS, **PARTS}
# mutmut's exit codes, as its own status table reads them
KILLED = {1, 3, 36, 24, -24, 152, 255}  # test failure, pytest internal error, timeouts
SURVIVED = {0}


def equivalents() -> dict[str, str]:
    """mutant name → why it is equivalent, from the first two columns of the file's table rows."""
    if not EQUIVALENTS.is_file():
        return {}
    rows = re.findall(r"^\|\s*`([^`]+__mutmut_\d+)`\s*\|\s*(.*?)\s*\|\s*$", EQUIVALENTS.read_text(), flags=re.M)
    return dict(rows)


def results() -> dict[str, int | None]:
    """Every generated mutant's exit code (None: not run yet), from mutmut's mutants/**/*.meta."""
    out: dict[str, int | None] = {}
    for meta in sorted((REPO / "mutants").rglob("*.py.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def score(groups: list[str]) -> bool:
    """Print each group's score; True when every group that was run meets its target."""
    codes, equivalent = results(), equivalents()
    unknown = sorted(set(equivalent) - set(codes))
    ok = True
    print(f"{'group':<18} {'mutants':>7} {'checked':>7} {'killed':>6} {'equiv':>5} {'survived':>8} {'score':>7} target")
    for group in groups:
        pattern = re.compile(GROUPS_AND_PARTS[group][0].replace(".", r"\.").replace("*", ".*") + "$")
        names = [n for n in codes if pattern.match(n)]
        checked = [n for n in names if codes[n] is not None]
        killed = [n for n in checked if codes[n] in KILLED]
        equiv = [n for n in checked if n in equivalent and codes[n] in SURVIVED]
        survived = [n for n in checked if codes[n] in SURVIVED and n not in equivalent]
        other = [n for n in checked if n not in killed and codes[n] not in SURVIVED]
        denominator = len(checked) - len(equiv)
        value = 100.0 * len(killed) / denominator if denominator else float("nan")
        target = GROUPS_AND_PARTS[group][2]
        partial = f" (partial: {len(checked)} of {len(names)} run)" if len(checked) < len(names) else ""
        print(
            f"{group:<18} {len(names):>7} {len(checked):>7} {len(killed):>6} {len(equiv):>5} {len(survived):>8} "
            f"{value:>6.1f}% ≥{target}%{partial}"
        )
        for name in survived:
            print(f"    survived: {name}")
        for name in other:
            print(f"    other ({codes[name]}): {name}")
        if checked:
            ok &= value >= target
    if unknown:
        print("listed as equivalent but no such mutant (the source moved? renumber them):", ", ".join(unknown))
    return ok


def run(groups: list[str], max_children: int) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    # the mutated copy in mutants/ must be what the tests import, never a checkout on PYTHONPATH
    env.pop("PYTHONPATH", None)
    for group in groups:
        cmd = [sys.executable, "-m", "mutmut", "run", GROUPS_AND_PARTS[group][0], "--max-children", str(max_children)]
        print("$", " ".join(cmd), flush=True)
        code = subprocess.run(cmd, cwd=REPO, env=env).returncode
        if code != 0:
            return code
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "score"])
    parser.add_argument(
        "groups", nargs="*", help=f"default: all of {', '.join(GROUPS)}; parts of worlds: {', '.join(PARTS)}"
    )
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    args = parser.parse_args()
    unknown = [g for g in args.groups if g not in GROUPS_AND_PARTS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; valid: {', '.join(GROUPS_AND_PARTS)}")
    groups = args.groups or list(GROUPS)
    if args.command == "run":
        code = run(groups, args.max_children)
        if code != 0:
            return code
    return 0 if score(groups) else 1


if __name__ == "__main__":
    sys.exit(main())
