"""The `is-study case` command on the spec's worked cases (shared/spec/cases): --check passes, a
wrong number is named, --json encodes NaN/−inf. The numbers themselves, preset by preset, are
checked in tests/test_corrections.py."""

from __future__ import annotations

import pytest

from tests.helpers.repo import spec_case_file


@pytest.mark.slow
@pytest.mark.parametrize("name", ["seed-issue", "frameworks"])
def test_case_check_command_passes(cli, name):
    code, out, err = cli("case", str(spec_case_file(name)), "--check")
    assert code == 0, err
    assert "mismatch" not in out.lower()


def test_case_check_names_a_mismatch(cli, tmp_path):
    text = (
        spec_case_file("seed-issue")
        .read_text()
        .replace("{loss: -2.75, grad: [[-2.5, -0.25]]}", "{loss: -2.70, grad: [[-2.5, -0.25]]}", 1)
    )
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
