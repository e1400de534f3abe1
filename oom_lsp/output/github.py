"""GitHub Actions workflow commands, one annotation per finding:
`::warning file=PATH,line=L,col=C,endLine=L,endColumn=C,title=CODE::message`.

Errors become `::error`, warnings `::warning`, info and hints `::notice`.
"""

from __future__ import annotations

from collections.abc import Sequence

from oom_lsp.analysis.findings import Severity
from oom_lsp.output import CheckedFile, RenderOptions, located

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
    for file, finding in located(files):
        start, end = finding.range.start, finding.range.end
        properties = ",".join(
            [
                f"file={escape_property(file.display)}",
                f"line={start.line}",
                f"col={start.column + 1}",
                f"endLine={end.line}",
                f"endColumn={end.column + 1}",
                f"title={escape_property(finding.code)}",
            ]
        )
        lines.append(f"::{_COMMAND[finding.severity]} {properties}::{escape_data(finding.message)}")
    return "".join(line + "\n" for line in lines)
