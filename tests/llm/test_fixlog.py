from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from oom_lsp.llm.fixlog import HEADER, Figures, FixLogEntry, append_entry, record_figures, render_entry

WHEN = datetime(2026, 11, 29, 18, 40, tzinfo=timezone.utc)


def entry(file: str = "train.py", entry_id: str = "aa11", **changes: object) -> FixLogEntry:
    values: dict[str, object] = dict(
        subject="OOM301 loss-accumulated-with-graph",
        file=file,
        changelog="Accumulate the loss with .item()",
        causes=("Graph kept (high): line 12",),
        model="qwen",
        host="localhost:11434",
        prompt="## Solutions\n```python\nx = 1\n```\n",
        answer="## Diagnosis\n1. a (high): b\n",
        diff="--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-x\n+y\n",
        when=WHEN,
        entry_id=entry_id,
    )
    values.update(changes)
    return FixLogEntry(**values)  # type: ignore[arg-type]


def test_render() -> None:
    text = render_entry(entry())
    assert (
        "## 2026-11-29 18:40 UTC · OOM301 loss-accumulated-with-graph · `train.py`\n<!-- oom-lsp-fix: aa11 file: train.py -->"
        in text
    )
    assert "- Model: `qwen` at localhost:11434\n- Causes:\n  1. Graph kept (high): line 12\n" in text
    assert (
        "- Peak before / after: not measured yet (run `oom-lsp validate train.py --before REPORT.json`)"
        in text
    )
    assert "```diff\n--- a/train.py" in text
    assert "````markdown\n## Solutions\n```python" in text  # a longer fence around a fenced prompt


def test_append_and_record_figures(tmp_path: Path) -> None:
    log = tmp_path / "OOM_FIXES.md"
    append_entry(log, entry(entry_id="aa11"))
    append_entry(log, entry(file="other.py", entry_id="bb22"))
    append_entry(log, entry(entry_id="cc33"))
    text = log.read_text()
    assert text.startswith(HEADER) and text.count("<!-- oom-lsp-fix:") == 3
    figures = Figures(2 * 2**30, 2**30, "measured by profile")
    assert record_figures(log, "train.py", figures) == "cc33"  # the latest pending entry of the file
    assert record_figures(log, "train.py", figures) == "aa11"  # then the one before
    assert record_figures(log, "train.py", figures) is None
    assert record_figures(log, "other.py", Figures(10, 10, "estimated"), entry_id="bb22") == "bb22"
    text = log.read_text()
    assert (
        text.count("- Peak before / after: 2.00 GiB → 1.00 GiB, -1.00 GiB (-50.0%) (measured by profile)")
        == 2
    )
    assert "- Peak before / after: 10 bytes → 10 bytes, ±0 bytes (+0.0%) (estimated)" in text


def test_record_without_a_log(tmp_path: Path) -> None:
    assert record_figures(tmp_path / "missing.md", "train.py", Figures(1, 1, "estimated")) is None
