"""The layering of DESIGN.md, read off the import statements of every module.

`fixes/` (codemods) and `analysis/` (rules) share only `oom_lsp.edits`: rules
build their fixes with codemods from `fixes/`, and nothing in `fixes/` imports
`analysis/`, so the two packages form no loop. The CLI's check path imports
neither pygls, lsprotocol nor torch (DESIGN.md: pre-commit must start fast).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "oom_lsp"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def test_fixes_never_import_analysis() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(name for name in _imports(path) if name.startswith("oom_lsp.analysis"))
        for path in _modules("fixes")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_edit_vocabulary_imports_nothing_of_the_project() -> None:
    names = _imports(PACKAGE / "edits.py")
    assert sorted(name for name in names if name.startswith("oom_lsp")) == []


def test_analysis_and_fixes_import_no_editor_or_torch() -> None:
    heavy = ("pygls", "lsprotocol", "torch")
    offenders = {}
    for package in ("analysis", "fixes"):
        for path in _modules(package):
            names = sorted(name for name in _imports(path) if name.split(".")[0] in heavy)
            if names:
                offenders[str(path.relative_to(PACKAGE))] = names
    assert offenders == {}


# --- the import graph ----------------------------------------------------------------------------

ROOT = PACKAGE.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:`: annotations only, never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def _resolve(name: str) -> str | None:
    """The project module a dotted name is (or is in): `oom_lsp.estimate.results.Trace` -> its module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _runtime_imports(module: str) -> set[str]:
    """The project modules `module` imports when it runs, at any depth (function-level imports
    count: they run too; `if TYPE_CHECKING:` blocks do not). `from package import name` is the
    submodule when `name` is one, else the package itself."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(filter(None, (_resolve(alias.name) for alias in node.names if alias.name.startswith("oom_lsp"))))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not source.startswith("oom_lsp"):
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                resolved = target if target in MODULES else _resolve(source)
                if resolved:
                    found.add(resolved)
    found.discard(module)
    return found


GRAPH = {module: _runtime_imports(module) for module in MODULES}


def _import_loops() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(GRAPH[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return loops


def _in(module: str, *packages: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def test_the_graph_sees_function_level_imports_and_not_type_checking_ones() -> None:
    # The harness of the estimate imports nothing of the project (it runs in the user's interpreter).
    assert "oom_lsp.usecases.explain" in GRAPH["oom_lsp.usecases.profile"]  # a function-level import
    assert "oom_lsp.server.server" not in GRAPH["oom_lsp.server.hooks"]  # under TYPE_CHECKING
    assert "oom_lsp.output.base" in GRAPH["oom_lsp.output.text"]


def test_no_import_loop_anywhere_in_the_package() -> None:
    assert _import_loops() == []


CLI_FACE = ("oom_lsp.cli", "oom_lsp.output")
SERVER_FACE = ("oom_lsp.server",)
USE_CASES = ("oom_lsp.usecases",)
# The server's core: what every feature shares; the features are listed in server/features.py.
SERVER_CORE = {
    "oom_lsp.server.server",
    "oom_lsp.server.hooks",
    "oom_lsp.server.jobs",
    "oom_lsp.server.protocol",
    "oom_lsp.server.transport",
    "oom_lsp.server.framing",
    "oom_lsp.server.logs",
    "oom_lsp.server.positions",
    "oom_lsp.server.settings",
    "oom_lsp.server.scheduling",  # one pending analysis per document, stale requests answered
}
SERVER_ROOTS = {"oom_lsp.server", "oom_lsp.server.features"}  # start_server, create_server


def test_the_server_core_imports_no_feature() -> None:
    features = {
        module for module in MODULES if _in(module, *SERVER_FACE) and module not in SERVER_CORE | SERVER_ROOTS
    }
    assert "oom_lsp.server.estimate" in features and "oom_lsp.server.diagnostics" in features
    offenders = {module: sorted(GRAPH[module] & features) for module in SERVER_CORE}
    assert {module: names for module, names in offenders.items() if names} == {}


def test_every_feature_is_registered_in_one_place() -> None:
    source = MODULES["oom_lsp.server.features"].read_text(encoding="utf-8")
    registering = {
        module
        for module, path in MODULES.items()
        if _in(module, *SERVER_FACE) and "\ndef register(server" in path.read_text(encoding="utf-8")
    }
    assert registering, "no feature found"
    missing = [module for module in registering if f"        {module.rpartition('.')[2]},\n" not in source]
    assert missing == []


def test_the_faces_never_import_each_other() -> None:
    """The CLI starts the server (`oom-lsp`, `oom-lsp server`) by name, through importlib, and
    imports nothing of it; the server imports nothing of the CLI or its output formats."""
    cli_offenders = {
        module: sorted(name for name in GRAPH[module] if _in(name, *SERVER_FACE))
        for module in MODULES
        if _in(module, *CLI_FACE)
    }
    server_offenders = {
        module: sorted(name for name in GRAPH[module] if _in(name, *CLI_FACE))
        for module in MODULES
        if _in(module, *SERVER_FACE)
    }
    assert {m: names for m, names in {**cli_offenders, **server_offenders}.items() if names} == {}


ENTRY_POINTS = {"oom_lsp.__main__"}  # `python -m oom_lsp`: the CLI's main


def test_below_the_faces_nothing_imports_a_face_or_a_use_case() -> None:
    below = [
        module
        for module in MODULES
        if not _in(module, *CLI_FACE, *SERVER_FACE, *USE_CASES) and module not in ENTRY_POINTS
    ]
    offenders = {
        module: sorted(name for name in GRAPH[module] if _in(name, *CLI_FACE, *SERVER_FACE, *USE_CASES))
        for module in below
    }
    assert {module: names for module, names in offenders.items() if names} == {}


# The sequences a use case owns: a face that imports one of these writes the use case out again.
USE_CASE_INTERNALS = {
    "oom_lsp.estimate.estimator": {"estimate", "find_max_batch", "run_harness", "predict", "prediction_from"},
    "oom_lsp.estimate.whatif": {"what_if"},
    "oom_lsp.estimate.sweep": {"sweep"},
    "oom_lsp.estimate.whatif_record": {"save_record", "compare_with_record"},
    "oom_lsp.profiling.runner": {"ProfileRun", "profile"},
    "oom_lsp.llm.fixer": {"propose_fix"},
    "oom_lsp.llm.validation": {"measure_again", "comparison_problems", "figures"},
    "oom_lsp.llm.fixlog": {"append_entry", "record_figures"},
}


def _imported_names(module: str) -> set[tuple[str, str]]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def test_the_faces_run_long_commands_through_the_use_case_layer() -> None:
    offenders = {}
    for module in MODULES:
        if not _in(module, *CLI_FACE, *SERVER_FACE):
            continue
        used = sorted(
            f"{source}.{name}"
            for source, name in _imported_names(module)
            if name in USE_CASE_INTERNALS.get(source, ())
        )
        if used:
            offenders[module] = used
    assert offenders == {}
    for face in ("oom_lsp.cli.estimate", "oom_lsp.server.estimate", "oom_lsp.server.what_if"):
        assert any(_in(name, *USE_CASES) for name in GRAPH[face]), face


# --- no module-level state in the server ------------------------------------------------------

_MUTABLE_CALLS = {
    "dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter", "local",
    "WeakKeyDictionary", "WeakValueDictionary", "WeakSet",
}
_MUTATING_METHODS = {
    "append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove", "discard", "clear",
}


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        function = value.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        return name in _MUTABLE_CALLS
    return False


def test_the_server_keeps_no_state_in_module_globals() -> None:
    """What a server remembers lives on the server (`ls.state(...)`, `ls.hooks`): a module-level
    container is a constant, named in capitals and never changed."""
    problems = []
    for module, path in MODULES.items():
        if not _in(module, *SERVER_FACE):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = set()
        for statement in tree.body:
            targets = (
                statement.targets
                if isinstance(statement, ast.Assign)
                else [statement.target]
                if isinstance(statement, ast.AnnAssign)
                else []
            )
            value = getattr(statement, "value", None)
            for target in targets:
                if isinstance(target, ast.Name) and _mutable(value):
                    if target.id.lstrip("_").isupper():
                        constants.add(target.id)
                    else:
                        problems.append(f"{module}: {target.id} (a mutable module global)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                problems.append(f"{module}: global {', '.join(node.names)}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in constants
                and node.func.attr in _MUTATING_METHODS
            ):
                problems.append(f"{module}: {node.func.value.id}.{node.func.attr}(...) changes a constant")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for target in getattr(node, "targets", None) or [getattr(node, "target", None)]:
                    if isinstance(target, ast.Subscript) and getattr(target.value, "id", None) in constants:
                        problems.append(f"{module}: {target.value.id}[...] changes a constant")
    assert problems == []
