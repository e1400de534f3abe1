"""The AI fix, the whole sequence: what is asked (a finding, an OOM error, a line, with the
profile or estimate and the environment that go with it), the model's answer checked into an
edit, and the fix log's entry once the edit is applied.

`oom-lsp fix --ai` and `oom-lsp prompt` (oom_lsp.cli.ai) and the editor's "Ask AI to fix" and
`oom-lsp.askAi` (oom_lsp.server.ai) build the request with `fix_request`, ask with `propose`,
and log with `log_applied`. Each face applies the edit its own way (the file written back in its
encoding; a versioned WorkspaceEdit the user confirms) and only after checking that the text is
still the one the model was asked about (`still_current`).

Nothing is sent unless the user enabled AI fixes (oom_lsp.llm.settings); the prompt carries
only the code the fix needs, secrets redacted (oom_lsp.llm.prompt).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp.llm.prompt import FixRequest, PromptError

__all__ = [
    "FixOutcome",
    "FixRequest",
    "PromptError",
    "fix_request",
    "log_applied",
    "propose",
    "still_current",
]


@dataclass(frozen=True)
class FixOutcome:
    """A proposal with a checked edit, or the message why there is none."""

    message: str  # the changelog of the edit; else why there is no edit, for the user
    proposal: Any = None  # oom_lsp.llm.fixer.Proposal with an edit

    @property
    def has_edit(self) -> bool:
        return self.proposal is not None and self.proposal.edit is not None


def fix_request(
    path: str,
    text: str,
    *,
    lint_settings: Any = None,
    line: int | None = None,
    finding: Any = None,
    oom: Any = None,
    report: Any = None,
    estimate: Any = None,
    environment: Any = None,
    gpu_memory: int | None = None,
    version: int | None = None,
    with_finding: bool = True,
) -> FixRequest:
    """What to ask about. Without a line or a finding, the line is the error's, the profile's or
    else the file's first finding (analysed with `lint_settings`); with `with_finding`, the
    finding on that line goes with it (the editor, asked about a diagnostic, knows its target).
    Raises PromptError when nothing points at a line."""
    request = FixRequest(
        path=path,
        text=text,
        version=version,
        line=line,
        finding=finding,
        oom=oom,
        report=report,
        estimate=estimate,
        environment=environment,
        gpu_memory=gpu_memory,
        lint_settings=lint_settings,
    )
    if finding is not None or not with_finding:
        return request
    from oom_lsp.analysis.engine import analyze

    findings = [f for f in analyze(text, lint_settings, path) if f.code != "OOM000"] if lint_settings else []
    try:
        target = request.target_line()
    except PromptError:
        if not findings:
            raise
        target = findings[0].line
    return dataclasses.replace(
        request, line=target, finding=next((f for f in findings if f.line == target), None)
    )


def environment_of(report: Any) -> Any:
    """The environment of a failed run's report (the runtime guard's: maybe another machine)."""
    from oom_lsp.llm.context import EnvironmentFacts

    device = report.device
    return EnvironmentFacts(
        python=report.python_version,
        torch=report.torch_version,
        cuda=report.cuda_version,
        gpu_name=device.name if device.type == "cuda" else None,
        gpu_memory=device.total_memory if device.type == "cuda" else None,
    )


async def propose(
    request: FixRequest,
    settings: Any,
    on_progress: Callable[[str], None] | None = None,
    cancel: asyncio.Event | None = None,
    stream: bool = False,
) -> FixOutcome:
    """Ask the configured model and check its edit (a unique match in the code sent, a result
    that parses); never raises for a user-facing problem."""
    from oom_lsp.llm.fixer import FixError, propose_fix

    result = await propose_fix(request, settings, on_progress=on_progress, cancel=cancel, stream=stream)
    if isinstance(result, FixError):
        return FixOutcome(result.message)
    if result.edit is None:
        diagnosis = result.diagnosis()
        return FixOutcome(f"No edit: {result.problem}." + (f"\n{diagnosis}" if diagnosis else ""), result)
    return FixOutcome(result.changelog, result)


def still_current(current: str, outcome: FixOutcome) -> bool:
    """Whether the text is still the one the model was asked about (else nothing is applied)."""
    return outcome.proposal is not None and current == outcome.proposal.request.text


def log_applied(proposal: Any, log: Path, display: str, host: str, root: Path | None) -> str | None:
    """The applied fix's entry in the fix log (`root`: the log must stay inside the project;
    None for a log the user named). None when written, else why not (the fix stays applied)."""
    from oom_lsp.llm import fixlog

    try:
        fixlog.append_entry(log, proposal.log_entry(display, host), root)
    except (fixlog.FixLogError, OSError) as error:
        return error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return None
