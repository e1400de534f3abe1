"""Golden fix tests for the autograd-graph rules, OOM301..OOM305.

Each tests/fixes/golden/OOM30x_<case>.in.py, fixed with unsafe fixes enabled
and only its own rule selected, must equal OOM30x_<case>.out.py byte for
byte: comments and formatting are kept. The fixed file must parse, a second
fix must change nothing, and what is still reported must be exactly what had
no fix to begin with.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
CODES = ("OOM301", "OOM302", "OOM303", "OOM304", "OOM305")
CASES = sorted(path for code in CODES for path in GOLDEN_DIR.glob(f"{code}_*.in.py"))
SAFE_CODES = ("OOM301", "OOM302", "OOM303", "OOM305")


def _settings(path: Path) -> LintSettings:
    # Strict mode: a golden case tests the fix, also where the finding is shown
    # only in strict mode (its memory at stake not shown to matter).
    return LintSettings(enabled=frozenset({path.name.split("_", 1)[0]}), strict=True)


def _expected(case: Path) -> str:
    return case.with_name(case.name.replace(".in.py", ".out.py")).read_text(encoding="utf-8")


def test_every_rule_has_a_golden_case() -> None:
    assert {path.name.split("_", 1)[0] for path in CASES} == set(CODES)


@pytest.mark.parametrize("case", CASES, ids=[path.name.removesuffix(".in.py") for path in CASES])
def test_fix_matches_golden_output(case: Path) -> None:
    source = case.read_text(encoding="utf-8")
    settings = _settings(case)
    before = analyze(source, settings)
    assert any(finding.fix for finding in before), f"{case.name} has nothing to fix"

    result = fix_source(source, settings, unsafe=True)

    assert result.source == _expected(case)
    cst.parse_module(result.source)
    assert fix_source(result.source, settings, unsafe=True).applied == 0
    unfixable = sorted(finding.line for finding in before if finding.fix is None)
    assert len(result.remaining) == len(unfixable)
    assert all(finding.fix is None for finding in result.remaining)


@pytest.mark.parametrize(
    "case",
    [path for path in CASES if path.name.startswith(SAFE_CODES)],
    ids=lambda path: path.name.removesuffix(".in.py"),
)
def test_safe_fixes_apply_without_unsafe_fixes(case: Path) -> None:
    assert fix_source(case.read_text(encoding="utf-8"), _settings(case), unsafe=False).source == _expected(
        case
    )


@pytest.mark.parametrize(
    "case",
    [path for path in CASES if path.name.startswith("OOM304")],
    ids=lambda path: path.name.removesuffix(".in.py"),
)
def test_retain_graph_fixes_need_unsafe_fixes(case: Path) -> None:
    source = case.read_text(encoding="utf-8")
    result = fix_source(source, _settings(case), unsafe=False)
    assert result.source == source
    assert result.applied == 0


def test_the_whole_family_fixes_together() -> None:
    """Every case, fixed with all five rules on, still parses and is stable."""
    settings = LintSettings(enabled=frozenset(CODES), strict=True)
    for case in CASES:
        result = fix_source(case.read_text(encoding="utf-8"), settings, unsafe=True)
        cst.parse_module(result.source)
        assert fix_source(result.source, settings, unsafe=True).applied == 0, case.name
