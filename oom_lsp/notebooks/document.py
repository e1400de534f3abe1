"""An `.ipynb` file: nbformat 4 JSON, read with where each cell's source sits.

`read_notebook` validates the JSON with the standard library's C scanner and
walks only the structure it needs (the top-level object, `cells`, each cell's
`cell_type`, `source` and `metadata`), recording the character span of every
`source` value and of each of its strings. `NotebookFile.with_sources` then
replaces the spans of the cells a fix changed and nothing else, written in the
style the file already uses (its indentation, one string per line or one
string, `\\uXXXX` escapes or raw characters), so outputs, metadata, cell ids,
key order and the final newline are kept byte for byte.

A file that is not JSON, not nbformat 4, or whose cells are malformed raises
`NotebookError` with a one-line reason.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from json.decoder import WHITESPACE, scanstring  # type: ignore[attr-defined]

_DECODER = json.JSONDecoder()
# A \uXXXX escape of a character outside ASCII: the file was written with ensure_ascii.
_ESCAPED_NON_ASCII_RE = re.compile(
    r"\\u(?:00[89a-fA-F]|0[1-9a-fA-F][0-9a-fA-F]|[1-9a-fA-F][0-9a-fA-F]{2})[0-9a-fA-F]"
)
_NON_ASCII_RE = re.compile(r"[^\x00-\x7f]")


class NotebookError(ValueError):
    """The file is not a notebook this tool can read; the message is one line."""


@dataclass(frozen=True)
class StringSpan:
    """A JSON string in the file: `start` at its opening quote, `end` after the closing one."""

    start: int
    end: int
    value: str


@dataclass(frozen=True)
class Cell:
    index: int  # 0-based, among all cells (markdown included): "cell {index + 1}"
    cell_type: str
    source: str
    # The cell's own language when the file says it (VS Code: metadata.vscode.languageId).
    language: str | None
    # Where the `source` value sits in the file text, and its strings (one, or one per element).
    source_start: int
    source_end: int
    strings: tuple[StringSpan, ...]
    source_is_list: bool

    @property
    def number(self) -> int:
        """1-based, as output and editors show it."""
        return self.index + 1

    @property
    def is_code(self) -> bool:
        return self.cell_type == "code"


@dataclass
class NotebookFile:
    text: str
    cells: list[Cell]
    nbformat_minor: int | None
    # The kernel's language when the file says it (metadata.kernelspec / language_info).
    language: str | None
    _line_starts: list[int] | None = field(default=None, repr=False)

    @property
    def is_python(self) -> bool:
        return self.language is None or self.language.lower() in ("python", "python3", "ipython", "ipython3")

    def code_cells(self) -> list[Cell]:
        """The cells that hold Python: code cells, in a Python notebook, not marked
        as another language."""
        if not self.is_python:
            return []
        return [
            cell
            for cell in self.cells
            if cell.is_code and (cell.language is None or cell.language.lower() == "python")
        ]

    def cell(self, number: int) -> Cell | None:
        return self.cells[number - 1] if 0 < number <= len(self.cells) else None

    # --- writing ---------------------------------------------------------------

    def with_sources(self, sources: dict[int, str]) -> str:
        """The file text with the source of each cell `index -> text` replaced and
        every other character as it was."""
        ensure_ascii = _writes_ascii(self.text)
        pieces = []
        cursor = 0
        for cell in self.cells:
            new = sources.get(cell.index)
            if new is None or new == cell.source:
                continue
            pieces.append(self.text[cursor : cell.source_start])
            pieces.append(self._source_json(cell, new, ensure_ascii))
            cursor = cell.source_end
        pieces.append(self.text[cursor:])
        return "".join(pieces)

    def _source_json(self, cell: Cell, source: str, ensure_ascii: bool) -> str:
        if not cell.source_is_list:
            return json.dumps(source, ensure_ascii=ensure_ascii)
        # nbformat's split: one string per line, each keeping its line end.
        lines = source.splitlines(keepends=True)
        if not lines:
            return "[]"
        opening, separator, closing = self._list_layout(cell)
        return (
            "["
            + opening
            + separator.join(json.dumps(line, ensure_ascii=ensure_ascii) for line in lines)
            + closing
            + "]"
        )

    def _list_layout(self, cell: Cell) -> tuple[str, str, str]:
        """(after `[`, between strings, before `]`) as this cell's list, or another
        cell's, writes them; nbformat's own layout when no list shows one."""
        for candidate in [cell, *self.cells]:
            if candidate.source_is_list and candidate.strings:
                strings = candidate.strings
                opening = self.text[candidate.source_start + 1 : strings[0].start]
                closing = self.text[strings[-1].end : candidate.source_end - 1]
                if len(strings) > 1:
                    separator = self.text[strings[0].end : strings[1].start]
                else:
                    separator = "," + (opening if "\n" in opening else " ")
                if candidate is not cell and "\n" in opening:
                    # Another cell at the same depth: same layout, re-based on this cell's indentation.
                    shift = _indent_at(self.text, cell.source_start) - _indent_at(
                        self.text, candidate.source_start
                    )
                    opening, separator, closing = (
                        _reindent(part, shift) for part in (opening, separator, closing)
                    )
                return opening, separator, closing
        indent = _indent_at(self.text, cell.source_start)
        return "\n" + " " * (indent + 1), ",\n" + " " * (indent + 1), "\n" + " " * indent

    # --- positions -------------------------------------------------------------

    def file_position(self, cell: Cell, line: int, column: int) -> tuple[int, int]:
        """Where (1-based line, 0-based column of the file text) the character at
        `line`/`column` of the cell's source is written: where a reader of the raw
        `.ipynb` (a SARIF viewer, a pull-request annotation) finds it."""
        offset = _offset_in(cell.source, line, column)
        consumed = 0
        for string in cell.strings:
            if offset < consumed + len(string.value) or string is cell.strings[-1]:
                inner = self.text[string.start + 1 : string.end - 1]
                raw = string.start + 1 + _raw_index(inner, min(offset - consumed, len(string.value)))
                return self._line_column(raw)
            consumed += len(string.value)
        return self._line_column(cell.source_start)

    def _line_column(self, offset: int) -> tuple[int, int]:
        if self._line_starts is None:
            self._line_starts = [0] + [match.end() for match in re.finditer(r"\r\n|\r|\n", self.text)]
        index = bisect.bisect_right(self._line_starts, offset) - 1
        return index + 1, offset - self._line_starts[index]


def _offset_in(source: str, line: int, column: int) -> int:
    starts = [0] + [match.end() for match in re.finditer(r"\r\n|\r|\n", source)]
    if line - 1 >= len(starts):
        return len(source)
    return min(starts[line - 1] + column, len(source))


def _raw_index(inner: str, decoded_index: int) -> int:
    """The index in a JSON string's raw text of its `decoded_index`-th decoded character."""
    raw = 0
    decoded = 0
    while decoded < decoded_index and raw < len(inner):
        if inner[raw] == "\\":
            if inner[raw + 1 : raw + 2] == "u":
                code = int(inner[raw + 2 : raw + 6], 16)
                raw += 6
                if 0xD800 <= code < 0xDC00 and inner[raw : raw + 2] == "\\u":
                    raw += 6  # a surrogate pair is one character
            else:
                raw += 2
        else:
            raw += 1
        decoded += 1
    return raw


def _indent_at(text: str, offset: int) -> int:
    """The indentation of the line holding `offset`."""
    line_start = text.rfind("\n", 0, offset) + 1
    line = text[line_start:offset]
    return len(line) - len(line.lstrip(" \t"))


def _reindent(part: str, shift: int) -> str:
    if shift == 0 or "\n" not in part:
        return part
    head, _, indent = part.rpartition("\n")
    return head + "\n" + " " * max(0, len(indent) + shift)


def _writes_ascii(text: str) -> bool:
    """Whether the file escapes non-ASCII characters (`json.dumps`'s default) or
    writes them as they are (nbformat's and VS Code's way)."""
    if _NON_ASCII_RE.search(text):
        return False
    return _ESCAPED_NON_ASCII_RE.search(text) is not None


# --- reading ---------------------------------------------------------------------


def decode_notebook_bytes(raw: bytes) -> tuple[str, bool]:
    """(text, had a BOM). nbformat files are UTF-8."""
    bom = raw.startswith(b"\xef\xbb\xbf")
    try:
        return raw[3 if bom else 0 :].decode("utf-8"), bom
    except UnicodeDecodeError as error:
        raise NotebookError(
            f"not a notebook: the file is not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start})"
        ) from None


def encode_notebook_text(text: str, bom: bool) -> bytes:
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")


def read_notebook(text: str) -> NotebookFile:
    """Parse and check a notebook's text; `NotebookError` says what is wrong, in one line."""
    try:
        return _Reader(text).read()
    except json.JSONDecodeError as error:
        raise NotebookError(
            f"not a notebook: invalid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except RecursionError:
        raise NotebookError("not a notebook: the JSON is nested too deeply") from None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text

    def _skip(self, index: int) -> int:
        return WHITESPACE.match(self.text, index).end()

    def _expect(self, index: int, char: str, what: str) -> int:
        if self.text[index : index + 1] != char:
            raise json.JSONDecodeError(f"Expecting {what}", self.text, index)
        return index + 1

    def _value(self, index: int) -> tuple[object, int]:
        try:
            return _DECODER.raw_decode(self.text, index)
        except json.JSONDecodeError:
            raise
        except ValueError as error:  # raw_decode's own "Expecting value" is a JSONDecodeError; be safe
            raise json.JSONDecodeError(str(error), self.text, index) from None

    def _object(self, index: int, on_member) -> int:
        """Walk an object at `index`: `on_member(key, value_index)` returns the index after
        the value. Returns the index after `}`."""
        index = self._expect(self._skip(index), "{", "'{'")
        index = self._skip(index)
        if self.text[index : index + 1] == "}":
            return index + 1
        while True:
            index = self._expect(index, '"', "property name enclosed in double quotes")
            key, index = scanstring(self.text, index)
            index = self._expect(self._skip(index), ":", "':' delimiter")
            index = self._skip(on_member(key, self._skip(index)))
            if self.text[index : index + 1] == "}":
                return index + 1
            index = self._skip(self._expect(index, ",", "',' delimiter"))

    def _skip_value(self, index: int) -> int:
        return self._value(index)[1]

    def read(self) -> NotebookFile:
        text = self.text
        start = self._skip(0)
        if text[start : start + 1] != "{":
            # Let the decoder say what it is (or what is wrong with it).
            value, end = self._value(start)
            raise NotebookError(f"not a notebook: the file holds a JSON {_json_type(value)}, not an object")
        top: dict[str, object] = {}
        cells_at: list[int] = []

        def member(key: str, index: int) -> int:
            if key == "cells" and text[index : index + 1] == "[":
                cells_at.append(index)
                value, end = self._value(index)  # validated here, walked once the version is known
                top[key] = value
                return end
            value, end = self._value(index)
            top[key] = value
            return end

        end = self._object(start, member)
        if self._skip(end) != len(text):
            raise json.JSONDecodeError("Extra data", text, self._skip(end))
        version = top.get("nbformat")
        if "nbformat" not in top:
            raise NotebookError('not a notebook: no "nbformat" version')
        if isinstance(version, bool) or not isinstance(version, int):
            raise NotebookError(f'not a notebook: "nbformat" is {version!r}, not a version number')
        if version != 4:
            hint = " (convert it with `jupyter nbconvert --to notebook --nbformat 4`)" if version < 4 else ""
            raise NotebookError(f"nbformat {version} is not supported, only nbformat 4{hint}")
        if not isinstance(top.get("cells"), list) or not cells_at:
            raise NotebookError('not a notebook: no "cells" list')
        minor = top.get("nbformat_minor")
        cells = self._cells(cells_at[-1])
        return NotebookFile(
            text=text,
            cells=cells,
            nbformat_minor=minor if isinstance(minor, int) else None,
            language=_notebook_language(top.get("metadata")),
        )

    def _cells(self, index: int) -> list[Cell]:
        text = self.text
        cells: list[Cell] = []
        index = self._skip(self._expect(index, "[", "'['"))
        if text[index : index + 1] == "]":
            return cells
        while True:
            cells.append(self._cell(index, len(cells)))
            index = self._skip(self._skip_value(index))
            if text[index : index + 1] == "]":
                return cells
            index = self._skip(self._expect(index, ",", "',' delimiter"))

    def _cell(self, index: int, position: int) -> Cell:
        text = self.text
        number = position + 1
        if text[index : index + 1] != "{":
            raise NotebookError(f"not a notebook: cell {number} is not an object")
        found: dict[str, object] = {}
        spans: dict[str, tuple[int, int, tuple[StringSpan, ...], bool]] = {}

        def member(key: str, value_index: int) -> int:
            if key == "source":
                strings, end, is_list = self._source(value_index, number)
                spans["source"] = (value_index, end, strings, is_list)
                return end
            value, end = self._value(value_index)
            found[key] = value
            return end

        self._object(index, member)
        cell_type = found.get("cell_type")
        if not isinstance(cell_type, str):
            raise NotebookError(f'not a notebook: cell {number} has no "cell_type"')
        if "source" not in spans:
            raise NotebookError(f'not a notebook: cell {number} has no "source"')
        start, end, strings, is_list = spans["source"]
        metadata = found.get("metadata")
        language = None
        if isinstance(metadata, dict) and isinstance(metadata.get("vscode"), dict):
            language_id = metadata["vscode"].get("languageId")
            language = language_id if isinstance(language_id, str) else None
        return Cell(
            index=position,
            cell_type=cell_type,
            source="".join(string.value for string in strings),
            language=language,
            source_start=start,
            source_end=end,
            strings=strings,
            source_is_list=is_list,
        )

    def _source(self, index: int, number: int) -> tuple[tuple[StringSpan, ...], int, bool]:
        text = self.text
        if text[index : index + 1] == '"':
            value, end = scanstring(text, index + 1)
            return (StringSpan(index, end, value),), end, False
        if text[index : index + 1] != "[":
            raise NotebookError(
                f"not a notebook: the source of cell {number} is neither a string nor a list of strings"
            )
        strings: list[StringSpan] = []
        position = self._skip(index + 1)
        if text[position : position + 1] == "]":
            return (), position + 1, True
        while True:
            if text[position : position + 1] != '"':
                self._value(position)  # a JSON error is reported as such
                raise NotebookError(
                    f"not a notebook: the source of cell {number} is neither a string nor a list of strings"
                )
            value, end = scanstring(text, position + 1)
            strings.append(StringSpan(position, end, value))
            position = self._skip(end)
            if text[position : position + 1] == "]":
                return tuple(strings), position + 1, True
            position = self._skip(self._expect(position, ",", "',' delimiter"))


def _json_type(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _notebook_language(metadata: object) -> str | None:
    if not isinstance(metadata, dict):
        return None
    info = metadata.get("language_info")
    if isinstance(info, dict) and isinstance(info.get("name"), str):
        return info["name"]
    spec = metadata.get("kernelspec")
    if isinstance(spec, dict) and isinstance(spec.get("language"), str):
        return spec["language"]
    return None
