"""What the OOM guard records, inside the process that ran out of memory.

Every probe (the allocator's figures, the device, the snapshot, the locals of the failing
frame, the prompt, the model) is read on its own and catches only the errors that probe can
raise; what could not be read becomes a note in the report instead of an exception. Nothing
here allocates device memory: the figures are the CUDA allocator's counters, the shapes are
read from tensor metadata.

Files, in the order they are written (report.json last: the editor watches for it):
prompt.md, snapshot.pickle (history on), report.json, then answer.md (`ask=True`).
"""

from __future__ import annotations

import asyncio
import json
import linecache
import os
import platform
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp import safe_files
from oom_lsp.profiling.oom_messages import Frame, OomError, from_exception, is_user_file
from oom_lsp.profiling.report import DeviceInfo, OomFailure, Report
from oom_lsp.runtime.reports import (
    ANSWER_NAME,
    PROMPT_NAME,
    REPORT_NAME,
    SNAPSHOT_NAME,
    TENSORS_KEY,
    describe_tensor,
    find_project_root,
    last_oom_dir,
)
from oom_lsp.units import short_bytes

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent) + os.sep
MAX_TENSORS = 32
PROMPT_TENSORS = 8
# Local names that hold a model's input, most telling first; their leading dimension is the batch.
INPUT_NAMES = (
    "inputs",
    "input",
    "input_ids",
    "pixel_values",
    "images",
    "imgs",
    "x",
    "xb",
    "X",
    "src",
    "tokens",
    "features",
    "samples",
    "data",
    "batch",
)
ASK_TIMEOUT_MARGIN = 30.0  # seconds beyond the request timeout (retries with backoff) before giving up


@dataclass(frozen=True)
class CaptureOptions:
    project_root: Path | None
    out: Path | None
    snapshot: bool  # memory history was on: dump it
    ask: bool
    log: Callable[[str], None]


def _is_recorded_file(path: str) -> bool:
    return is_user_file(path) and not path.startswith(_PACKAGE_ROOT)


def _traceback_entries(exc: BaseException) -> list[Any]:
    entries = []
    tb = exc.__traceback__
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def _frames(entries: list[Any]) -> list[Frame]:
    frames = []
    for entry in entries:
        code = entry.tb_frame.f_code
        text = linecache.getline(code.co_filename, entry.tb_lineno).strip() or None
        frames.append(Frame(code.co_filename, entry.tb_lineno, code.co_name, text))
    return frames


def _script_path() -> Path | None:
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    return Path(os.path.abspath(file)) if file else None


def record_oom(exc: BaseException, options: CaptureOptions) -> Path:
    """Write the report (and the prompt, snapshot, answer) for `exc`; return report.json's path."""
    notes: list[str] = []
    entries = [
        entry for entry in _traceback_entries(exc) if _is_recorded_file(entry.tb_frame.f_code.co_filename)
    ]
    frames = _frames(_traceback_entries(exc))
    oom = from_exception(exc, [frame for frame in frames if not frame.file.startswith(_PACKAGE_ROOT)])
    if oom is None:  # a torch.OutOfMemoryError whose message this version does not know
        kind = type(exc)
        oom = OomError(
            backend="cuda",
            message=str(exc),
            exception_type=f"{kind.__module__}.{kind.__qualname__}",
            frames=tuple(frame for frame in frames if _is_recorded_file(frame.file)),
        )
        notes.append("the error message is in a format oom-lsp does not know: its figures were not read")

    script = _script_path()
    # The outermost user frame is the user's script even under a launcher (torchrun, python -m ...).
    outermost = oom.frames[0].file if oom.frames else None
    root = options.project_root or find_project_root(outermost or script)
    out = options.out or last_oom_dir(root)
    # A cloned repository's committed `.oom_lsp/last_oom` link out of it is not written through.
    safe_files.make_folder(out, root)
    for stale in (ANSWER_NAME, SNAPSHOT_NAME, PROMPT_NAME):
        (out / stale).unlink(missing_ok=True)

    torch = sys.modules.get("torch")
    report = Report(
        script=str(script) if script else None,
        argv=list(sys.argv[1:]),
        status="oom",
        device=DeviceInfo(oom.backend if oom.backend != "hip" else "cuda"),
        python_version=platform.python_version(),
    )
    memory_state: dict[str, int] = {}
    if torch is None:
        notes.append("torch was not imported: no allocator figures")
    else:
        report.torch_version = str(torch.__version__)
        report.cuda_version = getattr(torch.version, "cuda", None)
        if oom.backend in ("cuda", "hip"):
            memory_state = _cuda_figures(torch, oom, report, notes)
        else:
            report.device = DeviceInfo(oom.backend)
            notes.append(
                f"{oom.backend.upper()} out of memory: the allocator figures are the error message's"
            )
        if options.snapshot:
            _dump_snapshot(torch, out, report, notes)

    tensors = _tensors_of(entries[-1].tb_frame, torch) if entries and torch is not None else []
    if not entries:
        notes.append("no user-code frame in the traceback: no tensors recorded")
    batch = _batch_size(entries, torch) if torch is not None else None
    if batch is not None:
        report.batch_size, report.input_shape = batch[0], batch[1]
    report.oom = OomFailure(oom, memory_state)

    prepared = _prepare_request(oom, report, tensors, batch, memory_state, notes)
    if prepared is not None:
        _write_prompt(prepared[0], out, notes)
    report.notes = notes
    report_path = out / REPORT_NAME
    _write_report(report, tensors, report_path)
    options.log(
        f"oom-lsp: out-of-memory report written to {report_path}"
        + (f" (prompt: {PROMPT_NAME})" if (out / PROMPT_NAME).is_file() else "")
    )
    if options.ask and prepared is not None:
        _ask(*prepared, out, options.log)
    return report_path


def _cuda_figures(torch: Any, oom: OomError, report: Report, notes: list[str]) -> dict[str, int]:
    cuda = torch.cuda
    try:
        if not cuda.is_available():
            notes.append("the error names a CUDA device but torch sees none: no allocator figures")
            return {}
        index = int(oom.device.split(":")[1]) if oom.device and ":" in oom.device else cuda.current_device()
        properties = cuda.get_device_properties(index)
        report.device = DeviceInfo("cuda", properties.name, index, int(properties.total_memory))
        state = {
            "allocated": int(cuda.memory_allocated(index)),
            "reserved": int(cuda.memory_reserved(index)),
            "max_allocated": int(cuda.max_memory_allocated(index)),
            "max_reserved": int(cuda.max_memory_reserved(index)),
        }
        report.peak_allocated, report.peak_reserved = state["max_allocated"], state["max_reserved"]
        report.measured_with = "cuda-allocator"
        report.memory_summary = cuda.memory_summary(index)
        return state
    except (RuntimeError, AssertionError, ValueError) as problem:  # a broken CUDA context after a fatal error
        notes.append(f"the CUDA allocator could not be read: {problem}")
        return {}


def _dump_snapshot(torch: Any, out: Path, report: Report, notes: list[str]) -> None:
    try:
        temporary = safe_files.temporary_file(out, SNAPSHOT_NAME, root=out)
        torch.cuda.memory._dump_snapshot(str(temporary))
        safe_files.publish(temporary, out / SNAPSHOT_NAME, root=out)
    except (RuntimeError, OSError) as problem:
        notes.append(f"the memory snapshot could not be written: {problem}")
        return
    report.artifacts.snapshot = SNAPSHOT_NAME


def _tensor_entry(name: str, value: Any, torch: Any) -> dict[str, Any] | None:
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return {
            "name": name,
            "shape": [int(size) for size in value.shape],
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
            "bytes": int(value.nelement()) * int(value.element_size()),
            "requires_grad": bool(value.requires_grad),
            "parameter": isinstance(value, torch.nn.Parameter),
        }
    except (RuntimeError, TypeError, NotImplementedError):  # nested or symbolic shapes, exotic subclasses
        return None


def _named_values(frame_locals: dict[str, Any]) -> list[tuple[str, Any]]:
    """Locals, and one level into the lists, tuples and dicts among them (`batch[0]`, `batch['x']`)."""
    named = []
    for name, value in frame_locals.items():
        named.append((name, value))
        if isinstance(value, (list, tuple)):
            named.extend((f"{name}[{index}]", item) for index, item in enumerate(value[:MAX_TENSORS]))
        elif isinstance(value, dict):
            named.extend((f"{name}[{key!r}]", item) for key, item in list(value.items())[:MAX_TENSORS])
    return named


def _tensors_of(frame: Any, torch: Any) -> list[dict[str, Any]]:
    found = [
        entry
        for name, value in _named_values(dict(frame.f_locals))
        if (entry := _tensor_entry(name, value, torch))
    ]
    found.sort(key=lambda entry: (-entry["bytes"], entry["name"]))
    return found[:MAX_TENSORS]


def _leading_tensor(value: Any, torch: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.dim() > 0 else None
    if isinstance(value, (list, tuple)) and value:
        return _leading_tensor(value[0], torch) if isinstance(value[0], torch.Tensor) else None
    if isinstance(value, dict):
        for key in INPUT_NAMES:
            if isinstance(value.get(key), torch.Tensor):
                return _leading_tensor(value[key], torch)
    return None


def _batch_size(entries: list[Any], torch: Any) -> tuple[int, list[int], str] | None:
    """The leading dimension of the input-like tensor nearest the failure: a `forward`'s first
    argument, else the first local named like an input, from the failing frame outwards."""
    for entry in reversed(entries):
        frame = entry.tb_frame
        code = frame.f_code
        names = list(INPUT_NAMES)
        if code.co_name == "forward" and code.co_argcount >= 2:
            names.insert(0, code.co_varnames[1])
        frame_locals = frame.f_locals
        for name in names:
            if name in frame_locals:
                tensor = _leading_tensor(frame_locals[name], torch)
                if tensor is None:
                    continue
                try:
                    shape = [int(size) for size in tensor.shape]
                except (RuntimeError, TypeError, NotImplementedError):  # nested or symbolic shapes
                    continue
                return shape[0], shape, name
    return None


def _prompt_file(oom: OomError) -> Frame | None:
    """The frame whose file the prompt shows: the innermost user frame outside a `forward`,
    where the batch size, autocast and what is kept are decided (as oom_lsp.llm.prompt does)."""
    outside_forward = [frame for frame in oom.frames if frame.function != "forward"]
    return (outside_forward or list(oom.frames) or [None])[-1]


def _runtime_facts(
    tensors: list[dict[str, Any]],
    batch: tuple[int, list[int], str] | None,
    memory_state: dict[str, int],
    failing: Frame | None,
) -> tuple[str, ...]:
    facts = []
    if memory_state:
        facts.append(
            f"Peak allocated {short_bytes(memory_state['max_allocated'])}, peak reserved "
            f"{short_bytes(memory_state['max_reserved'])} (torch.cuda.max_memory_allocated/reserved); "
            f"allocated {short_bytes(memory_state['allocated'])}, "
            f"reserved {short_bytes(memory_state['reserved'])} at the failure"
        )
    if batch is not None:
        facts.append(
            f"Batch size at the failure: {batch[0]} (leading dimension of `{batch[2]}`, shape {batch[1]})"
        )
    if tensors and failing is not None:
        facts.append(
            f"Largest tensors in `{failing.function}` ({Path(failing.file).name}:{failing.line}) at the failure: "
            + "; ".join(describe_tensor(tensor) for tensor in tensors[:PROMPT_TENSORS])
        )
    return tuple(facts)


def _prepare_request(
    oom: OomError,
    report: Report,
    tensors: list[dict[str, Any]],
    batch: tuple[int, list[int], str] | None,
    memory_state: dict[str, int],
    notes: list[str],
) -> tuple[Any, Any] | None:
    """The FixRequest for this OOM and the project's configuration (None without a pyproject)."""
    target = _prompt_file(oom)
    if target is None:
        notes.append("no user-code frame: no prompt written")
        return None
    try:
        text = Path(target.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as problem:
        notes.append(f"{target.file} could not be read for the prompt: {problem}")
        return None
    from oom_lsp.config import ConfigError, find_pyproject, load_config
    from oom_lsp.llm.context import EnvironmentFacts
    from oom_lsp.llm.prompt import FixRequest

    config = None
    pyproject = find_pyproject(Path(target.file))
    if pyproject is not None:
        try:
            config = load_config(pyproject)
        except ConfigError as problem:
            notes.append(f"the project configuration could not be read: {problem}")
    device = report.device
    environment = EnvironmentFacts(
        python=report.python_version,
        torch=report.torch_version,
        cuda=report.cuda_version,
        gpu_name=device.name if device.type == "cuda" else None,
        gpu_memory=device.total_memory if device.type == "cuda" else None,
    )
    return FixRequest(
        path=target.file,
        text=text,
        oom=oom,
        environment=environment,
        gpu_memory=config.gpu_memory if config else None,
        lint_settings=config.settings_for(Path(target.file)) if config else None,
        runtime_facts=_runtime_facts(tensors, batch, memory_state, oom.failing_frame),
    ), config


def _write_prompt(request: Any, out: Path, notes: list[str]) -> None:
    from oom_lsp.llm.prompt import PromptError, build_prompt

    try:
        prompt = build_prompt(request)
    except PromptError as problem:
        notes.append(f"no prompt: {problem}")
        return
    safe_files.write_file(out / PROMPT_NAME, prompt.markdown(include_system=True), root=out)


def _write_report(report: Report, tensors: list[dict[str, Any]], path: Path) -> None:
    data = report.to_dict()
    data[TENSORS_KEY] = tensors
    # Atomic: the editor never sees half a report.
    safe_files.write_file(path, json.dumps(data, indent=2) + "\n", root=path.parent)


def _ask(request: Any, config: Any, out: Path, log: Callable[[str], None]) -> None:
    """Ask the configured model for a diagnosis; write answer.md. Never edits code, never raises."""
    from oom_lsp.config import ConfigError, ProjectConfig
    from oom_lsp.llm.fixer import FixError, propose_fix
    from oom_lsp.llm.settings import NotReady, resolve_settings

    try:
        settings = resolve_settings(config or ProjectConfig(path=None, root=Path.cwd()))
        settings.check_ready()
    except (ConfigError, NotReady) as problem:
        log(f"oom-lsp: ask=True, but {problem}")
        return
    for note in settings.notes():
        log(f"oom-lsp: {note}")
    log(f"oom-lsp: asking {settings.model} at {settings.host} for a diagnosis")
    outcome: list[Any] = []

    def converse() -> None:
        # A fresh event loop in its own thread: the guard may be inside the user's running loop.
        try:
            outcome.append(asyncio.run(propose_fix(request, settings)))
        except Exception:
            outcome.append(FixError("server", traceback.format_exc()))

    worker = threading.Thread(target=converse, name="oom-lsp-ask", daemon=True)
    worker.start()
    worker.join(settings.timeout * (settings.max_retries + 1) + ASK_TIMEOUT_MARGIN)
    if not outcome:
        log("oom-lsp: the model did not answer in time; no diagnosis written")
        return
    result = outcome[0]
    if isinstance(result, FixError):
        log(f"oom-lsp: could not ask for a diagnosis: {result.message}")
        return
    safe_files.write_file(out / ANSWER_NAME, _answer_markdown(result, settings), root=out)
    log(f"oom-lsp: diagnosis written to {out / ANSWER_NAME} (nothing was changed)")


def _answer_markdown(proposal: Any, settings: Any) -> str:
    lines = [
        "# Diagnosis of the out-of-memory error",
        "",
        (
            f"Model: `{proposal.model}` at {settings.host}. Nothing was changed: apply a change with "
            '`oom-lsp fix --ai` or the editor\'s "Ask AI to fix this OOM".'
        ),
        "",
        "## Causes",
        proposal.diagnosis(),
        "",
    ]
    if proposal.edit is not None:
        lines += [
            "## Proposed change",
            "```diff",
            proposal.edit.diff(proposal.request.path).rstrip("\n"),
            "```",
            "",
        ]
    elif proposal.problem:
        lines += ["## Proposed change", f"None: {proposal.problem}.", ""]
    validation = proposal.fix.validation
    lines += [
        "## Validation",
        f"{validation.step}: {validation.expected}",
        "",
        "## Changelog",
        proposal.changelog,
        "",
    ]
    return "\n".join(lines)
