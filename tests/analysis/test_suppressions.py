"""Suppression comments count lines as Python does: a form feed, `\\x1c`-`\\x1e`, `\\x85`,
U+2028 or U+2029 above them (in a comment, or a page break) starts no new line for the
tokenizer and the rules, whatever `str.splitlines` says."""

from __future__ import annotations

import pytest

from oom_lsp.analysis import LintSettings, analyze

TRAIN = """import torch


def train(model, loader, optimizer):
    total_loss = 0
    for x, y in loader:
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
{suppressed}
    return total_loss
"""
SETTINGS = LintSettings(enabled=frozenset({"OOM301"}))
AWKWARD = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _with_a_page_break(text: str, char: str) -> str:
    header, _, rest = text.partition("\n\n\n")
    return f"{header}\n# page {char} break\n{char if char == chr(12) else ''}\n{rest}"


@pytest.mark.parametrize(
    "suppressed",
    [
        "        # oom: ignore[OOM301]\n        total_loss += loss",
        "        total_loss += loss  # noqa: OOM301",
        "        total_loss += loss  # oom: ignore[OOM301]",
    ],
    ids=["own line", "noqa", "trailing"],
)
@pytest.mark.parametrize("char", AWKWARD, ids=[f"U+{ord(c):04X}" for c in AWKWARD])
def test_a_suppression_below_a_character_splitlines_breaks_at_still_applies(char: str, suppressed: str):
    unsuppressed = _with_a_page_break(TRAIN.format(suppressed="        total_loss += loss"), char)
    assert [(f.code, f.line) for f in analyze(unsuppressed, SETTINGS)] == [("OOM301", 10)]
    text = _with_a_page_break(TRAIN.format(suppressed=suppressed), char)
    assert len(text.splitlines()) > text.count("\n")  # str.splitlines sees more lines
    assert analyze(text, SETTINGS) == []
