"""Hover: the rule's documentation (Markdown) on a diagnostic's range, or on
a code inside `# oom: ignore[...]` / `# noqa: ...`."""

from __future__ import annotations

import re

from lsprotocol import types

from oom_lsp.analysis import registry
from oom_lsp.edits import Position, Range
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.server import OomLanguageServer

_SUPPRESSION_RE = re.compile(
    r"#\s*(?:oom:\s*(?:ignore-file|file-ignore|ignore)\s*\[(?P<bracket>[^\]]*)\]"
    r"|noqa:\s*(?P<noqa>[A-Za-z0-9_\-]+(?:\s*,\s*[A-Za-z0-9_\-]+)*))",
    re.IGNORECASE,
)
_ENTRY_RE = re.compile(r"[A-Za-z0-9_\-]+")


def register(server: OomLanguageServer) -> None:
    server.feature(types.TEXT_DOCUMENT_HOVER)(on_hover)


def rule_docs(code_or_name: str) -> tuple[str, str] | None:
    """(code, Markdown docs) of a rule given by code or kebab-case name."""
    rule = registry.rule_for(code_or_name.upper()) or registry.rule_by_name(code_or_name.lower())
    return (rule.code, rule.docs()) if rule is not None else None


def suppression_entry_at(line_text: str, column: int) -> tuple[str, int, int] | None:
    """(entry, start, end) of the code or rule name under `column` inside a
    suppression comment on this line."""
    for match in _SUPPRESSION_RE.finditer(line_text):
        group = "bracket" if match.group("bracket") is not None else "noqa"
        offset = match.start(group)
        for entry in _ENTRY_RE.finditer(match.group(group)):
            start, end = offset + entry.start(), offset + entry.end()
            if start <= column <= end:
                return entry.group(), start, end
    return None


def _hover(markdown: str, lsp_range: types.Range) -> types.Hover:
    return types.Hover(
        contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=markdown),
        range=lsp_range,
    )


async def on_hover(ls: OomLanguageServer, params: types.HoverParams) -> types.Hover | None:
    document = ls.open_document(params.text_document.uri)
    if document is None:
        return None
    converter = PositionConverter(document.source, ls.position_encoding)
    position = converter.from_lsp(params.position)
    line_text = converter.lines[position.line - 1] if position.line <= len(converter.lines) else ""
    if "#" in line_text:
        entry = suppression_entry_at(line_text, position.column)
        if entry is not None:
            docs = rule_docs(entry[0])
            if docs is not None:
                entry_range = Range(Position(position.line, entry[1]), Position(position.line, entry[2]))
                return _hover(docs[1], converter.range_to_lsp(entry_range))
    await ls.settings_ready.wait()
    analysis = await ls.analysis_of(document)
    if not ls.is_current(analysis):
        return None
    under = [finding for finding in analysis.findings if finding.range.start <= position <= finding.range.end]
    if not under:
        return None
    sections = []
    for code in dict.fromkeys(finding.code for finding in under):
        docs = rule_docs(code)
        if docs is not None:
            sections.append(docs[1])
    if not sections:
        return None
    innermost = min(
        under, key=lambda finding: (finding.range.end.line - finding.range.start.line, finding.range.end)
    )
    return _hover("\n\n---\n\n".join(sections), converter.range_to_lsp(innermost.range))
