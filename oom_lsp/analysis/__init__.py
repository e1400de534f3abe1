"""Pure analysis: source text + settings -> findings."""

from oom_lsp.analysis.engine import analyze
from oom_lsp.analysis.findings import Applicability, Finding, Fix, Position, Range, Severity, TextEdit
from oom_lsp.analysis.settings import LintSettings, default_settings

__all__ = [
    "Applicability",
    "Finding",
    "Fix",
    "LintSettings",
    "Position",
    "Range",
    "Severity",
    "TextEdit",
    "analyze",
    "default_settings",
]
