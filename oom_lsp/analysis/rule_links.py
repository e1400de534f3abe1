"""Where each rule is documented: `oom-lsp rule --all` writes docs/rules.md, whose headings
`# <name> (<code>)` GitHub turns into these anchors. Diagnostics link here in every face (the
CLI's JSON and SARIF, the editor's diagnostics and hovers), so the server needs no CLI output
module for it. Kept apart from catalogue.py, which is generated from the rule classes."""

from __future__ import annotations

DOCS_URL = "https://github.com/oom-lsp/oom-lsp/blob/main/docs/rules.md"


def rule_url(code: str, name: str) -> str:
    """The rule's section in docs/rules.md."""
    return f"{DOCS_URL}#{name}-{code.lower()}"
