"""Suppression comments.

- `# oom: ignore[OOM301]` trailing a line covers that line; on a line of its
  own it covers the next statement, all of its lines (multi-line calls are
  the norm in training scripts).
- `# noqa: OOM301` trailing a line covers that line; a bare `# noqa` covers
  every code on it, as in Ruff.
- `# oom: ignore-file[OOM101]` anywhere covers the whole file.

Codes may be written as codes or rule names, several separated by commas.
Only comments are read (tokenize), never strings that look like comments.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from oom_lsp.analysis.findings import Finding
from oom_lsp.edits import Position, Range, split_lines

_OOM_RE = re.compile(r"#\s*oom:\s*(ignore-file|file-ignore|ignore)\s*\[([^\]]*)\]", re.IGNORECASE)
_NOQA_RE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z0-9_\-]+(?:\s*,\s*[A-Za-z0-9_\-]+)*))?", re.IGNORECASE)


@dataclass
class Suppression:
    kind: str  # "line", "next-statement", "file"
    line: int  # the comment's line
    target_line: int  # the line covered ("next-statement": first line of the statement)
    codes: tuple[str, ...] | None  # None: every code (bare noqa)
    comment_range: Range
    comment_text: str
    syntax: str  # "oom" or "noqa"
    used: set[str] = field(default_factory=set)


def _split_codes(text: str) -> tuple[str, ...]:
    return tuple(code.strip() for code in text.split(",") if code.strip())


def _comments(source: str) -> list[tuple[int, int, str, bool]]:
    """(line, column, text, own_line) of every comment."""
    comments: list[tuple[int, int, str, bool]] = []
    lines = split_lines(source)
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                line, column = token.start
                text_before = lines[line - 1][:column] if line - 1 < len(lines) else ""
                comments.append((line, column, token.string, not text_before.strip()))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        # A file the tokenizer rejects was already reported as OOM000.
        pass
    return comments


def _next_code_line(lines: list[str], after: int) -> int:
    """The first line after `after` (1-based) that is not blank or a comment."""
    for index in range(after, len(lines)):
        stripped = lines[index].strip()
        if stripped and not stripped.startswith("#"):
            return index + 1
    return after + 1


def parse_suppressions(source: str) -> list[Suppression]:
    if "noqa" not in source.lower() and "oom:" not in source.lower():
        return []
    lines = split_lines(source)
    found: list[Suppression] = []
    for line, column, text, own_line in _comments(source):
        comment_range = Range(Position(line, column), Position(line, column + len(text)))
        for match in _OOM_RE.finditer(text):
            kind_word = match.group(1).lower()
            codes = _split_codes(match.group(2))
            if kind_word in ("ignore-file", "file-ignore"):
                kind, target = "file", 0
            elif own_line:
                kind, target = "next-statement", _next_code_line(lines, line)
            else:
                kind, target = "line", line
            found.append(Suppression(kind, line, target, codes, comment_range, text, "oom"))
        noqa = _NOQA_RE.search(text)
        if noqa and not own_line:
            codes_text = noqa.group("codes")
            codes = _split_codes(codes_text) if codes_text else None
            found.append(Suppression("line", line, line, codes, comment_range, text, "noqa"))
    return found


def _matches(entry: str, finding: Finding) -> bool:
    return entry.upper() == finding.code or entry.lower() == finding.name


def _covers(suppression: Suppression, finding: Finding) -> bool:
    if suppression.kind == "file":
        return True
    lines = {finding.line, finding.statement_line or finding.line}
    return suppression.target_line in lines


def apply_suppressions(
    findings: list[Finding], suppressions: list[Suppression]
) -> list[Finding]:
    """The findings no suppression covers; marks which codes were used."""
    kept: list[Finding] = []
    for finding in findings:
        suppressed = False
        for suppression in suppressions:
            if not _covers(suppression, finding):
                continue
            if suppression.codes is None:
                suppression.used.add(finding.code)
                suppressed = True
                continue
            for entry in suppression.codes:
                if _matches(entry, finding):
                    suppression.used.add(entry)
                    suppressed = True
        if not suppressed:
            kept.append(finding)
    return kept
