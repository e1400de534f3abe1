"""Old PyTorch code with `async=` (a keyword since Python 3.7) is still checked."""

from __future__ import annotations

import textwrap

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.registry import default_codes

SOURCE = textwrap.dedent(
    """\
    import torch
    for x, y in loader:
        x = x.cuda(async=True)
        y = y.cuda(non_blocking=True, async=True)
        loss = model(x).sum()
        loss.backward()
        total += loss
    """
)


def test_the_file_is_checked_past_the_legacy_keyword() -> None:
    findings = analyze(SOURCE, LintSettings(enabled=frozenset(default_codes())))
    codes = [(finding.code, finding.line) for finding in findings]
    assert ("OOM000", 3) in codes  # where it breaks on Python 3.7+, said once
    assert [code for code, _ in codes].count("OOM000") == 1
    [syntax] = [finding for finding in findings if finding.code == "OOM000"]
    assert "non_blocking" in syntax.message and syntax.range.start.column == 15
    # The rules ran on the rest of the file.
    assert ("OOM301", 7) in codes


def test_no_fix_is_written_from_the_renamed_text() -> None:
    findings = analyze(SOURCE, LintSettings(enabled=frozenset({"OOM000", "OOM301"}), strict=True))
    assert [finding.fix for finding in findings if finding.code == "OOM301"] == [None]


def test_a_real_syntax_error_elsewhere_is_reported_too() -> None:
    broken = SOURCE + "def broken(:\n    pass\n"
    findings = analyze(broken, LintSettings(enabled=frozenset(default_codes())))
    # The legacy keyword, and the error that remains without it (where a plain syntax error is put).
    assert [finding.code for finding in findings] == ["OOM000", "OOM000"]
    assert findings[0].line == 3 and findings[1].line >= 8


def test_async_as_a_value_or_comparison_is_not_renamed() -> None:
    # `async` can only be a keyword argument name here; `==` is no keyword argument.
    source = "import torch\nf(a == async)\n"
    findings = analyze(source, LintSettings(enabled=frozenset(default_codes())))
    assert [finding.code for finding in findings] == ["OOM000"]
