"""The documentation says what the code does: docs/corrections.md's preset table against the preset
files, its worked cases against `is-study case`, every logged column defined (docs/corrections.md and
docs/metrics.md); the README stays a README (at most 15 KB, every docs/ page it links present); the
README, docs/ and the gallery agree with each other, with the scripts and with figures/VERDICTS.md."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "corrections.md"
README = REPO / "README.md"
GALLERY = REPO / "docs" / "gallery.md"
CLAIMS = REPO / "docs" / "claims.md"
METRICS = REPO / "docs" / "metrics.md"
PERFORMANCE = REPO / "docs" / "performance.md"
README_MAX_BYTES = 15_000  # 15 kB, read strictly


def _rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows of the first Markdown table whose header row starts with `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _band(v) -> str:
    return "—" if v is None else f"{v:g}"


# the preamble's exceptions to "no veto, no self-normalisation"
VETOED = {"skyrl/outlier-token-is": 1e-4, "slime/mis-rs-veto": 1e-4, "slime/mis-batch-normalize": 1e-4}
SELF_NORMALIZED = {"slime/mis-batch-normalize": "token"}


def test_preset_table_matches_the_preset_files():
    from runner import registry

    rows = {r[0].strip("`"): r for r in _rows(DOC.read_text(), "| preset | band [low, high] |")}
    names = registry.own_presets() + registry.faithful_presets()
    assert sorted(rows) == sorted(names) and len(names) == len(registry.presets())
    for name in names:
        cfg = yaml.safe_load((registry.conf_dir() / "correction" / f"{name}.yaml").read_text())
        expected = [
            f"[{_band(cfg['low'])}, {_band(cfg['high'])}]",
            "—" if cfg["log_clamp"] is None else f"{cfg['log_clamp']:g}",
            cfg["weight"],
            cfg["weight_op"],
            cfg["filter"],
            "—" if cfg["filter_log_clamp"] is None else f"{cfg['filter_log_clamp']:g}",
            "yes" if cfg["filter_inverted"] else "no",
            cfg["band_space"],
            cfg["reject"],
            cfg["denominator"],
            cfg["padding"],
        ]
        assert rows[name][1:] == expected, name
        assert cfg["ratio"] == "decoupled"  # what the table's preamble says, and it names the one veto
        assert cfg["veto"] == VETOED.get(name)
        assert cfg.get("self_normalize", "none") == SELF_NORMALIZED.get(name, "none")
        assert f"- **`{name}`**" in DOC.read_text()  # and a sentence on what it computes


def _number(text: str) -> float:
    text = text.replace("−", "-").strip()
    special = {"NaN": math.nan, "-inf": -math.inf, "inf": math.inf}
    return special[text] if text in special else float(text)


@pytest.mark.slow
def test_worked_cases_are_what_is_study_case_gives():
    rows = _rows(DOC.read_text(), "| preset | accepted-moderate |")
    assert len(rows) == 10
    for row in rows:
        preset = row[0].strip("`")
        code, out, err = run_cli("case", "openrlhf-seq-mask-tis", f"correction={preset}", "--json")
        assert code == 0, err
        data = json.loads(out)
        cases = data if isinstance(data, list) else data["cases"]
        for cell, case in zip(row[1:], cases):
            want, got = _number(cell), float(case["loss"])
            assert (math.isnan(want) and math.isnan(got)) or want == pytest.approx(got, abs=1e-6), (preset, cell, got)


def test_every_logged_column_is_defined():
    from runner.core.schema import CORRECTION_METRICS, LOSS_METRICS, PROBE_FIGURES

    text = DOC.read_text()
    defined = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            defined |= set(re.findall(r"`([a-z0-9_]+)`", line.split("|")[1]))
    missing = [c for c in (*CORRECTION_METRICS, *LOSS_METRICS, *PROBE_FIGURES) if c not in defined]
    assert not missing, missing
    assert "can be negative" in text and "unbiased" in text  # kl_k1 / chi2 under 0 are not bugs


def _first_column_names(text: str, header_start: str) -> list[str]:
    """The `code` names in the first cell of each body row of the table whose header starts with `header_start`."""
    return [name for row in _rows(text, header_start) for name in re.findall(r"`([a-z0-9_]+)`", row[0])]


def test_metrics_doc_defines_every_column_once_and_maps_every_update_metric():
    """docs/metrics.md: one definition per column of metrics.csv and probe.csv, in the files' order, and a row
    of framework names for every correction and loss metric, each cell a name or "—", and where each name
    was read (a 40-hex commit per framework)."""
    from runner.core.schema import ALL_METRICS_COLUMNS, PROBE_COLUMNS, UPDATE_METRICS

    text = METRICS.read_text()
    assert _first_column_names(text, "| column | definition |") == list(ALL_METRICS_COLUMNS)
    probe_section = text.split("## `probe.csv`", 1)[1]
    assert _first_column_names(probe_section, "| column | definition |") == list(PROBE_COLUMNS)
    frameworks = ("verl", "TRL (GRPO)", "slime", "SkyRL", "NeMo-RL", "OpenRLHF")
    header = "| is-study | " + " | ".join(frameworks) + " |"
    assert header in text
    mapping = {row[0].strip("`"): row[1:] for row in _rows(text, header)}
    assert set(UPDATE_METRICS) <= set(mapping), set(UPDATE_METRICS) - set(mapping)
    assert all(len(cells) == len(frameworks) and all(cells) for cells in mapping.values()), mapping
    assert "rollout_corr/rollout_is_mean" in mapping["is_weight_mean"][0]  # verl's namespaced name
    sources = {row[0].split(" (")[0]: row[1] for row in _rows(text, "| framework | commit | files |")}
    assert set(sources) == {"verl", "TRL", "slime", "SkyRL", "NeMo-RL", "OpenRLHF"}, sources
    assert all(re.match(r"[0-9a-f]{40} ", commit) for commit in sources.values()), sources


def test_schema_makes_no_verl_style_claim():
    """The columns are flat, not verl's rollout_corr/ names: the schema says so and points to the mapping."""
    from runner.core import schema

    assert "verl-style" not in schema.__doc__ and "docs/metrics.md" in schema.__doc__


def test_docs_explain_the_settings():
    text = DOC.read_text()
    for heading in (
        "`old`, `roll` and `lp` under staleness",
        "`mismatch.precision` in each world",
        "Why train and probe use different reductions",
        "Why IcePop's tight band masks 100% in the probe",
    ):
        assert heading in text, heading


def test_readme_ships_its_own_maths_and_links_exist():
    text = README.read_text()
    assert "../shared" not in text and "docs/corrections.md" in text
    for doc in (README, *sorted((REPO / "docs").glob("*.md"))):
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in link:
                continue
            assert (doc.parent / link).exists(), (doc.name, link)


def test_readme_is_a_readme():
    """At most 15 KB, the rest in docs/: every page the issue asked for exists and is linked from the README,
    and every docs/ page the README links exists."""
    assert len(README.read_bytes()) <= README_MAX_BYTES, len(README.read_bytes())
    text = README.read_text()
    linked = re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", text)
    for page in ("worlds", "sweeps", "audit", "claims", "performance", "testing", "metrics", "corrections"):
        assert f"docs/{page}.md" in linked, page
    missing = [page for page in linked if not (REPO / page).is_file()]
    assert not missing, missing


def test_readme_keeps_its_two_first_commands():
    """The README opens with the two commands a newcomer runs (.ci/run runs the second)."""
    first_block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first_block[0].startswith("make run ") and "is-study run correction=seq-mask-tis" in first_block[0]
    assert first_block[1].startswith("make test ") and "python -m pytest" in first_block[1]
    assert (REPO / ".ci" / "run").read_text().rstrip().endswith("make test")


def test_user_docs_hold_no_internal_history():
    """No "issue N" or session history in the README or docs/ (measurements state their date once, in
    docs/performance.md)."""
    for doc in (README, *sorted((REPO / "docs").glob("*.md"))):
        text = doc.read_text()
        assert not re.search(r"\bissue \d+", text), doc.name
        assert not re.search(r"later session|earlier rules|before issue", text, re.I), doc.name


def test_figures_sh_time_is_quoted_the_same_everywhere():
    header = (REPO / "scripts" / "figures.sh").read_text()
    seconds = re.search(r"default size: (\d+) s measured on the 2-core machine", header).group(1)
    for doc in (PERFORMANCE, GALLERY):
        quoted = re.findall(
            r"figures\.sh`? (?:takes |rebuilds them at the default size in )?about (\d+) s", doc.read_text()
        )
        assert quoted and set(quoted) == {seconds}, (doc.name, quoted, seconds)


def _world_verdicts() -> dict[str, dict[int, str]]:
    """figures/WORLD/verdicts.json (default size): world → {claim number: verdict}, the claims numbered in
    analysis/claims' order (VERDICTS.md's rows)."""
    from analysis.claims.registry import CLAIMS, WORLDS

    number = {name: i + 1 for i, name in enumerate(CLAIMS)}
    out = {}
    for world in WORLDS:
        path = REPO / "figures" / world / "verdicts.json"
        if path.is_file():
            claims = json.loads(path.read_text())["claims"]
            out[world] = {number[n]: c["verdict"] for n, c in claims.items()}
    return out


def test_claims_doc_agrees_with_verdicts():
    """docs/claims.md's summary, per world, of which claims hold, which do not, which are inconclusive and which
    are untestable here is figures/WORLD/verdicts.json's (VERDICTS.md's table), every claim named exactly once
    per world."""
    found = _world_verdicts()
    assert set(found) == {"bigram", "mlp", "transformer"} and all(len(v) == 6 for v in found.values())
    section = CLAIMS.read_text().split("## Results at the default size", 1)[1].split("\n## ", 1)[0]
    verdicts_md = (REPO / "figures" / "VERDICTS.md").read_text()
    for world, claims in found.items():
        part = section.split(f"### The {world} world", 1)[1].split("\n### ", 1)[0]
        said: dict[int, str] = {}
        for label, verdict in (
            ("Hold", "holds"),
            ("Do not hold", "does not hold"),
            ("Inconclusive", "inconclusive"),
            ("Untestable here", "untestable here"),
        ):
            bullet = re.search(rf"^- \*\*{label}\*\*: claims? ([\d, and]+)", part, re.M)
            for n in re.findall(r"\d", bullet.group(1)) if bullet else []:
                assert int(n) not in said, (world, n)
                said[int(n)] = verdict
        assert said == claims, (world, said, claims)
        assert f"{world} (default size)" in verdicts_md


def test_band_names_are_given_with_their_values_where_the_experiment_is_documented():
    """tight / mid / loose mean nothing without their [low, high]: every experiment that defines named
    bands states them in its one-line header comment, and the README where it lists the experiment."""
    experiments = [
        p
        for p in sorted((REPO / "conf" / "experiment").rglob("*.yaml"))
        if isinstance(yaml.safe_load(p.read_text()).get("bands"), dict)
    ]
    assert any(p.stem == "threshold-tradeoff" for p in experiments)
    readme = " ".join(README.read_text().split())
    for path in experiments:
        text = path.read_text()
        lines = text.splitlines()
        end = next(i for i, line in enumerate(lines) if not line.startswith("#"))
        header = " ".join(line.lstrip("#").strip() for line in lines[:end])  # the file's opening comment
        for name, band in yaml.safe_load(text)["bands"].items():
            stated = f"{name} [{_band(band['low'])}, {_band(band['high'])}]"
            assert stated in header, (path.name, stated)
            assert stated in readme, (path.name, stated)


def test_readme_regime_table_agrees_with_verdicts():
    """The README's table of the mlp and transformer worlds' verdicts before and in the field regime is
    figures/WORLD/verdicts.json's and figures/regime/WORLD/verdicts.json's, claim by claim, in analysis/claims'
    order; a claim not yet run in a column reads "not run", as in VERDICTS.md."""
    from analysis.claims.registry import CLAIMS

    columns = []
    for world in ("mlp", "transformer"):
        for folder in (REPO / "figures" / world, REPO / "figures" / "regime" / world):
            claims = json.loads((folder / "verdicts.json").read_text())["claims"]
            columns.append({name: claims[name]["verdict"] if name in claims else "not run" for name in CLAIMS})
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `") and line.count("|") == 6]
    table = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    table = [r for r in table if r[0].strip("`") in CLAIMS]
    assert [r[0].strip("`") for r in table] == list(CLAIMS)
    for name, *cells in table:
        assert cells == [column[name.strip("`")] for column in columns], name
