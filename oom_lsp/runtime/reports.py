"""Where the OOM guard writes its report, and what the editor and the terminal say about it.

Pure Python, no torch: the language server and `oom-lsp explain --last` import this module.

The guard writes `<project root>/.oom_lsp/last_oom/`:

* `report.json`  the profile report model (schema v1, `status: "oom"`), plus the extra key
  `failing_frame_tensors` (readers of schema v1 ignore unknown keys);
* `prompt.md`    the seven-section prompt (oom_lsp.llm.prompt) for this error;
* `snapshot.pickle`  a CUDA memory snapshot, when history recording was on;
* `answer.md`    the model's diagnosis, when `ask=True` and AI fixes are enabled.

The project root is the `project_root` argument, else the `OOM_LSP_PROJECT_ROOT` environment
variable, else the nearest folder holding a pyproject.toml or a .git above the script, else the
current folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from oom_lsp.profiling.oom_messages import describe
from oom_lsp.profiling.report import Report, ReportError, read_report
from oom_lsp.units import short_bytes

ROOT_ENVIRONMENT_VARIABLE = "OOM_LSP_PROJECT_ROOT"
LAST_OOM_DIR = Path(".oom_lsp") / "last_oom"
REPORT_NAME = "report.json"
PROMPT_NAME = "prompt.md"
ANSWER_NAME = "answer.md"
SNAPSHOT_NAME = "snapshot.pickle"
TENSORS_KEY = "failing_frame_tensors"
_ROOT_MARKERS = ("pyproject.toml", ".git")


def find_project_root(start: Path | str | None, environ: dict[str, str] | None = None) -> Path:
    """The project root for a script at `start` (a file or a folder; None: the current folder)."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    configured = environ.get(ROOT_ENVIRONMENT_VARIABLE)
    if configured:
        return Path(configured).expanduser().resolve()
    folder = Path(os.path.abspath(start)) if start is not None else Path.cwd()
    if not folder.is_dir():
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        if any((candidate / marker).exists() for marker in _ROOT_MARKERS):
            return candidate
    return Path.cwd()


def last_oom_dir(root: Path) -> Path:
    return root / LAST_OOM_DIR


class OomDiagnostic(NamedTuple):
    """An Error diagnostic for the editor: where the OOM happened and what to say there."""

    path: str  # the failing user-code frame's file, as the script saw it (absolute when run by path)
    line: int  # 1-based
    message: str  # "CUDA out of memory here: tried to allocate 1.5 GiB with 1.1 GiB free, batch 64"
    facts: dict[str, Any]


def diagnostic_message(report: Report) -> str | None:
    """The one-line diagnostic text for an OOM report; None when it has no OOM."""
    if report.oom is None:
        return None
    error = report.oom.error
    allocation = []
    if error.tried_to_allocate is not None:
        allocation.append(f"tried to allocate {short_bytes(error.tried_to_allocate)}")
    if error.free is not None:
        allocation.append(
            f"with {short_bytes(error.free)} free" if allocation else f"{short_bytes(error.free)} free"
        )
    details = [" ".join(allocation)] if allocation else []
    if report.batch_size is not None:
        details.append(f"batch {report.batch_size}")
    head = f"{error.backend.upper()} out of memory here"
    return head + (": " + ", ".join(details) if details else "")


def latest_oom_diagnostic(report_path: Path | str) -> OomDiagnostic | None:
    """The diagnostic for the OOM report at `report_path` (`.oom_lsp/last_oom/report.json`).

    None when the report records no OOM or no user-code frame to put it on. Raises
    ReportError when the file cannot be read as a report (missing, half-written by an
    older writer, newer schema). `facts` holds the numbers a code action or hover needs
    (sizes in bytes) and the paths of the files written beside the report.
    """
    report_path = Path(report_path)
    report = read_report(report_path)
    message = diagnostic_message(report)
    if report.oom is None or message is None:
        return None
    failing = report.oom.error.failing_frame
    if failing is None:
        return None
    error = report.oom.error
    folder = report_path.parent
    facts: dict[str, Any] = {
        "report": str(report_path),
        "prompt": str(folder / PROMPT_NAME) if (folder / PROMPT_NAME).is_file() else None,
        "answer": str(folder / ANSWER_NAME) if (folder / ANSWER_NAME).is_file() else None,
        "snapshot": (str(folder / report.artifacts.snapshot) if report.artifacts.snapshot else None),
        "backend": error.backend,
        "device": error.device,
        "function": failing.function,
        "code": failing.code,
        "tried_to_allocate": error.tried_to_allocate,
        "free": error.free,
        "total_capacity": error.total_capacity or report.device.total_memory,
        "batch_size": report.batch_size,
        "input_shape": report.input_shape,
        "peak_allocated": report.peak_allocated,
        "peak_reserved": report.peak_reserved,
        "script": report.script,
        "error": error.to_dict(),
    }
    return OomDiagnostic(failing.file, failing.line, message, facts)


def read_tensors(report_path: Path) -> list[dict[str, Any]]:
    """The guard's table of tensors in the failing frame (empty for other reports)."""
    try:
        data = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{report_path}: {exc}") from exc
    tensors = data.get(TENSORS_KEY) if isinstance(data, dict) else None
    return tensors if isinstance(tensors, list) else []


def run_explain_last(start: Path, output_format: str, out: TextIO, err: TextIO) -> int:
    """`oom-lsp explain --last`: the guard's latest report in the project around `start`, as the
    editor shows it. Exit 0 when printed, 1 when there is none, 2 when it cannot be read."""
    report_path = last_oom_dir(find_project_root(start)) / REPORT_NAME
    if not report_path.is_file():
        print(
            f"no out-of-memory report at {report_path} (oom_guard writes one when an OOM happens)", file=err
        )
        return 1
    try:
        report = read_report(report_path)
        tensors = read_tensors(report_path)
        diagnostic = latest_oom_diagnostic(report_path)
    except ReportError as problem:
        print(f"oom-lsp: {problem}", file=err)
        return 2
    if report.oom is None:
        print(f"oom-lsp: {report_path} records no out-of-memory error", file=err)
        return 2
    if output_format == "json":
        print(
            json.dumps(
                {
                    "report": str(report_path),
                    "diagnostic": diagnostic._asdict() if diagnostic else None,
                    "ooms": [report.oom.error.to_dict()],
                    TENSORS_KEY: tensors,
                },
                indent=2,
            ),
            file=out,
        )
        return 0
    if diagnostic is not None:
        print(f"{diagnostic.path}:{diagnostic.line}: {diagnostic.message}", file=out)
    else:
        print(diagnostic_message(report), file=out)
    for label, value in describe(report.oom.error):
        print(f"  {label}: {value}", file=out)
    if report.peak_allocated is not None:
        reserved = (
            f", reserved {short_bytes(report.peak_reserved)}" if report.peak_reserved is not None else ""
        )
        print(f"  peak allocated: {short_bytes(report.peak_allocated)}{reserved}", file=out)
    if report.batch_size is not None:
        print(f"  batch size: {report.batch_size} (input shape {report.input_shape})", file=out)
    if tensors:
        print("  tensors in the failing frame:", file=out)
        for tensor in tensors:
            print(f"    {describe_tensor(tensor)}", file=out)
    for note in report.notes:
        print(f"  note: {note}", file=out)
    folder = report_path.parent
    written = [name for name in (PROMPT_NAME, ANSWER_NAME, SNAPSHOT_NAME) if (folder / name).is_file()]
    print(f"report: {report_path}" + (f" (also {', '.join(written)})" if written else ""), file=out)
    return 0


def describe_tensor(tensor: dict[str, Any]) -> str:
    """'x: float32[64, 3, 224, 224] on cuda:0, 36.75 MiB (requires grad)'."""
    shape = ", ".join(str(size) for size in tensor.get("shape", []))
    grad = " (requires grad)" if tensor.get("requires_grad") else ""
    return (
        f"{tensor.get('name')}: {tensor.get('dtype')}[{shape}] on {tensor.get('device')}, "
        f"{short_bytes(int(tensor.get('bytes', 0)))}{grad}"
    )
