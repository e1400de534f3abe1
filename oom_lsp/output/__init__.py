"""Output formats of `oom-lsp --check`: text (concise), full, json, sarif, github.

Every renderer takes the checked files (anything with `display`, `findings`
and `source`) and returns the text to print. Columns are 1-based in every
format, as in Ruff's output; findings hold 0-based columns internally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the parser imports this package; keep libcst out of `--help`
    from oom_lsp.analysis.findings import Finding, Fix

DOCS_URL = "https://github.com/oom-lsp/oom-lsp/blob/main/docs/rules.md"


class CheckedFile(Protocol):
    display: str
    findings: list[Finding]
    source: str | None


@dataclass(frozen=True)
class RenderOptions:
    # Unsafe fixes count as available (`--unsafe-fixes`).
    unsafe_fixes: bool = False
    # Text format: print each fix's title under its finding (`--show-fixes`).
    show_fix_titles: bool = False


def rule_url(code: str, name: str) -> str:
    """The rule's section in docs/rules.md (`oom-lsp rule --all` writes it;
    GitHub's anchor of the heading `# <name> (<code>)`)."""
    return f"{DOCS_URL}#{name}-{code.lower()}"


def applicable_fix(finding: Finding, options: RenderOptions) -> Fix | None:
    """The fix `--fix` would apply under these options."""
    if finding.fix is None or not (finding.fix.is_safe or options.unsafe_fixes):
        return None
    return finding.fix


def located(files: Sequence[CheckedFile]) -> list[tuple[CheckedFile, Finding]]:
    """Every finding with its file, in file order then position order."""
    return [(file, finding) for file in files for finding in file.findings]


Renderer = Callable[[Sequence[CheckedFile], RenderOptions], str]


def renderer(name: str) -> Renderer:
    from oom_lsp.output import full, github, json_format, sarif, text

    return {
        "text": text.render,
        "concise": text.render,
        "full": full.render,
        "json": json_format.render,
        "sarif": sarif.render,
        "github": github.render,
    }[name]


FORMATS = ("text", "full", "json", "sarif", "github")
