"""The command line: help, list without torch, and bad input as one line with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner import registry
from tests.helpers.repo import REPO, spec_case_file


def test_help_lists_every_command_with_an_example(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli("--help")
    assert code == 0
    for command in ("list", "show", "run", "case"):
        assert f"is-study {command}" in out.replace("\n", " ") or f"e.g. is-study {command}" in out


def test_list_and_help_do_not_import_torch():
    probe = (
        "import sys; from runner import cli; sys.argv=['is-study', %r]\n"
        "try: cli.main()\nexcept SystemExit: pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', 'HYDRA' if 'hydra' in sys.modules else 'NO-HYDRA',"
        " file=sys.stderr)"
    )
    for arg in ("list", "--help"):
        res = subprocess.run([sys.executable, "-c", probe % arg], cwd=REPO, capture_output=True, text=True)
        assert "NO-TORCH" in res.stderr, (arg, res.stderr)
        assert "NO-HYDRA" in res.stderr, (arg, res.stderr)


def test_list_shows_presets_with_descriptions(cli):
    code, out, _ = cli("list")
    assert code == 0
    assert "openrlhf-bc71bb1/seq-mask-tis" in out and "verl/geo-rs" in out and "trl/sequence-mask" in out
    assert "[0.999, 1.001]" in out  # geo-mask's band
    assert "ppo" in out and "gspo" in out and "reinforce" in out


def test_version_prints_the_package_version(cli):
    import re

    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    code, out, err = cli("--version")
    assert (code, out, err) == (0, f"is-study {version}\n", "")


def test_list_piped_prints_one_plain_line_per_item():
    """Not a terminal (a pipe, a file): no tables and no wrapping, one tab-separated line per item,
    what to type first; at 80 columns the tables wrapped to ~300 lines."""
    from runner import registry

    got = subprocess.run(
        [sys.executable, "-m", "runner", "list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=60,
    )
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    expected = [f"correction={e.name}" for e in registry.presets()] + [
        f"case {e.name}" if g == "cases" else f"{g}={e.name}" for g in registry.GROUPS[1:] for e in registry.entries(g)
    ]
    assert [line.split("\t")[0] for line in lines] == expected
    tis = next(line for line in lines if line.startswith("correction=tis\t"))
    assert tis.split("\t")[1:3] == ["ours", "[0.5, 5]"] and tis.split("\t")[3].startswith("token TIS")
    assert not any(ch in got.stdout for ch in "┏┃│━")


def test_list_on_a_terminal_keeps_its_tables(monkeypatch):
    import io
    import re

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    monkeypatch.setenv("COLUMNS", "200")
    from runner import cli as cli_module

    monkeypatch.setattr(sys, "argv", ["is-study", "list"])
    with pytest.raises(SystemExit) as exit_:
        cli_module.main()
    assert exit_.value.code == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", sys.stdout.getvalue())  # rich's styles on a terminal
    assert "correction presets  (correction=NAME)" in out and "┃ preset" in out
    # grouped by framework, with a count per framework, in the title and on each group's first row
    from runner import registry

    counts = {name: len(group) for name, group in registry.presets_by_framework()}
    assert "by framework: " + ", ".join(f"{name} {n}" for name, n in counts.items()) in out
    assert counts["is-study"] == 7 and counts["OpenRLHF"] == 6
    assert re.search(rf"│ nemo-rl/icepop +│ NeMo-RL \({counts['NeMo-RL']}\) +│", out) and re.search(
        r"│ openrlhf-0\.11/seq-mask +│ OpenRLHF \(6\)", out
    )


def test_presets_are_grouped_by_framework_with_version_suffixes_merged():
    from runner import registry

    groups = dict(registry.presets_by_framework())
    assert list(groups)[0] == registry.OWN and [e.name for e in groups[registry.OWN]][:2] == ["none", "tis"]
    assert {e.name.split("/")[0] for e in groups["OpenRLHF"]} == {"openrlhf-0.11", "openrlhf-bc71bb1"}
    assert sorted(e.name for e in groups["NeMo-RL"]) == ["nemo-rl/icepop", "nemo-rl/seq-mask-tis", "nemo-rl/tis"]
    assert sum(len(g) for g in groups.values()) == len(registry.presets())


def test_show_prints_the_composed_config(cli):
    code, out, _ = cli("show", "correction=seq-mask-tis", "correction.high=2")
    assert code == 0
    assert "name: seq-mask-tis" in out and "high: 2" in out


def _one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("is-study: error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_preset_lists_valid_names(cli):
    code, _, err = cli("show", "correction=nope")
    _one_line_error(code, err, "unknown correction 'nope'", "seq-mask-tis", "verl/geo-rs")


def test_low_above_high(cli):
    code, _, err = cli("case", "openrlhf-seq-mask-tis", "correction=tis", "correction.low=3", "correction.high=2")
    _one_line_error(code, err, "correction.low (3", "> correction.high (2")


def test_unknown_study_name_lists_the_studies(cli):
    code, _, err = cli("run", "study.name=nope")
    _one_line_error(code, err, "study.name='nope' is not one of: probe, train")


def test_negative_threshold(cli):
    code, _, err = cli("case", "openrlhf-seq-mask-tis", "correction=tis", "correction.high=-1")
    _one_line_error(code, err, "correction.high must be non-negative")


def test_bad_override_syntax(cli):
    code, _, err = cli("show", "correction.high==")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content,needle",
    [
        (
            "cases:\n  - log_probs: [[0.0, 1.0]]\n    old_log_probs: [[0.0]]\n    rollout_log_probs: [[0.0, 0.0]]\n"
            "    advantages: [[1.0, 1.0]]\n",
            "old_log_probs has shape [1, 1] but log_probs has [1, 2]",
        ),
        ("cases: [ {log_probs: [[0.0]]", "not valid YAML"),
        (
            "cases:\n  - log_probs: [[0.0]]\n    old_log_probs: [[0.0]]\n    rollout_log_probs: [[0.0]]\n"
            "    advantages: [[1.0]]\n    action_mask: [[0.5]]\n",
            "values must be 0 or 1",
        ),
        (
            "cases:\n  - log_probs: [[0.0]]\n    old_log_probs: [[0.0]]\n    advantages: [[1.0]]\n",
            "missing rollout_log_probs",
        ),
        (
            "cases:\n  - log_probs: [[zero]]\n    old_log_probs: [[0.0]]\n    rollout_log_probs: [[0.0]]\n    advantages: [[1.0]]\n",
            "expected a number",
        ),
        ("just a string", "expected a non-empty list of cases"),
    ],
)
def test_malformed_case_files(cli, tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, _, err = cli("case", str(path))
    _one_line_error(code, err, needle)


def test_missing_case_file(cli):
    code, _, err = cli("case", "/nonexistent/case.yaml")
    _one_line_error(code, err, "case file not found")


def test_json_case_file_and_nonfinite_strings(cli, tmp_path):
    import json

    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            [
                {
                    "name": "x",
                    "log_probs": [[0.0, "nan"]],
                    "old_log_probs": [[0.0, 0.0]],
                    "rollout_log_probs": [[0.0, "-inf"]],
                    "advantages": [[1.0, 1.0]],
                    "action_mask": [[1, 0]],
                }
            ]
        )
    )
    code, out, err = cli("case", str(path), "correction=seq-mask-tis", "--json")
    assert code == 0, err
    row = json.loads(out)[0]
    assert row["loss"] == -1.0 and row["finite"] is True  # the NaN/−inf sit at padding
    assert row["grad"] == [[-1.0, 0.0]]


@pytest.mark.slow
def test_real_binary_exit_code_and_no_traceback():
    res = subprocess.run(
        [sys.executable, "-m", "runner", "case", str(spec_case_file("seed-issue")), "correction=bogus"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("is-study: error: config: unknown correction 'bogus'")
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "--bogus"], "No such option: --bogus"),
        (["nosuchcmd"], "No such command 'nosuchcmd'"),
        (["case"], "Missing argument 'file'"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(args, needle):
    """Click's usage errors (raised by click itself or by the copy newer Typer versions vendor)."""
    res = subprocess.run([sys.executable, "-m", "runner", *args], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("is-study: error:") and needle in lines[0], res.stderr


@pytest.mark.parametrize(
    "override,suggestion",
    [
        ("train.step=10", "did you mean train.steps?"),
        ("trian.steps=10", "did you mean train.steps?"),
        ("mismatch.stalenes=2", "did you mean mismatch.staleness?"),
        ("rollout.seqlen=8", "did you mean rollout.seq_len?"),
        ("correction.hgh=2", "did you mean correction.high?"),
        ("probe.repeat=3", "probe.* keys belong to study=probe"),
    ],
)
def test_unknown_key_suggests_the_nearest(cli, tmp_path, override, suggestion):
    """`is-study run train.step=10`: one line naming the key and the nearest real one; nothing is made."""
    code, _, err = cli("run", override, f"hydra.run.dir={tmp_path / 'r'}")
    _one_line_error(code, err, f"unknown key '{override.split('=')[0]}'", suggestion)
    assert not (tmp_path / "r").exists()


def test_unknown_key_of_the_probe_study_is_suggested_too(cli):
    code, _, err = cli("show", "study=probe", "probe.repeat=3")
    _one_line_error(code, err, "unknown key 'probe.repeat'; did you mean probe.repeats?")


def test_an_unknown_probe_key_under_study_probe_is_not_sent_to_study_probe(cli):
    code, _, err = cli("run", "study=probe", "probe.nope_key=3")
    assert code == 2 and err.strip() == "is-study: error: config: unknown key 'probe.nope_key'"
    code, _, err = cli("run", "probe.repeats=3")
    assert code == 2 and "probe.* keys belong to study=probe" in err


VALID_EXPERIMENTS = ", ".join(registry.group_options("experiment"))


@pytest.mark.parametrize("command", ["run", "show", "sweep"])
def test_an_unknown_experiment_is_refused_with_the_nearest(cli, tmp_path, command):
    """`experiment=threshold-tradeof` ran the defaults and exited 0 (issue 31); now one line and exit 2,
    and no run or sweep dir is made."""
    code, out, err = cli(
        command, "experiment=threshold-tradeof", f"hydra.run.dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 's'}"
    )
    assert code == 2 and out == "" and err.count("\n") == 1
    # the list of every experiment runs past the one-line bound (runner/errors.py), which cuts its middle, as
    # it does the presets' (test_sweep.py)
    assert err.startswith(
        "is-study: error: config: unknown experiment 'threshold-tradeof'; did you mean bigram/threshold-tradeoff? "
        f"(valid: {VALID_EXPERIMENTS[:40]}"
    )
    assert err.endswith(f"{VALID_EXPERIMENTS[-40:]})\n")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_experiment_in_a_world_folder_is_named_as_typed(cli):
    code, _, err = cli("show", "experiment=mlp/tis-tames")
    _one_line_error(code, err, "unknown experiment 'mlp/tis-tames'; did you mean mlp/tis-tames-mismatch?")


@pytest.mark.parametrize("command", ["run", "show", "sweep"])
def test_a_bare_option_name_says_which_override_was_meant(cli, tmp_path, command):
    """`is-study sweep threshold-tradeoff` (forgot experiment=) said "Error parsing override"."""
    code, out, err = cli(
        command, "threshold-tradeoff", f"hydra.run.dir={tmp_path / 'r'}", f"hydra.sweep.dir={tmp_path / 's'}"
    )
    assert (code, out) == (2, "")
    assert err == (
        "is-study: error: config: 'threshold-tradeoff' is not an override: write KEY=VALUE; "
        "did you mean experiment=bigram/threshold-tradeoff?\n"
    )
    assert list(tmp_path.iterdir()) == []
    code, _, err = cli("show", "xyzzy")
    assert (code, err) == (
        2,
        "is-study: error: config: 'xyzzy' is not an override: write KEY=VALUE "
        "(e.g. correction=tis; see is-study list)\n",
    )


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "correction.high=2,5",
            "correction.high=2,5: a comma-separated value sweeps: use `is-study sweep` with the same "
            "overrides (`--dry-run` lists its jobs); for a list write correction.high=[2,5], for a "
            "string correction.high='2,5'",
        ),
        (
            "correction=tis,icepop",
            "correction=tis,icepop: a comma-separated value sweeps: use `is-study sweep` with the "
            "same overrides (`--dry-run` lists its jobs)",
        ),
        (
            "seed=range(0,3)",
            "seed=range(0,3): a sweep over values: use `is-study sweep` with the same overrides "
            "(`--dry-run` lists its jobs)",
        ),
    ],
)
def test_a_sweep_value_given_to_run_points_to_sweep(cli, tmp_path, override, message):
    """Hydra said "Ambiguous value for argument" (and, below, "add --multirun")."""
    code, out, err = cli("run", override, f"hydra.run.dir={tmp_path / 'r'}")
    assert (code, out, err) == (2, "", f"is-study: error: config: {message}\n")
    assert not (tmp_path / "r").exists()


def test_a_run_dir_that_cannot_be_made_says_so(cli, tmp_path):
    """hydra.run.dir=/proc/forbidden said only "No such file or directory"."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = cli("run", f"hydra.run.dir={blocker / 'run'}", "train.steps=1")
    assert (code, out) == (2, "")
    assert err == (
        f"is-study: error: the run dir cannot be created or written: {blocker / 'run'} (Not a directory); "
        f"choose another hydra.run.dir\n"
    )
    if Path("/proc/self").is_dir():
        code, _, err = cli("run", "hydra.run.dir=/proc/forbidden", "train.steps=1")
        assert (code, err) == (
            2,
            "is-study: error: the run dir cannot be created or written: /proc/forbidden "
            "(No such file or directory); choose another hydra.run.dir\n",
        )
