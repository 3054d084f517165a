"""Every preset reproduces every number of the spec's worked cases (shared/spec/cases), to 1e-5:
the bug report's three cases and the frameworks' released-code cases, NaN/−inf included."""

from __future__ import annotations

import math

import pytest
import yaml

from runner.hydra_app import app as hydra_app
from runner.cases import load_case_file
from runner.corrections import Correction
from runner.losses import LossSpec
from runner.studies.case import compare, evaluate
from tests.helpers.repo import spec_case_file


def _entries():
    for name in ("seed-issue", "frameworks"):
        path = spec_case_file(name)
        data = yaml.safe_load(path.read_text())
        for entry in data["expect"]:
            yield pytest.param(path, entry, id=f"{name}:{entry['preset']}")


@pytest.mark.parametrize("path,entry", list(_entries()))
def test_preset_reproduces_spec_numbers(path, entry):
    cfg = hydra_app.compose([f"correction={entry['preset']}", *entry.get("overrides", [])])
    corr = Correction.from_config(hydra_app.to_container(cfg.correction))
    spec = LossSpec.from_config(hydra_app.to_container(cfg.loss))
    case_file = load_case_file(path)
    results = [evaluate(c, spec, corr) for c in case_file.cases]
    assert compare(results, entry["results"]) == []
    # finite is exactly "loss and grad finite"
    for res, exp in zip(results, entry["results"]):
        loss = float(exp["loss"])
        assert res["finite"] == (math.isfinite(loss) and all(
            math.isfinite(float(v)) for row in exp.get("grad", [[0.0]]) for v in row))


def test_seed_bug_numbers_side_by_side():
    """The headline of the bug report: as shipped −inf / NaN, fixed 0 with zero gradient."""
    case_file = load_case_file(spec_case_file("seed-issue"))
    spec = LossSpec()
    shipped = Correction.from_config(hydra_app.to_container(
        hydra_app.compose(["correction=openrlhf-bc71bb1/seq-mask-tis"]).correction))
    fixed = Correction.from_config(hydra_app.to_container(hydra_app.compose(["correction=seq-mask-tis"]).correction))
    accepted, rejected = case_file.cases[1], case_file.cases[2]
    assert evaluate(accepted, spec, shipped)["loss"] == "-inf"
    assert evaluate(rejected, spec, shipped)["loss"] == "nan"
    assert evaluate(accepted, spec, fixed)["loss"] == pytest.approx(-2.75)
    assert evaluate(rejected, spec, fixed)["loss"] == 0.0
    assert evaluate(rejected, spec, fixed)["grad"] == [[0.0, 0.0]]


@pytest.mark.parametrize("name", ["seed-issue", "frameworks"])
def test_case_check_command_passes(cli, name):
    code, out, err = cli("case", str(spec_case_file(name)), "--check")
    assert code == 0, err
    assert "mismatch" not in out.lower()


def test_case_check_names_a_mismatch(cli, tmp_path):
    text = spec_case_file("seed-issue").read_text().replace("{loss: -2.75, grad: [[-2.5, -0.25]]}", "{loss: -2.70, grad: [[-2.5, -0.25]]}", 1)
    path = tmp_path / "wrong.yaml"
    path.write_text(text)
    code, out, err = cli("case", str(path), "correction=tis", "--check")
    assert code == 1
    assert "MISMATCH tis: accepted-moderate: loss expected -2.7, got -2.75" in err


def test_case_json_encodes_nonfinite(cli):
    import json

    code, out, err = cli("case", "openrlhf-seq-mask-tis", "correction=openrlhf-bc71bb1/seq-mask-tis", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["accepted-moderate", "accepted-extreme", "rejected-extreme"]
    assert rows[0]["loss"] == pytest.approx(-5.05) and rows[0]["finite"] is True
    assert rows[1]["loss"] == "-inf" and rows[1]["grad"] == [["-inf", 0.0]] and rows[1]["finite"] is False
    assert rows[2]["loss"] == "nan" and rows[2]["grad"][0][0] == "nan"
    assert rows[0]["weights"] == [[pytest.approx(10.0, rel=1e-5), pytest.approx(0.1, rel=1e-5)]]
    assert set(rows[0]["metrics"]) >= {"ess", "is_weight_mean", "kl_k3", "chi2_seq", "nonfinite_loss", "nonfinite_grad"}
    assert rows[1]["metrics"]["nonfinite_loss"] == 1.0 and rows[1]["metrics"]["nonfinite_grad"] == 1.0
