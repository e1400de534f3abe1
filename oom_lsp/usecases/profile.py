"""Profile: run a training script for a few optimizer steps under the user's interpreter and
report its memory (the peak per step, the top lines and modules, an OOM where it happened).

`oom-lsp profile` (oom_lsp.cli.profile) and the editor's `oom-lsp.profile`
(oom_lsp.server.profiling) describe the run with a `ProfileRequest` and call `run_profile`; the
outcome says whether the run measured anything and, for an OOM, what to do next (the same
advice `oom-lsp explain` gives). The run is a process group of its own, killed on cancel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.profiling.report import Report
from oom_lsp.profiling.runner import ProfileError, ProfileRequest, ProfileRun

__all__ = ["ProfileError", "ProfileOutcome", "ProfileRequest", "run_profile"]

ENDED = ("completed", "finished", "exited")  # the script ran to its end or to the steps asked
# `oom-lsp profile`'s default output (--out .oom_lsp/profile): the last profile of the project,
# what a fix is compared with when nothing else was measured.
LAST_PROFILE = Path(".oom_lsp/profile/report.json")


@dataclass(frozen=True)
class ProfileOutcome:
    report: Report
    advice: list[str] = field(default_factory=list)  # next steps after an OOM

    @property
    def completed_steps(self) -> int:
        return sum(1 for step in self.report.steps if step.complete)

    @property
    def no_measurement(self) -> str | None:
        """Why a run that ended measured nothing (it stopped before its first optimizer step)."""
        report = self.report
        if report.status in ENDED and not self.completed_steps:
            ended = f"exited with code {report.exit_code}" if report.status == "exited" else "ended"
            return f"no measurement: the script {ended} before its first optimizer step"
        return None

    @property
    def stopped(self) -> str | None:
        """Why a run that timed out, crashed or failed (with no OOM) stopped, in one line."""
        report = self.report
        if report.status in ("timeout", "crashed", "error") and report.oom is None:
            return "; ".join([*([report.error] if report.error else []), *report.notes]) or report.status
        return None


def run_profile(
    request: ProfileRequest,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
) -> ProfileOutcome:
    """Run the profile to its end (`cancel.set()` from another thread stops it). Raises
    ProfileError when it cannot start (no torch there, no such interpreter) or the advice needs
    a configuration that is broken (oom_lsp.config.ConfigError)."""
    from oom_lsp.usecases.explain import next_steps

    run = ProfileRun(request, on_progress, on_output, cancel=cancel)
    try:
        run.start()
        report = run.wait()
    except BaseException:  # Ctrl-C, a failure to start: no empty results folder is left behind
        run.remove_created_folders()
        raise
    return ProfileOutcome(report, next_steps(report.oom.error) if report.oom else [])
