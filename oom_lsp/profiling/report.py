"""The profiling report: what `oom-lsp profile` writes to report.json (schema_version 1).

Plain dataclasses with `to_dict` / `from_dict`; no torch import, so the parent process,
the language server and the in-script OOM guard read and write the same model. The
schema is described field by field in docs/profiling.md. Sizes are bytes, times seconds.

Compatibility: readers accept unknown keys (a newer writer may add fields) and refuse a
report whose `schema_version` is newer than the one they know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.profiling.oom_messages import OomError

SCHEMA_VERSION = 1


class ReportError(ValueError):
    """A file that is not a report this version can read."""


@dataclass
class DeviceInfo:
    type: str  # "cuda", "cpu", "mps", ...
    name: str | None = None  # "NVIDIA H100 80GB HBM3"; None on the CPU
    index: int | None = None
    total_memory: int | None = None  # bytes; None where unknown (CPU)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "index": self.index, "total_memory": self.total_memory}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceInfo:
        return cls(data["type"], data.get("name"), data.get("index"), data.get("total_memory"))


@dataclass
class StepStats:
    """One optimizer step: from the end of the previous step (or the start of the script) to its end."""

    index: int  # 1-based
    peak_allocated: int
    peak_reserved: int | None = None  # CUDA caching allocator segments; None on the CPU
    wall_time: float | None = None
    complete: bool = True  # False: the run ended inside this step (OOM, error, exit, end of script)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "wall_time": self.wall_time,
            "complete": self.complete,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepStats:
        return cls(
            int(data["index"]), int(data["peak_allocated"]), data.get("peak_reserved"), data.get("wall_time"),
            bool(data.get("complete", True)),
        )


@dataclass
class LineUsage:
    """Bytes live at the overall peak that were allocated by this user-code line.

    A line inside a function called from the training loop counts the allocations of
    everything it called (library code included) that no deeper user line claims.
    """

    file: str
    line: int
    bytes: int
    function: str | None = None
    code: str | None = None
    allocations: int = 0  # live blocks counted

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "bytes": self.bytes,
            "function": self.function,
            "code": self.code,
            "allocations": self.allocations,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LineUsage:
        return cls(
            data["file"], int(data["line"]), int(data["bytes"]), data.get("function"), data.get("code"),
            int(data.get("allocations", 0)),
        )


@dataclass
class ModuleUsage:
    """Bytes live at the overall peak allocated inside this module's forward (innermost module wins)."""

    name: str  # qualified name from the first root seen, e.g. "Net.encoder.layers.0.attn"
    type: str  # class name
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModuleUsage:
        return cls(data["name"], data["type"], int(data["bytes"]))


@dataclass
class OomFailure:
    """The out-of-memory error that ended the run, with the allocator's state when it was caught."""

    error: OomError
    memory_state: dict[str, int] = field(default_factory=dict)  # allocated / reserved / peak_* (CUDA)
    step: int | None = None  # the step that was running (1-based)

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error.to_dict(), "memory_state": dict(self.memory_state), "step": self.step}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OomFailure:
        return cls(OomError.from_dict(data["error"]), dict(data.get("memory_state", {})), data.get("step"))


@dataclass
class Artifacts:
    """Files written beside report.json, relative to its folder; None when not produced."""

    trace: str | None = None  # chrome trace (Perfetto, chrome://tracing)
    stacks: str | None = None  # "frame;frame;... bytes": memory live at the peak per stack (flame graph)
    snapshot: str | None = None  # CUDA memory snapshot pickle (pytorch.org/memory_viz)
    source: str | None = None  # `profile --import`: the file the report was made from

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "stacks": self.stacks,
            "snapshot": self.snapshot,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Artifacts:
        return cls(data.get("trace"), data.get("stacks"), data.get("snapshot"), data.get("source"))


# How a run ended. "completed": the requested steps ran and the harness stopped the script;
# "finished": the script ended by itself (fewer steps than requested, or no optimizer at all);
# "exited": the script called sys.exit; "oom": out of memory; "error": another exception;
# "timeout" / "cancelled": killed by the parent; "crashed": the interpreter died without a report.
STATUSES = ("completed", "finished", "exited", "oom", "error", "timeout", "cancelled", "crashed", "imported")


@dataclass
class Report:
    script: str | None  # absolute path of the profiled script; None for an imported profile
    status: str
    device: DeviceInfo
    argv: list[str] = field(default_factory=list)
    torch_version: str | None = None
    cuda_version: str | None = None
    python_version: str | None = None
    measured_with: str | None = None  # "cuda-allocator" or "cpu-profiler" or the import format
    steps_requested: int | None = None
    steps: list[StepStats] = field(default_factory=list)
    peak_allocated: int | None = None  # over the whole run (before the first step included)
    peak_reserved: int | None = None
    top_lines: list[LineUsage] = field(default_factory=list)
    top_modules: list[ModuleUsage] = field(default_factory=list)
    batch_size: int | None = None  # first dimension of the first tensor given to the outermost module
    input_shape: list[int] | None = None
    memory_summary: str | None = None  # torch.cuda.memory_summary() at the end (CUDA)
    oom: OomFailure | None = None
    error: str | None = None  # "ExceptionType: message" for a non-OOM failure
    exit_code: int | None = None  # sys.exit code for "exited", the process return code otherwise
    wall_time: float | None = None
    artifacts: Artifacts = field(default_factory=Artifacts)
    output_tail: str | None = None  # last lines of the script's stdout+stderr
    notes: list[str] = field(default_factory=list)  # what could not be measured, and why

    @property
    def steps_reached(self) -> int:
        """Optimizer steps that ran to their end."""
        return sum(1 for step in self.steps if step.complete)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "script": self.script,
            "argv": list(self.argv),
            "status": self.status,
            "device": self.device.to_dict(),
            "torch_version": self.torch_version,
            "cuda_version": self.cuda_version,
            "python_version": self.python_version,
            "measured_with": self.measured_with,
            "steps_requested": self.steps_requested,
            "steps": [s.to_dict() for s in self.steps],
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "top_lines": [u.to_dict() for u in self.top_lines],
            "top_modules": [m.to_dict() for m in self.top_modules],
            "batch_size": self.batch_size,
            "input_shape": self.input_shape,
            "memory_summary": self.memory_summary,
            "oom": self.oom.to_dict() if self.oom else None,
            "error": self.error,
            "exit_code": self.exit_code,
            "wall_time": self.wall_time,
            "artifacts": self.artifacts.to_dict(),
            "output_tail": self.output_tail,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        if not isinstance(data, dict) or "schema_version" not in data:
            raise ReportError("not an oom-lsp report (no schema_version)")
        version = data["schema_version"]
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ReportError(f"report schema_version {version!r} is newer than this oom-lsp reads ({SCHEMA_VERSION})")
        try:
            return cls(
                script=data.get("script"),
                argv=list(data.get("argv", [])),
                status=data["status"],
                device=DeviceInfo.from_dict(data["device"]),
                torch_version=data.get("torch_version"),
                cuda_version=data.get("cuda_version"),
                python_version=data.get("python_version"),
                measured_with=data.get("measured_with"),
                steps_requested=data.get("steps_requested"),
                steps=[StepStats.from_dict(s) for s in data.get("steps", [])],
                peak_allocated=data.get("peak_allocated"),
                peak_reserved=data.get("peak_reserved"),
                top_lines=[LineUsage.from_dict(u) for u in data.get("top_lines", [])],
                top_modules=[ModuleUsage.from_dict(m) for m in data.get("top_modules", [])],
                batch_size=data.get("batch_size"),
                input_shape=data.get("input_shape"),
                memory_summary=data.get("memory_summary"),
                oom=OomFailure.from_dict(data["oom"]) if data.get("oom") else None,
                error=data.get("error"),
                exit_code=data.get("exit_code"),
                wall_time=data.get("wall_time"),
                artifacts=Artifacts.from_dict(data.get("artifacts") or {}),
                output_tail=data.get("output_tail"),
                notes=list(data.get("notes", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"malformed report: {exc!r}") from exc

    def write(self, path: Path, root: Path | None = None) -> None:
        """Atomically (readers, the editor watching the folder, never see half a file) and
        through no symbolic link out of `root` (oom_lsp.safe_files)."""
        from oom_lsp import safe_files

        safe_files.write_file(path, json.dumps(self.to_dict(), indent=2) + "\n", root=root)


# Runs whose peaks mean nothing to compare: the script failed, or was stopped from outside.
_BROKEN = ("error", "crashed", "timeout", "cancelled")


@dataclass(frozen=True)
class Mismatch:
    """Why two reports do not measure the same thing. `refuse`: comparing their peaks would
    mislead; otherwise a warning. `after_run`: the trouble is the "after" run's own outcome."""

    message: str
    refuse: bool
    after_run: bool = False


def mismatches(before: Report, after: Report) -> list[Mismatch]:
    """What two reports of `compare` (or `validate`) measured differently."""
    found = []
    for label, report in (("before", before), ("after", after)):
        steps = f"{report.steps_reached} optimizer step{'' if report.steps_reached == 1 else 's'}"
        if report.status in _BROKEN:
            detail = f": {report.error}" if report.error else ""
            message = f"the {label} run ended `{report.status}` after {steps}{detail}"
            found.append(Mismatch(message, True, label == "after"))
        elif report.status == "oom":
            message = f"the {label} run ran out of memory after {steps}: its peak is where it stopped"
            found.append(Mismatch(message, False))
        elif report.status != "imported" and not report.steps_reached:
            message = f"the {label} run measured no optimizer step (`{report.status}`)"
            found.append(Mismatch(message, True, label == "after"))
    if before.script and after.script and Path(before.script).resolve() != Path(after.script).resolve():
        message = f"the reports are of different scripts: {before.script} and {after.script}"
        found.append(Mismatch(message, True))
    if before.device.type != after.device.type:
        message = f"measured on different devices: {before.device.type} and {after.device.type}"
        found.append(Mismatch(message, True))
    if before.argv != after.argv and before.status != "imported" and after.status != "imported":
        found.append(
            Mismatch(f"the script's arguments differ: {' '.join(before.argv) or '(none)'} and "
                     f"{' '.join(after.argv) or '(none)'}", False)
        )
    if None not in (before.batch_size, after.batch_size) and before.batch_size != after.batch_size:
        found.append(Mismatch(f"batch size {before.batch_size} before and {after.batch_size} after", False))
    if before.steps_reached and after.steps_reached and before.steps_reached != after.steps_reached:
        found.append(
            Mismatch(f"{before.steps_reached} optimizer steps before and {after.steps_reached} after", False)
        )
    return found


def read_report(path: Path) -> Report:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: {exc}") from exc
    return Report.from_dict(data)
