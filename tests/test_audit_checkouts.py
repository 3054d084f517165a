"""The audit, and the committed worked cases, on released framework code that is not on PyPI at the audited
version (examples/audit/released.py's CHECKOUTS: NeMo-RL, SkyRL, ROLL, prime-rl and slime, each at a named commit). The checkout is fetched at test
time (`git fetch --depth 1` of the commit; nothing installed, nothing of it in this repository), or taken from
the folder a Checkout's variable names (IS_STUDY_NEMO_RL, IS_STUDY_SKYRL, IS_STUDY_ROLL, IS_STUDY_PRIME_RL, IS_STUDY_SLIME: a
checkout of that commit). Everything runs in its
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
    "roll": ("roll", "examples/audit/roll.py:ActorLoss"),
    "prime-rl": ("prime_rl", "examples/audit/prime_rl.py:RLLoss"),
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
    # the preset that reproduces the target agrees on every batch (unless the disagreement is the listed bug)
    if "--reference" in target.args and not any(s.startswith("reference") for s in expected):
        reference = [c for c in cells if c["invariant"] == "reference"]
        assert reference and all(c["status"] == "pass" for c in reference), reference
    empty = next(c for c in cells if c["invariant"] == "all-masked")
    if not any(s.startswith("all-masked") for s in expected):  # prime-rl: 0·inf on an all-masked batch
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


def test_rolls_pg_variants_are_our_losses_element_for_element(site):
    """ROLL's pg_variant losses (roll/pipeline/rlvr/actor_pg_worker.py, compiled from the checkout) against ours, per
    token and its gradient, on 20 random batches (|lp − old| ~ 0.5 and ~ 3): cispo with ROLL's ε = 0.1 is
    loss=cispo, tis (clamp(r, 0, 1)) is loss=cispo with eps_low 1 and eps_high 0, kimi15 with τ = 0.1 is loss=kimi15
    with kl_tau 0.05, topr is loss=topr (scores of the advantages' sign), cispo_use_unified_mask is loss.cispo_mask.
    Measured difference: exactly 0."""
    import types

    import torch

    sys.path.insert(0, str(REPO / "examples" / "audit"))
    from compiled_source import compile_into

    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec, policy_loss

    ns = {"torch": torch, "np": None, "DataProto": object, "ActorWorker": object}
    compile_into(ns, site / "roll" / "pipeline" / "rlvr" / "actor_pg_worker.py", {"ActorPGWorker"})
    worker = ns["ActorPGWorker"]
    ours = {
        "cispo": LossSpec(name="cispo", eps_low=0.1, eps_high=0.1),
        "tis": LossSpec(name="cispo", eps_low=1.0, eps_high=0.0),
        "kimi15": LossSpec(name="kimi15", kl_tau=0.05),
        "topr": LossSpec(name="topr"),
        "cispo-unified": LossSpec(name="cispo", eps_low=0.1, eps_high=0.1, cispo_mask=True),
    }
    settings = {"cispo_epsilon_low": 0.1, "cispo_epsilon_high": 0.1, "kimi15_tau": 0.1}

    def roll_loss(variant, lp, old, adv, scores):
        self = types.SimpleNamespace(
            _pg_config_cache={},
            _cispo_config_logged=True,
            _kimi15_config_logged=True,
            _topr_sample_logged=True,
            _cached_metrics={},
            pipeline_config=types.SimpleNamespace(
                actor_train=types.SimpleNamespace(**settings, cispo_use_unified_mask=variant == "cispo-unified")
            ),
        )
        self._get_or_cache_config = lambda key, default: worker._get_or_cache_config(self, key, default)
        ratio, data = (lp - old).exp(), types.SimpleNamespace(batch={"scores": scores})
        if variant in ("cispo", "cispo-unified"):
            return worker._compute_cispo_loss(self, ratio, lp, adv)
        if variant == "kimi15":
            return worker._compute_kimi15_loss(self, ratio, lp, old, adv)
        method = worker._compute_tis_loss if variant == "tis" else worker._compute_topr_loss
        return method(self, ratio, lp, old, adv, data)

    g = torch.Generator().manual_seed(26)
    for trial in range(20):
        old = -torch.rand(8, 16, generator=g) * 3
        lp0 = old + torch.randn(8, 16, generator=g) * (0.5 if trial % 2 else 3.0)
        scores = torch.randn(8, generator=g)
        adv = scores.unsqueeze(-1).expand(8, 16).clone()
        for variant, spec in ours.items():
            theirs_lp, mine_lp = lp0.clone().requires_grad_(True), lp0.clone().requires_grad_(True)
            theirs = roll_loss(variant, theirs_lp, old, adv, scores)
            theirs.sum().backward()
            mine = policy_loss(spec, Correction(padding="multiply"), mine_lp, old, old, adv, torch.ones_like(old))
            mine.per_token.sum().backward()
            assert torch.equal(theirs.detach(), mine.per_token.detach()), variant
            assert torch.equal(theirs_lp.grad, mine_lp.grad), variant


def test_segment_means_are_rolls_to_float32_rounding(site):
    """runner/core/segments.py against ROLL's compute_segment_masked_mean (roll/pipeline/agentic/utils.py, compiled
    from the checkout) on 200 random [3, 7] masks with gaps: equal to 2e-7 (measured at most 1.8e-7; ROLL divides
    each run's sum by n + 1e-8 and sums in another order)."""
    import torch

    sys.path.insert(0, str(REPO / "examples" / "audit"))
    from compiled_source import compile_into

    from runner.core.segments import segment_mean

    ns = {"torch": torch}
    compile_into(ns, site / "roll" / "pipeline" / "agentic" / "utils.py", {"compute_segment_masked_mean"})
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        x = torch.randn(3, 7, generator=g)
        mask = (torch.rand(3, 7, generator=g) > 0.4).long()
        theirs = ns["compute_segment_masked_mean"](x, mask)
        assert torch.allclose(segment_mean(x, mask), theirs, rtol=0, atol=2e-7)
        assert torch.equal(segment_mean(x, mask) == 0, theirs == 0)  # the same positions outside every run
