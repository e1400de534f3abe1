"""The "Ignore OOMxxx for this line" edit. Pure function over text.

The edit adds `# oom: ignore[OOMxxx]` trailing the finding's line, or adds the
code to a `# oom: ignore[...]` comment already there. Where a trailing comment
cannot go (the line ends inside a multi-line string, or with a backslash
continuation), the comment goes on its own line above the statement, the form
that covers the whole statement (`oom_lsp/analysis/suppressions.py`); an
own-line `# oom: ignore[...]` already above it is extended instead.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass

from oom_lsp.edits import Position, Range, TextEdit

_NEWLINE_RE = re.compile(r"\r\n?|\n")
# Only the line form: `ignore-file[...]` covers the file, merging into it
# would widen what the user asked for.
_LINE_IGNORE_RE = re.compile(r"#\s*oom:\s*ignore\s*\[([^\]]*)\]", re.IGNORECASE)


@dataclass(frozen=True)
class _LineFacts:
    comment: tuple[int, str] | None  # (column, text) of the trailing comment
    ends_inside_token: bool  # a string (or other token) continues on the next line


def _line_facts(source: str, line: int) -> _LineFacts | None:
    """What the tokenizer knows about `line`; None when it rejects the file."""
    comment = None
    ends_inside = False
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            start_line, end_line = token.start[0], token.end[0]
            if start_line > line:
                break
            if token.type == tokenize.COMMENT and start_line == line:
                comment = (token.start[1], token.string)
            elif token.type not in (tokenize.NEWLINE, tokenize.NL) and start_line <= line < end_line:
                ends_inside = True
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return _LineFacts(comment, ends_inside)


def _codes_in(bracket_text: str) -> list[str]:
    return [code.strip() for code in bracket_text.split(",") if code.strip()]


def _add_code(comment_line: int, comment_column: int, match: re.Match[str], code: str) -> TextEdit | None:
    """The edit adding `code` inside the brackets of a matched
    `# oom: ignore[...]`; None when the code is already there."""
    existing = _codes_in(match.group(1))
    if code.upper() in (entry.upper() for entry in existing):
        return None
    if existing:
        column = comment_column + match.start(1) + len(match.group(1).rstrip())
        position = Position(comment_line, column)
        return TextEdit(Range(position, position), f", {code}")
    # `ignore[]` or `ignore[ ]`: the code replaces what is inside the brackets.
    start = Position(comment_line, comment_column + match.start(1))
    end = Position(comment_line, comment_column + match.end(1))
    return TextEdit(Range(start, end), code)


def ignore_for_line(source: str, line: int, code: str, statement_line: int | None = None) -> TextEdit | None:
    """The edit that silences `code` on `line` (1-based), or None when the
    line already ignores it or the file does not tokenize.

    `statement_line` is the first line of the statement holding the finding;
    it is where an own-line comment goes when a trailing one cannot.
    """
    lines = _NEWLINE_RE.split(source)
    if not 1 <= line <= len(lines):
        return None
    facts = _line_facts(source, line)
    if facts is None:
        return None
    text = lines[line - 1]
    if facts.comment is not None:
        column, comment = facts.comment
        match = _LINE_IGNORE_RE.search(comment)
        if match is not None:
            return _add_code(line, column, match, code)
    continued = text.rstrip().endswith("\\") and facts.comment is None
    if not facts.ends_inside_token and not continued:
        end = Position(line, len(text))
        start = Position(line, len(text.rstrip()))
        return TextEdit(Range(start, end), f"  # oom: ignore[{code}]")
    newline_match = _NEWLINE_RE.search(source)
    newline = newline_match.group() if newline_match else "\n"
    return _own_line_ignore(lines, statement_line or line, code, newline)


def _own_line_ignore(lines: list[str], statement_line: int, code: str, newline: str) -> TextEdit | None:
    above = statement_line - 1
    if above >= 1:
        previous = lines[above - 1]
        stripped = previous.lstrip()
        match = _LINE_IGNORE_RE.match(stripped)
        if match is not None:
            return _add_code(above, len(previous) - len(stripped), match, code)
    statement_text = lines[statement_line - 1]
    indent = statement_text[: len(statement_text) - len(statement_text.lstrip())]
    position = Position(statement_line, 0)
    return TextEdit(Range(position, position), f"{indent}# oom: ignore[{code}]{newline}")
