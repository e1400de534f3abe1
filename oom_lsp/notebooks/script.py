"""A notebook run as a script (`oom-lsp estimate nb.ipynb`), and the script's
lines named back as cells. Pure: the notebook's text in, the script's text and
its line map out; the caller writes and runs it.

- The code cells run in document order, as "Run All" in a fresh kernel does.
- IPython's escapes cannot run in a script: a line magic or shell escape
  (`%matplotlib inline`, `!pip install x`, `x = !ls`) becomes `None`, a cell
  magic whose body is Python (`%%time`) runs its body, any other cell magic
  (`%%bash`, `%%writefile`) or automagic skips the cell. Each is listed, by
  cell and line, for a warning.
- A cell that does not compile, or that needs the kernel's top-level
  `await`, stops the script being built: "Run All" stops at it too.
- `display()`, a builtin in every kernel, is defined when a cell calls it
  (IPython's when it can be imported, else `print`), on lines before the
  first cell.
- `places()` rewrites what the run reports about the script, `script:12` or
  a traceback's `File "script", line 12`, into `nb.ipynb, cell 4, line 3`.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from oom_lsp.notebooks.document import NotebookError, read_notebook
from oom_lsp.notebooks.magics import mask_cell

_DISPLAY_PREAMBLE = (
    "try:  # oom-lsp: IPython's display(), as in the notebook's kernel\n"
    "    from IPython.display import display\n"
    "except ImportError:\n"
    "    display = print\n"
)
_CALLS_DISPLAY_RE = re.compile(r"\bdisplay\s*\(")
_LINE_END_RE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class SkippedCode:
    """A magic or shell escape the script does not run."""

    cell: int  # "cell N" (1-based, markdown cells counted)
    line: int | None  # its line in the cell; None: the whole cell
    code: str  # the escape's first line, or why the cell is skipped

    def describe(self) -> str:
        if self.line is None:
            return f"cell {self.cell} ({self.code})"
        return f"cell {self.cell}, line {self.line} (`{self.code}`)"


@dataclass(frozen=True)
class _ScriptCell:
    number: int
    first_line: int  # in the script, 1-based
    line_count: int


@dataclass(frozen=True)
class NotebookScript:
    text: str
    cells: tuple[_ScriptCell, ...]
    skipped: tuple[SkippedCode, ...]

    def locate(self, line: int) -> tuple[int, int] | None:
        """(cell, line in the cell) of a script line; None for the lines oom-lsp added."""
        index = bisect.bisect_right([cell.first_line for cell in self.cells], line) - 1
        if index < 0:
            return None
        cell = self.cells[index]
        if line >= cell.first_line + cell.line_count:
            return None
        return cell.number, line - cell.first_line + 1

    def warning(self) -> str | None:
        if not self.skipped:
            return None
        return "not run (IPython only): " + "; ".join(skipped.describe() for skipped in self.skipped)


def build_script(notebook_text: str) -> NotebookScript:
    """The code cells as one script. Raises NotebookError for a file that is not an
    nbformat 4 notebook, or a cell the script cannot run."""
    notebook = read_notebook(notebook_text)
    if not notebook.is_python:
        raise NotebookError(f"not a Python notebook (its kernel is {notebook.language})")
    parts: list[str] = []
    cells: list[_ScriptCell] = []
    skipped: list[SkippedCode] = []
    line = 1
    for cell in notebook.code_cells():
        masked = mask_cell(cell.source, placeholder="None")
        if masked.text is None:
            skipped.append(SkippedCode(cell.number, None, masked.skipped or "not Python"))
            continue
        if not masked.text.strip():
            continue
        source_lines = _LINE_END_RE.split(cell.source)
        for number in sorted(masked.masked_lines):
            if number - 1 in masked.masked_lines and source_lines[number - 2].rstrip().endswith("\\"):
                continue  # a continuation line of the escape above
            code = source_lines[number - 1].strip().rstrip("\\").rstrip()
            skipped.append(SkippedCode(cell.number, number, code))
        _check_compiles(masked.text, cell.number)
        text = masked.text if masked.text.endswith(("\n", "\r")) else masked.text + "\n"
        count = text.count("\n") + text.count("\r") - text.count("\r\n")
        cells.append(_ScriptCell(cell.number, line, count))
        parts.append(text)
        line += count
    if not cells:
        raise NotebookError("no code cell to run")
    preamble = _DISPLAY_PREAMBLE if any(_CALLS_DISPLAY_RE.search(part) for part in parts) else ""
    if preamble:
        shift = preamble.count("\n")
        cells = [_ScriptCell(cell.number, cell.first_line + shift, cell.line_count) for cell in cells]
    return NotebookScript(preamble + "".join(parts), tuple(cells), tuple(skipped))


def _check_compiles(text: str, number: int) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<cell>", "exec", dont_inherit=True)
    except SyntaxError as error:
        where = f"cell {number}, line {error.lineno or 1}"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile(text, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        except SyntaxError:
            raise NotebookError(f"{where}: SyntaxError: {error.msg}; Run All stops there too") from None
        raise NotebookError(
            f"{where}: `await` outside a function runs only in a kernel, not in a script"
        ) from None
    except (ValueError, RecursionError, MemoryError) as error:
        raise NotebookError(f"cell {number}: cannot be compiled: {error}") from None


class ScriptPlaces:
    """Names the script's lines as the notebook's cells in what a run reports.

    `script_names`: how the run may spell the script's path (absolute, relative to
    the current folder); `notebook`: how messages name the notebook (as the user
    gave it); `notebook_path`: its absolute path, for a report's file fields (as a
    script's are)."""

    def __init__(
        self, script: NotebookScript, script_names: Iterable[str], notebook: str, notebook_path: str
    ) -> None:
        self.script = script
        self.notebook = notebook
        self.notebook_path = notebook_path
        names = sorted({name for name in script_names if name}, key=len, reverse=True)
        alternatives = "|".join(re.escape(name) for name in names)
        self._names = set(names)
        self._place_re = re.compile(rf"(?:{alternatives}):(\d+)")
        self._frame_re = re.compile(rf'File "(?:{alternatives})", line (\d+)')
        self._path_re = re.compile(alternatives)

    def text(self, value: str) -> str:
        """`script:12` -> `nb.ipynb, cell 4, line 3`; a traceback's `File "script",
        line 12` -> `File "nb.ipynb", cell 4, line 3`; the bare path -> the notebook."""

        def place(match: re.Match[str]) -> str:
            located = self.script.locate(int(match.group(1)))
            if located is None:
                return f"{self.notebook} (a line oom-lsp added)"
            return f"{self.notebook}, cell {located[0]}, line {located[1]}"

        def frame(match: re.Match[str]) -> str:
            located = self.script.locate(int(match.group(1)))
            if located is None:
                return f'File "{self.notebook}" (a line oom-lsp added)'
            return f'File "{self.notebook}", cell {located[0]}, line {located[1]}'

        value = self._frame_re.sub(frame, value)
        value = self._place_re.sub(place, value)
        return self._path_re.sub(lambda match: self.notebook, value)

    def report(self, value: Any) -> Any:
        """A JSON-shaped report (an estimate's prediction) with every place in the
        script named as a cell: {"file", "line"} objects get the notebook, "cell" and
        the line in the cell; "script:12" strings become "nb.ipynb:cell 4:3" (as
        `--check` names a cell's line), other strings as `text()` does."""
        if isinstance(value, dict):
            mapped = {key: self.report(item) for key, item in value.items()}
            if value.get("file") in self._names and isinstance(value.get("line"), int):
                located = self.script.locate(value["line"])
                mapped["file"] = self.notebook_path
                mapped["cell"], mapped["line"] = located if located is not None else (None, None)
            return mapped
        if isinstance(value, list):
            return [self.report(item) for item in value]
        if isinstance(value, str):
            if value in self._names:
                return self.notebook_path
            match = self._place_re.fullmatch(value)
            if match is not None:
                located = self.script.locate(int(match.group(1)))
                return (
                    f"{self.notebook_path}:cell {located[0]}:{located[1]}" if located else self.notebook_path
                )
            return self.text(value)
        return value
