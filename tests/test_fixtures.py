"""Golden tests over the realistic training scripts in fixtures/.

Each fixtures/<name>.py is analysed with the default settings and in strict
mode; the findings, rendered one per line as `line:col CODE message`, must equal
fixtures/expected/<name>.txt (what a user sees by default: the findings whose
memory at stake is shown to matter) and fixtures/expected/strict/<name>.txt
(every finding the rules prove). After a deliberate change to a rule,
regenerate the expectations and review the diff:

    OOM_LSP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_fixtures.py

Every fixture starts with a comment `# Intended findings: ...`, either `none`
(a clean script: it must produce no finding at all) or a list such as
`OOM101 (line 34), OOM301 (line 107)` (a risky script: each listed code must
be reported in strict mode, where every finding the rules prove is shown; the
lines tell reviewers where to look).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from oom_lsp.analysis import Finding, LintSettings, analyze, default_settings
from oom_lsp.analysis.registry import all_rules

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
EXPECTED_DIR = FIXTURES_DIR / "expected"
STRICT_EXPECTED_DIR = EXPECTED_DIR / "strict"
FIXTURES = sorted(FIXTURES_DIR.glob("*.py"))
UPDATE_GOLDEN = os.environ.get("OOM_LSP_UPDATE_GOLDEN") == "1"

_HEADER_RE = re.compile(r"^# Intended findings: (?P<body>.+)$", re.MULTILINE)
_INTENDED_RE = re.compile(r"(?P<code>OOM\d{3}) \(line (?P<line>\d+)\)")
# The header must sit in the first lines, before any code, where a reader sees it.
_HEADER_SEARCH_LINES = 5


def intended_findings(source: str) -> list[tuple[str, int]] | None:
    """The (code, line) pairs a fixture's header declares; [] for `none`, None without a header."""
    head = "\n".join(source.splitlines()[:_HEADER_SEARCH_LINES])
    match = _HEADER_RE.search(head)
    if match is None:
        return None
    body = match.group("body").strip()
    if body == "none":
        return []
    pairs = [(m.group("code"), int(m.group("line"))) for m in _INTENDED_RE.finditer(body)]
    return pairs or None


def render(findings: list[Finding]) -> str:
    return "".join(f"{f.range.start.line}:{f.range.start.column} {f.code} {f.message}\n" for f in findings)


def every_rule_settings() -> LintSettings:
    """All registered rules, including those off by default, in strict mode: intent is
    checked against everything the rules can prove."""
    return LintSettings(enabled=frozenset(all_rules()), strict=True)


def _ids(paths: list[Path]) -> list[str]:
    return [path.stem for path in paths]


def _with_intent(clean: bool) -> list[Path]:
    selected = []
    for path in FIXTURES:
        intent = intended_findings(path.read_text(encoding="utf-8"))
        if intent is not None and (intent == []) == clean:
            selected.append(path)
    return selected


CLEAN_FIXTURES = _with_intent(clean=True)
RISKY_FIXTURES = _with_intent(clean=False)


def test_there_are_enough_fixtures_of_both_kinds():
    assert len(FIXTURES) >= 15
    assert len(CLEAN_FIXTURES) >= 6
    assert len(RISKY_FIXTURES) >= 6


@pytest.mark.parametrize("path", FIXTURES, ids=_ids(FIXTURES))
def test_fixture_declares_its_intent_consistently_with_its_name(path: Path):
    source = path.read_text(encoding="utf-8")
    intent = intended_findings(source)
    assert intent is not None, f"{path.name}: no `# Intended findings: ...` header in its first lines"
    line_count = len(source.splitlines())
    for code, line in intent:
        assert 1 <= line <= line_count, f"{path.name}: {code} points at line {line}, past the end"
    if path.stem.endswith("_clean"):
        assert intent == [], f"{path.name} is named clean but declares findings"
    if path.stem.endswith("_risky"):
        assert intent, f"{path.name} is named risky but declares no finding"


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("path", FIXTURES, ids=_ids(FIXTURES))
def test_findings_match_golden_file(path: Path, strict: bool):
    settings = replace(default_settings(), strict=strict)
    actual = render(analyze(path.read_text(encoding="utf-8"), settings, str(path)))
    expected_dir = STRICT_EXPECTED_DIR if strict else EXPECTED_DIR
    expected_path = expected_dir / f"{path.stem}.txt"
    if UPDATE_GOLDEN:
        expected_dir.mkdir(parents=True, exist_ok=True)
        expected_path.write_text(actual, encoding="utf-8")
        return
    assert expected_path.exists(), (
        f"{expected_path.name} is missing; generate it with OOM_LSP_UPDATE_GOLDEN=1 and review it"
    )
    assert actual == expected_path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", CLEAN_FIXTURES, ids=_ids(CLEAN_FIXTURES))
def test_clean_fixture_has_no_findings(path: Path):
    findings = analyze(path.read_text(encoding="utf-8"), every_rule_settings(), str(path))
    assert render(findings) == ""


@pytest.mark.parametrize("path", RISKY_FIXTURES, ids=_ids(RISKY_FIXTURES))
def test_risky_fixture_reports_every_intended_code(path: Path):
    source = path.read_text(encoding="utf-8")
    reported = {finding.code for finding in analyze(source, every_rule_settings(), str(path))}
    missing = [f"{code} (line {line})" for code, line in intended_findings(source) if code not in reported]
    assert not missing, f"{path.name}: not reported: {', '.join(missing)}"


@pytest.mark.parametrize("path", RISKY_FIXTURES, ids=_ids(RISKY_FIXTURES))
def test_risky_fixture_shows_a_finding_by_default(path: Path):
    """A bundled risky example is what a new user runs first: it must show a risk
    whose memory at stake matters, not only strict-mode findings."""
    source = path.read_text(encoding="utf-8")
    shown = {finding.code for finding in analyze(source, default_settings(), str(path))}
    intended = {code for code, _ in intended_findings(source)}
    assert shown & intended, f"{path.name}: none of its intended findings is shown by default"
