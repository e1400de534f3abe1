"""Position conversion and the minimal fix-all edit (pure, no server)."""

from __future__ import annotations

import pytest
from lsprotocol import types

from oom_lsp.edits import Position
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
