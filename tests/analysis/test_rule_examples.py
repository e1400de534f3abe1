"""Every rule's VALID / INVALID examples, run as tests (Fixit's model).

A notebook rule's examples are notebooks in the percent format (`# %%` starts
a cell): they run through the notebook analysis, and a finding's line is
counted in the example's text."""

from __future__ import annotations

import dataclasses
import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.registry import all_rules
from oom_lsp.analysis.rule import Invalid, Rule, Valid
from oom_lsp.notebooks.percent import join_cells, split_cells
from oom_lsp.notebooks.program import analyze_cells, fix_cells


class _Fixed:
    def __init__(self, source: str, remaining: list, applied: int) -> None:
        self.source, self.remaining, self.applied = source, remaining, applied


def _analyze(rule: type[Rule], source: str, settings: LintSettings) -> list:
    """Findings with lines counted in the example's text."""
    if not rule.notebook_only:
        return analyze(source, settings)
    pairs = split_cells(source)
    first_line = {cell.key: first for cell, first in pairs}
    analysis = analyze_cells([cell for cell, _ in pairs], settings)
    return [
        dataclasses.replace(
            finding,
            range=type(finding.range)(
                type(finding.range.start)(first_line[key] + finding.line - 1, finding.range.start.column),
                finding.range.end,
            ),
        )
        for key, findings in analysis.findings.items()
        for finding in findings
    ]


def _fix(rule: type[Rule], source: str, settings: LintSettings) -> _Fixed:
    if not rule.notebook_only:
        result = fix_source(source, settings, unsafe=True)
        return _Fixed(result.source, result.remaining, result.applied)
    cells = [cell for cell, _ in split_cells(source)]
    result = fix_cells(cells, settings, unsafe=True)
    text = "\n" + join_cells([result.sources.get(cell.key, cell.source) for cell in cells])
    return _Fixed(text, result.remaining.all_findings(), result.applied)


def _settings(rule: type[Rule], example: Valid | Invalid, *, strict: bool = True) -> LintSettings:
    """The example's settings; strict by default: a VALID example must stay silent
    even where every finding is shown, an INVALID one is reported there."""
    return LintSettings(
        enabled=frozenset({rule.code}),
        max_batch_size=int(example.settings.get("max_batch_size", 32)),  # type: ignore[arg-type]
        strict=strict,
    )


def _cases(kind: str):
    for code, rule in all_rules().items():
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{code}-{kind.lower()}-{index}")


@pytest.mark.parametrize(("rule", "example"), list(_cases("VALID")))
def test_valid_example_is_not_reported(rule: type[Rule], example: Valid) -> None:
    source = textwrap.dedent(example.code)
    findings = _analyze(rule, source, _settings(rule, example))
    assert [f for f in findings if f.code == rule.code] == []


@pytest.mark.parametrize(("rule", "example"), list(_cases("INVALID")))
def test_invalid_example_is_reported(rule: type[Rule], example: Invalid) -> None:
    source = textwrap.dedent(example.code)
    settings = _settings(rule, example)
    findings = [f for f in _analyze(rule, source, settings) if f.code == rule.code]
    assert findings, f"{rule.code} did not report:\n{source}"
    if example.line is not None:
        assert example.line in [f.line for f in findings]
    for finding in findings:
        assert finding.message.strip()
        assert finding.name == rule.name
    if example.expected_fix is None:
        return
    assert rule.fix_applicability is not None, "an expected_fix needs fix_applicability"
    assert any(f.fix for f in findings), f"{rule.code} reported no fix"
    result = _fix(rule, source, settings)
    expected = textwrap.dedent(example.expected_fix)
    assert result.source == expected
    cst.parse_module(result.source)
    # The fix removes the finding it was for, and a second --fix is a no-op.
    assert len([f for f in result.remaining if f.code == rule.code]) < len(findings)
    again = _fix(rule, result.source, settings)
    assert again.applied == 0


@pytest.mark.parametrize(("rule", "example"), list(_cases("INVALID")))
def test_invalid_example_is_shown_by_default_only_with_evidence(rule: type[Rule], example: Invalid) -> None:
    """An advisory rule's finding is shown by default only where the facts show
    the memory at stake; its examples say which ones are (`by_default`)."""
    source = textwrap.dedent(example.code)
    findings = [f for f in _analyze(rule, source, _settings(rule, example, strict=False)) if f.code == rule.code]
    if example.line is not None:
        findings = [f for f in findings if f.line == example.line]
    assert bool(findings) is example.shown_by_default(rule), (
        f"{rule.code} {'did not report' if not findings else 'reported'} at the default level:\n{source}"
    )


@pytest.mark.parametrize("rule", [rule for rule in all_rules().values() if rule.advisory])
def test_an_advisory_rule_shows_both_levels(rule: type[Rule]) -> None:
    levels = {example.shown_by_default(rule) for example in rule.INVALID}
    assert levels == {True, False}, (
        f"{rule.code}: examples of a finding shown by default (memory at stake shown) and of one shown "
        "only in strict mode"
    )


@pytest.mark.parametrize(("rule", "example"), list(_cases("INVALID")))
def test_noqa_silences_exactly_that_rule(rule: type[Rule], example: Invalid) -> None:
    source = textwrap.dedent(example.code)
    settings = _settings(rule, example)
    findings = [f for f in _analyze(rule, source, settings) if f.code == rule.code]
    lines = source.splitlines()
    target = findings[0].line
    if '"""' in lines[target - 1] or "'''" in lines[target - 1]:
        pytest.skip("the reported line ends inside a string")
    lines[target - 1] += f"  # noqa: {rule.code}"
    silenced = _analyze(rule, "\n".join(lines) + "\n", settings)
    assert [f for f in silenced if f.code == rule.code and f.line == target] == []
    other = "OOM999"
    lines[target - 1] = lines[target - 1].replace(rule.code, other)
    still = _analyze(rule, "\n".join(lines) + "\n", settings)
    assert [f for f in still if f.code == rule.code and f.line == target]
