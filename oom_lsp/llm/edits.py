"""Apply a proposal's SEARCH/REPLACE blocks to a document, or refuse with a reason.

Pure functions over text. A block applies only if:
- its SEARCH text is not empty and matches exactly once inside the code that was sent
  (the region, plus the import lines shown above it)
  (whole lines; trailing whitespace ignored), or, failing that, once with one uniform
  indentation shift (the model dropped or added a level): REPLACE is re-indented by it;
- it does not overlap another block;
- the whole resulting file still parses, and no redaction placeholder is left in it.
No fuzzy matching: an edit the user did not see verbatim is never applied.

The result is expressed as minimal line edits (difflib opcodes between the old and the
new lines), so an editor's preview shows the real change, in the positions of
oom_lsp.analysis.findings (1-based lines, 0-based columns in code points). Lines are
those of `oom_lsp.edits.split_lines`, the editor's: a form feed or U+2028 inside a line
does not end it.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from oom_lsp import python_ast
from oom_lsp.edits import Position, Range, TextEdit, split_lines
from oom_lsp.llm.secrets import PLACEHOLDER_RE, restore

MAX_BLOCKS = 5


@dataclass(frozen=True)
class Region:
    """The lines sent to the model (1-based, inclusive): edits must fall inside."""

    start_line: int
    end_line: int

    def contains(self, first: int, last: int) -> bool:
        return self.start_line <= first and last <= self.end_line


@dataclass(frozen=True)
class SearchReplace:
    search: str
    replace: str
    why: str = ""


@dataclass(frozen=True)
class EditResult:
    old_text: str
    new_text: str
    edits: tuple[TextEdit, ...]  # minimal line edits, in positions of old_text

    def diff(self, path: str) -> str:
        return unified_diff(self.old_text, self.new_text, path)


class EditRefused(Exception):
    """A block that cannot be applied; `hint` holds the closest actual lines, for the retry."""

    def __init__(self, reason: str, hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.hint = hint

    def feedback(self) -> str:
        """What to tell the model on the retry."""
        return self.reason + (
            f"\nDid you mean to match some of these actual lines?\n{self.hint}" if self.hint else ""
        )


@dataclass(frozen=True)
class _Match:
    start: int  # 0-based index of the first matched line
    stop: int  # exclusive
    replacement: list[str]  # lines with their endings


def apply_blocks(
    text: str,
    blocks: Sequence[SearchReplace],
    region: Region,
    secrets: dict[str, str] | None = None,
    shown_lines: Collection[int] = (),
) -> EditResult:
    """The checked result of applying every block to `text`; raises EditRefused.
    `shown_lines`: other 1-based lines that were sent and may change (the imports)."""
    if not blocks:
        raise EditRefused("the answer contains no SEARCH/REPLACE block")
    if len(blocks) > MAX_BLOCKS:
        raise EditRefused(f"too many edits ({len(blocks)}); propose at most {MAX_BLOCKS}")
    lines = split_lines(text, keepends=True)
    newline = _newline_of(text)
    matches = []
    for number, block in enumerate(blocks, 1):
        search = restore(block.search, secrets or {})
        replace = restore(block.replace, secrets or {})
        label = f"edit {number}" if len(blocks) > 1 else "the edit"
        matches.append(
            _locate(lines, search, replace, _Scope(region, frozenset(shown_lines)), label, newline)
        )
    matches.sort(key=lambda match: match.start)
    for before, after in zip(matches, matches[1:]):
        if after.start < before.stop:
            raise EditRefused("two edits change the same lines; merge them into one block")
    new_lines = list(lines)
    for match in reversed(matches):
        new_lines[match.start : match.stop] = match.replacement
    new_text = "".join(new_lines)
    if new_text == text:
        raise EditRefused("the edit changes nothing (REPLACE is the same as SEARCH)")
    leftover = set(PLACEHOLDER_RE.findall(new_text)) - set(PLACEHOLDER_RE.findall(text))
    if leftover:
        raise EditRefused(
            f"the edit contains the placeholder {sorted(leftover)[0]}, which is not in the file"
        )
    try:
        python_ast.parse(new_text)
    except SyntaxError as error:
        raise EditRefused(f"the edited file does not parse: {error.msg} (line {error.lineno})") from None
    return EditResult(text, new_text, line_edits(text, new_text))


def _newline_of(text: str) -> str:
    for ending in ("\r\n", "\n", "\r"):
        if ending in text:
            return ending
    return "\n"


def _split(block_text: str) -> list[str]:
    lines = split_lines(block_text)
    # A block's own first/last blank line is framing, not content.
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


@dataclass(frozen=True)
class _Scope:
    region: Region
    shown_lines: frozenset[int]

    def allows(self, start: int, count: int) -> bool:
        """Whether the 0-based lines start..start+count-1 were all sent."""
        return all(
            self.region.start_line <= line <= self.region.end_line or line in self.shown_lines
            for line in range(start + 1, start + count + 1)
        )


def _locate(lines: list[str], search: str, replace: str, scope: _Scope, label: str, newline: str) -> _Match:
    search_lines = _split(search)
    if not search_lines:
        raise EditRefused(f"{label} has an empty SEARCH: copy at least one existing line to anchor it")
    replace_lines = _split(replace) if replace.strip() else []
    bare = [line.rstrip("\r\n").rstrip() for line in lines]
    wanted = [line.rstrip() for line in search_lines]
    exact = _find(bare, wanted)
    inside = [start for start in exact if scope.allows(start, len(wanted))]
    if len(inside) == 1:
        return _Match(inside[0], inside[0] + len(wanted), _with_endings(replace_lines, newline))
    if len(inside) > 1:
        raise EditRefused(
            f"the SEARCH text of {label} matches {len(inside)} places in the code sent; "
            "include more context lines so that it matches exactly once"
        )
    shifted = [
        (start, shift) for start, shift in _find_shifted(bare, wanted) if scope.allows(start, len(wanted))
    ]
    if len(shifted) == 1:
        start, shift = shifted[0]
        return _Match(
            start, start + len(wanted), _with_endings(_reindent(replace_lines, shift, label), newline)
        )
    if len(shifted) > 1:
        raise EditRefused(
            f"the SEARCH text of {label} matches {len(shifted)} places in the code sent; "
            "include more context lines so that it matches exactly once"
        )
    if exact:
        raise EditRefused(f"the SEARCH text of {label} matches only outside the code that was sent")
    sent = [line for index, line in enumerate(bare) if scope.allows(index, 1)]
    raise EditRefused(
        f"the SEARCH text of {label} was not found in the code; copy the lines exactly",
        _closest_lines(sent, wanted),
    )


def _find(bare: list[str], wanted: list[str]) -> list[int]:
    return [
        start for start in range(len(bare) - len(wanted) + 1) if bare[start : start + len(wanted)] == wanted
    ]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _find_shifted(bare: list[str], wanted: list[str]) -> list[tuple[int, tuple[str, str]]]:
    """Starts where the lines match after one uniform indentation change, with the shift
    (file prefix, search prefix): one of the two is empty. Blank lines are not compared."""
    found = []
    anchor = next(index for index, line in enumerate(wanted) if line.strip())
    for start in range(len(bare) - len(wanted) + 1):
        window = bare[start : start + len(wanted)]
        file_indent, search_indent = _indent(window[anchor]), _indent(wanted[anchor])
        if file_indent.startswith(search_indent):
            shift = (file_indent[len(search_indent) :], "")
        elif search_indent.startswith(file_indent):
            shift = ("", search_indent[len(file_indent) :])
        else:
            continue
        if shift == ("", ""):
            continue  # the exact match was already looked for
        if all(_shifted_equal(actual, expected, shift) for actual, expected in zip(window, wanted)):
            found.append((start, shift))
    return found


def _shifted_equal(actual: str, expected: str, shift: tuple[str, str]) -> bool:
    if not expected.strip():
        return not actual.strip()
    added, removed = shift
    if removed:
        return expected.startswith(removed) and expected[len(removed) :] == actual
    return actual == added + expected


def _reindent(lines: list[str], shift: tuple[str, str], label: str) -> list[str]:
    added, removed = shift
    result = []
    for line in lines:
        if not line.strip():
            result.append("")
        elif removed:
            if not line.startswith(removed):
                raise EditRefused(f"the REPLACE text of {label} is indented less than its SEARCH text")
            result.append(line[len(removed) :])
        else:
            result.append(added + line)
    return result


def _with_endings(lines: list[str], newline: str) -> list[str]:
    return [line.rstrip("\r\n") + newline for line in lines]


def _closest_lines(region_lines: list[str], wanted: list[str]) -> str:
    """Up to 3 actual lines closest to the SEARCH lines that are not in the code as written."""
    candidates = [line for line in region_lines if line.strip()]
    present = {line.strip() for line in candidates}
    missing = [line for line in wanted if line.strip() and line.strip() not in present]
    close: list[str] = []
    for line in missing or wanted:
        for match in difflib.get_close_matches(line, candidates, n=3, cutoff=0.6):
            if match not in close:
                close.append(match)
    return "\n".join(close[:3])


# --- Results as editor edits -------------------------------------------------------------


def line_edits(old: str, new: str) -> tuple[TextEdit, ...]:
    """Minimal whole-line edits turning `old` into `new`, in positions of `old`."""
    old_lines = split_lines(old, keepends=True)
    new_lines = split_lines(new, keepends=True)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    edits = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        edits.append(
            TextEdit(Range(_line_start(old_lines, i1), _line_start(old_lines, i2)), "".join(new_lines[j1:j2]))
        )
    return tuple(edits)


def _line_start(lines: list[str], index: int) -> Position:
    """The start of line `index` (0-based); past the last line, the end of the text."""
    if index < len(lines) or not lines or lines[-1].endswith(("\n", "\r")):
        return Position(index + 1, 0)
    return Position(len(lines), len(lines[-1]))


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            split_lines(old, keepends=True),
            split_lines(new, keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )
