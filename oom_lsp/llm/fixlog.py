"""The project's OOM fix log (`OOM_FIXES.md` by default): one Markdown entry per applied
AI fix: date, the rule or error, the changelog line, the causes, the edits as a unified
diff, the prompt sent and the model's answer, and the peak before/after once
`oom-lsp validate` (or the editor's validateFix) has measured it.

The prompt and answer are logged as sent: redacted; the diff is redacted too (it shows
the real file, where a changed line may hold a secret). Each of them is cut at
`MAX_SECTION_CHARS`, so a hostile or runaway answer cannot grow the log without bound.
Entries carry an id in an HTML comment so the figures can be filled in later without
parsing the rest.

The log is only ever a Markdown file inside the project that is a fix log already or
does not exist yet (`checked_log_path`): a `fix-log` setting pointing at a source file,
`~/.bashrc` or `../elsewhere` is refused, so an answer is never appended to code.
"""

from __future__ import annotations

import os
import re
import secrets as random_ids
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from oom_lsp import safe_files
from oom_lsp.llm.secrets import redact
from oom_lsp.units import format_bytes

HEADER = (
    "# OOM fix log\n\n"
    "Memory fixes proposed by a model and applied with oom-lsp, oldest first: what was changed, why, "
    "and the peak memory of a training step before and after.\n"
)
LOG_SUFFIXES = (".md", ".markdown")
MAX_SECTION_CHARS = 20_000
PENDING = "not measured yet (run `oom-lsp validate {file} --before REPORT.json`)"
_FIGURES_LINE = re.compile(r"^- Peak before / after: .*$", re.M)
_ENTRY_ID = re.compile(r"<!-- oom-lsp-fix: (?P<id>[0-9a-f]+) file: (?P<file>.*?) -->")


class FixLogError(ValueError):
    """The fix log may not be written there; the message says why and what to set."""


def checked_log_path(path: Path, root: Path | None, name: str | None = None) -> Path:
    """`path` if a fix log may be written there: a Markdown file, inside `root` (when
    given: after resolving `..` and symbolic links), that is not there yet or already
    starts like a fix log. Raises FixLogError; `name` is the setting as written."""
    name = name or str(path)
    resolved = Path(os.path.realpath(path))
    if resolved.suffix.lower() not in LOG_SUFFIXES:
        raise FixLogError(f"the fix log must be a Markdown file (.md), not {name}; set fix-log to e.g. OOM_FIXES.md")
    if root is not None:
        real_root = Path(os.path.realpath(root))
        if real_root != resolved and real_root not in resolved.parents:
            raise FixLogError(f"the fix log {name} is outside the project {root}; set fix-log to a path inside it")
    if resolved.exists() and not _is_fix_log(resolved):
        raise FixLogError(f"{name} exists and is not an oom-lsp fix log; choose another fix-log file")
    return path


def _is_fix_log(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            return stream.readline().rstrip("\r\n") == HEADER.splitlines()[0]
    except OSError:
        return False


def _capped(text: str) -> str:
    if len(text) <= MAX_SECTION_CHARS:
        return text
    return text[:MAX_SECTION_CHARS] + f"\n… ({len(text) - MAX_SECTION_CHARS:,} more characters not logged)\n"


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


def _fence(text: str, char: str = "`") -> str:
    longest = max((len(run) for run in re.findall(f"{re.escape(char)}+", text)), default=0)
    return char * max(3, longest + 1)


def render_entry(entry: FixLogEntry) -> str:
    when = entry.when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    figures = entry.figures.render() if entry.figures else PENDING.format(file=entry.file)
    diff, prompt, answer = _capped(entry.diff), _capped(entry.prompt), _capped(entry.answer)
    diff_fence, prompt_fence, answer_fence = _fence(diff), _fence(prompt), _fence(answer)
    causes = "\n".join(f"  {number}. {cause}" for number, cause in enumerate(entry.causes, 1))
    return (
        f"\n## {when} · {entry.subject} · `{entry.file}`\n"
        f"<!-- oom-lsp-fix: {entry.entry_id} file: {entry.file} -->\n\n"
        f"{entry.changelog}\n\n"
        f"- Model: `{entry.model}` at {entry.host}\n"
        f"- Causes:\n{causes}\n"
        f"- Peak before / after: {figures}\n\n"
        f"{diff_fence}diff\n{diff.rstrip()}\n{diff_fence}\n\n"
        f"<details><summary>Prompt sent (secrets redacted)</summary>\n\n"
        f"{prompt_fence}markdown\n{prompt.rstrip()}\n{prompt_fence}\n\n</details>\n\n"
        f"<details><summary>Answer</summary>\n\n"
        f"{answer_fence}markdown\n{answer.rstrip()}\n{answer_fence}\n\n</details>\n"
    )


def append_entry(log: Path, entry: FixLogEntry, root: Path | None = None) -> None:
    """Append `entry` to `log` (checked again here: raises FixLogError)."""
    checked_log_path(log, root)
    existing = log.read_text(encoding="utf-8") if log.exists() else ""
    text = (existing or HEADER).rstrip("\n") + "\n" + render_entry(entry)
    safe_files.make_folder(log.parent, root)
    _replace_contents(log, text, root)


def _replace_contents(log: Path, text: str, root: Path | None) -> None:
    """Write `text` to `log` (oom_lsp.safe_files): through a temporary file of a fresh,
    unpredictable name, never a fixed one such as `OOM_FIXES.md.tmp` that a cloned
    repository could have planted as a link to the user's files; a log that is a link
    inside the project stays one."""
    safe_files.write_through(log, text, root=root)


def record_figures(
    log: Path, file: str, figures: Figures, entry_id: str | None = None, root: Path | None = None
) -> str | None:
    """Fill in the figures of entry `entry_id`, or of the latest entry for `file` that has
    none yet. Returns the id of the entry updated, or None when there is none (or `log`
    is not a fix log). `root`: the project, which no link may lead `log` out of."""
    if not log.exists() or not _is_fix_log(log):
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
        _replace_contents(log, updated, root)
        return marker["id"]
    return None
