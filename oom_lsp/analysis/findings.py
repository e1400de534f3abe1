"""The values the analysis produces: findings, their ranges and their fixes.

Everything here is plain data that round-trips through JSON (`to_dict` /
`from_dict`), so a finding can travel in the results cache, in `--format json`
and in an LSP diagnostic's `data` without being recomputed.

Positions are 1-based lines and 0-based columns counted in code points, the
convention of libcst and of Ruff's JSON output. The LSP adapter converts
columns to the client's position encoding.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from oom_lsp.edits import Range, TextEdit


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    HINT = "hint"


class Applicability(str, enum.Enum):
    """Whether a fix keeps the program's meaning (Ruff's fix safety)."""

    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True, slots=True)
class Fix:
    title: str
    edits: tuple[TextEdit, ...]
    applicability: Applicability

    @property
    def is_safe(self) -> bool:
        return self.applicability is Applicability.SAFE

    @property
    def help(self) -> str:
        """Ruff's `help:` line, the fix's title: under the frame in `--output-format full`, and
        after a blank line in the editor's diagnostic message (as Ruff's server does)."""
        return f"help: {self.title}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "applicability": self.applicability.value,
            "edits": [edit.to_dict() for edit in self.edits],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fix:
        return cls(
            data["title"],
            tuple(TextEdit.from_dict(edit) for edit in data["edits"]),
            Applicability(data["applicability"]),
        )


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    name: str
    message: str
    range: Range
    severity: Severity
    fix: Fix | None = None
    # The first line of the statement the finding sits in: a suppression
    # comment on the line above it covers a multi-line statement.
    statement_line: int = field(default=0, compare=False)
    # In a notebook: the 1-based number of the cell (markdown cells counted) the
    # range and fix are relative to; None in a file of Python.
    cell: int | None = None

    @property
    def line(self) -> int:
        return self.range.start.line

    @property
    def column(self) -> int:
        return self.range.start.column

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "message": self.message,
            "range": self.range.to_dict(),
            "severity": self.severity.value,
            "fix": self.fix.to_dict() if self.fix else None,
            "statement_line": self.statement_line,
            **({"cell": self.cell} if self.cell is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            code=data["code"],
            name=data["name"],
            message=data["message"],
            range=Range.from_dict(data["range"]),
            severity=Severity(data["severity"]),
            fix=Fix.from_dict(data["fix"]) if data.get("fix") else None,
            statement_line=data.get("statement_line", 0),
            cell=data.get("cell"),
        )
