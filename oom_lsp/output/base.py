"""What every output format of `oom-lsp --check` shares: the checked file, the render options,
the fix `--fix` would apply, a finding's location (1-based columns, `cell N:` in notebooks), and
positions in a notebook's own file. The formats import this module, never the package, which
imports them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the parser imports this package; keep libcst out of `--help`
    from oom_lsp.analysis.findings import Finding, Fix


class CheckedFile(Protocol):
    display: str
    findings: list[Finding]
    source: str | None


@dataclass(frozen=True)
class RenderOptions:
    # Unsafe fixes count as available (`--unsafe-fixes`).
    unsafe_fixes: bool = False
    # Text format: print each fix's title under its finding (`--show-fixes`).
    show_fix_titles: bool = False


def applicable_fix(finding: Finding, options: RenderOptions) -> Fix | None:
    """The fix `--fix` would apply under these options."""
    if finding.fix is None or not (finding.fix.is_safe or options.unsafe_fixes):
        return None
    return finding.fix


def location(finding: Finding) -> str:
    """`3:5`, or `cell 4:3:5` in a notebook (Ruff's spelling): 1-based column."""
    where = f"{finding.line}:{finding.column + 1}"
    return f"cell {finding.cell}:{where}" if finding.cell is not None else where


class NotebookPositions:
    """Where a notebook finding sits in the `.ipynb` file's own text, for formats whose
    readers open the raw file (SARIF, GitHub annotations). The notebook is parsed
    once per file, only when a finding has a cell."""

    def __init__(self) -> None:
        self._parsed: dict[int, object] = {}

    def file_range(
        self, file: CheckedFile, finding: Finding
    ) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """((line, column), (end line, end column)), 1-based lines, 0-based columns."""
        if finding.cell is None or not file.source:
            return None
        from oom_lsp.notebooks.document import NotebookError, read_notebook

        notebook = self._parsed.get(id(file))
        if notebook is None:
            try:
                notebook = read_notebook(file.source)
            except NotebookError:
                return None
            self._parsed[id(file)] = notebook
        cell = notebook.cell(finding.cell)  # type: ignore[attr-defined]
        if cell is None:
            return None
        start, end = finding.range.start, finding.range.end
        return (
            notebook.file_position(cell, start.line, start.column),  # type: ignore[attr-defined]
            notebook.file_position(cell, end.line, end.column),  # type: ignore[attr-defined]
        )


def located(files: Sequence[CheckedFile]) -> list[tuple[CheckedFile, Finding]]:
    """Every finding with its file, in file order then position order."""
    return [(file, finding) for file in files for finding in file.findings]


# What a terminal would act on rather than show: C0 controls (ESC starts the sequences that
# retitle a terminal or move its cursor) and DEL as their Unicode "control pictures", as Ruff
# draws them (ESC as U+241B); C1 controls and the bidirectional overrides and isolates
# (which reorder the rest of the line, "Trojan Source") as U+FFFD. One character each: the
# carets under a code frame keep their columns. Tabs stay.
_UNPRINTABLE = {code: 0x2400 + code for code in range(0x20) if code != 0x09}
_UNPRINTABLE[0x7F] = 0x2421
_UNPRINTABLE.update({code: 0xFFFD for code in range(0x80, 0xA0)})
_UNPRINTABLE.update({code: 0xFFFD for code in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def printable(text: str) -> str:
    """`text` as the human formats print it: nothing in it acts on the terminal."""
    return text.translate(_UNPRINTABLE)
