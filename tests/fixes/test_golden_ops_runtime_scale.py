"""Golden fix tests for OOM4xx, OOM50x and OOM60x.

Each tests/fixes/golden/OOMxxx_<case>.in.py, fixed with unsafe fixes enabled
and only its own rule selected, must equal OOMxxx_<case>.out.py byte for byte:
comments and formatting are kept. The fixed file must parse, a second fix
must change nothing, and the lines the rule still reports must be the ones
the case leaves unfixed on purpose.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CASES = sorted(
    path
    for prefix in ("OOM40", "OOM50", "OOM60")
    for path in GOLDEN_DIR.glob(f"{prefix}*.in.py")
)


def _settings(path: Path) -> LintSettings:
    # Strict mode: a golden case tests the fix, also where the finding is shown
    # only in strict mode (its memory at stake not shown to matter).
    return LintSettings(enabled=frozenset({path.name.split("_", 1)[0]}), strict=True)


def test_every_rule_of_the_families_has_a_golden_case() -> None:
    codes = {path.name.split("_", 1)[0] for path in CASES}
    assert codes == {"OOM401", "OOM402", "OOM501", "OOM502", "OOM503", "OOM601", "OOM602", "OOM603"}


@pytest.mark.parametrize("case", CASES, ids=[path.name.removesuffix(".in.py") for path in CASES])
def test_fix_matches_golden_output(case: Path) -> None:
    source = case.read_text(encoding="utf-8")
    expected = case.with_name(case.name.replace(".in.py", ".out.py")).read_text(encoding="utf-8")
    settings = _settings(case)
    before = analyze(source, settings)
    assert before, f"{case.name} has nothing to report"

    result = fix_source(source, settings, unsafe=True)

    assert result.source == expected
    cst.parse_module(result.source)
    assert fix_source(result.source, settings, unsafe=True).applied == 0
    # What is still reported is exactly what had no fix to begin with.
    unfixable = sorted(finding.line for finding in before if finding.fix is None)
    assert len(result.remaining) == len(unfixable)
    assert all(finding.fix is None for finding in result.remaining)


def test_safe_only_fixing_leaves_unsafe_fixes_alone() -> None:
    case = GOLDEN_DIR / "OOM601_hf_manual_loop.in.py"
    source = case.read_text(encoding="utf-8")
    result = fix_source(source, _settings(case), unsafe=False)
    assert result.source == source
    assert result.applied == 0
