"""Hover: a short summary of the rule on a diagnostic's range, or on a code
inside `# oom: ignore[...]` / `# noqa: ...`: the message, why it costs memory,
the fix, and a link to the full rule page (which `oom-lsp rule CODE` prints).

The summary is Markdown or plain text, whichever the client lists first in its
hover `contentFormat`; plain text for a client that lists neither.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from lsprotocol import types

from oom_lsp.analysis import Finding, registry
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule_links import rule_url
from oom_lsp.edits import Position, Range
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.server import OomLanguageServer

_SUPPRESSION_RE = re.compile(
    r"#\s*(?:oom:\s*(?:ignore-file|file-ignore|ignore)\s*\[(?P<bracket>[^\]]*)\]"
    r"|noqa:\s*(?P<noqa>[A-Za-z0-9_\-]+(?:\s*,\s*[A-Za-z0-9_\-]+)*))",
    re.IGNORECASE,
)
_ENTRY_RE = re.compile(r"[A-Za-z0-9_\-]+")
_MARKDOWN_SPECIAL_RE = re.compile(r"[\\`*\[\]<]|(?<!\w)_|_(?!\w)")
_SAFETY = {Applicability.SAFE: "safe", Applicability.UNSAFE: "unsafe: review it"}


def register(server: OomLanguageServer) -> None:
    server.feature(types.TEXT_DOCUMENT_HOVER)(on_hover)


@dataclass(frozen=True)
class Summary:
    """What the hover says about one rule, at one finding or in a suppression comment."""

    code: str
    name: str
    headline: str  # the finding's message, or the rule's summary (plain text)
    why: str  # plain text
    fix: str  # the quick fix's title (code in backticks), or the rule's remedy (plain text)
    quick_fix: Applicability | None  # the quick fix's safety; None: no quick fix here

    def render(self, markdown: bool) -> str:
        url = rule_url(self.code, self.name)
        if self.quick_fix is not None:
            fix = self.fix if markdown else self.fix.replace("`", "")
            fix_line = f"Quick fix: {fix} ({_SAFETY[self.quick_fix]})"
        else:
            fix_line = f"Fix: {_escape(self.fix) if markdown else self.fix}"
        if markdown:
            # Two trailing spaces: a line break inside the paragraph. The paragraphs are wrapped
            # at word boundaries (a soft line break renders as a space in VS Code): Neovim shows
            # the Markdown's own lines in its float, and wraps a longer one at any character.
            link = f"[{self.name} ({self.code})]({url})  \n`oom-lsp rule {self.code}`"
            headline = _wrap(f"**{self.code}** {_escape(self.headline)}")
            return f"{headline}\n\n{_wrap(_escape(self.why))}\n\n{_wrap(fix_line)}  \n{link}"
        link = f"{self.name}: {url} (or: oom-lsp rule {self.code})"
        return f"{self.code} {self.headline}\n\n{self.why}\n\n{fix_line}\n{link}"


MARKDOWN_WIDTH = 78  # columns: a hover float beside an 80-column window's text
_BLOCK_START_RE = re.compile(r"([-+*>#=]+|\d+[.)])(\s|$)")


def _wrap(text: str) -> str:
    """`text` on lines of at most MARKDOWN_WIDTH columns, broken between words only (a longer
    word, a URL, keeps its line)."""
    lines: list[str] = []
    for line in textwrap.wrap(text, MARKDOWN_WIDTH, break_long_words=False, break_on_hyphens=False):
        if lines and _BLOCK_START_RE.match(line):
            lines[-1] += " " + line  # not broken there: the line would start a list, quote or heading
        else:
            lines.append(line)
    return "\n".join(lines) or text


def _escape(text: str) -> str:
    """Plain text that Markdown would render otherwise: `*`, `<`, backticks, brackets, and a `_`
    that starts or ends a word (`__init__`; not the one inside `epoch_loss`, which stays as is)."""
    return _MARKDOWN_SPECIAL_RE.sub(r"\\\g<0>", text)


def summary_of_rule(code_or_name: str) -> Summary | None:
    """The summary of a rule given by code or kebab-case name, with no finding."""
    rule = registry.rule_for(code_or_name.upper()) or registry.rule_by_name(code_or_name.lower())
    if rule is None:
        return None
    return Summary(rule.code, rule.name, rule.summary.replace("`", ""), rule.why, rule.remedy, None)


def summary_of_finding(finding: Finding) -> Summary | None:
    rule = registry.rule_for(finding.code)
    if rule is None:
        return None
    if finding.fix is not None:
        safety = Applicability.SAFE if finding.fix.is_safe else Applicability.UNSAFE
        return Summary(rule.code, rule.name, finding.message, rule.why, finding.fix.title, safety)
    return Summary(rule.code, rule.name, finding.message, rule.why, rule.remedy, None)


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


def _wants_markdown(ls: OomLanguageServer) -> bool:
    """The first of the client's hover content formats that this server writes."""
    text_document = ls.client_capabilities.text_document
    hover = text_document.hover if text_document else None
    for kind in (hover.content_format if hover else None) or []:
        if kind in (types.MarkupKind.Markdown, types.MarkupKind.PlainText):
            return kind == types.MarkupKind.Markdown
    return False


def _hover(ls: OomLanguageServer, summaries: list[Summary], lsp_range: types.Range) -> types.Hover:
    markdown = _wants_markdown(ls)
    return types.Hover(
        contents=types.MarkupContent(
            kind=types.MarkupKind.Markdown if markdown else types.MarkupKind.PlainText,
            value="\n\n".join(summary.render(markdown) for summary in summaries),
        ),
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
            summary = summary_of_rule(entry[0])
            if summary is not None:
                entry_range = Range(Position(position.line, entry[1]), Position(position.line, entry[2]))
                return _hover(ls, [summary], converter.range_to_lsp(entry_range))
    await ls.settings_ready.wait()
    analysis = ls.current_analysis(await ls.analysis_of(document))
    under = [finding for finding in analysis.findings if finding.range.start <= position <= finding.range.end]
    summaries = list(dict.fromkeys(filter(None, map(summary_of_finding, under))))
    if not summaries:
        return None
    innermost = min(
        under, key=lambda finding: (finding.range.end.line - finding.range.start.line, finding.range.end)
    )
    return _hover(ls, summaries, converter.range_to_lsp(innermost.range))
