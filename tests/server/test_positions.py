"""Position conversion and the minimal fix-all edit (pure, no server)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types

from oom_lsp.edits import Position
from oom_lsp.llm.edits import line_edits
from oom_lsp.server.code_actions import _minimal_edit
from oom_lsp.server.positions import PositionConverter
from tests.server.lsp_session import apply_text_edits

TEXT = 'a = "é😀"; torch.load(x)\r\nsecond\rthird\n'


@pytest.mark.parametrize(("encoding", "character"), [("utf-8", 22), ("utf-16", 19), ("utf-32", 18)])
def test_code_points_to_each_encoding_and_back(encoding: str, character: int):
    converter = PositionConverter(TEXT, encoding)
    lsp = converter.to_lsp(Position(1, 18))
    assert lsp == types.Position(line=0, character=character)
    assert converter.from_lsp(lsp) == Position(1, 18)


def test_lines_end_at_crlf_cr_and_lf():
    converter = PositionConverter(TEXT, "utf-16")
    assert converter.lines == ['a = "é😀"; torch.load(x)', "second", "third", ""]
    assert converter.to_lsp(Position(3, 2)) == types.Position(line=2, character=2)


def test_positions_past_the_end_are_clamped():
    converter = PositionConverter(TEXT, "utf-16")
    assert converter.to_lsp(Position(9, 0)) == converter.end() == types.Position(line=3, character=0)
    assert converter.from_lsp(types.Position(line=1, character=99)) == Position(2, 6)
    assert converter.from_lsp(types.Position(line=9, character=0)) == Position(4, 0)


def test_a_position_inside_a_surrogate_pair_maps_to_its_character():
    converter = PositionConverter(TEXT, "utf-16")
    assert converter.from_lsp(types.Position(line=0, character=7)) == Position(1, 6)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("x = load(a)\ny = 1\n", 'x = load(a, map_location="cpu")\ny = 1\n'),
        ("é😀 = 1\r\nx = f(a)\r\nz\r\n", "é😀 = 1\r\nx = f(a, b)\r\nz\r\n"),
        ("a\r\nb\r\n", "a\r\nc\r\nb\r\n"),
        ("same\n", "same\n"),
        ("", "import torch\n"),
    ],
)
def test_minimal_edit_turns_old_into_new(old: str, new: str):
    for encoding in ("utf-8", "utf-16"):
        edit = _minimal_edit(old, new, PositionConverter(old, encoding))
        assert apply_text_edits(old, [edit], encoding) == new
        assert len(edit.new_text) <= len(new)


# Characters str.splitlines takes for line ends and the LSP does not, and the ones both do.
_AWKWARD = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
_LINE_TEXT = st.text(alphabet=st.sampled_from(["a", "é", "😀", " ", "#", *_AWKWARD]), max_size=8)
_ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _texts(draw: st.DrawFn) -> tuple[str, str]:
    """A text and an edited version: lines replaced, inserted and deleted."""
    lines = draw(st.lists(st.tuples(_LINE_TEXT, _ENDINGS), min_size=1, max_size=12))
    new = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(new)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        if action == "insert" or not new:
            new.insert(index, draw(st.tuples(_LINE_TEXT, _ENDINGS)))
        elif action == "delete":
            del new[min(index, len(new) - 1)]
        else:
            new[min(index, len(new) - 1)] = draw(st.tuples(_LINE_TEXT, _ENDINGS))
    old_text = "".join(text + ending for text, ending in lines)
    new_text = "".join(text + ending for text, ending in new)
    if draw(st.booleans()):  # no final newline
        old_text, new_text = old_text.rstrip("\r\n"), new_text.rstrip("\r\n")
    return old_text, new_text


@settings(max_examples=300, deadline=None)
@given(_texts(), st.sampled_from(["utf-8", "utf-16", "utf-32"]))
def test_ai_fix_edits_applied_by_a_client_give_the_checked_text(texts: tuple[str, str], encoding: str):
    """The path of an AI fix to the editor: llm.edits' minimal line edits, converted to LSP
    ranges as server/ai.py does, applied as a client applies them."""
    old, new = texts
    converter = PositionConverter(old, encoding)
    edits = [
        types.TextEdit(range=converter.range_to_lsp(edit.range), new_text=edit.new_text)
        for edit in line_edits(old, new)
    ]
    assert apply_text_edits(old, edits, encoding) == new


def test_an_edit_below_a_form_feed_lands_on_its_line():
    old = "def f():\n    # page\x0cbreak \u2028 here\n    total = 0\n    return total\n"
    new = old.replace("    return total\n", "    return total.item()\n")
    converter = PositionConverter(old, "utf-16")
    (edit,) = line_edits(old, new)
    lsp = converter.range_to_lsp(edit.range)
    assert (lsp.start.line, lsp.end.line) == (3, 4)
    assert apply_text_edits(old, [types.TextEdit(range=lsp, new_text=edit.new_text)]) == new
