"""What `is-study claims` writes: one verdict line per claim, each claim's figure (PNG and PDF), and with
--all figures/VERDICTS.md, one line per claim with its experiment, verdict and numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from analysis.claims.registry import CLAIMS, claim, evaluate
from analysis.claims.stats import Verdict
from runner.errors import UserError


def chosen(name: str | None, every: bool, only: str = "") -> list[str]:
    """The claims to check: `name`, or with `every` the space-separated `only` (default: all of them)."""
    if every == bool(name):
        raise UserError("give either --claim NAME or --all")
    names = [name] if name else (only.split() or list(CLAIMS))
    for n in names:
        claim(n)
    return names


def check(directory: Path, names: list[str], every: bool, out: Path | None,
          style: str = "default") -> Iterator[tuple[str, Verdict]]:
    """Evaluate each claim on its experiment's dir (`directory`, or with `every` DIRECTORY/<name>), writing
    its figure into `out` if given; yields (name, verdict) as each one finishes."""
    from analysis import plots

    if out is not None:
        out = plots.ensure_dir(out)
    for n in names:
        v, fig = evaluate(n, Path(directory) / n if every else Path(directory), style)
        if out is not None:
            for written in plots.save(fig, out, n, style):
                if written.suffix == ".png":
                    shrink_png(written)
        yield n, v


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


def line(name: str, v: Verdict) -> str:
    return f"{name}: {v.verdict} — {v.statement}"


def verdicts_markdown(results: list[tuple[str, Verdict]], size: str = "default") -> str:
    out = ["# Verdicts: the literature's claims in the synthetic world", "",
           f"Written by `bash scripts/figures.sh{' --full' if size == 'full' else ''}` ({size} size). One line per "
           "claim: the experiment (`conf/experiment/NAME.yaml`: its command, source, world and what the world can "
           "and cannot show), the verdict, and the numbers behind it. The rules were fixed before the runs and are "
           "stated in `analysis/claims/`; a claim the synthetic world does not reproduce is reported as such.", ""]
    for name, v in results:
        c = claim(name)
        out.append(f"- **{c.TITLE}** ({c.SOURCE}; `is-study sweep experiment={name}`, [figure]({name}.png)): "
                   f"**{v.verdict}**. {v.statement}")
    return "\n".join(out) + "\n"


def write_verdicts(out: Path, results: list[tuple[str, Verdict]], size: str = "default") -> Path:
    """OUT/VERDICTS.md, the claims in registry order."""
    order = [n for n in CLAIMS if n in dict(results)]
    path = Path(out) / "VERDICTS.md"
    path.write_text(verdicts_markdown([r for n in order for r in results if r[0] == n], size), encoding="utf-8")
    return path
