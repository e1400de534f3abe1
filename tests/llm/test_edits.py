from __future__ import annotations

import pytest

from oom_lsp.edits import Position, apply_edits
from oom_lsp.llm.edits import EditRefused, Region, SearchReplace, apply_blocks, line_edits

CODE = """import torch


def train(model, loader):
    total = 0
    for x in loader:
        out = model(x)
        total += out.sum()
    return total


def other():
    total = 0
"""
REGION = Region(4, 9)


def apply(*blocks: tuple[str, str], text: str = CODE, region: Region = REGION) -> str:
    result = apply_blocks(text, [SearchReplace(search, replace) for search, replace in blocks], region)
    assert apply_edits(text, result.edits) == result.new_text
    return result.new_text


def test_exact_match() -> None:
    assert apply(("        total += out.sum()\n", "        total += out.sum().item()\n")) == CODE.replace(
        "total += out.sum()", "total += out.sum().item()"
    )


def test_search_dedented_by_the_model_is_reindented() -> None:
    new = apply(
        (
            "for x in loader:\n    out = model(x)\n",
            "for x in loader:\n    with torch.no_grad():\n        out = model(x)\n",
        )
    )
    assert "    for x in loader:\n        with torch.no_grad():\n            out = model(x)\n" in new


def test_search_indented_more_than_the_file() -> None:
    new = apply(("            out = model(x)\n", "            out = model(x).float()\n"))
    assert "        out = model(x).float()\n" in new


def test_replace_indented_less_than_a_too_deep_search_is_refused() -> None:
    with pytest.raises(EditRefused, match="indented less"):
        apply(("            out = model(x)\n", "out = model(x)\n"))


def test_blank_lines_are_not_compared_but_must_be_blank() -> None:
    text = "def f():\n    a = 1\n\n    b = 2\n"
    assert (
        apply(("a = 1\n\nb = 2\n", "a = 1\n\nb = 3\n"), text=text, region=Region(1, 4))
        == "def f():\n    a = 1\n\n    b = 3\n"
    )


def test_match_only_outside_the_region() -> None:
    with pytest.raises(EditRefused, match="only outside the code that was sent"):
        apply(("def other():\n", "def other2():\n"))


def test_ambiguous_inside_the_region() -> None:
    text = "def f():\n    x = 1\n    x = 1\n"
    with pytest.raises(EditRefused, match="matches 2 places"):
        apply(("    x = 1\n", "    x = 2\n"), text=text, region=Region(1, 3))


def test_the_same_text_outside_the_region_is_no_ambiguity() -> None:
    assert "def train(model, loader):\n    total = 0.0\n" in apply(
        ("    total = 0\n    for x in loader:\n", "    total = 0.0\n    for x in loader:\n")
    )
    assert apply(("    total = 0\n", "    total = 0.0\n")).count("total = 0.0") == 1


def test_not_found_hints_the_closest_lines() -> None:
    with pytest.raises(EditRefused) as refused:
        apply(("        total += out.summ()\n", "x\n"))
    assert "        total += out.sum()" in refused.value.feedback()


def test_refusals() -> None:
    with pytest.raises(EditRefused, match="empty SEARCH"):
        apply(("\n", "import os\n"))
    with pytest.raises(EditRefused, match="changes nothing"):
        apply(("    return total\n", "    return total\n"))
    with pytest.raises(EditRefused, match="does not parse"):
        apply(("    return total\n", "    return (total\n"))
    with pytest.raises(EditRefused, match="change the same lines"):
        apply(
            ("    total = 0\n    for x in loader:\n", "    total = 0.0\n    for x in loader:\n"),
            ("    for x in loader:\n", "    for y in loader:\n"),
        )
    with pytest.raises(EditRefused, match="too many edits"):
        apply(*[("    return total\n", "    return 1\n")] * 6)
    with pytest.raises(EditRefused, match="no SEARCH/REPLACE block"):
        apply()


def test_several_blocks_and_deletion() -> None:
    new = apply(
        ("    total = 0\n", "    total = 0.0\n"),
        ("        out = model(x)\n        total += out.sum()\n", "        total += model(x).sum().item()\n"),
    )
    assert "        out = model(x)\n" not in new and "total += model(x).sum().item()" in new


def test_crlf_file_keeps_its_line_endings() -> None:
    text = CODE.replace("\n", "\r\n")
    new = apply(("        total += out.sum()\n", "        total += out.sum().item()\n"), text=text)
    assert new == text.replace("total += out.sum()", "total += out.sum().item()")


def test_line_edits_are_minimal_and_handle_a_missing_final_newline() -> None:
    old, new = "a\nb\nc", "a\nB\nc\nd\n"
    edits = line_edits(old, new)
    assert apply_edits(old, edits) == new
    (edit,) = edits  # "c" and "c\n" differ, so the change runs to the end
    assert edit.range.start == Position(2, 0) and edit.new_text == "B\nc\nd\n"
    assert edit.range.end == Position(3, 1)  # the end of the last line, which has no newline
    (middle,) = line_edits("a\nb\nc\n", "a\nB\nc\n")
    assert (middle.range.start, middle.range.end, middle.new_text) == (Position(2, 0), Position(3, 0), "B\n")


def test_shown_import_lines_may_change_too() -> None:
    result = apply_blocks(
        CODE,
        [SearchReplace("import torch\n", "import torch\nfrom torch.utils.checkpoint import checkpoint\n")],
        REGION,
        shown_lines=(1,),
    )
    assert result.new_text.startswith("import torch\nfrom torch.utils.checkpoint import checkpoint\n\n")
    with pytest.raises(EditRefused, match="only outside"):  # not shown: not editable
        apply(("import torch\n", "import torch\nimport os\n"))


def test_a_match_straddling_the_region_is_outside() -> None:
    with pytest.raises(EditRefused, match="only outside"):
        apply(("    return total\n\n\ndef other():\n", "    return total\n\n\ndef other2():\n"))
