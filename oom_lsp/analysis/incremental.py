"""Re-parse only the top-level statements that an edit touched.

An editor re-checks a file after every pause in typing, and libcst's parse is
most of that cost (about 80 ms for 1,000 lines on a 2-core machine). The stdlib
`ast` parser, written in C and about 12 times cheaper, says where each
top-level statement starts. The text from one start to the next (comments and
blank lines before the next statement included) is a chunk. Each chunk is
parsed alone by libcst and kept, keyed by its text, until the next version, so
an edit inside one function re-parses that function only. The chunks'
statements are then joined into one Module whose code is the source, character
for character (tests/analysis/test_incremental.py checks it is also the tree
a whole parse gives).

Anything this cannot join exactly is parsed whole: a file `ast` rejects
(the syntax error then comes from libcst, as without this), blocks indented
differently from one chunk to the next, or mixed line endings.

The stdlib tree itself (about 10 ms for 1,000 lines, an eighth of an edit's
analysis) is built the same way (`_StatementChunks`): the chunks at the start of
the text that an edit left as they were, and those at its end when the edit
moved no line, keep their statements; only the text between them is given to
`ast`, after as many newlines as lines precede it, so that its line numbers are
the whole file's. A chunk starts where the whole file's tokenizer is between
two top-level statements, a state the text before it alone decides; so when the
text between parses alone, its statements are those of a whole parse (a tail
such as `else:` that would join a statement before it does not parse alone).
Anything else (the text between does not parse, a carriage return anywhere) is
parsed whole.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

import libcst as cst

from oom_lsp import python_ast
from oom_lsp.analysis.positions import PositionCache

_LINE_END_RE = re.compile(r"\r\n|\r|\n")


class ParsedSource(NamedTuple):
    module: cst.Module
    # The stdlib tree of the same text, when it was built on the way.
    statements: ast.Module | None
    # Positions generated for earlier versions of the same document.
    positions: PositionCache | None = None


def parse_whole(source: str) -> ParsedSource:
    """libcst's parse of the whole text, after python_ast.check_nesting (CPython's tree, when
    CPython accepts the text, is kept for the positions)."""
    statements = python_ast.check_nesting(source)
    return ParsedSource(python_ast.parse_cst(source), statements)


class IncrementalParser:
    """Parses successive versions of one document."""

    def __init__(self) -> None:
        # The chunks of the previous version: text -> one module per occurrence
        # (a module is never shared by two places of one tree: positions and
        # reports are keyed by node identity).
        self._chunks: dict[str, list[cst.Module]] = {}
        self._positions = PositionCache()
        self._statements = _StatementChunks()

    def parse(self, source: str, statements: ast.Module | None = None) -> ParsedSource:
        """Like `cst.parse_module(source)`. A version that cannot be parsed
        in chunks (a syntax error mid-typing) leaves the kept chunks as they
        were, for the next version. `statements`: `ast.parse(source)` when the
        caller has it (a notebook joins it from its cells' trees)."""
        keep_statements = statements is None
        if statements is None:
            try:
                statements = self._statements.parse(source)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return parse_whole(source)
        python_ast.check_nesting(source, statements)
        boundaries = _boundaries(source, statements)
        if keep_statements:
            self._statements.keep(source, statements, boundaries)
        offsets = [0, *(offset for offset, _ in boundaries), len(source)]
        texts = [source[start:end] for start, end in zip(offsets, offsets[1:])]
        if len(texts) < 2:
            return ParsedSource(python_ast.parse_cst(source), statements, self._positions)
        current: dict[str, list[cst.Module]] = {}
        chunks = []
        try:
            for text in texts:
                kept = self._chunks.get(text, ())
                reused = len(current.get(text, ()))
                chunk = kept[reused] if reused < len(kept) else python_ast.parse_cst(text)
                current.setdefault(text, []).append(chunk)
                chunks.append(chunk)
        except cst.ParserSyntaxError:
            # libcst refuses what `ast` accepted: report libcst's error at its
            # place in the whole file.
            return ParsedSource(python_ast.parse_cst(source), statements, self._positions)
        self._chunks = current
        module = join_chunks(texts, chunks)
        if module is None:
            return ParsedSource(python_ast.parse_cst(source), statements, self._positions)
        return ParsedSource(module, statements, self._positions)


def _boundaries(source: str, statements: ast.Module) -> list[tuple[int, int]]:
    """Where each chunk after the first starts: (offset, index of its first statement).
    The first chunk also holds what precedes the first statement."""
    line_starts = [0]
    line_starts.extend(match.end() for match in _LINE_END_RE.finditer(source))
    boundaries = []
    last_end = 0
    for index, statement in enumerate(statements.body):
        start = _first_line(statement)
        if last_end and start > last_end and _plain_gap(source, line_starts, last_end + 1, start):
            boundaries.append((line_starts[start - 1], index))
        last_end = max(last_end, statement.end_lineno or statement.lineno)
    return boundaries


class _StatementChunks:
    """The stdlib trees of one document's successive versions, built from the
    previous version's chunks (see the module's docstring)."""

    def __init__(self) -> None:
        # The previous version, and per chunk of it: (offset, text, its top-level statements).
        # One tuple, replaced whole: the two always belong together.
        self._kept: tuple[str, list[tuple[int, str, list[ast.stmt]]]] | None = None

    def parse(self, source: str) -> ast.Module:
        """`python_ast.parse(source)`: the same tree, or the same error."""
        kept = self._kept
        if kept is None:
            return python_ast.parse(source)
        previous, chunks = kept
        if not chunks or "\r" in source or "\r" in previous:
            return python_ast.parse(source)
        # The chunks before the edit: the same text at the same offset. The last one is
        # only kept as a chunk after the edit: the text's end is no boundary between
        # two statements (`x = 1` without a newline, then `x = 12`).
        before = 0
        while before < len(chunks) - 1 and source.startswith(chunks[before][1], chunks[before][0]):
            before += 1
        start = chunks[before][0]
        # The chunks after it, when the edit moved no line: the same text at the same
        # distance from the end, starting a line.
        after = len(chunks)
        end = len(source)
        if source.count("\n") == previous.count("\n"):
            shift = len(source) - len(previous)
            while after > before:
                offset, text, _ = chunks[after - 1]
                moved = offset + shift
                if moved < start or (moved > start and source[moved - 1] != "\n"):
                    break
                if not source.startswith(text, moved):
                    break
                after -= 1
                end = moved
        body: list[ast.stmt] = []
        for _, _, statements in chunks[:before]:
            body.extend(statements)
        if end > start:
            try:
                middle = python_ast.parse("\n" * source.count("\n", 0, start) + source[start:end])
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                # It may still parse whole (`else:` after an `if` kept before it).
                return python_ast.parse(source)
            body.extend(middle.body)
        for _, _, statements in chunks[after:]:
            body.extend(statements)
        return ast.Module(body=body, type_ignores=[])

    def keep(self, source: str, tree: ast.Module, boundaries: list[tuple[int, int]]) -> None:
        """Remember `tree`, the stdlib tree of `source`, with its chunks' `boundaries`
        (`_boundaries`), for the next version."""
        offsets = [(0, 0), *boundaries, (len(source), len(tree.body))]
        self._kept = (
            source,
            [
                (start, source[start:end], tree.body[first:last])
                for (start, first), (end, last) in zip(offsets, offsets[1:])
            ],
        )


def _plain_gap(source: str, line_starts: list[int], first: int, end: int) -> bool:
    """Whether lines `first`..`end - 1` are all empty or comments at column 0.
    Anything else, such as an indented comment after a block, stays in one
    chunk with the statements around it: at the end of a text libcst places
    it differently (and loses a blank line before it)."""
    for line in range(first, end):
        text = source[line_starts[line - 1] : line_starts[line]].rstrip("\r\n")
        if text and not text.startswith("#"):
            return False
    return True


def _first_line(statement: ast.stmt) -> int:
    decorators = getattr(statement, "decorator_list", None)
    if decorators:
        return min(statement.lineno, *(decorator.lineno for decorator in decorators))
    return statement.lineno


def join_chunks(texts: list[str], chunks: list[cst.Module]) -> cst.Module | None:
    """One Module of the statements of `chunks` (parsed from `texts`), or
    None when its code would not be the texts put together."""
    indented = [_has_indented_block(chunk) for chunk in chunks]
    indent = next((chunk.default_indent for chunk, has in zip(chunks, indented) if has), None)
    newline = chunks[0].default_newline
    body: list[cst.BaseStatement] = []
    carried: tuple[cst.EmptyLine, ...] = ()
    for text, chunk, has_indented_block in zip(texts, chunks, indented):
        if has_indented_block and chunk.default_indent != indent:
            return None  # its blocks' indentation is implied by a default the join would change
        if chunk.default_newline != newline and _LINE_END_RE.search(text):
            return None  # mixed line endings: each chunk's Newline() means its own
        statements = list(chunk.body)
        if not statements:
            return None
        # Comments and blank lines between two statements belong to the next
        # one, as in a whole parse; within a chunk they ended up in the
        # chunk's footer.
        lead = (*carried, *(chunk.header if body else ()))
        if lead:
            statements[0] = statements[0].with_changes(leading_lines=(*lead, *statements[0].leading_lines))
        body.extend(statements)
        carried = chunk.footer
    first, last = chunks[0], chunks[-1]
    return cst.Module(
        body=body,
        header=first.header,
        footer=carried,
        encoding=first.encoding,
        default_indent=indent if indent is not None else first.default_indent,
        default_newline=newline,
        has_trailing_newline=last.has_trailing_newline,
    )


def _has_indented_block(chunk: cst.Module) -> bool:
    """Whether the chunk has an indented block (whose indentation libcst
    records relative to the module's default)."""
    for statement in chunk.body:
        if isinstance(statement, cst.SimpleStatementLine):
            continue
        for block in _top_blocks(statement):
            if isinstance(block, cst.IndentedBlock):
                return True
    return False


def _top_blocks(statement: cst.CSTNode) -> list[object]:
    blocks: list[object] = [getattr(statement, "body", None)]
    orelse = getattr(statement, "orelse", None)
    while orelse is not None:
        blocks.append(orelse.body)
        orelse = getattr(orelse, "orelse", None)
    blocks.extend(handler.body for handler in getattr(statement, "handlers", ()))
    finalbody = getattr(statement, "finalbody", None)
    if finalbody is not None:
        blocks.append(finalbody.body)
    blocks.extend(case.body for case in getattr(statement, "cases", ()))
    return blocks
