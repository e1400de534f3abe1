"""SARIF 2.1.0, as GitHub code scanning loads it (`github/codeql-action/upload-sarif`).

One run; `tool.driver.rules` lists every rule (id, name, descriptions,
helpUri, default level); each result names its rule, level, message and a
physical location with 1-based lines and columns (code points, declared by
`columnKind`). Paths below the current folder are relative to `%SRCROOT%`.

In a notebook the region is where the cell's code is written in the `.ipynb`
file itself (what a SARIF viewer opens), and the result's `properties` say the
cell and the line and column in it (`cell`, `cellLine`, `cellColumn`, 1-based);
the message starts with `cell N, line L:`. Fixes are left out there: their
edits are in the cell's text, not in the file's JSON.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import oom_lsp
from oom_lsp.analysis import registry
from oom_lsp.analysis.rule_links import rule_url
from oom_lsp.analysis.findings import Finding, Fix, Severity
from oom_lsp.edits import Range
from oom_lsp.output.base import CheckedFile, NotebookPositions, RenderOptions, located

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/oom-lsp/oom-lsp"
SRCROOT = "%SRCROOT%"

_LEVEL = {
    Severity.ERROR: "error",
    Severity.WARNING: "warning",
    Severity.INFO: "note",
    Severity.HINT: "note",
}


def _first_paragraph(markdown: str, heading: str) -> str | None:
    match = re.search(
        rf"^## {re.escape(heading)}\s*\n+(.+?)(?:\n\s*\n|\Z)", markdown, re.MULTILINE | re.DOTALL
    )
    return " ".join(match.group(1).split()) if match else None


def _rule_descriptor(rule: Any) -> dict[str, Any]:
    docs = rule.docs()
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": _first_paragraph(docs, "What it does") or rule.summary},
        "helpUri": rule_url(rule.code, rule.name),
        "help": {"text": rule.summary, "markdown": docs},
        "defaultConfiguration": {"level": _LEVEL[rule.default_severity], "enabled": rule.default_enabled},
        "properties": {"tags": ["memory", "pytorch"]},
    }


def _artifact_location(display: str) -> dict[str, str]:
    if os.path.isabs(display):
        return {"uri": Path(display).as_uri()}
    return {"uri": Path(display).as_posix(), "uriBaseId": SRCROOT}


def _region(code_range: Range) -> dict[str, int]:
    return {
        "startLine": code_range.start.line,
        "startColumn": code_range.start.column + 1,
        "endLine": code_range.end.line,
        "endColumn": code_range.end.column + 1,
    }


def _fix(display: str, fix: Fix) -> dict[str, Any]:
    return {
        "description": {"text": f"{fix.title} ({fix.applicability.value})"},
        "artifactChanges": [
            {
                "artifactLocation": _artifact_location(display),
                "replacements": [
                    {"deletedRegion": _region(edit.range), "insertedContent": {"text": edit.new_text}}
                    for edit in fix.edits
                ],
            }
        ],
    }


def _result(
    file: CheckedFile, finding: Finding, rule_index: dict[str, int], notebooks: NotebookPositions
) -> dict[str, Any]:
    display = file.display
    region = _region(finding.range)
    message = finding.message
    in_file = notebooks.file_range(file, finding)
    if in_file is not None:
        (line, column), (end_line, end_column) = in_file
        region = {"startLine": line, "startColumn": column + 1, "endLine": end_line, "endColumn": end_column + 1}
        message = f"cell {finding.cell}, line {finding.line}: {finding.message}"
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "level": _LEVEL[finding.severity],
        "message": {"text": message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": _artifact_location(display),
                    "region": region,
                }
            }
        ],
    }
    if finding.code in rule_index:
        result["ruleIndex"] = rule_index[finding.code]
    if finding.cell is not None:
        result["properties"] = {
            "cell": finding.cell,
            "cellLine": finding.line,
            "cellColumn": finding.column + 1,
        }
    elif finding.fix is not None:
        result["fixes"] = [_fix(display, finding.fix)]
    return result


def render(files: Sequence[CheckedFile], options: RenderOptions) -> str:
    rules = [_rule_descriptor(rule) for rule in _all_rules()]
    rule_index = {descriptor["id"]: index for index, descriptor in enumerate(rules)}
    notebooks = NotebookPositions()
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "oom-lsp",
                        "version": oom_lsp.__version__,
                        "semanticVersion": oom_lsp.__version__,
                        "informationUri": INFORMATION_URI,
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {SRCROOT: {"uri": Path.cwd().as_uri() + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": [_result(file, finding, rule_index, notebooks) for file, finding in located(files)],
            }
        ],
    }
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"


def _all_rules() -> list[Any]:
    rules: list[Any] = [*registry.all_rules().values(), *registry.META_RULES.values()]
    return sorted(rules, key=lambda rule: rule.code)
