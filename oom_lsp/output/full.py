"""Each finding with a code frame and its fix title, in the style of Ruff's
`full` output:

    OOM501 [*] `torch.load` without `map_location` ...
     --> train.py:2:9
      |
    1 | import torch
    2 | state = torch.load("ckpt.pt")
      |         ^^^^^^^^^^^^^^^^^^^^^
      |
    help: Pass map_location="cpu"
"""

from __future__ import annotations

from collections.abc import Sequence

from oom_lsp.analysis.findings import Finding
from oom_lsp.edits import split_lines
from oom_lsp.output.base import CheckedFile, RenderOptions, applicable_fix, located, location, printable

CONTEXT_LINES = 1


def render(files: Sequence[CheckedFile], options: RenderOptions) -> str:
    blocks = []
    notebooks: dict[int, object] = {}
    for file, finding in located(files):
        blocks.append(_block(file, finding, options, _frame_source(file, finding, notebooks)))
    return "".join(block + "\n" for block in blocks)


def _frame_source(file: CheckedFile, finding: Finding, notebooks: dict[int, object]) -> str:
    """The text the finding's lines count in: the file, or in a notebook its cell."""
    if finding.cell is None or not file.source:
        return file.source or ""
    from oom_lsp.notebooks.document import NotebookError, read_notebook

    if id(file) not in notebooks:
        try:
            notebooks[id(file)] = read_notebook(file.source)
        except NotebookError:
            notebooks[id(file)] = None
    notebook = notebooks[id(file)]
    cell = notebook.cell(finding.cell) if notebook is not None else None  # type: ignore[attr-defined]
    return cell.source if cell is not None else ""


def _block(file: CheckedFile, finding: Finding, options: RenderOptions, source: str) -> str:
    fix = applicable_fix(finding, options)
    marker = " [*]" if fix is not None else ""
    out = [
        f"{finding.code}{marker} {finding.message}",
        f" --> {file.display}:{location(finding)}",
    ]
    lines = split_lines(source)
    if lines:
        out.extend(_frame(lines, finding))
    if finding.fix is not None:
        qualifier = "" if finding.fix.is_safe else " (unsafe: review it; applied only with --unsafe-fixes)"
        out.append(f"{finding.fix.help}{qualifier}")
    # The file's own characters (a comment can hold an escape sequence) never reach the terminal.
    return "\n".join(printable(line) for line in out) + "\n"


def _frame(lines: list[str], finding: Finding) -> list[str]:
    start, end = finding.range.start, finding.range.end
    first = max(1, start.line - CONTEXT_LINES)
    last = min(len(lines), max(start.line, min(end.line, start.line + 4)) + CONTEXT_LINES)
    width = len(str(last))
    gutter = " " * width
    out = [f"{gutter} |"]
    for number in range(first, last + 1):
        text = lines[number - 1].expandtabs(1) if number - 1 < len(lines) else ""
        out.append(f"{number:>{width}} | {text}".rstrip())
        if number == start.line:
            underline_end = end.column if end.line == start.line else len(text)
            carets = "^" * max(1, underline_end - start.column)
            out.append(f"{gutter} | {' ' * start.column}{carets} {finding.code}")
    out.append(f"{gutter} |")
    return out
