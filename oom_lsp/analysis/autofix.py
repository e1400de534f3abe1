"""Applying the analysis's fixes to text, as `--fix` and fix-all do. Pure functions.

`fix_source` repeats analyse -> apply until nothing more applies (a fix can
enable or move another), as Ruff does, and never returns code that does not
parse. Applying one set of edits is `oom_lsp.edits.apply_edits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from oom_lsp import python_ast
from oom_lsp.analysis.engine import analyze
from oom_lsp.analysis.findings import Finding, Fix
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.edits import Position, TextEdit, apply_edits, line_starts, offset_of

MAX_PASSES = 10


def _parses(source: str) -> bool:
    try:
        python_ast.parse_module(source)
    except (cst.ParserSyntaxError, RecursionError):
        return False
    return True


def select_fixes(findings: list[Finding], *, unsafe: bool) -> list[Fix]:
    fixes = []
    for finding in findings:
        if finding.fix is None:
            continue
        if finding.fix.is_safe or unsafe:
            fixes.append(finding.fix)
    return fixes


def apply_non_overlapping(source: str, fixes: list[Fix]) -> tuple[str, int]:
    """Apply as many fixes as do not overlap each other, in source order."""
    starts = line_starts(source)
    taken: list[tuple[int, int]] = []
    chosen: list[TextEdit] = []
    applied = 0
    for fix in sorted(fixes, key=lambda fix: fix.edits[0].range.start if fix.edits else Position(0, 0)):
        spans = [
            (offset_of(edit.range.start, starts, source), offset_of(edit.range.end, starts, source))
            for edit in fix.edits
        ]
        if any(s < t_end and t_start < e or (s == e == t_start == t_end) for s, e in spans for t_start, t_end in taken):
            continue
        taken.extend(spans)
        chosen.extend(fix.edits)
        applied += 1
    if not chosen:
        return source, 0
    return apply_edits(source, chosen), applied


@dataclass
class FixResult:
    source: str
    applied: int  # number of fixes applied
    remaining: list[Finding]  # findings left after fixing


def fix_source(
    source: str,
    settings: LintSettings,
    *,
    unsafe: bool = False,
    path: str = "<stdin>",
    only_codes: set[str] | None = None,
) -> FixResult:
    """Apply fixes until stable. A pass whose result would not parse is dropped."""
    applied_total = 0
    current = source
    findings = analyze(current, settings, path)
    for _ in range(MAX_PASSES):
        candidates = [f for f in findings if only_codes is None or f.code in only_codes]
        fixes = select_fixes(candidates, unsafe=unsafe)
        if not fixes:
            break
        updated, applied = apply_non_overlapping(current, fixes)
        if applied == 0 or updated == current or not _parses(updated):
            break
        current = updated
        applied_total += applied
        findings = analyze(current, settings, path)
    return FixResult(current, applied_total, findings)
