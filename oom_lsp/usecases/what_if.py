"""The what-if: the step traced as it is, then once per change a user could make (each quick fix
of the script's findings, bf16 autocast, checkpointing per block, half the micro-batch with
accumulation, a fused optimizer, Adafactor), each change's predicted peak and saving.

`oom-lsp estimate --what-if` (oom_lsp.cli.what_if) and the editor's `oom-lsp.whatIf`
(oom_lsp.server.what_if) read the script with `read_script`, take the findings whose fixes are
measured (the CLI analyses the file; the editor takes those its diagnostics carry, so a quick
fix finds its row) and call `run_what_if`, which traces every change with the estimate's own
options and keeps the record the next estimate compares itself with.
"""

from __future__ import annotations

from pathlib import Path

from oom_lsp.analysis.findings import Finding
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.estimate.results import WhatIfTable
from oom_lsp.estimate.whatif_record import save_record
from oom_lsp.usecases.estimate import (
    EstimateInputError,
    EstimateRequest,
    Listener,
    check_distributed,
    options_for,
)


class UnreadableScript(EstimateInputError):
    """The script's text cannot be decoded: `place` is "train.py:3:7" (1-based column)."""

    def __init__(self, script: Path, line: int, column: int, message: str) -> None:
        super().__init__(f"{script}:{line}:{column + 1}: {message}")
        self.line, self.column, self.problem = line, column + 1, message


def read_script(script: Path) -> tuple[str, str]:
    """The script's text as Python reads it (BOM and coding cookie honoured) and its encoding,
    which the edited copies are written in."""
    from oom_lsp.checker import decode_source

    try:
        decoded = decode_source(script.read_bytes())
    except OSError as error:
        raise EstimateInputError(f"{script}: {error.strerror or error}") from None
    if decoded.text is None:
        line, column, message = decoded.problem
        raise UnreadableScript(script, line, column, message)
    return decoded.text, decoded.encoding


def run_what_if(
    request: EstimateRequest,
    text: str,
    encoding: str,
    findings: list[Finding],
    settings: LintSettings,
    listener: Listener | None = None,
) -> WhatIfTable:
    """The table for the script's `text` (as on disk), and its record kept in the project."""
    from oom_lsp.config import ConfigError, ConfigResolver
    from oom_lsp.estimate.whatif import what_if

    listener = listener or Listener()
    if request.world_sizes and len(request.world_sizes) > 1:
        raise EstimateInputError("the what-if traces one world size, not a list")
    check_distributed(request, request.script)
    options = options_for(request, request.script, listener)
    table = what_if(options, text, findings, settings, listener.message, encoding)
    root = request.root
    if root is None:
        try:
            root = ConfigResolver().resolve(request.script).root
        except ConfigError:
            return table  # no project to keep the record in
    save_record(root, table)
    return table
