"""The edit vocabulary that analysis/ and fixes/ share, and nothing else.

Rules describe a fix as node-level edits (`Replace`, `InsertBefore`, ...)
built by the codemods of `oom_lsp.fixes`; the engine resolves node positions
and turns each into a `TextEdit`. Both packages import this module, and
`fixes/` imports nothing from `analysis/`: the dependency is one-way.

Positions are 1-based lines and 0-based columns counted in code points, the
convention of libcst and of Ruff's JSON output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    # Only for annotations: the CLI answers cached files without importing libcst.
    import libcst as cst

# What ends a line for Python's tokenizer, libcst and the LSP. `str.splitlines` also
# breaks at \v, \f, \x1c-\x1e, \x85, U+2028 and U+2029: text split with it numbers its
# lines differently from the editor once one of those precedes an edit.
NEWLINE_RE = re.compile(r"\r\n?|\n")
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str, keepends: bool = False) -> list[str]:
    """`text.splitlines(keepends)`, but with only `\\n`, `\\r\\n` and `\\r` ending a line:
    the one line splitting for every path from text to line numbers and ranges."""
    lines = _LINE_RE.findall(text)
    return lines if keepends else [line.rstrip("\r\n") for line in lines]


@dataclass(frozen=True, slots=True, order=True)
class Position:
    line: int  # 1-based
    column: int  # 0-based, code points


@dataclass(frozen=True, slots=True, order=True)
class Range:
    start: Position
    end: Position

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": {"line": self.start.line, "column": self.start.column},
            "end": {"line": self.end.line, "column": self.end.column},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Range:
        return cls(
            Position(data["start"]["line"], data["start"]["column"]),
            Position(data["end"]["line"], data["end"]["column"]),
        )


@dataclass(frozen=True, slots=True)
class TextEdit:
    range: Range
    new_text: str

    def to_dict(self) -> dict[str, Any]:
        return {"range": self.range.to_dict(), "new_text": self.new_text}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TextEdit:
        return cls(Range.from_dict(data["range"]), data["new_text"])


# --- Node-level edits: what a codemod returns --------------------------------


@dataclass(frozen=True)
class Replace:
    """Replace a node's text with a new node's code or a string."""

    node: cst.CSTNode
    new: Union[cst.CSTNode, str]


@dataclass(frozen=True)
class InsertBefore:
    """Insert text right before a node (same line, same column)."""

    node: cst.CSTNode
    text: str


@dataclass(frozen=True)
class InsertAfter:
    """Insert text right after a node's end."""

    node: cst.CSTNode
    text: str


@dataclass(frozen=True)
class InsertLinesBefore:
    """Insert whole lines before a statement, indented like it.

    `lines` are given without indentation or newline; nested indentation
    inside them is written with four spaces and rebased on the statement's.
    """

    statement: cst.CSTNode
    lines: tuple[str, ...]


@dataclass(frozen=True)
class InsertLinesAfter:
    """Insert whole lines after a (possibly compound) statement.

    The lines are indented like `statement`'s first line unless `indent_like`
    names another node whose indentation to use.
    """

    statement: cst.CSTNode
    lines: tuple[str, ...]
    indent_like: cst.CSTNode | None = None


@dataclass(frozen=True)
class DeleteStatement:
    """Delete a statement's whole line(s)."""

    statement: cst.CSTNode


NodeEdit = Union[Replace, InsertBefore, InsertAfter, InsertLinesBefore, InsertLinesAfter, DeleteStatement]


# --- Applying text edits ------------------------------------------------------


class OverlappingEdits(ValueError):
    pass


def line_starts(source: str) -> list[int]:
    """Offsets at which each line (1-based index - 1) starts."""
    starts = [0]
    starts.extend(match.end() for match in NEWLINE_RE.finditer(source))
    return starts


def offset_of(position: Position, starts: list[int], source: str) -> int:
    if position.line - 1 >= len(starts):
        return len(source)
    return min(starts[position.line - 1] + position.column, len(source))


def apply_edits(source: str, edits: list[TextEdit] | tuple[TextEdit, ...]) -> str:
    """Apply edits given in positions of `source`; overlapping edits raise."""
    starts = line_starts(source)
    spans = sorted(
        (offset_of(edit.range.start, starts, source), offset_of(edit.range.end, starts, source), edit.new_text)
        for edit in edits
    )
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        if start < end:
            raise OverlappingEdits("edits overlap")
    pieces = []
    cursor = 0
    for start, end, text in spans:
        pieces.append(source[cursor:start])
        pieces.append(text)
        cursor = end
    pieces.append(source[cursor:])
    return "".join(pieces)
