"""A JSON array of findings.

Fields: `path`, `line`, `column`, `end_line`, `end_column` (1-based columns),
`code`, `name`, `message`, `severity`, `fix` (null or `{title, applicability,
edits}`, each edit `{content, location, end_location}`), `url`; plus Ruff's
`filename`, `location` / `end_location` (`{row, column}`) so tools that read
`ruff check --output-format json` read this too. `cell` is the 1-based cell
number in a notebook (markdown cells counted), where lines count from the
cell's first line, and null elsewhere (Ruff's field).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from oom_lsp.analysis.rule_links import rule_url
from oom_lsp.analysis.findings import Finding, Fix
from oom_lsp.edits import Position
from oom_lsp.output.base import CheckedFile, RenderOptions, located


def _location(position: Position) -> dict[str, int]:
    return {"row": position.line, "column": position.column + 1}


def fix_to_json(fix: Fix) -> dict[str, Any]:
    return {
        "title": fix.title,
        "message": fix.title,
        "applicability": fix.applicability.value,
        "edits": [
            {
                "content": edit.new_text,
                "location": _location(edit.range.start),
                "end_location": _location(edit.range.end),
            }
            for edit in fix.edits
        ],
    }


def finding_to_json(path: str, finding: Finding) -> dict[str, Any]:
    start, end = finding.range.start, finding.range.end
    return {
        "path": path,
        "line": start.line,
        "column": start.column + 1,
        "end_line": end.line,
        "end_column": end.column + 1,
        "code": finding.code,
        "name": finding.name,
        "message": finding.message,
        "severity": finding.severity.value,
        "fix": fix_to_json(finding.fix) if finding.fix is not None else None,
        "url": rule_url(finding.code, finding.name),
        "filename": path,
        "location": _location(start),
        "end_location": _location(end),
        "noqa_row": finding.statement_line or start.line,
        "cell": finding.cell,
    }


def render(files: Sequence[CheckedFile], options: RenderOptions) -> str:
    records = [finding_to_json(file.display, finding) for file, finding in located(files)]
    return json.dumps(records, indent=2, ensure_ascii=False) + "\n"
