"""`oom-lsp --check` on one `.ipynb`: the file's text in, findings (with their
cell) and the fixed file's text out. Pure; the checker does the reading and
writing."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from oom_lsp.analysis.findings import Finding
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.notebooks.document import NotebookFile, read_notebook
from oom_lsp.notebooks.program import CellText, analyze_cells, fix_cells


@dataclass
class NotebookCheck:
    findings: list[Finding]
    fixed_text: str | None = None  # the whole file after fixing, when a fix changed it
    fixes_applied: int = 0
    before_fix: list[Finding] = field(default_factory=list)


def cell_texts(notebook: NotebookFile) -> list[CellText]:
    return [CellText(cell.index, cell.source, cell.number) for cell in notebook.code_cells()]


def check_notebook(
    text: str, settings: LintSettings, path: str, *, fix: bool = False, unsafe_fixes: bool = False
) -> NotebookCheck:
    """Raises NotebookError for a file that is not an nbformat 4 notebook."""
    notebook = read_notebook(text)
    cells = cell_texts(notebook)
    analysis = analyze_cells(cells, settings, path)
    findings = _ordered(analysis.all_findings())
    if not fix or not any(f.fix is not None and (f.fix.is_safe or unsafe_fixes) for f in findings):
        return NotebookCheck(findings)
    result = fix_cells(cells, settings, unsafe=unsafe_fixes, path=path)
    if not result.sources:
        return NotebookCheck(findings)
    return NotebookCheck(
        _ordered(result.remaining.all_findings()),
        notebook.with_sources(result.sources),
        result.applied,
        findings,
    )


def _ordered(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda finding: (finding.cell or 0, finding.range.start, finding.code))


def cell_diff(display: str, before: str, after: str) -> str:
    """A unified diff per changed cell (`--diff`), named `path:cell N` as Ruff does."""
    old, new = read_notebook(before), read_notebook(after)
    chunks = []
    for old_cell, new_cell in zip(old.cells, new.cells):
        if old_cell.source == new_cell.source:
            continue
        name = f"{display}:cell {old_cell.number}"
        chunks.append(
            "".join(
                difflib.unified_diff(
                    _lines(old_cell.source), _lines(new_cell.source), fromfile=name, tofile=name
                )
            )
        )
    return "\n".join(chunks)


def _lines(source: str) -> list[str]:
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    return lines
