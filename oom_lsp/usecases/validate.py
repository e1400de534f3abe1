"""Validate a fix: measure the script again as it was measured before the fix (a profile or an
estimate), compare the peaks, and record the figures in the fix log's entry of the script.

`oom-lsp validate` (oom_lsp.cli.ai) and the editor's `oom-lsp.validateFix`
(oom_lsp.server.ai) read the measurement before with `read_before`, take the new one with
`measure` (or read it, `--after`), and get the same `Validation`: what cannot be compared, the
change, whether it is within the measurement's noise, whether it still runs out of memory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp.llm.fixlog import Figures
from oom_lsp.llm.validation import (
    Measurement,
    MeasurementError,
    comparison_problems,
    figures,
    measure_again,
    noise_tolerance,
    read_measurement,
)

__all__ = ["Measurement", "MeasurementError", "Validation", "compare", "measure", "read_before"]


@dataclass(frozen=True)
class Validation:
    before: Measurement
    after: Measurement
    problems: list[Any]  # oom_lsp.profiling.report.Mismatch: what the two measured differently
    change: Figures | None  # None: the new run ended before a peak was known
    tolerance: int  # bytes: a profile's run-to-run noise; 0 for an estimate (exact)

    @property
    def broken_after(self) -> list[str]:
        """Why the new run measured nothing comparable (it crashed, the script failed)."""
        return [problem.message for problem in self.problems if problem.refuse and problem.after_run]

    @property
    def refused(self) -> list[str]:
        """Why the two cannot be compared at all."""
        return [problem.message for problem in self.problems if problem.refuse]

    @property
    def warnings(self) -> list[str]:
        return [problem.message for problem in self.problems if not problem.refuse]

    @property
    def within_noise(self) -> bool:
        return self.change is not None and abs(self.change.after - self.change.before) <= self.tolerance

    @property
    def grew(self) -> bool:
        """The peak grew beyond the noise, or the script still runs out of memory."""
        if self.after.ran_out_of_memory:
            return True
        return self.change is not None and self.change.after > self.change.before + self.tolerance


def read_before(path: Path, script: Path) -> Measurement:
    """The measurement a fix is compared with; a profile of another script is refused."""
    before = read_measurement(path)
    if before.kind == "profile" and Path(before.data.script or "").name not in ("", script.name):
        raise MeasurementError(f"{path} is a profile of {before.data.script}, not of {script.name}")
    return before


def measure(
    script: Path,
    before: Measurement,
    *,
    python: str,
    timeout: float,
    out: Path,
    cancel: threading.Event | None = None,
) -> Validation:
    """The measurement `before` came from, taken again on the script as it is now (blocking: the
    editor runs it in a thread, `cancel` stops the run's process group)."""
    after = measure_again(script, before, python=python, timeout=timeout, out=out, cancel=cancel)
    return compare(before, after)


def compare(before: Measurement, after: Measurement) -> Validation:
    """Two measurements side by side (`--after`: no run)."""
    if after.kind != before.kind:
        raise MeasurementError(
            f"--before is a {before.kind} and --after a {after.kind}: compare like with like"
        )
    return Validation(
        before, after, comparison_problems(before, after), figures(before, after), noise_tolerance(before)
    )


def record(validation: Validation, log: Path, display: str, root: Path | None = None) -> str | None:
    """The figures in the fix log's entry of the script that has none yet (the last fix applied
    to it); the entry's id, or None when no entry takes them. With `root` (the project's, when the
    log is the project's own), nothing is written through a link out of it (oom_lsp.safe_files).
    Raises fixlog.FixLogError, OSError."""
    from oom_lsp.llm import fixlog

    if validation.change is None:
        return None
    return fixlog.record_figures(log, display, validation.change, root=root)
