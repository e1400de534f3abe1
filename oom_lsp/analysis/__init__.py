"""Pure analysis: source text + settings -> findings.

The names below are imported lazily: `oom_lsp.analysis.registry`,
`catalogue`, `findings` and `settings` must stay importable without libcst,
so that the CLI can resolve its configuration and answer from its cache
without paying for the parser's import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "analyze": "oom_lsp.analysis.engine",
    "Applicability": "oom_lsp.analysis.findings",
    "Finding": "oom_lsp.analysis.findings",
    "Fix": "oom_lsp.analysis.findings",
    "Position": "oom_lsp.analysis.findings",
    "Range": "oom_lsp.analysis.findings",
    "Severity": "oom_lsp.analysis.findings",
    "TextEdit": "oom_lsp.analysis.findings",
    "LintSettings": "oom_lsp.analysis.settings",
    "default_settings": "oom_lsp.analysis.settings",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
