"""The project's OOM fix log (`OOM_FIXES.md` by default): one Markdown entry per applied
AI fix: date, the rule or error, the changelog line, the causes, the edits as a unified
diff, the prompt sent and the model's answer, and the peak before/after once
`oom-lsp validate` (or the editor's validateFix) has measured it.

The prompt and answer are logged as sent: redacted. Entries carry an id in an HTML
comment so the figures can be filled in later without parsing the rest.
"""

from __future__ import annotations

import re
import secrets as random_ids
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from oom_lsp.profiling.oom_messages import format_bytes

HEADER = (
    "# OOM fix log\n\n"
    "Memory fixes proposed by a model and applied with oom-lsp, oldest first: what was changed, why, "
    "and the peak memory of a training step before and after.\n"
)
PENDING = "not measured yet (run `oom-lsp validate {file} --before REPORT.json`)"
_FIGURES_LINE = re.compile(r"^- Peak before / after: .*$", re.M)
_ENTRY_ID = re.compile(r"<!-- oom-lsp-fix: (?P<id>[0-9a-f]+) file: (?P<file>.*?) -->")


@dataclass(frozen=True)
class Figures:
    before: int
    after: int
    method: str  # "profile" (measured) or "estimate"

    def render(self) -> str:
        change = self.after - self.before
        percent = f" ({100 * change / self.before:+.1f}%)" if self.before else ""
        sign = "+" if change > 0 else "-" if change < 0 else "±"
        return (
            f"{format_bytes(self.before)} → {format_bytes(self.after)}, "
            f"{sign}{format_bytes(abs(change))}{percent} ({self.method})"
        )


@dataclass(frozen=True)
class FixLogEntry:
    subject: str  # "OOM301 loss-accumulated-with-graph" or "CUDA out of memory"
    file: str  # as displayed, relative to the project when possible
    changelog: str
    causes: tuple[str, ...]
    model: str
    host: str
    prompt: str
    answer: str
    diff: str
    when: datetime
    entry_id: str
    figures: Figures | None = None


def new_entry_id() -> str:
    return random_ids.token_hex(4)


def entry_from_proposal(proposal: object, file: str, host: str, when: datetime | None = None) -> FixLogEntry:
    """A log entry for an applied `oom_lsp.llm.fixer.Proposal` (with an edit)."""
    from oom_lsp.llm.fixer import Proposal

    assert isinstance(proposal, Proposal) and proposal.edit is not None
    fix = proposal.fix
    return FixLogEntry(
        subject=proposal.prompt.subject,
        file=file,
        changelog=fix.changelog,
        causes=tuple(f"{cause.title} ({cause.likelihood.value}): {cause.evidence}" for cause in fix.causes),
        model=proposal.model,
        host=host,
        prompt=proposal.prompt.markdown(include_system=True),
        answer=proposal.answer,
        diff=proposal.edit.diff(file),
        when=when or datetime.now(timezone.utc),
        entry_id=new_entry_id(),
    )


def _fence(text: str, char: str = "`") -> str:
    longest = max((len(run) for run in re.findall(f"{re.escape(char)}+", text)), default=0)
    return char * max(3, longest + 1)


def render_entry(entry: FixLogEntry) -> str:
    when = entry.when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    figures = entry.figures.render() if entry.figures else PENDING.format(file=entry.file)
    diff_fence, prompt_fence, answer_fence = _fence(entry.diff), _fence(entry.prompt), _fence(entry.answer)
    causes = "\n".join(f"  {number}. {cause}" for number, cause in enumerate(entry.causes, 1))
    return (
        f"\n## {when} · {entry.subject} · `{entry.file}`\n"
        f"<!-- oom-lsp-fix: {entry.entry_id} file: {entry.file} -->\n\n"
        f"{entry.changelog}\n\n"
        f"- Model: `{entry.model}` at {entry.host}\n"
        f"- Causes:\n{causes}\n"
        f"- Peak before / after: {figures}\n\n"
        f"{diff_fence}diff\n{entry.diff.rstrip()}\n{diff_fence}\n\n"
        f"<details><summary>Prompt sent (secrets redacted)</summary>\n\n"
        f"{prompt_fence}markdown\n{entry.prompt.rstrip()}\n{prompt_fence}\n\n</details>\n\n"
        f"<details><summary>Answer</summary>\n\n"
        f"{answer_fence}markdown\n{entry.answer.rstrip()}\n{answer_fence}\n\n</details>\n"
    )


def append_entry(log: Path, entry: FixLogEntry) -> None:
    existing = log.read_text(encoding="utf-8") if log.exists() else ""
    text = (existing or HEADER).rstrip("\n") + "\n" + render_entry(entry)
    log.parent.mkdir(parents=True, exist_ok=True)
    temporary = log.with_name(log.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(log)


def record_figures(log: Path, file: str, figures: Figures, entry_id: str | None = None) -> str | None:
    """Fill in the figures of entry `entry_id`, or of the latest entry for `file` that has
    none yet. Returns the id of the entry updated, or None when there is none."""
    if not log.exists():
        return None
    text = log.read_text(encoding="utf-8")
    markers = list(_ENTRY_ID.finditer(text))
    for index in range(len(markers) - 1, -1, -1):
        marker = markers[index]
        end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
        body = text[marker.end() : end]
        line = _FIGURES_LINE.search(body)
        if line is None:
            continue
        wanted = (
            marker["id"] == entry_id
            if entry_id
            else (marker["file"] == file and "not measured yet" in line.group(0))
        )
        if not wanted:
            continue
        start = marker.end() + line.start()
        updated = (
            text[:start] + f"- Peak before / after: {figures.render()}" + text[marker.end() + line.end() :]
        )
        log.write_text(updated, encoding="utf-8")
        return marker["id"]
    return None
