"""Every rule's VALID / INVALID examples, run as tests (Fixit's model)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.registry import all_rules
from oom_lsp.analysis.rule import Invalid, Rule, Valid


def _settings(rule: type[Rule], example: Valid | Invalid) -> LintSettings:
    return LintSettings(
        enabled=frozenset({rule.code}),
        max_batch_size=int(example.settings.get("max_batch_size", 32)),  # type: ignore[arg-type]
    )


def _cases(kind: str):
    for code, rule in all_rules().items():
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{code}-{kind.lower()}-{index}")


@pytest.mark.parametrize(("rule", "example"), list(_cases("VALID")))
def test_valid_example_is_not_reported(rule: type[Rule], example: Valid) -> None:
    source = textwrap.dedent(example.code)
    findings = analyze(source, _settings(rule, example))
    assert [f for f in findings if f.code == rule.code] == []


@pytest.mark.parametrize(("rule", "example"), list(_cases("INVALID")))
def test_invalid_example_is_reported(rule: type[Rule], example: Invalid) -> None:
    source = textwrap.dedent(example.code)
    settings = _settings(rule, example)
    findings = [f for f in analyze(source, settings) if f.code == rule.code]
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
    result = fix_source(source, settings, unsafe=True)
    expected = textwrap.dedent(example.expected_fix)
    assert result.source == expected
    cst.parse_module(result.source)
    # The fix removes the finding it was for, and a second --fix is a no-op.
    assert len([f for f in result.remaining if f.code == rule.code]) < len(findings)
    again = fix_source(result.source, settings, unsafe=True)
    assert again.applied == 0


@pytest.mark.parametrize(("rule", "example"), list(_cases("INVALID")))
def test_noqa_silences_exactly_that_rule(rule: type[Rule], example: Invalid) -> None:
    source = textwrap.dedent(example.code)
    settings = _settings(rule, example)
    findings = [f for f in analyze(source, settings) if f.code == rule.code]
    lines = source.splitlines()
    target = findings[0].line
    if '"""' in lines[target - 1] or "'''" in lines[target - 1]:
        pytest.skip("the reported line ends inside a string")
    lines[target - 1] += f"  # noqa: {rule.code}"
    silenced = analyze("\n".join(lines) + "\n", settings)
    assert [f for f in silenced if f.code == rule.code and f.line == target] == []
    other = "OOM999"
    lines[target - 1] = lines[target - 1].replace(rule.code, other)
    still = analyze("\n".join(lines) + "\n", settings)
    assert [f for f in still if f.code == rule.code and f.line == target]
