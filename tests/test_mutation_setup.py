"""`make mutation` stays runnable: its groups, pyproject.toml's [tool.mutmut] and the list of
equivalent mutants agree with each other and with the tree (mutmut itself is not run here)."""

from __future__ import annotations

import importlib.util

import tomllib

from tests.helpers.repo import REPO


def _mutation_script():
    spec = importlib.util.spec_from_file_location("mutation_script", REPO / "scripts" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_group_is_mutated_and_its_tests_exist():
    script = _mutation_script()
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    for pattern, paths, target in script.GROUPS.values():
        for path in paths:
            assert (REPO / path).exists(), path
            glob = path + "*" if path.endswith("/") else path
            assert glob in cfg["only_mutate"], path
            assert pattern == path.rstrip("/").removesuffix(".py").replace("/", ".") + ".*"
        assert target in (80, 90)
    # a part of a group (worlds' modules, run alone) names files the group covers, by the same rule
    for pattern, paths, target in script.PARTS.values():
        for path in paths:
            assert (REPO / path).exists() and path.startswith("runner/worlds/"), path
            assert pattern == path.rstrip("/").removesuffix(".py").replace("/", ".") + ".*"
        assert target == script.GROUPS["worlds"][2]
    tests = [a for a in cfg["pytest_add_cli_args_test_selection"] if a.startswith("tests/")]
    assert tests and all((REPO / t).is_file() for t in tests), tests


def test_the_mutation_runs_leave_out_the_slow_tests_by_their_marker():
    """mutmut selects as `make test-fast` does, by the registered `slow` marker, not by a list of names."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    selection = cfg["mutmut"]["pytest_add_cli_args_test_selection"]
    assert "-k" not in selection
    assert selection[selection.index("-m") + 1] == "not slow"
    assert any(m.startswith("slow:") for m in cfg["pytest"]["ini_options"]["markers"])


def test_equivalent_mutants_are_listed_with_a_reason():
    script = _mutation_script()
    listed = script.equivalents()
    assert listed, "the table of tests/mutation_equivalents.md parsed to nothing"
    prefixes = tuple(p.removesuffix("*") for p, _, _ in script.GROUPS.values())
    for name, why in listed.items():
        assert name.startswith(prefixes) and len(why) > 20, (name, why)
