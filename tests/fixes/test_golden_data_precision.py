"""Golden fix tests for OOM101, OOM201 and OOM202.

Each tests/fixes/golden/OOMxxx_<case>.in.py of these rules, fixed with unsafe
fixes enabled and only its own rule selected, must equal
OOMxxx_<case>.out.py byte for byte: comments and formatting are kept. The
fixed file must parse, a second fix must change nothing, and what is still
reported must be exactly what had no fix to begin with.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CODES = ("OOM101", "OOM201", "OOM202")
CASES = sorted(path for code in CODES for path in GOLDEN_DIR.glob(f"{code}_*.in.py"))


def _settings(path: Path) -> LintSettings:
    # Strict mode: a golden case tests the fix, also where the finding is shown
    # only in strict mode (its memory at stake not shown to matter).
    return LintSettings(enabled=frozenset({path.name.split("_", 1)[0]}), strict=True)


def test_every_fixable_rule_has_a_golden_case() -> None:
    assert {path.name.split("_", 1)[0] for path in CASES} == set(CODES)


@pytest.mark.parametrize("case", CASES, ids=[path.name.removesuffix(".in.py") for path in CASES])
def test_fix_matches_golden_output(case: Path) -> None:
    source = case.read_text(encoding="utf-8")
    expected = case.with_name(case.name.replace(".in.py", ".out.py")).read_text(encoding="utf-8")
    settings = _settings(case)
    before = analyze(source, settings)
    assert any(finding.fix for finding in before), f"{case.name} has nothing to fix"

    result = fix_source(source, settings, unsafe=True)

    assert result.source == expected
    cst.parse_module(result.source)
    assert fix_source(result.source, settings, unsafe=True).applied == 0
    unfixable = sorted(finding.line for finding in before if finding.fix is None)
    assert len(result.remaining) == len(unfixable)
    assert all(finding.fix is None for finding in result.remaining)


@pytest.mark.parametrize("case", [path for path in CASES if not path.name.startswith("OOM202")], ids=str)
def test_safe_only_fixing_leaves_unsafe_fixes_alone(case: Path) -> None:
    source = case.read_text(encoding="utf-8")
    result = fix_source(source, _settings(case), unsafe=False)
    assert result.source == source
    assert result.applied == 0


def test_float64_fixes_are_safe() -> None:
    case = GOLDEN_DIR / "OOM202_double_precision_on_gpu.in.py"
    expected = case.with_name("OOM202_double_precision_on_gpu.out.py").read_text(encoding="utf-8")
    assert fix_source(case.read_text(encoding="utf-8"), _settings(case), unsafe=False).source == expected
