"""Explain an out-of-memory error: find the OOM errors in a log or traceback (the allocation
that failed, the device's memory, the allocator's hint, the user's failing line) and say what to
do about each.

`oom-lsp explain LOG` (oom_lsp.cli.profile) and the editor's `oom-lsp.explainOom`
(oom_lsp.server.profiling) read the same tail of a log with `read_log`, find the same errors with
`explain`, and name the same next steps; a profile that ran out of memory gets them too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from oom_lsp.profiling.importers import SnapshotExplanation, read_snapshot_file
from oom_lsp.profiling.oom_messages import OomError, find_ooms

MAX_LOG_CHARS = 4 * 2**20  # of a log: its end, where the error is


@dataclass(frozen=True)
class Explanation:
    """The OOM errors found, in the log's order (the last is the one that ended the run)."""

    ooms: list[OomError]

    def to_json(self) -> dict[str, object]:
        return {"ooms": [oom.to_dict() for oom in self.ooms]}


def is_snapshot(path: Path) -> bool:
    """A pickle (protocol 2+), or a gzipped one: a memory snapshot rather than a log."""
    try:
        with path.open("rb") as handle:
            head = handle.read(2)
    except OSError:
        return False  # said by the log reader, as for any log
    return head[:1] == b"\x80" or (head == b"\x1f\x8b" and path.suffix in (".gz", ".pickle", ".pkl"))


def explain_snapshot(path: Path) -> SnapshotExplanation:
    """A memory snapshot's peak: the report (top_lines: the bytes live there by the user line that
    allocated them), the same bytes grouped by what holds them, and the last allocation that failed
    (what was live then, by line). Raises ImportFormatError (not a snapshot, a pickle that asks
    for code) or OSError, each with a one-line message."""
    return read_snapshot_file(path)


def read_log(log: Path, limit: int | None = MAX_LOG_CHARS) -> str:
    """The log's text (its last `limit` characters: the error that ended a run is at its end).
    Raises OSError."""
    if limit is None:
        return log.read_text(encoding="utf-8", errors="replace")
    with open(log, "rb") as stream:
        stream.seek(0, os.SEEK_END)
        stream.seek(max(0, stream.tell() - 4 * limit))
        return stream.read().decode("utf-8", errors="replace")[-limit:]


def explain(text: str) -> Explanation:
    return Explanation(find_ooms(text))


def next_steps(oom: OomError) -> list[str]:
    """What to do about it: the rules that fire on the failing line of the user's file (when
    the file is here to analyse), and the estimate that finds the largest batch for that GPU.
    Reads the file's [tool.oom-lsp] (ConfigError when it is broken)."""
    from oom_lsp.analysis.engine import analyze
    from oom_lsp.config import ConfigResolver

    advice = []
    failing = oom.failing_frame
    path = Path(failing.file) if failing else None
    if failing and path is not None and path.is_file():
        settings = ConfigResolver().resolve(path).settings_for(path)
        text = path.read_text(encoding="utf-8", errors="replace")
        findings = [f for f in analyze(text, settings, str(path)) if f.code != "OOM000"]
        here = [f for f in findings if f.range.start.line <= failing.line <= f.range.end.line]
        shown = _shown(path)
        for finding in here:
            fix = ""
            if finding.fix is not None:
                flags = "--fix" if finding.fix.is_safe else "--fix --unsafe-fixes"
                fix = f"; `oom-lsp --check {flags} {shown}` applies its fix"
            headline = finding.message.split(". ")[0].rstrip(".")
            advice.append(
                f"{finding.code} {finding.name} fires on that line: {headline}. "
                f"`oom-lsp rule {finding.code}` explains it{fix}"
            )
        if not here and findings:
            advice.append(
                f"no rule fires on that line; `oom-lsp --check {shown}` lists the {len(findings)} "
                f"risk{'s' if len(findings) > 1 else ''} it finds elsewhere in the file"
            )
    entry = next((_shown(Path(frame.file)) for frame in oom.frames if Path(frame.file).is_file()), "train.py")
    target = f"--gpu-memory {_size_argument(oom.total_capacity)}" if oom.total_capacity else "--gpu NAME"
    advice.append(
        f"the largest batch that fits this GPU: `oom-lsp estimate {entry} {target} --find-max-batch`"
    )
    return advice


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _size_argument(size: int) -> str:
    """A --gpu-memory value: GiB when whole (the message's "23.69 GiB" is not), else MiB."""
    return f"{size // 2**30}GiB" if size % 2**30 == 0 else f"{size // 2**20}MiB"
