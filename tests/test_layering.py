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
