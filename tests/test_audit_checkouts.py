"""The audit, and the committed worked cases, on released framework code that is not on PyPI at the audited
version (examples/audit/released.py's CHECKOUTS: NeMo-RL, SkyRL and slime, each at a named commit). The checkout is fetched at test
time (`git fetch --depth 1` of the commit; nothing installed, nothing of it in this repository), or taken from
the folder a Checkout's variable names (IS_STUDY_NEMO_RL, IS_STUDY_SKYRL, IS_STUDY_SLIME: a checkout of that commit). Everything runs in its
own `is-study` process with only is-study's dependencies importable (tests/helpers/only_own_dependencies.py).

What this covers: conf/cases/nemo-rl.yaml's, skyrl.yaml's and slime.yaml's numbers are the frameworks' own (each `expect:` entry replayed on the
released loss with its recorded settings gives them again, NaN included); the audit of each mode finds
exactly the findings released.py lists (plus, at most, the `maybe` ones a search may or may not reach), none
under the realistic profile, and where a preset reproduces the target (`--reference correction=nemo-rl/MODE`)
the differential check passes on every generated batch.

The tests skip, saying why, only when the checkout cannot be fetched (no variable set and git cannot
reach the repository).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # fetches a framework's repository and audits it in subprocesses

REPO = Path(__file__).resolve().parent.parent
ONLY_OWN = REPO / "tests" / "helpers" / "only_own_dependencies.py"
spec = importlib.util.spec_from_file_location("released", REPO / "examples" / "audit" / "released.py")
released = sys.modules.setdefault("released", importlib.util.module_from_spec(spec))
spec.loader.exec_module(released)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    for checkout in released.CHECKOUTS:
        try:
            checkout.fetch(site)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            if os.environ.get(checkout.env):
                raise
            pytest.skip(
                f"{checkout.name} cannot be fetched from {checkout.url} ({exc}); set {checkout.env} to a "
                f"checkout of commit {checkout.commit}"
            )
    return site


def _is_study(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, str(ONLY_OWN), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


# case file, the package folder (the key of each entry's settings), the adapter
REPLAYED = {
    "nemo-rl": ("nemo_rl", "examples/audit/nemo_rl.py:ClippedPGLoss"),
    "skyrl": ("skyrl", "examples/audit/skyrl.py:PPOPolicyLoss"),
    "slime": ("slime", "examples/audit/slime.py:PolicyLoss"),
}
ENTRIES = [
    pytest.param(name, entry, id=f"{name}:{entry['preset']}:{i}")
    for name in REPLAYED
    for i, entry in enumerate(yaml.safe_load((REPO / "conf" / "cases" / f"{name}.yaml").read_text())["expect"])
]


@pytest.mark.parametrize("name,entry", ENTRIES)
def test_case_files_are_what_the_released_loss_gives(site, name, entry):
    from runner.audit.case_study import compare

    package, target = REPLAYED[name]
    kwargs = json.dumps({package: str(site / package), **entry[package]})
    got = _is_study("case", name, "--target", target, "--target-kwargs", kwargs, "--json")
    assert got.returncode == 0, got.stderr
    assert compare(json.loads(got.stdout), entry["results"]) == []


@pytest.mark.parametrize("profile", ["adversarial", "realistic"])
@pytest.mark.parametrize("target", released.CHECKOUT_TARGETS, ids=[t.name for t in released.CHECKOUT_TARGETS])
def test_checkout_audit_gives_the_listed_findings_and_matches_our_preset(site, tmp_path, target, profile):
    got = _is_study("audit", "--json", "--out", str(tmp_path), "--profile", profile, *target.argv(site))
    assert got.returncode in (0, 1), got.stderr
    cells = json.loads(got.stdout)
    findings = [_label(c) for c in cells if c["status"] == "fail"]
    expected = (*target.known, *target.other) if profile == "adversarial" else target.known
    assert got.returncode == (1 if findings else 0), got.stderr
    for start in expected:
        assert sum(f.startswith(start) for f in findings) == 1, (start, findings)
    others = [f for f in findings if not any(f.startswith(s) for s in expected)]
    assert all(any(f.startswith(s) for s in target.maybe) for f in others), others
    assert len(others) <= len(target.maybe), findings
    if "--reference" in target.args:  # the preset that reproduces the target agrees on every batch
        reference = [c for c in cells if c["invariant"] == "reference"]
        assert reference and all(c["status"] == "pass" for c in reference), reference
    empty = next(c for c in cells if c["invariant"] == "all-masked")
    assert empty["status"] == "pass", empty


def _label(cell: dict) -> str:
    from runner.audit.invariants import INVARIANTS

    n = cell["invariant"]
    return f"{n if isinstance(n, str) else f'{n} {INVARIANTS[n].short}'}: {cell['violation']}"


def test_the_audit_docs_show_the_checkout_commands():
    doc = (REPO / "docs" / "audit.md").read_text()
    for target in released.CHECKOUT_TARGETS:
        assert target.command() in doc, target.name
    for checkout in released.CHECKOUTS:
        assert checkout.commit in doc and checkout.env in doc
