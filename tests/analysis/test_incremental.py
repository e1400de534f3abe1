"""The incremental parser gives the tree a whole parse gives, re-parsing only
the chunks an edit touched."""

from __future__ import annotations

import ast
import dataclasses
import random
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oom_lsp
from oom_lsp.analysis import analyze, default_settings, incremental
from oom_lsp.analysis.incremental import IncrementalParser

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "fixtures").rglob("*.py")) + sorted(Path(oom_lsp.__file__).parent.rglob("*.py"))


def assert_same_as_whole_parse(source: str, parser: IncrementalParser | None = None) -> cst.Module:
    module = (parser or IncrementalParser()).parse(source).module
    whole = cst.parse_module(source)
    assert module.code == source
    assert module.deep_equals(whole)
    assert (module.default_indent, module.default_newline, module.has_trailing_newline, module.encoding) == (
        whole.default_indent,
        whole.default_newline,
        whole.has_trailing_newline,
        whole.encoding,
    )
    return module


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_real_files_give_the_whole_parse_tree(path: Path) -> None:
    assert_same_as_whole_parse(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "source",
    [
        "",
        "# only a comment\n",
        "x = 1",
        "import os\nx = 1",  # no trailing newline
        "#!/usr/bin/env python\n# -*- coding: latin-1 -*-\n\nimport os\n\n\ndef f():\n    pass\n",
        "def f():\n    x = 1\n    # end of the block\n# before g\n\n@dec\n# between\ndef g():\n    pass\n",
        "import a; import b\nif x: pass\nelse:\n\ty = 1\ndef f():\n\treturn 1\n",  # tabs
        "def f():\n  return 1\nclass A:\n  x = 1\n",  # two-space indentation
        "import os\r\ndef f():\r\n    return 1\r\n",  # CRLF
        'x = """\nnot = a statement\n"""\ny = 1\n',
        "try:\n    pass\nexcept E:\n    pass\nfinally:\n    pass\nz = 1\n",
        "x = (\n1,\n)\ny = [\n]\n",
    ],
)
def test_edge_cases_give_the_whole_parse_tree(source: str) -> None:
    assert_same_as_whole_parse(source)


def test_mixed_indentation_and_line_endings_are_parsed_whole() -> None:
    # Each chunk would imply its own default: the join is refused, the
    # result is still the whole parse.
    assert_same_as_whole_parse("def f():\n    return 1\ndef g():\n\treturn 2\n")
    assert_same_as_whole_parse("x = 1\ny = 2\r\nz = 3\r\n")


def test_a_syntax_error_is_libcsts_error_on_the_whole_file() -> None:
    source = "import torch\n\ndef f(:\n    pass\n"
    with pytest.raises(cst.ParserSyntaxError) as incremental_error:
        IncrementalParser().parse(source)
    with pytest.raises(cst.ParserSyntaxError) as whole_error:
        cst.parse_module(source)
    assert (incremental_error.value.raw_line, incremental_error.value.raw_column) == (
        whole_error.value.raw_line,
        whole_error.value.raw_column,
    )


def count_chunk_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real_parse = cst.parse_module

    def counting(text: str) -> cst.Module:
        parsed.append(text)
        return real_parse(text)

    monkeypatch.setattr(incremental.cst, "parse_module", counting)
    return parsed


FILE = (ROOT / "fixtures" / "cnn_cifar_risky.py").read_text(encoding="utf-8")


def test_an_edit_reparses_only_its_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = IncrementalParser()
    first = parser.parse(FILE).module
    parsed = count_chunk_parses(monkeypatch)
    edited = FILE.replace("def evaluate(model, loader):\n", "def evaluate(model, loader):\n    # typing\n", 1)
    assert edited != FILE
    second = parser.parse(edited).module
    monkeypatch.undo()
    assert second.deep_equals(cst.parse_module(edited))
    assert len(parsed) == 1 and parsed[0].startswith("def evaluate(")
    # The untouched statements' contents are the very same objects (a
    # statement itself is copied when blank lines before it move onto it).
    kept = {id(statement.body) for statement in first.body}
    assert sum(id(statement.body) in kept for statement in second.body) == len(second.body) - 1


def test_a_syntax_error_mid_typing_keeps_the_parsed_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = IncrementalParser()
    parser.parse(FILE)
    parsed = count_chunk_parses(monkeypatch)
    with pytest.raises(cst.ParserSyntaxError):
        parser.parse(FILE.replace("def evaluate(model, loader):", "def evaluate(model, loader", 1))
    parsed.clear()
    edited = FILE.replace("def evaluate(model, loader):", "def evaluate(model, loader, device):", 1)
    module = parser.parse(edited).module
    assert len(parsed) == 1 and parsed[0].startswith("def evaluate(")
    monkeypatch.undo()
    assert module.deep_equals(cst.parse_module(edited))


def test_repeated_statements_are_never_one_shared_node(monkeypatch: pytest.MonkeyPatch) -> None:
    source = "import torch\n\ndef f():\n    return 1\n\ndef f():\n    return 1\n"
    parser = IncrementalParser()
    parser.parse(source)
    parsed = count_chunk_parses(monkeypatch)
    module = parser.parse(source).module
    assert parsed == []
    assert module.body[1] is not module.body[2]
    assert len({id(statement) for statement in module.body}) == len(module.body)


def test_findings_are_those_of_a_whole_parse_across_edits() -> None:
    lint = default_settings()
    parser = IncrementalParser()
    versions = [
        FILE,
        FILE.replace("running_loss += loss.item()", "running_loss += loss"),
        FILE + "\n\ndef extra():\n    pass\n",
        FILE,
    ]
    for version in versions:
        assert analyze(version, lint, "x.py", parse=parser.parse) == analyze(version, lint, "x.py")


SNIPPETS = [
    "import torch\n",
    "x = 1\n",
    "# a comment\n",
    "\n",
    "    # an indented comment\n",
    "   \n",
    "\t# a tab-indented comment\n",
    "x = 1; y = 2\n",
    "async def a():\n    await b\n",
    "def f(a):\n    return a\n",
    "def g():\n  if a:\n    pass\n  # trailing\n",
    "@decorator\ndef h():\n\tpass\n",
    "class A:\n    y = 2\n\n    def m(self):\n        pass\n",
    "if x:\n    pass\nelif y:\n    pass\nelse:\n    pass\n",
    "for i in range(3):\n    total += i\n",
    "value = (\n    1,\n    2,\n)\n",
    's = """\ncolumn = zero\n"""\n',
    "with a as b:\n    c = b\n",
    "x = 1\r\n",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(SNIPPETS), max_size=12), min_size=1, max_size=4))
def test_any_sequence_of_versions_gives_the_whole_parse_tree(versions: list[list[str]]) -> None:
    parser = IncrementalParser()
    for snippets in versions:
        source = "".join(snippets)
        try:
            whole = cst.parse_module(source)
        except cst.ParserSyntaxError:
            with pytest.raises(cst.ParserSyntaxError):
                parser.parse(source)
            continue
        parsed = parser.parse(source)
        module = parsed.module
        if parsed.statements is not None:  # the stdlib tree kept from the versions before
            assert ast.dump(parsed.statements, include_attributes=True) == ast.dump(
                ast.parse(source), include_attributes=True
            )
        # Not `== source`: libcst itself drops a blank line before a trailing
        # over-indented comment.
        assert module.code == whole.code
        assert module.deep_equals(whole)
        assert module.default_indent == whole.default_indent
        assert module.default_newline == whole.default_newline


RISKY = sorted((ROOT / "fixtures").glob("*_risky.py"))


def _edits_of(text: str, seed: int) -> list[str]:
    """Versions of `text` as typing makes them: lines inserted, removed or
    changed above and below the findings, blank lines moved between statements."""
    chooser = random.Random(seed)
    versions = []
    lines = text.splitlines(keepends=True)
    for _ in range(8):
        before = list(lines)
        at = chooser.randrange(len(lines) + 1)
        kind = chooser.choice(["comment", "blank", "remove-blank", "statement"])
        if kind == "comment":
            lines.insert(at, "# typing\n")
        elif kind == "blank":
            lines.insert(at, "\n")
        elif kind == "remove-blank":
            blanks = [index for index, line in enumerate(lines) if not line.strip()]
            if blanks:
                del lines[chooser.choice(blanks)]
        else:
            lines.insert(at, "unused_name = 1\n")
        version = "".join(lines)
        try:
            compile(version, "<version>", "exec")
        except SyntaxError:
            lines = before  # inside a block or a bracket: typing goes on elsewhere
            continue
        versions.append(version)
    return versions


@pytest.mark.parametrize("path", RISKY, ids=lambda path: path.name)
def test_positions_moved_from_earlier_versions_are_those_of_a_whole_parse(path: Path) -> None:
    """The editor's position cache: every finding's range and fix is the one a
    fresh analysis of that version gives, whatever moved above it."""
    lint = default_settings()
    parser = IncrementalParser()
    text = path.read_text(encoding="utf-8")
    for seed in range(3):
        for version in [text, *_edits_of(text, seed)]:
            assert analyze(version, lint, "x.py", parse=parser.parse) == analyze(version, lint, "x.py")


def test_an_edit_generates_positions_only_in_the_statements_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from oom_lsp.analysis import positions

    lint = default_settings()
    parser = IncrementalParser()
    first = analyze(FILE, lint, "x.py", parse=parser.parse)
    generated: list[cst.CSTNode] = []
    real_codegen = positions.PositionProvidingCodegenState

    def counting(*args: object, **kwargs: object) -> positions.PositionProvidingCodegenState:
        generated.append(object())
        return real_codegen(*args, **kwargs)

    monkeypatch.setattr(positions, "PositionProvidingCodegenState", counting)
    moved = analyze("# a new first line\n" + FILE, lint, "x.py", parse=parser.parse)
    assert first and generated == []
    assert [finding.range.start.line for finding in moved] == [
        finding.range.start.line + 1 for finding in first
    ]


def _assert_stdlib_tree_of_whole_parse(parser: IncrementalParser, source: str) -> None:
    statements = parser.parse(source).statements
    assert statements is not None
    assert ast.dump(statements, include_attributes=True) == ast.dump(ast.parse(source), include_attributes=True)


@pytest.mark.parametrize("path", RISKY, ids=lambda path: path.name)
def test_the_stdlib_tree_of_each_version_is_that_of_a_whole_parse(path: Path) -> None:
    """The statements kept from the previous version's chunks carry the line
    numbers of this version: edits that move lines, and edits that do not."""
    text = path.read_text(encoding="utf-8")
    for seed in range(3):
        parser = IncrementalParser()
        versions = [text, *_edits_of(text, seed)]
        chooser = random.Random(seed)
        lines = text.splitlines(keepends=True)
        for _ in range(6):  # a line changed in place: the chunks after it are kept
            at = chooser.randrange(len(lines))
            if lines[at].strip():
                lines[at] = lines[at].rstrip("\n") + "  # typing\n"
                versions.append("".join(lines))
        versions += [text, text]
        for version in versions:
            _assert_stdlib_tree_of_whole_parse(parser, version)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("x = 1", "x = 12\n"),  # the end of a text without a newline is no boundary
        ("if a:\n    pass\n\n\ny = 1\n", "if a:\n    pass\n\n\nelse:\n    y = 1\n"),  # joins the statement before
        ("def f():\n    pass\n\n\ny = 1\n", "def f():\n    pass\n\n\n    y = 1\n"),  # into the block before
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nx = (1 +\n\n\nz) = 3\n"),  # a bracket left open
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nx = '''1\n\n\nz = 3'''\n"),  # a string
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nx = 1 + \\\n2\n\n\nz = 3\n"),  # a continued line
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nx = 1\n\n\nz = 3\n\n\nw = 4\n"),
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "x = 1\n\n\nz = 3\n"),
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nz = 3\n"),
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nx = 1\n\n\nz = 3\n"),
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\n\n\nx = 2\n\n\nz = 3\n"),
        ("import a\n\n\nx = 1\n\n\nz = 3\n", "import a\r\n\n\nx = 1\n\n\nz = 3\n"),
    ],
)
def test_an_edit_at_a_chunks_edge_gives_the_stdlib_tree_of_a_whole_parse(first: str, second: str) -> None:
    parser = IncrementalParser()
    _assert_stdlib_tree_of_whole_parse(parser, first)
    try:
        ast.parse(second)
    except SyntaxError:
        with pytest.raises(cst.ParserSyntaxError):
            parser.parse(second)
        return
    _assert_stdlib_tree_of_whole_parse(parser, second)


def test_an_edit_in_place_gives_only_its_chunk_to_ast(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = IncrementalParser()
    parser.parse(FILE)
    given: list[str] = []
    parse = incremental.python_ast.parse
    monkeypatch.setattr(incremental.python_ast, "parse", lambda source, *rest: given.append(source) or parse(source, *rest))
    edited = FILE.replace("def evaluate(model, loader):\n", "def evaluate(model, loader, x):\n", 1)
    assert edited != FILE
    statements = parser.parse(edited).statements
    monkeypatch.undo()
    assert len(given) == 1 and given[0].lstrip("\n").startswith("def evaluate(")
    assert ast.dump(statements, include_attributes=True) == ast.dump(ast.parse(edited), include_attributes=True)


def test_an_edit_in_place_that_changes_a_finding_changes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Edits that move no line keep the statements of the chunks around them: the findings
    still follow the edited text, whether the edit is in the statement that has the
    finding or in a chunk before it that the finding depends on (where the tensors go)."""
    lint = dataclasses.replace(default_settings(), strict=True)
    parser = IncrementalParser()
    fixed = FILE.replace("        total_loss += loss\n", "        total_loss += loss.item()\n", 1)
    on_cpu = FILE.replace('device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n', 'device = "cpu"\n', 1)
    assert fixed != FILE and on_cpu != FILE
    given: list[str] = []
    parse = incremental.python_ast.parse
    monkeypatch.setattr(incremental.python_ast, "parse", lambda source, *rest: given.append(source) or parse(source, *rest))
    seen = []
    for number, version in enumerate((FILE, fixed, FILE, on_cpu, FILE)):
        given.clear()
        findings = analyze(version, lint, "x.py", parse=parser.parse)
        if number:  # ast was given a part of the text only
            assert given and all(len(text.lstrip("\n")) < len(version) / 2 for text in given)
        assert findings == analyze(version, lint, "x.py")
        seen.append(sorted(finding.code for finding in findings))
    monkeypatch.undo()
    assert "OOM301" in seen[0] and "OOM301" not in seen[1] and seen[2] == seen[0] and seen[4] == seen[0]
    assert "OOM501" in seen[0] and "OOM501" not in seen[3]  # torch.load's map_location matters on a GPU only
