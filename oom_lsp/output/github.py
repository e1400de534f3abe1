"""GitHub Actions workflow commands, one annotation per finding:
`::warning file=PATH,line=L,col=C,endLine=L,endColumn=C,title=CODE::message`.

Errors become `::error`, warnings `::warning`, info and hints `::notice`.
In a notebook the annotation points at the line of the `.ipynb` file where the
cell's code is written (the line a pull request's diff shows), and the title
names the cell and the line in it: `OOM301 (cell 4:3:5)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from oom_lsp.analysis.findings import Severity
from oom_lsp.output.base import CheckedFile, NotebookPositions, RenderOptions, located, location

_COMMAND = {
    Severity.ERROR: "error",
    Severity.WARNING: "warning",
    Severity.INFO: "notice",
    Severity.HINT: "notice",
}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render(files: Sequence[CheckedFile], options: RenderOptions) -> str:
    lines = []
    notebooks = NotebookPositions()
    for file, finding in located(files):
        start = (finding.range.start.line, finding.range.start.column)
        end = (finding.range.end.line, finding.range.end.column)
        title = finding.code
        in_file = notebooks.file_range(file, finding)
        if in_file is not None:
            start, end = in_file
            title = f"{finding.code} (cell {location(finding)[len('cell ') :]})"
        properties = ",".join(
            [
                f"file={escape_property(file.display)}",
                f"line={start[0]}",
                f"col={start[1] + 1}",
                f"endLine={end[0]}",
                f"endColumn={end[1] + 1}",
                f"title={escape_property(title)}",
            ]
        )
        lines.append(f"::{_COMMAND[finding.severity]} {properties}::{escape_data(finding.message)}")
    return "".join(line + "\n" for line in lines)
