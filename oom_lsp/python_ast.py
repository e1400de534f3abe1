"""`ast.parse` and libcst's `evaluated_value` (an `ast.literal_eval`), one thread at a time.

CPython 3.11 before 3.11.8 and 3.12 before 3.12.2 count the depth of the conversion from
its C syntax tree to Python objects in state shared by every thread (python/cpython#106905,
fixed by #113035): a garbage collection that runs a finalizer in the middle of one
conversion lets another thread convert, and one of them fails with `SystemError: AST
constructor recursion depth mismatch (before=27, after=22)`. The language server analyses
a big document in a worker of its own while the others go on, and builds prompts and
checks AI edits in threads, so its parses do meet: a document then got no diagnostics at
all. `ast.parse` is a small part of an analysis (libcst's parser, which is not affected,
and the rules take most of it), so holding the lock over the whole call costs little.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

_CONVERSION = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """`ast.parse(source, filename, mode)`."""
    with _CONVERSION:
        return ast.parse(source, filename, mode)


def parse_only(source: str, filename: str) -> Any:
    """`compile(source, filename, "exec", PyCF_ONLY_AST)`: what `compile` says about the text."""
    with _CONVERSION:
        return compile(source, filename, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)


def evaluated_value(node: Any) -> Any:
    """A libcst string or number node's `evaluated_value`."""
    with _CONVERSION:
        return node.evaluated_value


# --- What libcst may parse -----------------------------------------------------------------
#
# libcst's parser (Rust) has no limit of its own on nesting: 1,500 nested brackets overflow
# the native stack and kill the process (SIGSEGV: no exception, every other file's findings
# lost), and long chains that CPython accepts cost it far more than their size (3,000 unary
# minus signs: 15 s and 500 MB; 3,000 chained subscripts: minutes). CPython's parser, in C,
# refuses what it cannot handle with a SyntaxError ("too many nested parentheses" past 200
# brackets, "too many levels of indentation" past 100 blocks) or a RecursionError /
# MemoryError (about 3,000 nested operators). So the text goes to CPython's parser first;
# what it accepts is then measured (the depth of its tree, only in statements long enough
# to nest deeply), and what it rejects is scanned token by token, since its first error can
# hide deeper nesting after it.

MAX_NESTING = 500  # levels of nested expressions or blocks the analysis takes (libcst: ~0.2 s)
_NESTING_MESSAGES = (
    "too many nested parentheses",
    "too many levels of indentation",
    "too many statically nested blocks",
    "too complex",
)


def _nesting_error(message: str, source: str, line: int, column: int) -> Exception:
    import libcst as cst

    lines = source.splitlines(keepends=True) or [""]
    line = min(max(line, 1), len(lines))
    return cst.ParserSyntaxError(message, lines=lines, raw_line=line, raw_column=max(column, 0))


def check_nesting(source: str, statements: Any = None) -> Any:
    """Raise libcst's ParserSyntaxError when libcst must not parse `source`: what CPython
    itself refuses for its nesting (with CPython's message and position), or nesting deeper
    than MAX_NESTING. Returns CPython's tree of the text when CPython accepts it (the caller
    keeps it), None when CPython reports an ordinary syntax error (libcst then reports it
    too, or parses syntax newer than this interpreter). `statements`: CPython's tree of
    `source` when the caller has it."""
    if statements is None:
        try:
            statements = parse(source)
        except SyntaxError as error:
            if error.msg in _NESTING_MESSAGES:
                raise _nesting_error(error.msg, source, error.lineno or 1, (error.offset or 1) - 1) from None
            if _scan_depth(source) is not None:
                # Deeper than libcst takes, after the first error: CPython's error is the answer.
                raise _nesting_error(error.msg, source, error.lineno or 1, (error.offset or 1) - 1) from None
            return None
        except (RecursionError, MemoryError) as error:
            where = _scan_depth(source) or (1, 0)
            said = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            raise _nesting_error(f"too deeply nested for Python's parser ({said})", source, *where) from None
        except ValueError:  # a NUL byte: libcst reports it
            return None
    deep = _tree_depth(source, statements)
    if deep is not None:
        line, column = deep
        raise _nesting_error(
            f"nested too deeply to analyse (more than {MAX_NESTING} levels)", source, line, column
        )
    return statements


def parse_module(source: str) -> Any:
    """`libcst.parse_module(source)`, after `check_nesting`: raises ParserSyntaxError for
    what libcst must not parse."""
    check_nesting(source)
    return parse_cst(source)


# --- libcst's parse without validating its own output ---------------------------------------
#
# Every libcst node validates itself when it is built (`CSTNode.__post_init__` calls
# `_validate`: that a whitespace token is whitespace, that brackets pair up, ...). Nodes its
# parser builds from text are valid by construction, and checking them again was an eighth
# of `--check`'s CPU time (650k nodes for transformers' training code; libcst's own comment
# there: "It might make more sense to move validation work into the visitor, which would allow
# us to avoid validating the tree when parsing a file"). So while this thread parses, the check
# is skipped; nodes built anywhere else (a codemod's replacement, another thread) are still
# validated.

_PARSING = threading.local()
_VALIDATION_HOOKED = False


def _hook_validation() -> None:
    global _VALIDATION_HOOKED
    from libcst._nodes.base import CSTNode

    def __post_init__(self: Any) -> None:
        if not getattr(_PARSING, "active", False):
            self._validate()

    CSTNode.__post_init__ = __post_init__  # type: ignore[method-assign]
    _VALIDATION_HOOKED = True


def parse_cst(source: str) -> Any:
    """`libcst.parse_module(source)`, without re-validating each node the parser builds."""
    import libcst as cst

    if not _VALIDATION_HOOKED:
        _hook_validation()
    _PARSING.active = True
    try:
        return cst.parse_module(source)
    finally:
        _PARSING.active = False


def _tree_depth(source: str, tree: Any) -> tuple[int, int] | None:
    """Where CPython's tree of `source` nests deeper than MAX_NESTING (line, column), or
    None. A node whose text is at most as long as the levels left cannot go deeper than
    that (every level takes a character), so only long statements are walked."""
    import itertools

    line_lengths = [len(line) + 1 for line in source.split("\n")]
    ends = [0, *itertools.accumulate(line_lengths)]

    def span(node: Any) -> int:
        first, last = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        if first is None or last is None:
            return len(source)
        if first == last:
            return (node.end_col_offset or 0) - node.col_offset
        return ends[min(last, len(line_lengths))] - ends[first - 1]

    stack = [(tree, 0, (1, 0))]
    while stack:
        node, depth, where = stack.pop()
        if hasattr(node, "lineno"):
            where = (node.lineno, node.col_offset)
        if depth > MAX_NESTING:
            return where
        for child in ast.iter_child_nodes(node):
            if span(child) > MAX_NESTING - depth:
                stack.append((child, depth + 1, where))
    return None


def _scan_depth(source: str) -> tuple[int, int] | None:
    """Without a tree (CPython stopped at its first error): where the tokens nest deeper
    than libcst may be given (brackets past CPython's 200, blocks past its 100, a logical
    line of more than MAX_NESTING tokens, an f-string holding more brackets than that, or
    text the tokenizer cannot follow), or None."""
    import io
    import tokenize

    if len(source) <= MAX_NESTING:
        return None  # every level takes a character
    brackets = indents = in_line = 0
    line_start = (1, 0)
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            kind, text = token.type, token.string
            if in_line == 0:
                line_start = token.start
            in_line += 1
            if kind == tokenize.OP and text in "([{":
                brackets += 1
                if brackets > 200:
                    return token.start
            elif kind == tokenize.OP and text in ")]}":
                brackets = max(brackets - 1, 0)
            elif kind == tokenize.INDENT:
                indents += 1
                if indents > 100:
                    return token.start
            elif kind == tokenize.DEDENT:
                indents = max(indents - 1, 0)
            elif kind == tokenize.STRING and len(text) > MAX_NESTING and "f" in text[:3].lower():
                if sum(text.count(char) for char in "([{") > MAX_NESTING:
                    return token.start
            if kind in (tokenize.NEWLINE, tokenize.ENDMARKER):
                in_line = 0
            elif in_line > MAX_NESTING:
                return line_start
    except tokenize.TokenError:
        return None  # the end of the text, inside brackets or a string: everything was seen
    except (SyntaxError, ValueError):  # an inconsistent dedent: the rest cannot be followed
        return (1, 0)
    return None
