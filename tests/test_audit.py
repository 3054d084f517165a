"""`is-study audit` (issue 7): the seven invariants find the seed bug by themselves, our presets pass
them all, external losses in OpenRLHF's PolicyLoss convention can be audited, and every failure
comes with a shrunk case file that `is-study case` reproduces.

Hypothesis always runs derandomized (runner/audit/generators.py: hypothesis_settings), so these
tests are deterministic. They audit one preset at a time, or use the "fast" profile, to stay fast.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from runner.audit.case_files import load_case_file

SEED_PRESET = "openrlhf-bc71bb1/seq-mask-tis"
PLANTED = "tests.helpers.external_loss_planted_bug:PlantedLoss"
KEYS = {
    "preset",
    "invariant",
    "status",
    "faithful",
    "counterexample",
    "violation",
    "reason",
    "note",
    "loss",
    "found_by",
    "profile",
    "seconds",
}
CHECKS = [1, 2, 3, 4, 5, 6, 7, "all-masked"]


def _audit(cli, out: Path, *args: str) -> tuple[int, list[dict], str]:
    code, stdout, stderr = cli("audit", "--json", "--out", str(out), *args)
    cells = json.loads(stdout) if stdout.strip() else []
    return code, cells, stderr


def _by_invariant(cells: list[dict], preset: str | None = None) -> dict[int, dict]:
    return {c["invariant"]: c for c in cells if preset is None or c["preset"] == preset}


def _check_schema(cells: list[dict]) -> None:
    assert cells
    for c in cells:
        assert set(c) == KEYS, c
        assert isinstance(c["preset"], str) and c["preset"]
        assert c["invariant"] in CHECKS or c["invariant"] in ("reference", "raises")
        assert c["status"] in ("pass", "fail", "n/a", "raise")
        assert isinstance(c["faithful"], bool)
        assert c["profile"] in ("adversarial", "realistic", "ordinary")
        assert isinstance(c["seconds"], float) and c["seconds"] >= 0
        if c["status"] == "fail":
            assert isinstance(c["counterexample"], str) and Path(c["counterexample"]).is_file(), c
            assert c["violation"] and c["found_by"], c
        else:
            assert c["counterexample"] is None and c["violation"] is None, c
    for preset in {c["preset"] for c in cells}:
        checks = [c["invariant"] for c in cells if c["preset"] == preset and c["invariant"] in CHECKS]
        assert sorted(checks, key=str) == sorted(CHECKS, key=str)


def _number(value) -> float:
    return float(value) if not isinstance(value, str) else {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[value]


def _case_loss(cli, path: str, *overrides: str, code_wanted: int = 0) -> float:
    code, out, err = cli("case", path, *overrides, "--json")
    assert code == code_wanted, err
    results = json.loads(out)
    assert len(results) == 1
    return _number(results[0]["loss"])


def _shape(path: str) -> tuple[int, int]:
    (case,) = load_case_file(path).cases
    return len(case.log_probs), len(case.log_probs[0])


# --------------------------------------------------------------------------------- acceptance
@pytest.mark.slow
def test_seed_bug_fails_1_and_2_with_a_tiny_counterexample(cli, tmp_path):
    code, cells, err = _audit(cli, tmp_path / "out", f"correction={SEED_PRESET}")
    _check_schema(cells)
    assert code == 0, err  # a faithful preset reproduces upstream behaviour: no exit 1
    inv = _by_invariant(cells)
    assert inv[1]["status"] == "fail" and inv[2]["status"] == "fail"
    assert all(c["faithful"] for c in cells)
    for n in (1, 2):
        path = inv[n]["counterexample"]
        B, T = _shape(path)
        assert B == 1 and T <= 2, (n, B, T)
        text = Path(path).read_text()
        assert text.startswith("# is-study audit:") and f"reproduce: is-study case {path}   (the file names" in text
        # the file names its preset: no correction= needed, and the finding replays as exit 1
        assert not math.isfinite(_case_loss(cli, path, code_wanted=1))


@pytest.mark.slow
def test_hypothesis_alone_finds_and_shrinks_the_seed_bug(tmp_path):
    """Without the hand-written cases, the property-based search finds and shrinks it too."""
    from runner.audit.command import run_audit

    cells = run_audit(
        [f"correction={SEED_PRESET}"], out_dir=tmp_path, budget="fast", invariants=[1, 2], hand=False, all_masked=False
    )
    assert [c.status for c in cells] == ["fail", "fail"]
    for c in cells:
        assert "hypothesis" in c.found_by
        B, T = _shape(c.counterexample)
        assert B == 1 and T <= 2


def test_bc71bb1_icepop_fails_invariant_1(cli, tmp_path):
    code, cells, _ = _audit(cli, tmp_path, "correction=openrlhf-bc71bb1/icepop")
    _check_schema(cells)
    assert code == 0
    assert _by_invariant(cells)[1]["status"] == "fail"


def test_openrlhf_011_seq_mask_fails_1_on_an_accepted_extreme_sequence(cli, tmp_path):
    from runner.core.corrections import Correction, apply_correction
    from runner.hydra_app import app as hydra_app

    preset = "openrlhf-0.11/seq-mask"
    code, cells, _ = _audit(cli, tmp_path, f"correction={preset}")
    assert code == 0
    cell = _by_invariant(cells)[1]
    assert cell["status"] == "fail"
    (case,) = load_case_file(cell["counterexample"]).cases
    t = case.tensors(torch.float32)
    corr = Correction.from_config(hydra_app.to_container(hydra_app.compose([f"correction={preset}"]).correction))
    res = apply_correction(corr, t["old_log_probs"], t["rollout_log_probs"], t["action_mask"], metrics=False)
    inside = t["action_mask"] > 0
    assert bool(inside.all()) and bool(res.keep[inside].all())  # every token generated, the sequence accepted
    assert float((t["old_log_probs"] - t["rollout_log_probs"]).abs().max()) > 88.8  # e^lr overflows float32
    assert not math.isfinite(_case_loss(cli, cell["counterexample"], f"correction={preset}", code_wanted=1))


@pytest.mark.slow
def test_every_own_preset_passes_every_invariant(tmp_path):
    from runner import registry
    from runner.audit.command import audit_groups, preset_groups
    from runner.audit.generators import BUDGETS

    own = registry.own_presets()
    assert {"none", "tis", "icepop", "seq-mask-tis", "seq-tis", "seq-mis", "geo-mask"} <= set(own)
    groups = [g for g in preset_groups([]) if g.name in own]
    cells = audit_groups(groups, BUDGETS["default"], tmp_path)
    failures = [f"{c.preset} #{c.invariant} (loss={c.loss}): {c.detail}" for c in cells if c.status == "fail"]
    assert not failures, failures
    for c in cells:  # these apply to every preset: they must really have run
        if c.invariant in (1, 4, 5, 6, 7, "all-masked"):
            assert c.status == "pass", c
    assert not list(tmp_path.iterdir())


def test_an_own_preset_that_fails_exits_1_and_its_case_file_checks(cli, tmp_path):
    """tis with low=2 is not plain PPO on-policy (coefficient 2): invariant 5, exit 1, and the saved
    file carries `none`'s numbers, so `is-study case FILE --check` shows the mismatch."""
    code, cells, _ = _audit(cli, tmp_path, "correction=tis", "correction.low=2")
    _check_schema(cells)
    assert code == 1
    inv = _by_invariant(cells)
    assert inv[5]["status"] == "fail" and not inv[5]["faithful"]
    assert inv[1]["status"] == "pass"
    path = inv[5]["counterexample"]
    assert f"is-study case {path} --check" in Path(path).read_text()
    code, _, err = cli("case", path, "--check")
    assert code == 1 and "MISMATCH" in err
    code, _, err = cli("case", path)  # the file names its preset and overrides: invariant 5 fails again
    assert code == 1 and err.strip().splitlines()[-1] == (
        "FAIL invariant 5 (on-policy inputs give coefficient 1 and the loss of `none`) on tis loss=ppo: "
        f"{inv[5]['violation']}"
    )
    assert load_case_file(path).audit["overrides"] == ["correction=tis", "loss=ppo", "correction.low=2"]


def test_padding_counterexample_checks_against_clean_padding(cli, tmp_path):
    from runner.audit.command import run_audit

    (cell,) = run_audit(["correction=verl/token-tis"], out_dir=tmp_path, invariants=[4], all_masked=False)
    assert cell.status == "fail" and cell.faithful
    cases = load_case_file(cell.counterexample).cases
    assert [c.name for c in cases] == ["clean-padding", "garbage-padding"]
    code, _, err = cli("case", cell.counterexample, "--check")
    assert code == 1 and "garbage-padding" in err


# --------------------------------------------------------------------------------- replaying a counterexample
@pytest.mark.slow
def test_a_preset_counterexample_replays_its_finding_and_exits_1(cli, tmp_path):
    """Issue 31: `is-study case FILE` on a preset's counterexample ran under correction=none and
    exited 0 (the preset was only in a comment). The file now carries its preset and check as data."""
    code, cells, _ = _audit(cli, tmp_path, f"correction={SEED_PRESET}")
    failed = [c for c in cells if c["status"] == "fail"]
    assert sorted((c["invariant"] for c in failed), key=str) == [1, 2, 4, "all-masked"]
    labels = {
        1: "invariant 1 (finite inputs give a finite loss and gradient)",
        2: "invariant 2 (a rejected unit contributes exactly zero gradient)",
        4: "invariant 4 (values at mask = 0 (even NaN/±inf) change neither loss nor gradient)",
        "all-masked": "the all-masked check (a batch with no generated token gives a finite loss and gradient "
        "(or an allowed refusal))",
    }
    for cell in failed:
        path = cell["counterexample"]
        audit = load_case_file(path).audit
        assert audit == {
            "check": cell["invariant"],
            "violation": cell["violation"],
            "overrides": [f"correction={SEED_PRESET}", "loss=ppo"],
            **({"case": "garbage-padding"} if cell["invariant"] == 4 else {}),
        }, audit
        code, _, err = cli("case", path)
        assert code == 1, err
        assert (
            err.strip().splitlines()[-1]
            == f"FAIL {labels[cell['invariant']]} on {SEED_PRESET} loss=ppo: {cell['violation']}"
        )

    inv2 = _by_invariant(cells)[2]["counterexample"]
    # the command line still wins: another preset is checked the same way, key by key otherwise
    code, _, err = cli("case", inv2, "correction=seq-mask-tis")
    assert code == 0 and err.strip().splitlines()[-1].startswith(
        f"pass {labels[2]} on seq-mask-tis loss=ppo: holds on this file (the audit found: "
    )
    code, _, err = cli("case", inv2, "loss=reinforce")
    assert code == 1 and f"FAIL {labels[2]} on {SEED_PRESET} loss=reinforce: " in err
    code, _, err = cli("case", inv2, "correction=none")
    assert code == 0 and f"n/a {labels[2]} on none loss=ppo: does not apply (no filter and no veto" in err


def test_a_case_file_without_an_audit_block_runs_as_before(cli, tmp_path):
    code, cells, _ = _audit(cli, tmp_path, f"correction={SEED_PRESET}")
    path = Path(_by_invariant(cells)[1]["counterexample"])
    old = tmp_path / "old-style.yaml"
    old.write_text(path.read_text().split("\naudit:\n")[0] + "\n")
    assert load_case_file(old).audit is None
    code, out, err = cli("case", str(old), "--json")
    assert code == 0 and err == ""  # correction=none, as an old file always ran
    assert json.loads(out)[0]["finite"] is True
    assert not math.isfinite(_case_loss(cli, str(old), f"correction={SEED_PRESET}"))


@pytest.mark.parametrize(
    "block, needle",
    [
        ("audit: [1]", "`audit:` must be a mapping with a `check:`"),
        ("audit: {violation: x}", "`audit:` must be a mapping with a `check:`"),
        ("audit: {check: 1, colour: red}", "unknown key(s) in `audit:`: 'colour'"),
        ("audit: {check: 1, overrides: correction=tis}", "`audit.overrides` must be a list"),
        ("audit: {check: 1, case: nope}", "`audit.case` names 'nope'"),
        ("audit: {check: 9}", "`audit.check` must be an invariant 1-7"),
        ("audit: {check: true}", "`audit.check` must be an invariant 1-7"),
        ("audit: {check: reference}", "needs `reference:`"),
        ("audit: {check: raises, dtype: float16}", "`audit.dtype` must be float32 or float64"),
    ],
)
def test_a_bad_audit_block_is_one_line_and_exit_2(cli, tmp_path, block, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "cases:\n- {log_probs: [[0.0]], old_log_probs: [[0.0]], rollout_log_probs: [[0.0]], "
        "advantages: [[1.0]]}\n" + block + "\n"
    )
    code, out, err = cli("case", str(path))
    assert code == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err


def test_a_reference_counterexample_replays_against_its_preset(cli, tmp_path):
    from runner.audit.command import run_audit

    cells = run_audit(
        [f"correction={SEED_PRESET}", "loss=ppo"],
        out_dir=tmp_path,
        invariants=[1],
        all_masked=False,
        reference="correction=seq-mask-tis",
    )
    ref = next(c for c in cells if c.invariant == "reference")
    assert ref.status == "fail"
    assert load_case_file(ref.counterexample).audit["reference"] == "seq-mask-tis"
    code, _, err = cli("case", ref.counterexample)
    assert code == 1
    assert err.strip() == (
        f"FAIL the reference check (the results of correction=seq-mask-tis on ordinary inputs) on "
        f"{SEED_PRESET} loss=ppo: token[0][0] gets weight 10; correction=seq-mask-tis gives 5"
    )
    code, _, err = cli("case", ref.counterexample, "correction=seq-mask-tis")  # the reference itself agrees
    assert code == 0 and err.startswith("pass the reference check")


# --------------------------------------------------------------------------------- external targets
def test_planted_bug_fails_and_a_correct_external_loss_passes(cli, tmp_path):
    code, cells, _ = _audit(cli, tmp_path / "planted", "--target", PLANTED)
    _check_schema(cells)
    assert code == 1
    inv = _by_invariant(cells)
    assert {c["preset"] for c in cells} == {PLANTED} and not any(c["faithful"] for c in cells)
    assert inv[1]["status"] == "fail" and inv[2]["status"] == "fail" and inv[4]["status"] == "fail"
    assert inv[3]["status"] == "n/a"
    B, T = _shape(inv[1]["counterexample"])
    assert B == 1 and T <= 2

    for target, kwargs in (
        ("tests.helpers.external_loss_planted_bug:CorrectLoss", None),
        ("tests.helpers.external_loss_planted_bug:correct_policy_loss", '{"high": 3.0}'),
    ):
        args = ["--target", target] + (["--target-kwargs", kwargs] if kwargs else [])
        code, cells, err = _audit(cli, tmp_path / "correct", *args)
        _check_schema(cells)
        assert code == 0, (target, err)
        assert {c["invariant"]: c["status"] for c in cells} == {
            1: "pass",
            2: "pass",
            3: "n/a",
            4: "pass",
            5: "pass",
            6: "pass",
            7: "pass",
            "all-masked": "pass",
        }


def test_invariants_5_6_7_have_teeth(tmp_path):
    """External losses with one planted defect each: a wrong scale, a batch-order dependence and a
    gradient that does not match the loss."""
    from runner.audit.command import Group, audit_groups
    from runner.audit.generators import BUDGETS
    from runner.audit.subjects import ExternalSubject
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec, policy_loss

    corr = Correction(name="seq-mask-tis", weight="token", weight_op="clamp", filter="geometric", low=0.5, high=5.0)

    def good(lp, old, adv, action_mask=None, rollout_log_probs=None):
        return policy_loss(LossSpec(), corr, lp, old, rollout_log_probs, adv, action_mask, metrics=False).loss

    def doubled(*args, **kw):
        return 2 * good(*args, **kw)

    def first_row_advantage(lp, old, adv, **kw):
        return good(lp, old, torch.where(kw["action_mask"] > 0, adv[:1].nan_to_num(), adv), **kw)

    def detached_half(lp, old, adv, **kw):
        return good(0.5 * (lp + lp.detach()), old, adv, **kw) + 0.0 * lp.sum()

    expected = {doubled: 5, first_row_advantage: 6, detached_half: 7}
    for fn, n in expected.items():
        (cell,) = audit_groups(
            [Group(fn.__name__, False, [ExternalSubject(fn.__name__, fn)])],
            BUDGETS["default"],
            tmp_path,
            invariants=[n],
            all_masked=False,
        )
        assert cell.status == "fail", (fn.__name__, n)
    (cell,) = audit_groups(
        [Group("good", False, [ExternalSubject("good", good)])],
        BUDGETS["default"],
        tmp_path,
        invariants=[7],
        all_masked=False,
    )
    assert cell.status == "pass"


PLANTED_5_6_7 = """
import torch
from runner.core.corrections import Correction
from runner.core.losses import LossSpec, policy_loss

CORR = Correction(name="seq-mask-tis", weight="token", weight_op="clamp", filter="geometric", low=0.5, high=5.0)


def good(lp, old, adv, action_mask=None, rollout_log_probs=None):
    return policy_loss(LossSpec(), CORR, lp, old, rollout_log_probs, adv, action_mask, metrics=False).loss


def doubled(*args, **kw):
    return 2 * good(*args, **kw)


def first_row_advantage(lp, old, adv, **kw):
    return good(lp, old, torch.where(kw["action_mask"] > 0, adv[:1].nan_to_num(), adv), **kw)


def detached_half(lp, old, adv, **kw):
    return good(0.5 * (lp + lp.detach()), old, adv, **kw) + 0.0 * lp.sum()
"""


@pytest.mark.parametrize("fn, n", [("doubled", 5), ("first_row_advantage", 6), ("detached_half", 7)])
def test_counterexamples_of_5_6_7_replay_on_their_target(cli, tmp_path, fn, n):
    """The on-policy case, the permuted rows (in float64) and the finite differences (in float64)
    are checked again by `is-study case FILE`, as the audit checked them."""
    from runner.audit.command import run_audit
    from runner.audit.invariants import INVARIANTS

    module = tmp_path / "planted_5_6_7.py"
    module.write_text(PLANTED_5_6_7)
    (cell,) = run_audit(out_dir=tmp_path / "out", target=f"{module}:{fn}", invariants=[n], all_masked=False)
    assert cell.status == "fail"
    code, _, err = cli("case", cell.counterexample)
    assert code == 1, err
    assert (
        err.strip().splitlines()[-1] == f"FAIL invariant {n} ({INVARIANTS[n].text}) on planted_5_6_7:{fn}: "
        f"{cell.detail}"
    )
    code, _, err = cli("case", cell.counterexample, "--target", f"{module}:good")
    assert code == 0 and f"pass invariant {n} " in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--target", "nocolon"), "module:attr"),
        (("--target", "no_such_module_xyz:Loss"), "cannot import"),
        (("--target", "tests.helpers.external_loss_planted_bug:Missing"), "no attribute"),
        (("--target", "tests.helpers.external_loss_planted_bug:NOT_CALLABLE"), "not callable"),
        (("--target", PLANTED, "--target-kwargs", "{bad json"), "not valid JSON"),
        (("--target", PLANTED, "--target-kwargs", "[1, 2]"), "JSON object"),
        (("--target", PLANTED, "--target-kwargs", '{"nope": 1}'), "failed"),
        (("--target-kwargs", "{}"), "needs --target"),
        (("--target", PLANTED, "correction=tis"), "do not apply"),
        (("correction=no-such-preset",), "unknown correction"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, needle):
    code, out, err = cli("audit", "--out", str(tmp_path), *args)
    assert code == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err


def test_help_documents_the_external_convention(cli):
    code, out, _ = cli("audit", "--help")
    flat = " ".join(out.split())
    assert code == 0
    for needle in (
        "module:attr",
        "rollout_log_probs",
        "action_mask",
        "first item",
        "--thorough",
        "--json",
        "e.g. is-study audit",
    ):
        assert needle in flat, needle


# --------------------------------------------------------------------------------- behaviour
def test_table_output_marks_faithful_failures_as_upstream(cli, tmp_path):
    code, out, _ = cli("audit", "--out", str(tmp_path), f"correction={SEED_PRESET}")
    assert code == 0
    flat = " ".join(out.split())
    assert "FAIL" in flat and ("reproduces upstream behaviour" in flat)


@pytest.mark.slow
def test_the_audit_is_deterministic_and_removes_stale_counterexamples(tmp_path):
    from runner.audit.command import run_audit

    stale = tmp_path / "tis.inv1.yaml"
    stale.write_text("cases: []\n")
    args = dict(out_dir=tmp_path, budget="fast", invariants=[1, 2, 4], hand=False)
    first = run_audit([f"correction={SEED_PRESET}"], **args)
    texts = {c.counterexample: Path(c.counterexample).read_text() for c in first if c.counterexample}
    second = run_audit([f"correction={SEED_PRESET}"], **args)

    def timeless(cells):
        return [{k: v for k, v in c.to_json().items() if k != "seconds"} for c in cells]

    assert timeless(first) == timeless(second)
    assert texts == {c.counterexample: Path(c.counterexample).read_text() for c in second if c.counterexample}
    run_audit(["correction=tis"], out_dir=tmp_path, budget="fast", invariants=[1], all_masked=False)
    assert not stale.exists()


def test_thorough_budget_searches_longer():
    from runner.audit.generators import BUDGETS, KINDS

    for kind in KINDS:
        thorough, default, fast = (BUDGETS[p].examples[kind] for p in ("thorough", "default", "fast"))
        assert thorough > default > fast


# --------------------------------------------------------------------------------- algebra findings
def test_gspo_finite_inputs_give_a_finite_gradient(tmp_path):
    """Found by this audit: gspo's sequence ratio overflowed to inf on lp − old = 1000 and the
    clipped branch's backward gave 0·inf = NaN; the log-ratio is now clamped to ±20 like PPO's."""
    from runner.audit.command import run_audit

    (cell,) = run_audit(
        ["correction=none", "loss=gspo"], out_dir=tmp_path, budget="fast", invariants=[1], all_masked=False
    )
    assert cell.status == "pass", cell.detail
