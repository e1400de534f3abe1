"""Notebooks written as text in the "percent" format (Jupytext, VS Code's
interactive window, Spyder): each cell starts with a `# %%` line. The notebook
rules' VALID / INVALID examples are written this way, so their docs read as
notebooks and their tests run the notebook analysis."""

from __future__ import annotations

import re

from oom_lsp.notebooks.program import CellText

_MARKER_RE = re.compile(r"^# %%.*$")


def is_percent_notebook(text: str) -> bool:
    return any(_MARKER_RE.match(line) for line in text.splitlines())


def split_cells(text: str) -> list[tuple[CellText, int]]:
    """The cells, each with the 1-based line of the text its first line is on."""
    cells: list[tuple[CellText, int]] = []
    current: list[str] | None = None
    first = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if _MARKER_RE.match(line):
            if current is not None:
                cells.append(_cell(len(cells), current, first))
            current, first = [], number + 1
        elif current is not None:
            current.append(line)
    if current is not None:
        cells.append(_cell(len(cells), current, first))
    return cells


def _cell(index: int, lines: list[str], first: int) -> tuple[CellText, int]:
    while lines and not lines[-1].strip():
        lines.pop()
    return CellText(index, "\n".join(lines), index + 1), first


def join_cells(sources: list[str]) -> str:
    return "".join(f"# %%\n{source}\n" for source in sources)
