"""Positions between the analysis (1-based lines, code-point columns) and the
LSP (0-based lines, columns in the negotiated encoding: UTF-16 unless the
client offered UTF-8 or UTF-32 and pygls chose it)."""

from __future__ import annotations

from lsprotocol import types

from oom_lsp.edits import NEWLINE_RE, Position, Range


def split_lines(source: str) -> list[str]:
    """Lines as the LSP counts them (`\\n`, `\\r\\n` and `\\r` end a line, as in
    `oom_lsp.edits.split_lines`), with the empty line after a final newline: a
    position may point there."""
    return NEWLINE_RE.split(source)


def _units(text: str, encoding: str) -> int:
    if encoding == types.PositionEncodingKind.Utf32 or text.isascii():
        return len(text)
    if encoding == types.PositionEncodingKind.Utf8:
        return len(text.encode("utf-8"))
    return len(text.encode("utf-16-le")) // 2


class PositionConverter:
    def __init__(self, source: str, encoding: str) -> None:
        self.lines = split_lines(source)
        self.encoding = encoding

    def to_lsp(self, position: Position) -> types.Position:
        index = position.line - 1
        if index >= len(self.lines):
            # The end of the document (an edit that appends a final line).
            return types.Position(line=len(self.lines) - 1, character=_units(self.lines[-1], self.encoding))
        text = self.lines[max(index, 0)]
        return types.Position(line=max(index, 0), character=_units(text[: position.column], self.encoding))

    def range_to_lsp(self, value: Range) -> types.Range:
        return types.Range(start=self.to_lsp(value.start), end=self.to_lsp(value.end))

    def from_lsp(self, position: types.Position) -> Position:
        """The code-point position of an LSP position, clamped to the text."""
        if position.line >= len(self.lines):
            return Position(len(self.lines), len(self.lines[-1]))
        text = self.lines[position.line]
        if self.encoding == types.PositionEncodingKind.Utf32 or text.isascii():
            return Position(position.line + 1, min(position.character, len(text)))
        units = 0
        for column, char in enumerate(text):
            width = _units(char, self.encoding)
            if units + width > position.character:
                # At the character, or inside its encoding (half a surrogate pair).
                return Position(position.line + 1, column)
            units += width
        return Position(position.line + 1, len(text))

    def end(self) -> types.Position:
        return types.Position(line=len(self.lines) - 1, character=_units(self.lines[-1], self.encoding))

    def offset_to_lsp(self, offset: int, source: str) -> types.Position:
        """The LSP position of a code-point offset into `source` (the text
        these lines were split from)."""
        before = split_lines(source[:offset])
        return types.Position(line=len(before) - 1, character=_units(before[-1], self.encoding))
