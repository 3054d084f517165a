"""What `is-study claims` writes: one verdict line per claim, each claim's figure (PNG and PDF), and with --all
one verdicts.json per world and size, and figures/VERDICTS.md: one table, claim × world → verdict, with each
cell's key numbers and a link to its figure, then every verdict's full statement.

Layout under OUT (scripts/figures.sh: OUT = figures):
    OUT/WORLD/NAME.{png,pdf}, OUT/WORLD/verdicts.json           the default size
    OUT/full/WORLD/NAME.{png,pdf}, OUT/full/WORLD/verdicts.json  paper size (figures.sh --full)
    OUT/regime/WORLD/..., OUT/regime-full/WORLD/...              the field regime (figures.sh --regime [--full])
    OUT/VERDICTS.md                                              every verdicts.json under OUT, one table
A run over some worlds or claims updates their entries and leaves the others' as they were, so the table
always shows every world that has been run, and each column names its size."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from analysis.claims.registry import CLAIMS, WORLDS, claim, evaluate, experiment, world
from analysis.claims.stats import Verdict
from runner.errors import UserError

# A column of VERDICTS.md: the size the runs were, in the world as it is or rebuilt to the field's regime
# (docs/regime.md). Each has its own folder under OUT, and its label names both.
SIZES = ("default", "full", "regime", "regime-full")
SIZE_LABELS = {
    "default": "default size",
    "full": "full size",
    "regime": "field regime, default size",
    "regime-full": "field regime, paper size",
}


def is_regime(size: str) -> bool:
    return size.startswith("regime")


def chosen(name: str | None, every: bool, only: str = "") -> list[str]:
    """The claims to check: `name`, or with `every` the space-separated `only` (default: all of them)."""
    if every == bool(name):
        raise UserError("give either --claim NAME or --all")
    names = [name] if name else (only.split() or list(CLAIMS))
    for n in names:
        claim(n)
    return names


def chosen_worlds(worlds: str = "") -> list[str]:
    """The space-separated worlds (default: all of them, in WORLDS' order), checked."""
    names = worlds.split() or list(WORLDS)
    for w in names:
        world(w)
    return names


def size_checked(size: str) -> str:
    if size not in SIZES:
        raise UserError(f"unknown --size {size!r}; valid: {', '.join(SIZES)}")
    return size


def world_dir(root: Path, in_world: str, size: str = "default") -> Path:
    """Where a world's figures and verdicts.json go: ROOT/WORLD at default size, else ROOT/SIZE/WORLD."""
    return Path(root) / in_world if size == "default" else Path(root) / size / in_world


def check(
    directory: Path, names: list[str], every: bool, out: Path | None, style: str = "default"
) -> Iterator[tuple[str, Verdict]]:
    """Evaluate each claim on its experiment's dir (`directory`, or with `every` DIRECTORY/<name>), writing
    its figure into `out` if given; yields (name, verdict) as each one finishes."""
    from analysis.figures import layout

    if out is not None:
        out = layout.ensure_dir(out)
    for n in names:
        v, fig = evaluate(n, Path(directory) / n if every else Path(directory), style)
        if out is not None:
            for written in layout.save(fig, out, n, style):
                if written.suffix == ".png":
                    shrink_png(written)
        yield n, v


def check_all(
    directory: Path,
    names: list[str],
    worlds: list[str],
    out: Path | None,
    style: str = "default",
    size: str = "default",
) -> Iterator[str]:
    """`is-study claims --all`: every claim in every world, from DIRECTORY/WORLD/NAME; with `out`, each
    world's figures and verdicts.json, then VERDICTS.md. Every experiment dir is checked before anything
    is read or written; yields each verdict's line as it finishes."""
    for w in worlds:
        for name in names:
            if not (Path(directory) / w / name).is_dir():
                raise UserError(
                    f"{Path(directory) / w / name}: no experiment output here; run "
                    f"`bash scripts/figures.sh` (FIGURES_WORLDS='{w}' FIGURES_ONLY='{name}') first"
                )
    for w in worlds:
        results = []
        dest = world_dir(out, w, size) if out is not None else None
        for name, verdict in check(Path(directory) / w, names, True, dest, style):
            yield line(name, verdict, w)
            results.append((name, verdict))
        if out is not None:
            write_world(out, w, size, results)
    if out is not None:
        write_verdicts(out)


def shrink_png(path: Path) -> None:
    """Re-save a PNG with a 256-colour palette (as scripts/make_gallery.sh does): line figures look the same at
    about a third of the size, which matters for files kept in the repository. Left as is without Pillow."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return
    with Image.open(path) as im:
        q = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    q.save(path, optimize=True)


def line(name: str, v: Verdict, in_world: str | None = None) -> str:
    return f"{in_world + '/' if in_world else ''}{name}: {v.verdict} — {v.statement}"


# ----------------------------------------------------------------------------------------- verdicts.json
def write_world(root: Path, in_world: str, size: str, results: list[tuple[str, Verdict]], command: str = "") -> Path:
    """ROOT/[full/]WORLD/verdicts.json: this world's verdicts at this size, merged into what was there (the
    claims not re-run keep their entries)."""
    d = world_dir(root, in_world, size)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "verdicts.json"
    data = read_json(path) or {"world": in_world, "size": size, "claims": {}}
    for name, v in results:
        data["claims"][name] = {
            "verdict": v.verdict,
            "n": v.n_text(),
            "key": v.key,
            "statement": v.statement,
            "figure": str((d / f"{name}.png").relative_to(root)),
            "experiment": f"experiment={experiment(name, in_world, is_regime(size))}",
            "written": time.strftime("%Y-%m-%d"),
        }
    if command:
        data["command"] = command
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("claims"), dict) else None


def columns(root: Path) -> list[tuple[str, str, dict]]:
    """(world, size, verdicts.json) for every world and size run under ROOT: defaults first, in WORLDS' order."""
    out = []
    for size in SIZES:
        for w in WORLDS:
            data = read_json(world_dir(root, w, size) / "verdicts.json")
            if data is not None:
                out.append((w, size, data))
    return out


# ----------------------------------------------------------------------------------------- VERDICTS.md
def _verdict_word(entry: dict) -> str:
    """'**untestable here** (n = 4 seeds)': the verdict in bold (the table has no colours or symbols, so each of
    the four verdicts is told by its words) and the replicates behind it."""
    n = entry.get("n", "")
    return f"**{entry['verdict']}**" + (f" ({n})" if n else "")


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "not run"
    key = entry.get("key", "").replace("|", "/")
    return _verdict_word(entry) + (f": {key}" if key else "") + f" ([figure]({entry['figure']}))"


def verdicts_markdown(root: Path) -> str:
    cols = columns(root)
    if not cols:
        raise UserError(f"{root}: no verdicts.json under it; run scripts/figures.sh first")
    head = ["claim", *(f"{w} ({SIZE_LABELS[size]})" for w, size, _ in cols)]
    out = [
        "# Verdicts: the literature's claims in three worlds",
        "",
        "Written by `bash scripts/figures.sh` (`--full`: paper size; `--regime`: the world rebuilt to the field's "
        "regime, docs/regime.md) from the `verdicts.json` each run leaves in `figures/WORLD/` (default size), "
        "`figures/full/WORLD/` (paper size), `figures/regime/WORLD/` (field regime) and `figures/regime-full/WORLD/` "
        "(field regime, paper size); each column names its world "
        "and size. A cell is the verdict (holds / does not hold / inconclusive / untestable here: the "
        "world never shows the effect the claim is about, so its positive control failed and the claim is not "
        "tested), the number of seeds (or repeats) n behind it, its key numbers and its figure; the full "
        "statement of every cell is below the table, naming its test (on seeds, a 95% Student-t interval with "
        "n − 1 degrees of freedom; on collapse counts, exact: Fisher, Clopper–Pearson). The experiments are "
        "`conf/experiment/WORLD/NAME.yaml` (in the regime `conf/experiment/WORLD/regime/NAME.yaml`), each with its command, source, the world's calibrated "
        "parameters, the verdict rule and what was measured. The rules were fixed before the runs and are "
        "stated in `analysis/claims/`; a claim a world does not reproduce is reported as such.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, mod in CLAIMS.items():
        out.append("| " + " | ".join([mod.TITLE, *(_cell(data["claims"].get(name)) for _, _, data in cols)]) + " |")
    out += ["", "## Every verdict in full", ""]
    for name, mod in CLAIMS.items():
        out += [f"### {mod.TITLE}", "", f"Source: {mod.SOURCE}.", ""]
        for w, size, data in cols:
            e = data["claims"].get(name)
            if e is None:
                continue
            out.append(
                f"- **{w}** ({SIZE_LABELS[size]}; `is-study sweep {e['experiment']}`, [figure]({e['figure']})): "
                f"{_verdict_word(e)}. {e['statement']}"
            )
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_verdicts(root: Path) -> Path:
    """ROOT/VERDICTS.md from every verdicts.json under ROOT."""
    path = Path(root) / "VERDICTS.md"
    path.write_text(verdicts_markdown(root), encoding="utf-8")
    return path
