"""`is-study audit --target` on code as it ships (issue 17): file targets loaded without their
package's __init__, stubs, calling conventions, weights functions, crashes reported once with
their line, the all-masked batch judged on its own, shrinking that keeps the failure, invariant 2
that tells rejected from PPO-clipped tokens, differential testing against a preset, input profiles,
case files named by their kwargs and replayed by `is-study case`.

The targets are small functions in tests/helpers/audit_targets.py; the released frameworks themselves are
audited in tests/test_audit_released.py.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import torch

from runner.audit.case_files import load_case_file
from runner.errors import UserError

TARGETS = "tests.helpers.audit_targets"
HERE = Path(__file__).resolve().parent


def _audit(cli, out: Path, *args: str) -> tuple[int, list[dict], str]:
    code, stdout, stderr = cli("audit", "--json", "--out", str(out), *args)
    return code, (json.loads(stdout) if stdout.strip() else []), stderr


def _cells(cells: list[dict], check) -> list[dict]:
    return [c for c in cells if c["invariant"] == check]


def _one(cells: list[dict], check) -> dict:
    (cell,) = _cells(cells, check)
    return cell


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# --------------------------------------------------------------------------------- loading
@pytest.fixture
def heavy_package(tmp_path):
    """pkg/__init__.py and pkg/models/__init__.py import what is not installed (as OpenRLHF's
    import the actor and peft); pkg/models/loss.py needs only a sibling and one stubbable module."""
    root = tmp_path / "site"
    models = root / "heavypkg" / "models"
    models.mkdir(parents=True)
    (root / "heavypkg" / "__init__.py").write_text("import not_installed_trainer_stack\n")
    (models / "__init__.py").write_text("from .actor import Actor\n")
    (models / "actor.py").write_text("import peft_that_is_missing\n")
    (models / "helpers.py").write_text(
        textwrap.dedent("""
        import fake_deepspeed_xyz
        import fake_deepspeed_xyz.comm as dist
        from fake_deepspeed_xyz.zero import Init

        class Wrapped(Init):          # a stub can be subclassed
            pass

        @fake_deepspeed_xyz.jit       # ... and used as a decorator, which hands the function back
        def masked_mean(x, mask):
            return (x * mask).sum() / mask.sum().clamp(min=1)
    """)
    )
    (models / "loss.py").write_text(
        textwrap.dedent("""
        import torch
        from .helpers import masked_mean
        from heavypkg.models.helpers import Wrapped

        @torch.compile
        def eager(x):
            return x

        class PolicyLoss(torch.nn.Module):
            def forward(self, log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None):
                live = action_mask > 0  # padding zeroed first: NaN there must reach neither loss nor gradient
                log_probs, old_log_probs, advantages = (torch.where(live, x, 0.0)
                                                        for x in (log_probs, old_log_probs, advantages))
                ratio = (log_probs - old_log_probs).clamp(-20, 20).exp()
                loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
                return masked_mean(eager(loss), action_mask), None
    """)
    )
    return models / "loss.py"


def test_a_file_target_loads_without_its_package_init_and_with_stubs(heavy_package):
    from runner.audit.loading import install_stubs, load_attr

    with pytest.raises(UserError, match="fake_deepspeed_xyz.*--stub"):
        load_attr(f"{heavy_package}:PolicyLoss")
    install_stubs(["fake_deepspeed_xyz"])
    cls = load_attr(f"{heavy_package}:PolicyLoss")
    assert cls.__module__ == "heavypkg.models.loss" and cls.__name__ == "PolicyLoss"
    helpers = __import__("sys").modules["heavypkg.models.helpers"]
    assert helpers.masked_mean.__name__ == "masked_mean"  # the stub decorator handed it back
    assert issubclass(helpers.Wrapped, helpers.Init)
    assert helpers.Wrapped() is not None
    # torch.compile was the identity while loading, and is torch's own again afterwards
    loss_module = __import__("sys").modules["heavypkg.models.loss"]
    assert loss_module.eager.__name__ == "eager" and loss_module.eager(3) == 3
    assert torch.compile.__module__.startswith("torch")
    out = cls()(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))[0]
    assert float(out) == pytest.approx(-1.0)


def test_a_file_target_is_audited_by_its_package_name(cli, tmp_path, heavy_package):
    code, cells, err = _audit(cli, tmp_path, "--target", f"{heavy_package}:PolicyLoss", "--stub", "fake_deepspeed_xyz")
    assert code == 0, err
    assert {c["preset"] for c in cells} == {"heavypkg.models.loss:PolicyLoss"}
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


# --------------------------------------------------------------------------------- conventions
def test_conventions_bind_names_positions_and_the_loss_key():
    from runner.audit.conventions import Caller

    seen = {}

    def fn(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return {"policy_loss": 7.0}, 3.0

    t = {r: torch.full((1, 1), float(i)) for i, r in enumerate(("lp", "old", "roll", "adv", "mask"))}
    caller = Caller.build("openrlhf", arg_map="roll=-,mask=1,old=response_mask", loss_key="1")
    assert caller.pick_loss(caller(fn, t)) == 3.0
    assert [float(a) for a in seen["args"]] == [0.0, 4.0, 3.0] and list(seen["kwargs"]) == ["response_mask"]
    verl = Caller.build("verl", call_kwargs={"loss_agg_mode": "token-mean"})
    verl(fn, t)
    assert set(seen["kwargs"]) == {"old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode"}
    assert Caller.build("plain", loss_key="policy_loss").pick_loss({"policy_loss": 5}) == 5


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(convention="nope"), "--convention"),
        (dict(convention="openrlhf", arg_map="bogus=x"), "unknown role"),
        (dict(convention="openrlhf", arg_map="lp"), "ROLE=PARAM"),
        (dict(convention="openrlhf", arg_map="adv=5"), "without gaps"),
        (dict(convention="openrlhf", arg_map="mask=x,roll=x"), "same parameter"),
        (dict(convention="openrlhf", call_kwargs={"action_mask": 1}), "passes itself"),
    ],
)
def test_bad_conventions_are_user_errors(kwargs, needle):
    from runner.audit.conventions import Caller

    with pytest.raises(UserError, match=needle):
        Caller.build(**kwargs)


def test_verl_convention_with_a_config_object_and_a_weights_function(cli, tmp_path):
    """A two-stage target: weights from one function, loss from another that takes them precomputed
    and a config object built with _target_; invariant 3 now runs on external code."""
    common = [
        "--convention",
        "verl",
        "--target",
        f"{TARGETS}:verl_style",
        "--call-kwargs",
        '{"loss_agg_mode": "token-mean", "config": {"_target_": "types.SimpleNamespace", "clip_ratio": 0.2}}',
        "--band",
        ",2",
    ]
    code, cells, err = _audit(cli, tmp_path / "good", *common, "--weights-fn", f"{TARGETS}:clamped_weights")
    assert code == 0, err
    assert _one(cells, 3)["status"] == "pass" and _one(cells, 2)["status"] == "pass"
    code, cells, _ = _audit(cli, tmp_path / "bad", *common, "--weights-fn", f"{TARGETS}:unclamped_weights")
    assert code == 1
    bounds = _one(cells, 3)
    assert bounds["status"] == "fail" and "outside [—, 2]" in bounds["violation"]
    (case,) = load_case_file(bounds["counterexample"]).cases
    lr = torch.tensor(case.old_log_probs) - torch.tensor(case.rollout_log_probs)
    assert float(lr.max()) > math.log(2)  # the counterexample really holds a ratio above the band


def test_a_weights_function_alone_is_audited_under_our_losses(cli, tmp_path):
    code, cells, err = _audit(
        cli, tmp_path, "--convention", "verl", "--weights-fn", f"{TARGETS}:clamped_weights", "--band", ",2"
    )
    assert code == 0, err
    assert _one(cells, 3)["status"] == "pass"
    assert {c["loss"] for c in cells if c["status"] == "fail"} == set()


def test_plain_convention_with_a_dict_loss(cli, tmp_path):
    code, cells, err = _audit(
        cli, tmp_path, "--convention", "plain", "--target", f"{TARGETS}:dict_loss", "--loss-key", "policy_loss"
    )
    assert code == 0, err
    assert _one(cells, 5)["status"] == "pass"


# --------------------------------------------------------------------------------- crashes
def test_an_exception_is_one_finding_with_its_line_and_allowed_refusals_are_not(cli, tmp_path):
    code, cells, _ = _audit(cli, tmp_path, "--target", f"{TARGETS}:icepop_with_ess", "--allow-raise", "ValueError")
    assert code == 1
    raised = [c for c in _cells(cells, "raises") if c["status"] == "fail"]
    assert len(raised) == 1, raised
    line = _line_of(HERE / "helpers" / "audit_targets.py", "ess = 1.0 / mean_square")
    # the audit names a file as its package spells it: tests/helpers/ is a package, tests/ is not
    assert raised[0]["violation"] == f"ZeroDivisionError: float division by zero at helpers/audit_targets.py:{line}"
    assert raised[0]["found_by"].startswith("the 1 finite check")
    case_text = Path(raised[0]["counterexample"]).read_text()
    assert "raises ZeroDivisionError" in case_text
    # no invariant counts the crash, and the all-masked ValueError is an allowed refusal, not a finding
    assert all(c["status"] != "fail" for c in cells if isinstance(c["invariant"], int))
    empty = _one(cells, "all-masked")
    assert empty["status"] == "pass" and "refused with ValueError (allowed)" in empty["note"]
    # the crash's counterexample replays as the crash, and exits 1 while it raises
    code, out, err = cli("case", raised[0]["counterexample"], "--json")
    assert code == 1, err
    assert [r["raised"] for r in json.loads(out)] == [raised[0]["violation"]]
    assert f"FAIL raises (an exception the audit found) on {TARGETS}:icepop_with_ess: {raised[0]['violation']}\n" in err

    code, cells, _ = _audit(cli, tmp_path / "strict", "--target", f"{TARGETS}:icepop_with_ess")
    assert _one(cells, "all-masked")["status"] == "raise"
    texts = sorted(c["violation"] for c in _cells(cells, "raises"))
    assert [t.split(":")[0] for t in texts] == ["ValueError", "ZeroDivisionError"]


def test_a_crash_inside_torch_is_reported_at_the_target_line():
    from runner.audit.crashes import CrashLog, raising_frame
    from runner.audit.subjects import SubjectRaised

    def bad(x):
        return torch.einsum("ij,jk->ik", x, x)

    try:
        bad(torch.zeros(2, 3))
    except RuntimeError as exc:
        file, line = raising_frame(exc)
    assert file == __file__ and line == _line_of(Path(__file__), 'return torch.einsum("ij,jk->ik", x, x)')
    log = CrashLog()
    from runner.audit.subjects import Batch

    batch = Batch.of([[0.0]], [[0.0]], [[0.0]], [[1.0]])
    for check in ("1 finite", "4 padding", "1 finite"):
        try:
            bad(torch.zeros(2, 3))
        except RuntimeError as exc:
            log.record(SubjectRaised(exc, batch, torch.float32), check)
    (crash,) = log.crashes.values()
    assert crash.checks == ["1 finite", "4 padding"] and crash.type == "RuntimeError"


# --------------------------------------------------------------------------------- all-masked batch
def test_the_all_masked_batch_is_its_own_check():
    import tests.helpers.audit_targets as targets
    from runner.audit.all_masked import check
    from runner.audit.crashes import CrashLog
    from runner.audit.generators import PROFILES
    from runner.audit.subjects import ExternalSubject

    reduction = check(ExternalSubject("nan", targets.nan_when_empty), PROFILES["adversarial"], CrashLog())
    assert reduction.status == "pass" and "with on-policy inputs too" in reduction.note
    leak = check(ExternalSubject("leak", targets.weight_leaks_when_empty), PROFILES["adversarial"], CrashLog())
    assert leak.status == "fail" and leak.violation.kind == "loss:nan"
    assert str(leak.violation) == "all-masked batch gives loss nan; on-policy the same batch is finite"
    assert leak.batch.all_masked


def test_all_masked_batches_never_reach_the_invariants():
    import tests.helpers.audit_targets as targets
    from runner.audit.invariants import INVARIANTS, violation
    from runner.audit.subjects import Batch, ExternalSubject

    empty = Batch.of([[0.0, -1.0]], [[0.0, -1.0]], [[-1000.0, -1.0]], [[1.0, 1.0]], [[0, 0]])
    subject = ExternalSubject("nan", targets.nan_when_empty)
    assert math.isnan(float(subject(empty).loss))
    assert all(violation(inv, subject, empty) is None for inv in INVARIANTS.values())


# --------------------------------------------------------------------------------- keeping the failure
def test_shrinking_keeps_the_failure_kind(tmp_path):
    """bc71bb1's seq-mask-tis: the accepted extreme sequence gives −inf, its rejected twin NaN; the
    −inf found first must still be −inf after shrinking (it was shrunk into NaN once)."""
    from runner.audit.command import run_audit

    (cell,) = run_audit(
        ["correction=openrlhf-bc71bb1/seq-mask-tis", "loss=ppo"], out_dir=tmp_path, invariants=[1], all_masked=False
    )
    assert cell.detail == "loss -inf on finite inputs"
    assert cell.found_by == "the hand-written case 'accepted-extreme'"
    assert f"found by {cell.found_by}" in Path(cell.counterexample).read_text()

    from runner.audit.command import Search
    from runner.audit.crashes import CrashLog
    from runner.audit.generators import BUDGETS, PROFILES
    from runner.audit.invariants import Violation
    from runner.audit.subjects import Batch

    def check(batch):  # −inf on the first row's token 0, NaN whenever there are two rows
        if batch.shape[0] >= 2:
            return Violation("nan", "loss:nan")
        return Violation("-inf", "loss:-inf") if float(batch.lp[0, 0]) == -7 else None

    big = Batch.of([[-7.0, 0.0, 1.0]] * 3, [[0.0] * 3] * 3, [[0.0] * 3] * 3, [[1.0] * 3] * 3)
    search = Search(BUDGETS["fast"], PROFILES["adversarial"], CrashLog())
    batch, found, how = search.find("test", check, [big.rows([0])] + [big], "finite")
    assert found.kind == "loss:-inf" and batch.shape == (1, 1)


def test_a_target_that_answers_differently_twice_is_still_reported(tmp_path):
    import tests.helpers.audit_targets as targets
    from runner.audit.command import Group, audit_groups
    from runner.audit.generators import BUDGETS
    from runner.audit.subjects import ExternalSubject

    (cell,) = audit_groups(
        [Group("flaky", False, [ExternalSubject("flaky", targets.flaky)])],
        BUDGETS["fast"],
        tmp_path,
        invariants=[1],
        hand=False,
        all_masked=False,
    )
    assert cell.status == "fail" and cell.detail == "loss nan on finite inputs"
    assert Path(cell.counterexample).is_file() and "answers differently twice" in cell.found_by


def test_invariant_2_tells_ppo_clipped_tokens_from_rejected_ones(tmp_path):
    """Unclamped PPO at lp − old = 100: the clip binds, so the gradient is 0 in float64 and 0·inf =
    NaN in float32. That token was clipped by PPO, not rejected: invariant 1 reports the NaN,
    invariant 2 must not call it a rejected unit."""
    import tests.helpers.audit_targets as targets
    from runner.audit.command import Group, audit_groups
    from runner.audit.generators import BUDGETS
    from runner.audit.invariants import check_finite, check_rejection
    from runner.audit.subjects import Batch, ExternalSubject

    subject = ExternalSubject("unclamped", targets.unclamped_ppo)
    clipped = Batch.of([[100.0 - 1.0, -1.0]], [[-1.0, -1.0]], [[-1.0, -1.0]], [[1.0, 1.0]])
    assert float(subject(clipped, torch.float64).grad[0, 0]) == 0
    assert math.isnan(float(subject(clipped).grad[0, 0]))
    assert check_rejection(subject, clipped) is None
    assert check_finite(subject, clipped).kind == "grad:nan"
    cells = audit_groups(
        [Group("unclamped", False, [subject])], BUDGETS["fast"], tmp_path, invariants=[1, 2], all_masked=False
    )
    assert [c.status for c in cells] == ["fail", "pass"]


def test_invariant_2_flags_a_finite_nonzero_gradient_on_a_rejected_row():
    """Issue 20: checking only for non-finite gradients at rejected units must not survive."""
    from runner.audit.invariants import check_rejection
    from runner.audit.subjects import Batch, PresetSubject
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec
    from runner.hydra_app import app as hydra_app

    corr = Correction.from_config(hydra_app.to_container(hydra_app.compose(["correction=geo-mask"]).correction))
    subject = PresetSubject(corr, LossSpec())
    # row 0 kept (ρ_geo = 1), row 1 rejected (ρ_geo = e^3 > 5)
    batch = Batch.of(
        [[-1.0, -1.0], [-1.0, -1.0]],
        [[-1.0, -1.0], [-1.0, -1.0]],
        [[-1.0, -1.0], [-4.0, -4.0]],
        [[1.0, 1.0], [1.0, 1.0]],
    )
    out = subject(batch)
    assert out.keep.tolist() == [[True, True], [False, False]]
    assert check_rejection(subject, batch) is None

    class Leaky(PresetSubject):
        def __call__(self, batch, dtype=torch.float32):
            res = super().__call__(batch, dtype)
            res.grad = res.grad + 1e-3 * (~res.keep).to(res.grad.dtype)
            return res

    found = check_rejection(Leaky(corr, LossSpec()), batch)
    assert found == "rejected unit[1][0] (+1 more) has gradient 0.001, expected exactly 0"
    assert found.kind == "rejected-grad:finite"


def test_invariant_3_flags_a_coefficient_outside_its_band():
    """Issue 20: invariant 3 had no test showing it can fail."""
    from runner.audit.invariants import check_bounds
    from runner.audit.subjects import Batch, PresetSubject
    from runner.core.corrections import Correction
    from runner.core.losses import LossSpec
    from runner.hydra_app import app as hydra_app

    corr = Correction.from_config(hydra_app.to_container(hydra_app.compose(["correction=tis"]).correction))
    batch = Batch.of([[-1.0, -1.0]], [[-1.0, -1.0]], [[-4.0, -1.0]], [[1.0, 1.0]])  # ρ = e^3 → clamp to 5
    assert check_bounds(PresetSubject(corr, LossSpec()), batch) is None

    class Doubled(PresetSubject):
        def __call__(self, batch, dtype=torch.float32):
            res = super().__call__(batch, dtype)
            res.coef = 2 * res.coef
            return res

    found = check_bounds(Doubled(corr, LossSpec()), batch)
    assert found == "kept coefficient[0][0] 10 outside [0.5, 5]" and found.kind == "coef:above"


# --------------------------------------------------------------------------------- reference
def test_the_reference_finds_the_missing_clamp_on_ordinary_inputs(tmp_path):
    from runner.audit.command import run_audit

    cells = run_audit(
        ["correction=openrlhf-bc71bb1/seq-mask-tis", "loss=ppo"],
        out_dir=tmp_path,
        invariants=[1],
        all_masked=False,
        reference="correction=seq-mask-tis",
    )
    ref = next(c for c in cells if c.invariant == "reference")
    assert ref.status == "fail" and ref.profile == "ordinary"
    assert ref.detail == "vs correction=seq-mask-tis: token[0][0] gets weight 10; correction=seq-mask-tis gives 5"
    (case,) = load_case_file(ref.counterexample).cases
    assert max(abs(a - b) for a, b in zip(case.old_log_probs[0], case.rollout_log_probs[0])) < 3
    same = run_audit(
        ["correction=seq-mask-tis", "loss=ppo"],
        out_dir=tmp_path / "same",
        invariants=[1],
        all_masked=False,
        reference="correction=seq-mask-tis",
    )
    assert [c.status for c in same] == ["pass", "pass"]


# --------------------------------------------------------------------------------- profiles
def test_the_realistic_profile_generates_only_realistic_batches():
    from runner.audit.generators import BUDGETS, KINDS, PROFILES, hand_cases, pool

    realistic = PROFILES["realistic"]
    for kind in KINDS:
        batches = pool(kind, BUDGETS["fast"], realistic)
        assert batches and all(realistic.admits(b) for b in batches), kind
        if kind in ("finite", "padding"):
            assert all(float(b.lp.min()) >= -100 and float((b.lp - b.old).abs().max()) <= 20 for b in batches)
            assert all(bool(((b.roll - b.old)[b.mask == 0].abs() <= 20).all()) for b in batches)
    names = {b.name for b in hand_cases() if realistic.admits(b)}
    assert "float32-overflow-kept" in names and "accepted-extreme" not in names


@pytest.mark.slow
def test_each_finding_names_its_profile(cli, tmp_path):
    for profile in ("adversarial", "realistic"):
        code, cells, _ = _audit(cli, tmp_path / profile, "--profile", profile, "correction=openrlhf-0.11/seq-mask")
        assert code == 0
        inv = {c["invariant"]: c for c in cells}
        assert inv[1]["status"] == "fail" and inv[1]["profile"] == profile
        # NaN at masked positions leaks only under adversarial input
        assert inv[4]["status"] == ("fail" if profile == "adversarial" else "pass")


# --------------------------------------------------------------------------------- case files
@pytest.mark.slow
def test_case_files_carry_a_hash_of_the_kwargs_and_replay_their_target(cli, tmp_path):
    out = tmp_path / "out"
    files = []
    for kwargs in ('{"high": 5.0}', '{"high": 3.0}', '{"high": 5.0}'):
        code, cells, _ = _audit(
            cli, out, "--target", "tests.helpers.external_loss_planted_bug:PlantedLoss", "--target-kwargs", kwargs
        )
        assert code == 1
        files.append(Path(_one(cells, 1)["counterexample"]).name)
    assert files[0] == files[2] != files[1]
    assert files[0].startswith("tests.helpers.external_loss_planted_bug--PlantedLoss.") and files[0].endswith(
        ".inv1.yaml"
    )

    path = out / files[1]
    assert load_case_file(path).target == {
        "target": "tests.helpers.external_loss_planted_bug:PlantedLoss",
        "target_kwargs": '{"high": 3.0}',
    }
    code, stdout, err = cli("case", str(path), "--json")
    assert code == 1 and "replaying the target recorded in" in err  # invariant 1 still fails there
    (result,) = json.loads(stdout)
    assert result["finite"] is False and result["loss"] in ("nan", "-inf", "inf")
    # explicit --target wins, and so does correction=: the same check, on what the command line names
    code, stdout, err = cli(
        "case", str(path), "--json", "--target", "tests.helpers.external_loss_planted_bug:CorrectLoss"
    )
    assert code == 0 and json.loads(stdout)[0]["finite"] is True
    assert (
        "pass invariant 1 (finite inputs give a finite loss and gradient) on "
        "tests.helpers.external_loss_planted_bug:CorrectLoss: holds on this file" in err
    )
    code, stdout, _ = cli("case", str(path), "--json", "correction=seq-mask-tis")
    assert code == 0 and json.loads(stdout)[0]["finite"] is True


def test_a_weights_function_counterexample_replays_under_the_loss_it_failed(cli, tmp_path):
    """A --weights-fn without --target is audited under our losses: the file records its loss too."""
    code, cells, _ = _audit(
        cli, tmp_path, "--convention", "verl", "--weights-fn", f"{TARGETS}:clamped_weights", "--band", ",1.5"
    )
    assert code == 1
    cell = _one(cells, 3)
    assert cell["status"] == "fail" and cell["loss"] == "ppo"
    case_file = load_case_file(cell["counterexample"])
    assert case_file.target == {"convention": "verl", "weights_fn": f"{TARGETS}:clamped_weights", "band": ",1.5"}
    assert case_file.audit == {
        "check": 3,
        "violation": "kept coefficient[0][0] 2 outside [—, 1.5]",
        "overrides": ["loss=ppo"],
    }
    code, _, err = cli("case", cell["counterexample"])
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "FAIL invariant 3 (truncated coefficients stay inside their declared "
        f"bounds) on {TARGETS}:clamped_weights loss=ppo: kept coefficient[0][0] 2 "
        "outside [—, 1.5]"
    )
    # the check follows the recorded target: with the band the weights really keep, it passes
    wider = tmp_path / "wider.yaml"
    wider.write_text(Path(cell["counterexample"]).read_text().replace("band: ',1.5'", "band: ',2'"))
    code, _, err = cli("case", str(wider))
    assert (
        code == 0
        and f"pass invariant 3 (truncated coefficients stay inside their declared bounds) on "
        f"{TARGETS}:clamped_weights loss=ppo: holds on this file"
        in err
    )


def test_the_table_prints_each_finding_on_one_line(cli, tmp_path):
    code, out, _ = cli(
        "audit", "--out", str(tmp_path), "--target", "tests.helpers.external_loss_planted_bug:PlantedLoss"
    )
    assert code == 1
    lines = [ln for ln in out.splitlines() if ln.startswith("  tests.helpers.external_loss_planted_bug:PlantedLoss · ")]
    assert [ln.split(" · ")[1].split(":")[0] for ln in lines] == ["1 finite", "2 reject→0", "4 padding", "all-masked"]
    assert all("[adversarial inputs] (bug) → " in ln and ln.endswith(".yaml") for ln in lines)


# --------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "args, needle",
    [
        (("--target", "no/such/file.py:Loss"), "no such file"),
        (("--target", "tests.no_such_module_xyz:Loss"), "cannot import"),
        (("--target", "tests/helpers/audit_targets.py:nope"), "no attribute"),
        (("--target", "tests.helpers.audit_targets:verl_style", "--convention", "nope"), "--convention"),
        (("--target", "tests.helpers.audit_targets:verl_style", "--convention", "verl"), "benign batch"),
        (("--target", "tests.helpers.audit_targets:dict_loss", "--convention", "plain"), "--loss-key"),
        (
            (
                "--target",
                "tests.helpers.audit_targets:unclamped_ppo",
                "--weights-fn",
                "tests.helpers.audit_targets:clamped_weights",
            ),
            "--arg-map weights=NAME",
        ),
        (("--target", "tests.helpers.audit_targets:unclamped_ppo", "--band", "1,2"), "give --weights-fn"),
        (("--target", "tests.helpers.audit_targets:unclamped_ppo", "--band", "x"), "LOW,HIGH"),
        (("--target", "tests.helpers.audit_targets:unclamped_ppo", "--call-kwargs", "[1]"), "JSON object"),
        (
            (
                "--target",
                "tests.helpers.audit_targets:unclamped_ppo",
                "--call-kwargs",
                '{"c": {"_target_": "no.such.Thing"}}',
            ),
            "building c from no.such.Thing failed",
        ),
        (("--target", "tests.helpers.audit_targets:unclamped_ppo", "--stub", "not a module"), "not a module name"),
        (
            ("--target", "tests.helpers.audit_targets:unclamped_ppo", "--stub", "torch.distributed"),
            "the audit itself needs torch",
        ),
        (("--stub", "ray"), "needs --target"),
        (
            ("--weights-fn", "tests.helpers.audit_targets:clamped_weights", "correction=tis"),
            "correction= does not apply",
        ),
        (("--profile", "gentle", "correction=tis"), "--profile"),
        (("--reference", "seq-mask-tis", "correction=tis"), "correction=PRESET"),
        (("--reference", "correction=no-such", "correction=tis"), "unknown correction preset"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, tmp_path, args, needle):
    code, out, err = cli("audit", "--out", str(tmp_path), *args)
    assert code == 2, (out, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err


def test_an_unwritable_out_dir_is_one_line_and_exit_2(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = cli(
        "audit", "--out", str(blocker / "sub"), "--target", "tests.helpers.external_loss_planted_bug:PlantedLoss"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err


def test_case_with_check_on_a_target_is_a_user_error(cli, tmp_path):
    code, cells, _ = _audit(cli, tmp_path, "--target", "tests.helpers.external_loss_planted_bug:PlantedLoss")
    code, _, err = cli(
        "case",
        _one(cells, 1)["counterexample"],
        "--check",
        "--target",
        "tests.helpers.external_loss_planted_bug:PlantedLoss",
    )
    assert code == 2 and "does not apply to a target" in err


def test_a_package_init_that_fails_points_at_the_file_form(cli, tmp_path, monkeypatch):
    """`--target openrlhf.models.loss:PolicyLoss` failed on `import peft` in the package's __init__."""
    pkg = tmp_path / "initfails"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import peft_is_not_installed_here\n")
    (pkg / "loss.py").write_text("def loss(*a, **k):\n    return 0.0\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("audit", "--out", str(tmp_path / "out"), "--target", "initfails.loss:loss")
    assert code == 2
    assert err.strip().endswith(
        "stub what the loss does not need with --stub peft_is_not_installed_here, "
        "or give its file (.../initfails/loss.py:loss) to skip its packages' __init__"
    )


def test_the_shrink_budget_stops_at_the_best_so_far():
    from runner.audit.command import BudgetedShrink
    from runner.audit.subjects import Batch

    batches = [Batch.of([[float(-i)]], [[0.0]], [[0.0]], [[1.0]]) for i in range(6)]
    budget = BudgetedShrink(lambda b: float(b.lp[0, 0]) != -1, calls=3)
    assert [budget(b) for b in batches] == [True, False, True, False, False, False]
    assert budget.used == 3 and budget(batches[2]) is True and budget(batches[0]) is False


def test_the_realistic_all_masked_batches_hold_realistic_values():
    from runner.audit.generators import PROFILES, all_masked_cases

    for b in all_masked_cases(PROFILES["realistic"]):
        assert b.all_masked
        logprobs = torch.stack([b.lp, b.old, b.roll])
        assert float(logprobs.max()) <= 0 and float(logprobs.min()) >= -100
        assert float((b.lp - b.old).abs().max()) <= 20 and float((b.roll - b.old).abs().max()) <= 20
