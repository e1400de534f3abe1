"""Output formats of `oom-lsp --check`: text (concise), full, json, sarif, github.

Every renderer takes the checked files (anything with `display`, `findings`
and `source`) and returns the text to print. Columns are 1-based in every
format, as in Ruff's output; findings hold 0-based columns internally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from oom_lsp.analysis.rule_links import DOCS_URL, rule_url
from oom_lsp.output.base import (
    CheckedFile,
    NotebookPositions,
    RenderOptions,
    applicable_fix,
    located,
    location,
    printable,
)

__all__ = [
    "DOCS_URL",
    "FORMATS",
    "CheckedFile",
    "NotebookPositions",
    "RenderOptions",
    "Renderer",
    "applicable_fix",
    "located",
    "location",
    "printable",
    "renderer",
    "rule_url",
]

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
