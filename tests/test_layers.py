"""The layers of the code, read from its imports (ast, no importing): every `import` and `from ... import` of
every module of runner/, analysis/ and scripts/, at module level and inside functions alike.

The rules:
  - no import circle among the project's modules (a lazy import inside a function counts too), nor among runner's
    folders (runner/audit/ importing runner/studies/ and back), but for the Hydra gate and the sweep it launches;
  - the algebra (runner/core/) imports of runner only itself and runner.errors;
  - analysis/ never imports torch, the algebra (runner.core.corrections, runner.core.losses, runner.core.metrics,
    runner.core.masking), the audit or the Hydra gate, not even lazily, and of runner only the modules listed in
    ANALYSIS_MAY_IMPORT, none of which imports torch when imported;
  - runner/ never imports analysis/, except the CLI (which hands the data to it);
  - a study, the training library and the probe never name a concrete world: of runner.worlds only the
    world-agnostic modules (WORLD_AGNOSTIC);
  - Hydra is imported only in runner/hydra_app/; of OmegaConf, other modules may import only the types in
    OMEGACONF_TYPES, and only the modules listed in OMEGACONF_USERS.

What it cannot see: a module named in a string and imported at run time (the lazy registries' "module:attr"
targets). Those are resolved by name on purpose, so that listing a registry imports nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.repo import REPO

PACKAGES = ("runner", "analysis", "scripts")

ANALYSIS_FORBIDDEN = (
    "torch",
    "runner.core.corrections",
    "runner.core.losses",
    "runner.core.metrics",
    "runner.core.masking",
    "runner.audit",
)
HYDRA_GATE = "runner.hydra_app"  # analysis reads files; composing a config is runner's job
ANALYSIS_MAY_IMPORT = {
    "runner.errors",  # UserError
    "runner.lookup",  # lazy registries
    "runner.paths",  # conf_dir
    "runner.registry",  # preset names and order (analysis.style, analysis.reports)
    "runner.core.schema",  # column names (analysis.load, analysis.tables)
    "runner.values",  # override values as CSV / YAML / command line give them (analysis.load, analysis.provenance)
    "runner.worlds.registry",  # the world list (analysis.claims.registry)
}
RUNNER_MAY_IMPORT_ANALYSIS = {"runner.cli"}

WORLD_LAYERS = ("runner.core", "runner.studies", "runner.training", "runner.probe", "runner.sweep")

CORE = "runner.core"
CORE_MAY_IMPORT = {"runner.errors"}  # besides runner.core itself

# runner's folders (and its top-level modules, each its own node) form no circle, but for this one: the Hydra gate
# launches a sweep's jobs and runs each one's Hydra-free body (runner.sweep.job), and the sweep launches through it
FOLDER_CIRCLES_ALLOWED = [{"runner.hydra_app", "runner.sweep"}]
WORLD_AGNOSTIC = {
    "runner.worlds",
    "runner.worlds.protocol",
    "runner.worlds.precision",
    "runner.worlds.engine",
    "runner.worlds.registry",
}

HYDRA_PACKAGE = "runner.hydra_app"
OMEGACONF_TYPES = {"DictConfig", "OmegaConf"}
OMEGACONF_USERS = {"runner.studies", "runner.studies.train", "scripts.bench_probe"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a project module when it is one, else the name as written)
    names: tuple[str, ...]  # for `from target import a, b`: (a, b)
    line: int
    lazy: bool  # inside a function

    def where(self) -> str:
        return f"{self.source}:{self.line}{' (lazy)' if self.lazy else ''}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


FILES = _files()
MODULES = set(FILES)


def _is_package(module: str) -> bool:
    return FILES[module].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[Import]:
    tree = ast.parse(FILES[module].read_text(encoding="utf-8"))
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, (), child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(module, child)
                names = tuple(a.name for a in child.names)
                # `from pkg import mod` imports the module pkg.mod; `from mod import attr` imports mod
                subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in MODULES]
                rest = tuple(n for n in names if f"{base}.{n}" not in MODULES)
                found.extend(Import(module, s, (), child.lineno, lazy) for s in subs)
                if rest or not subs:
                    found.append(Import(module, base, rest, child.lineno, lazy))
            visit(child, inner)

    visit(tree, False)
    return found


IMPORTS = {m: _imports(m) for m in sorted(MODULES)}


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _report(violations: list[str]) -> str:
    return "\n".join(["", *violations])


# ----------------------------------------------------------------------------------------- the scan itself
def test_the_scan_sees_every_kind_of_import():
    """A check on the reader, so that the rules below cannot pass by reading nothing: a lazy import inside a
    function, a submodule imported by `from package import module`, and a relative import all come out."""
    assert "runner.cli" in MODULES and "analysis.claims.registry" in MODULES and "scripts.bench" in MODULES
    cli = {(i.target, i.lazy) for i in IMPORTS["runner.cli"]}
    assert ("runner.errors", False) in cli and ("runner.audit.case_card", True) in cli
    registry = {i.target for i in IMPORTS["analysis.claims.registry"]}
    assert {"analysis.claims.tis_tames_mismatch", "analysis.claims.seed_bug_end_to_end"} <= registry
    tree = ast.parse("from . import app\nfrom .app import compose\n").body
    assert _absolute("runner.hydra_app.launch", tree[0]) == "runner.hydra_app"
    assert _absolute("runner.hydra_app", tree[1]) == "runner.hydra_app.app"


# ----------------------------------------------------------------------------------------- no circles
def _cycles() -> list[tuple[list[Import], set[str]]]:
    """Per strongly connected component of the project's module graph (Tarjan): one import circle through it,
    and every module in it."""
    edges = {m: [i for i in IMPORTS[m] if i.target in MODULES] for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in edges[v]:
            w = e.target
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or any(e.target == v for e in edges[v]):
                components.append(component)

    for m in sorted(MODULES):
        if m not in index:
            connect(m)

    def circle(component: set[str]) -> list[Import]:
        start = min(component)
        path: list[Import] = []
        seen: set[str] = set()

        def walk(v: str) -> bool:
            seen.add(v)
            for e in edges[v]:
                if e.target not in component:
                    continue
                path.append(e)
                if e.target == start or (e.target not in seen and walk(e.target)):
                    return True
                path.pop()
            return False

        walk(start)
        return path

    return [(circle(c), c) for c in components]


def test_no_import_circles():
    circles = _cycles()
    shown = [
        " → ".join([c[0].source, *(f"{e.target} [{e.where()}]" for e in c)])
        + (f"  (the knot: {', '.join(sorted(knot))})" if len(knot) > len(c) else "")
        for c, knot in circles
    ]
    assert not circles, "import circles:" + _report(shown)


def test_the_circle_finder_finds_a_planted_circle(monkeypatch):
    """The finder itself, on a planted a → b → a (lazy) circle beside the real graph."""
    monkeypatch.setitem(FILES, "planted.a", Path("a.py"))
    monkeypatch.setitem(FILES, "planted.b", Path("b.py"))
    monkeypatch.setattr(f"{__name__}.MODULES", MODULES | {"planted.a", "planted.b"})
    monkeypatch.setitem(IMPORTS, "planted.a", [Import("planted.a", "planted.b", (), 1, False)])
    monkeypatch.setitem(IMPORTS, "planted.b", [Import("planted.b", "planted.a", (), 7, True)])
    planted = [[(e.source, e.target) for e in c] for c, _ in _cycles() if c[0].source.startswith("planted.")]
    assert planted == [[("planted.a", "planted.b"), ("planted.b", "planted.a")]]


def _folder(module: str) -> str | None:
    """runner's folder a module is in (runner.audit for runner.audit.table), or a top-level module itself."""
    parts = module.split(".")
    if parts[0] != "runner" or len(parts) == 1:
        return None
    return ".".join(parts[:2])


def _folder_circles() -> list[str]:
    """Each set of runner's folders that import one another round (a strongly connected component of the
    folder graph, more than one folder), but the allowed ones, with one import of each folder's out of it."""
    edges: dict[str, dict[str, Import]] = {}
    for m in sorted(MODULES):
        a = _folder(m)
        for i in IMPORTS[m] if a else ():
            b = _folder(i.target) if i.target in MODULES else None
            if b and b != a:
                edges.setdefault(a, {}).setdefault(b, i)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for b in edges.get(todo.pop(), {}):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    reached = {a: reach(a) for a in edges}
    knots = {frozenset({a} | {b for b in reached[a] if a in reached.get(b, set())}) for a in edges}
    shown = []
    for knot in sorted((k for k in knots if len(k) > 1 and set(k) not in FOLDER_CIRCLES_ALLOWED), key=sorted):
        arrows = [f"{a} → {b} [{i.where()}]" for a in sorted(knot) for b, i in sorted(edges[a].items()) if b in knot]
        shown.append(f"{', '.join(sorted(knot))}: " + "; ".join(arrows))
    return shown


def test_no_import_circles_between_runners_folders():
    """A module circle is caught above; this one is between folders: runner/audit/table.py importing the audit
    that lived in runner/studies/, which imported runner/audit/ back, made two folders one knot."""
    bad = _folder_circles()
    assert not bad, "folders that import one another:" + _report(bad)


def _core_imports() -> list[str]:
    return [
        f"{i.where()} imports {i.target}"
        for i in _imports_of((CORE,))
        if _under(i.target, ("runner",)) and not _under(i.target, (CORE,)) and i.target not in CORE_MAY_IMPORT
    ]


def test_the_algebra_imports_only_itself_of_runner():
    bad = _core_imports()
    assert not bad, _report(bad)


# ----------------------------------------------------------------------------------------- analysis reads, never computes
def _loaded_on_import(module: str) -> set[str]:
    """Every module importing `module` runs: its packages' __init__s and, transitively, their module-level
    imports (lazy ones run only when their function is called)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo.extend(".".join(parts[:k]) for k in range(1, len(parts)) if ".".join(parts[:k]) in MODULES)
        if m in MODULES:
            todo.extend(i.target for i in IMPORTS[m] if not i.lazy)
    return seen


def _imports_of(layer) -> list[Import]:
    return [i for m in sorted(MODULES) if _under(m, layer) for i in IMPORTS[m]]


def _analysis_forbidden() -> list[str]:
    return [
        f"{i.where()} imports {i.target}" for i in _imports_of(("analysis",)) if _under(i.target, ANALYSIS_FORBIDDEN)
    ]


def _analysis_unlisted() -> list[str]:
    return [
        f"{i.where()} imports {i.target}"
        for i in _imports_of(("analysis",))
        if _under(i.target, ("runner",)) and i.target not in ANALYSIS_MAY_IMPORT
    ]


def _loads_forbidden(modules) -> list[str]:
    return [
        f"importing {m} loads {n}"
        for m in sorted(modules)
        for n in sorted(_loaded_on_import(m))
        if _under(n, ANALYSIS_FORBIDDEN)
    ]


def _runner_imports_analysis() -> list[str]:
    return [
        f"{i.where()} imports {i.target}"
        for i in _imports_of(("runner",))
        if i.source not in RUNNER_MAY_IMPORT_ANALYSIS and _under(i.target, ("analysis",))
    ]


def test_analysis_never_imports_torch_the_algebra_or_the_audit():
    bad = _analysis_forbidden()
    assert not bad, _report(bad)


def test_analysis_imports_only_the_listed_runner_modules_and_none_of_them_loads_torch():
    unlisted = _analysis_unlisted()
    assert not unlisted, "analysis imports runner modules not in ANALYSIS_MAY_IMPORT:" + _report(unlisted)
    heavy = _loads_forbidden(ANALYSIS_MAY_IMPORT | {m for m in MODULES if _under(m, ("analysis",))})
    assert not heavy, _report(heavy)


def _analysis_uses_the_hydra_gate() -> list[str]:
    return [f"{i.where()} imports {i.target}" for i in _imports_of(("analysis",)) if _under(i.target, (HYDRA_GATE,))]


def test_analysis_never_uses_the_hydra_gate():
    bad = _analysis_uses_the_hydra_gate()
    assert not bad, "analysis composes configs (runner's job):" + _report(bad)


def test_runner_never_imports_analysis_but_the_cli():
    bad = _runner_imports_analysis()
    assert not bad, _report(bad)


# ----------------------------------------------------------------------------------------- studies ask what a world can do
def _concrete_worlds() -> list[str]:
    """Imports of a concrete world by a study, the training library or the probe."""
    return [
        f"{i.where()} imports {i.target}"
        for i in _imports_of(WORLD_LAYERS)
        if _under(i.target, ("runner.worlds",)) and i.target not in WORLD_AGNOSTIC
    ]


def test_studies_training_and_probe_name_no_world():
    bad = _concrete_worlds()
    assert not bad, _report(bad)


# ----------------------------------------------------------------------------------------- Hydra in one place
def _hydra_outside() -> list[str]:
    bad = []
    for i in _imports_of(PACKAGES):
        if _under(i.source, (HYDRA_PACKAGE,)):
            continue
        if _under(i.target, ("hydra", "hydra_plugins")):
            bad.append(f"{i.where()} imports {i.target}")
        elif _under(i.target, ("omegaconf",)):
            if i.target != "omegaconf" or not i.names or not set(i.names) <= OMEGACONF_TYPES:
                bad.append(f"{i.where()} imports {i.target} {list(i.names)}: only {sorted(OMEGACONF_TYPES)} may be")
            elif i.source not in OMEGACONF_USERS:
                bad.append(f"{i.where()} imports omegaconf but is not in OMEGACONF_USERS")
    return bad


def test_hydra_only_in_its_package_and_omegaconf_types_only_where_listed():
    bad = _hydra_outside()
    assert not bad, _report(bad)


# ----------------------------------------------------------------------------------------- the rules can fail
def test_every_rule_catches_a_planted_violation(monkeypatch):
    planted = {
        "analysis.planted": [
            Import("analysis.planted", "torch", (), 3, True),
            Import("analysis.planted", "runner.audit.case_study", ("evaluate",), 4, True),
        ],
        "runner.planted": [
            Import("runner.planted", "analysis.figures", (), 5, True),
            Import("runner.planted", "hydra.core.hydra_config", ("HydraConfig",), 6, True),
            Import("runner.planted", "omegaconf", ("open_dict",), 7, True),
            Import("runner.planted", "omegaconf", ("OmegaConf",), 8, False),
        ],
        "runner.studies.planted": [
            Import("runner.studies.planted", "runner.worlds.mlp", (), 9, False),
            Import("runner.studies.planted", "runner.worlds.bigram.world", ("BigramWorld",), 10, True),
            Import("runner.studies.planted", "runner.worlds.protocol", ("World",), 11, False),
        ],
    }
    for module, imports in planted.items():
        monkeypatch.setitem(FILES, module, Path(f"{module}.py"))
        monkeypatch.setitem(IMPORTS, module, imports)
    monkeypatch.setattr(f"{__name__}.MODULES", MODULES | set(planted))
    monkeypatch.setattr(f"{__name__}.ANALYSIS_MAY_IMPORT", ANALYSIS_MAY_IMPORT | {"runner.planted"})
    assert "analysis.planted:3 (lazy) imports torch" in _analysis_forbidden()
    assert "analysis.planted:4 (lazy) imports runner.audit.case_study" in _analysis_unlisted()
    assert "importing runner.planted loads torch" not in _loads_forbidden({"runner.planted"})  # lazy: not loaded
    # transitively, at module level: runner.planted -> runner.planted_b -> torch
    monkeypatch.setitem(FILES, "runner.planted_b", Path("runner.planted_b.py"))
    monkeypatch.setattr(f"{__name__}.MODULES", MODULES | set(planted) | {"runner.planted_b"})
    monkeypatch.setitem(IMPORTS, "runner.planted_b", [Import("runner.planted_b", "torch", (), 1, False)])
    monkeypatch.setitem(IMPORTS, "runner.planted", [Import("runner.planted", "runner.planted_b", (), 2, False)])
    assert _loads_forbidden({"runner.planted"}) == ["importing runner.planted loads torch"]
    monkeypatch.setitem(IMPORTS, "runner.planted", planted["runner.planted"])
    assert _runner_imports_analysis() == ["runner.planted:5 (lazy) imports analysis.figures"]
    hydra = [v for v in _hydra_outside() if v.startswith("runner.planted")]
    assert hydra == [
        "runner.planted:6 (lazy) imports hydra.core.hydra_config",
        "runner.planted:7 (lazy) imports omegaconf ['open_dict']: only ['DictConfig', 'OmegaConf'] may be",
        "runner.planted:8 imports omegaconf but is not in OMEGACONF_USERS",
    ]
    assert _concrete_worlds() == [
        "runner.studies.planted:9 imports runner.worlds.mlp",
        "runner.studies.planted:10 (lazy) imports runner.worlds.bigram.world",
    ]


def test_the_new_layers_rules_catch_planted_violations(monkeypatch):
    """The folder circle, the algebra's imports and the Hydra gate from analysis, each on a planted module."""
    planted = {
        "runner.audit.planted": [Import("runner.audit.planted", "runner.studies.train", (), 1, True)],
        "runner.studies.planted": [Import("runner.studies.planted", "runner.audit.groups", ("Group",), 2, False)],
        "runner.core.planted": [
            Import("runner.core.planted", "runner.registry", (), 3, True),
            Import("runner.core.planted", "runner.errors", ("UserError",), 4, False),
            Import("runner.core.planted", "runner.core.masking", (), 5, False),
        ],
        "analysis.planted": [Import("analysis.planted", "runner.hydra_app.app", ("compose",), 6, True)],
    }
    for module, imports in planted.items():
        monkeypatch.setitem(FILES, module, Path(f"{module}.py"))
        monkeypatch.setitem(IMPORTS, module, imports)
    monkeypatch.setattr(f"{__name__}.MODULES", MODULES | set(planted))
    circles = _folder_circles()  # the knot also takes in the allowed pair, which runner.audit reaches
    assert len(circles) == 1 and "runner.audit → runner.studies [runner.audit.planted:1 (lazy)]" in circles[0]
    assert "runner.studies → runner.audit [runner.studies.planted:2]" in circles[0]
    assert _core_imports() == ["runner.core.planted:3 (lazy) imports runner.registry"]
    assert "analysis.planted:6 (lazy) imports runner.hydra_app.app" in _analysis_uses_the_hydra_gate()


LONG_MODULE = 550  # "~500 lines": a module longer than this says at its top why it is one module


def long_modules_without_a_reason(root: Path = REPO) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            lines = text.count("\n")
            if lines <= LONG_MODULE:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "lines on purpose" not in doc and "lines in one module on purpose" not in doc:
                found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_a_long_module_says_why_it_is_one():
    assert long_modules_without_a_reason() == []


def test_the_long_module_rule_finds_a_planted_module(tmp_path):
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "big.py").write_text('"""A module."""\n' + "x = 1\n" * 600)
    (tmp_path / "runner" / "said.py").write_text(
        '"""A module.\n\nAbout 600 lines on purpose: one idea."""\n' + "x = 1\n" * 600
    )
    assert long_modules_without_a_reason(tmp_path) == ["runner/big.py (601 lines)"]
