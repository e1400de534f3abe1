"""IPython's syntax in a code cell, turned into Python of the same shape.

A cell may hold what IPython accepts and Python does not: line magics
(`%matplotlib inline`, `%time train()`), shell escapes (`!pip install x`),
help (`model?`, `?model`), assignments from them (`files = !ls`,
`t = %timeit -o f()`), and cell magics on the first line (`%%time`,
`%%bash`). As Ruff does:

- an escape at the start of a logical line (any indentation) becomes `_`
  padded with spaces to its own length, so every line keeps its number and
  every other character its column; its `\\` continuation lines become blank;
- a cell magic whose body is Python run in the notebook's namespace
  (`%%time`, `%%capture`, `%%timeit`, ...: Ruff's list) becomes a comment;
  any other cell magic (`%%bash`, `%%writefile`, `%%html`, ...), or a first
  line that is an automagic (`pip install x`), skips the cell.

Pure text processing; no parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Cell magics whose body is Python executed in the user's namespace (Ruff's list).
TRANSPARENT_CELL_MAGICS = frozenset(
    {"capture", "debug", "ipytest", "prun", "pypy", "python", "python3", "time", "timeit"}
)
# Line magics IPython runs without `%` when `automagic` is on (Ruff's list): a first
# line starting with one of these, not followed by an assignment, is not Python.
AUTOMAGICS = frozenset(
    [
        "alias",
        "alias_magic",
        "autoawait",
        "autocall",
        "automagic",
        "bookmark",
        "cd",
        "code_wrap",
        "colors",
        "conda",
        "config",
        "debug",
        "dhist",
        "dirs",
        "doctest_mode",
        "edit",
        "env",
        "gui",
        "history",
        "killbgscripts",
        "load",
        "load_ext",
        "loadpy",
        "logoff",
        "logon",
        "logstart",
        "logstate",
        "logstop",
        "lsmagic",
        "macro",
        "magic",
        "mamba",
        "matplotlib",
        "micromamba",
        "notebook",
        "page",
        "pastebin",
        "pdb",
        "pdef",
        "pdoc",
        "pfile",
        "pinfo",
        "pinfo2",
        "pip",
        "popd",
        "pprint",
        "precision",
        "prun",
        "psearch",
        "psource",
        "pushd",
        "pwd",
        "pycat",
        "pylab",
        "quickref",
        "recall",
        "rehashx",
        "reload_ext",
        "rerun",
        "reset",
        "reset_selective",
        "run",
        "save",
        "sc",
        "set_env",
        "sx",
        "system",
        "tb",
        "time",
        "timeit",
        "unalias",
        "unload_ext",
        "who",
        "who_ls",
        "whos",
        "xdel",
        "xmode",
    ]
)
_ASSIGN_OPERATORS = frozenset({"=", "+=", "-=", "*=", "/=", "//=", "%=", "**=", "&=", "|=", "^="})
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
# `obj?`, `obj.attr??`, `%magic?`: IPython's help at the end of a line.
_HELP_END_RE = re.compile(r"^%{0,2}[A-Za-z_*][\w*]*(?:\.[A-Za-z_*][\w*]*)*\?{1,2}$")
# `x = !cmd`, `a, b = %magic ...`: the assigned expression is an escape.
_ASSIGN_FROM_ESCAPE_RE = re.compile(r"^[\w.,\s\[\]()*]+?\s*=\s*(?=[!%][^=])")
_PLACEHOLDER = "_"


@dataclass(frozen=True)
class MaskedCell:
    """`text` is Python with the cell's lines, each as long as the cell's own, or
    None when the cell is not Python (`skipped` says why)."""

    text: str | None
    # 1-based lines where an escape was replaced (its continuation lines included).
    masked_lines: frozenset[int] = frozenset()
    skipped: str | None = None
    # A cell whose first line is indented runs dedented (IPython's `leading_indent`):
    # how many characters came off the start of each of `dedented_lines`.
    dedent: int = 0
    dedented_lines: frozenset[int] = frozenset()

    def column_in_cell(self, line: int, column: int) -> int:
        """A column of `text` as a column of the cell's own line."""
        return column + self.dedent if line in self.dedented_lines else column

    @property
    def analysed(self) -> bool:
        return self.text is not None


def mask_cell(source: str, placeholder: str = _PLACEHOLDER) -> MaskedCell:
    """The cell as Python of the same shape. `placeholder` replaces each escape
    (padded to its length): `_` for the analysis, which needs the columns;
    `None` for a script that runs the cells (`_` may be undefined there)."""
    lines = _LINE_RE.findall(source)
    if not lines:
        return MaskedCell(source)
    lines, dedent, dedented = _leading_indent(lines)
    skipped = _skipped(lines)
    if skipped is not None:
        return MaskedCell(None, skipped=skipped)
    out: list[str] = []
    masked: set[int] = set()
    state = _LineState()
    escape_continues = False
    for number, line in enumerate(lines, start=1):
        body, ending = _split_ending(line)
        if escape_continues:
            masked.add(number)
            out.append(" " * len(body) + ending)
            escape_continues = body.endswith("\\")
            continue
        if number == 1 and body.lstrip().startswith("%%"):
            masked.add(number)
            indent = len(body) - len(body.lstrip())
            out.append(body[:indent] + "#" + body[indent + 1 :] + ending)
            continue
        if state.at_statement_start:
            start = _escape_start(body)
            if start is not None:
                masked.add(number)
                escape = body[start:]
                out.append(body[:start] + placeholder.ljust(len(escape)) + ending)
                escape_continues = body.endswith("\\")
                continue
        out.append(line)
        state.feed(body)
    return MaskedCell("".join(out), frozenset(masked), dedent=dedent, dedented_lines=dedented)


def _leading_indent(lines: list[str]) -> tuple[list[str], int, frozenset[int]]:
    """IPython's `leading_indent` cleanup: when the cell's first non-blank line is
    indented, that indentation comes off every line that starts with it (IPython
    drops the blank lines before it first, which changes no other line)."""
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return lines, 0, frozenset()
    prefix = first[: len(first) - len(first.lstrip(" \t"))]
    if not prefix:
        return lines, 0, frozenset()
    dedented = frozenset(number for number, line in enumerate(lines, start=1) if line.startswith(prefix))
    return [line[len(prefix) :] if line.startswith(prefix) else line for line in lines], len(prefix), dedented


def _split_ending(line: str) -> tuple[str, str]:
    if line.endswith("\r\n"):
        return line[:-2], "\r\n"
    if line.endswith(("\n", "\r")):
        return line[:-1], line[-1]
    return line, ""


def _skipped(lines: list[str]) -> str | None:
    """Why the whole cell is not Python, or None."""
    first = lines[0].split()
    if first and first[0] in AUTOMAGICS and not (len(first) > 1 and first[1] in _ASSIGN_OPERATORS):
        return f"automagic `{first[0]}`"
    for index, line in enumerate(lines):
        words = line.split()
        if not words or not words[0].startswith("%%") or len(words[0]) < 3:
            continue
        name = words[0][2:]
        if index > 0 or name not in TRANSPARENT_CELL_MAGICS:
            return f"cell magic `%%{name}`"
    return None


def _escape_start(body: str) -> int | None:
    """The column where an IPython escape starts on a line that begins a statement."""
    stripped = body.lstrip()
    indent = len(body) - len(stripped)
    if not stripped:
        return None
    if stripped[0] in "!%?" and not stripped.startswith("!="):
        return indent
    code = stripped.rstrip()
    if code.endswith("?") and _HELP_END_RE.match(code):
        return indent
    match = _ASSIGN_FROM_ESCAPE_RE.match(stripped)
    if match is not None and "==" not in stripped[: match.end()]:
        return indent + match.end()
    return None


class _LineState:
    """Whether the next line starts a statement: not inside a bracket, a
    triple-quoted string, or after a `\\` continuation."""

    def __init__(self) -> None:
        self.depth = 0
        self.string: str | None = None  # the open string's quote, when a string spans lines
        self.continued = False

    @property
    def at_statement_start(self) -> bool:
        return self.depth == 0 and self.string is None and not self.continued

    def feed(self, body: str) -> None:
        index = 0
        length = len(body)
        self.continued = False
        while index < length:
            if self.string is not None:
                close = self._string_end(body, index, self.string)
                if close is None:
                    # A single-quoted string goes on only after a backslash at the line's end.
                    if len(self.string) == 1 and not body.endswith("\\"):
                        self.string = None
                    return
                index = close
                self.string = None
                continue
            char = body[index]
            if char == "#":
                return
            if char in "\"'":
                quote = body[index : index + 3] if body[index : index + 3] in ('"""', "'''") else char
                self.string = quote
                index += len(quote)
                continue
            if char in "([{":
                self.depth += 1
            elif char in ")]}":
                self.depth = max(0, self.depth - 1)
            elif char == "\\" and index == length - 1:
                self.continued = True
            index += 1

    @staticmethod
    def _string_end(body: str, index: int, quote: str) -> int | None:
        while index < len(body):
            if body[index] == "\\":
                index += 2
                continue
            if body.startswith(quote, index):
                return index + len(quote)
            index += 1
        return None
