"""`oom-lsp.estimate` in the editor: the predicted peak memory of a training
step (oom_lsp.estimate, fake tensors in a subprocess, no GPU), shown on the
batch-size literal the estimate varied.

After an estimate the file gets an inlay hint on that literal (lenses.py
draws it from the result kept here), the `oomLsp/memoryStatus` notification,
and, when the step does not fit the target GPU, an Error diagnostic OOM100
(predicted-out-of-memory) on the literal with two code actions: "Set batch
size to N (largest that fits)" and "Use gradient accumulation (N x k)". With
a largest fitting batch, OOM101's threshold for the file becomes that batch.
Any edit of the file drops the hint, OOM100 and the status (profiling.py).
The estimate of a text a what-if predicted is compared with it (server/what_if.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from oom_lsp.analysis import LintSettings, Severity
from oom_lsp.analysis.registry import PREDICTED_OUT_OF_MEMORY
from oom_lsp.edits import Position, Range
from oom_lsp.estimate.estimator import (
    DEFAULT_MARGIN,
    EstimateError,
    EstimateOptions,
    estimate,
    find_max_batch,
)
from oom_lsp.estimate.gpus import Gpu, UnknownGpuError, custom_gpu, find_gpu
from oom_lsp.notebooks import is_notebook_path
from oom_lsp.notebooks.document import NotebookError
from oom_lsp.notebooks.run import notebook_as_script
from oom_lsp.output import rule_url
from oom_lsp.server import code_actions
from oom_lsp.server.diagnostics import SOURCE
from oom_lsp.server.positions import PositionConverter, split_lines
from oom_lsp.server.profiling import (
    FileResult,
    Job,
    command_setting,
    current_results,
    document_version,
    interpreter,
    require_trusted_workspace,
    script_of,
    send_memory_status,
    store_result,
    write_result,
)
from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer

ESTIMATE_COMMAND = "oom-lsp.estimate"
OOM100 = "OOM100"
DEFAULT_ESTIMATE_TIMEOUT_S = 300.0
ACCUMULATION_CONSTANT = "GRADIENT_ACCUMULATION_STEPS"
_VERDICTS = {"fits": "fits", "tight": "tight", "will run out of memory": "oom"}
_SEVERITIES = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
    Severity.HINT: types.DiagnosticSeverity.Hint,
}


@dataclass(frozen=True)
class FollowUp:
    """What another module adds to the estimate of a `.py` file (server/what_if.py: the comparison
    with a what-if's prediction for this text): `run(options, prediction, searched, job)` in the
    job's thread after the trace; what it returns, unless None, goes through `report` on the
    event loop into the command's result under `key`."""

    key: str
    run: Callable[[EstimateOptions, dict[str, Any], bool, Job], Any]
    report: Callable[[OomLanguageServer, Any], Any]


_follow_ups: list[FollowUp] = []


def add_follow_up(follow_up: FollowUp) -> None:
    if follow_up not in _follow_ups:
        _follow_ups.append(follow_up)


@attrs.define
class EstimateArgs:
    uri: str
    batch_size: int | None = attrs.field(default=None, alias="batchSize")
    gpu: str | None = None
    gpu_memory: str | None = attrs.field(default=None, alias="gpuMemory")
    device: str = "cuda"
    args: list[str] | None = None
    python: str | None = None
    find_max_batch: bool | None = attrs.field(default=None, alias="findMaxBatch")
    timeout: float | None = None
    margin: float | None = None  # the share of the GPU kept free (default 10%)
    # A torchrun-style script traced as rank 0 of worldSize (the per-rank peak).
    world_size: int | None = attrs.field(default=None, alias="worldSize")
    nproc_per_node: int | None = attrs.field(default=None, alias="nprocPerNode")


@dataclass(frozen=True)
class BatchLiteral:
    """Where the script's batch size is written: 1-based line, code-point columns."""

    line: int
    start: int
    end: int
    statement_line: int  # the first line of its statement (where a line can be inserted)


def find_batch_literal(
    source: str, path: str, knob_lines: set[int], batch_size: int | None
) -> BatchLiteral | None:
    """The integer literal that sets the batch size: what OOM101 finds
    (argparse defaults, DataLoader/config keywords, the constants feeding
    them), on a line the estimate reported as a batch knob, else one whose
    value is the estimated batch size. None when neither exists."""
    from oom_lsp.analysis import analyze  # libcst, loaded by the analysis worker at start

    settings = LintSettings(enabled=frozenset({"OOM101"}), max_batch_size=1)
    lines = split_lines(source)
    candidates = []
    for finding in analyze(source, settings, path):
        if finding.code != "OOM101" or finding.fix is None or len(finding.fix.edits) != 1:
            continue
        span = finding.fix.edits[0].range
        if span.start.line != span.end.line:
            continue
        text = lines[span.start.line - 1][span.start.column : span.end.column]
        try:
            value = int(text.replace("_", ""), 0)
        except ValueError:
            continue
        literal = BatchLiteral(span.start.line, span.start.column, span.end.column, finding.statement_line)
        candidates.append((literal.line in knob_lines, value == batch_size, literal))
    on_knob = [item for item in candidates if item[0]]
    if on_knob:
        return on_knob[0][2]
    assigned = _knob_assignment(lines, knob_lines)
    if assigned is not None:
        return assigned
    by_value = [item for item in candidates if item[1]]
    return by_value[0][2] if by_value else None


# A batch size assigned as a module global (nanoGPT's `batch_size = 12`), which OOM101 does not
# flag: the estimate reports its line as a knob.
_KNOB_ASSIGNMENT = re.compile(
    r"^\s*(?:batch_size|bs|train_batch_size|per_device_train_batch_size|micro_batch_size)"
    r"\s*(?::[^=]*)?=\s*(\d[\d_]*)\s*(?:#.*)?$"
)


def _knob_assignment(lines: list[str], knob_lines: set[int]) -> BatchLiteral | None:
    for line in sorted(knob_lines):
        if 1 <= line <= len(lines):
            match = _KNOB_ASSIGNMENT.match(lines[line - 1].rstrip("\r\n"))
            if match:
                return BatchLiteral(line, match.start(1), match.end(1), line)
    return None


def target_gpu(ls: OomLanguageServer, args: EstimateArgs, script: Path) -> Gpu | None:
    """The argument's GPU or memory, else the `oomLsp.gpu` setting, else
    `gpu-memory` of the project (or the `oomLsp.gpuMemory` setting)."""
    config = ls.lint_settings.project_config(script)
    try:
        if args.gpu and args.gpu_memory:
            raise JsonRpcInvalidParams("give gpu or gpuMemory, not both")
        if args.gpu:
            return find_gpu(args.gpu, config.gpus)
        if args.gpu_memory:
            return custom_gpu(args.gpu_memory)
        configured = command_setting(ls, "gpu")
        if isinstance(configured, str) and configured:
            return find_gpu(configured, config.gpus)
    except (UnknownGpuError, ValueError) as error:
        raise JsonRpcInvalidParams(str(error)) from None
    return custom_gpu(config.gpu_memory) if config.gpu_memory else None


def short_size(size: float) -> str:
    """14.2 GiB, 24 GiB, 9.5 MiB: one decimal, none when it is .0."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            text = f"{size / scale:.1f}"
            return f"{text.removesuffix('.0')} {unit}"
    return f"{int(size)} B"


def _world_size(ls: OomLanguageServer, args: EstimateArgs) -> tuple[int | None, int | None]:
    """The command's worldSize (and nprocPerNode), else the `oomLsp.worldSize` setting."""
    world_size = args.world_size if args.world_size is not None else command_setting(ls, "worldSize")
    if world_size is None:
        if args.nproc_per_node is not None:
            raise JsonRpcInvalidParams("nprocPerNode needs worldSize")
        return None, None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise JsonRpcInvalidParams(f"worldSize must be a whole number of GPUs (1 or more), not {world_size!r}")
    nproc = args.nproc_per_node
    if nproc is not None and not (1 <= nproc <= world_size):
        raise JsonRpcInvalidParams(f"nprocPerNode must be from 1 to worldSize ({world_size}), not {nproc!r}")
    return world_size, nproc


def _gpu_label(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return ""
    name = gpu["name"].removeprefix("GeForce ")
    memory = short_size(gpu["memory"])
    return f" / {memory}" if name.startswith("GPU with ") else f" / {memory} {name}"


def check_trace_args(args: EstimateArgs) -> None:
    if args.device not in ("cuda", "cpu"):
        raise JsonRpcInvalidParams(f"device must be cuda or cpu, not {args.device!r}")
    if args.margin is not None and not 0 <= args.margin < 1:
        raise JsonRpcInvalidParams(
            f"margin must be from 0 to below 1 (0.1 keeps 10% free), not {args.margin!r}"
        )


def file_options(
    ls: OomLanguageServer, args: EstimateArgs, script: Path, gpu: Gpu | None, job: Job
) -> EstimateOptions:
    """How to trace a `.py` file: the command's arguments over the `oomLsp` settings
    (`profile.args`, `interpreter`, `worldSize`) and the project's."""
    world_size, nproc_per_node = _world_size(ls, args)
    profile_settings = command_setting(ls, "profile")
    default_args = profile_settings.get("args") if isinstance(profile_settings, dict) else None
    return EstimateOptions(
        script=script,
        script_args=[str(arg) for arg in (args.args if args.args is not None else default_args or [])],
        device=args.device,
        gpu=gpu,
        batch_size=args.batch_size,
        python=interpreter(ls, args.python),
        timeout=args.timeout or DEFAULT_ESTIMATE_TIMEOUT_S,
        cwd=ls.lint_settings.project_config(script).root,
        cancel=job.cancel,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        world_size=world_size,
        nproc_per_node=nproc_per_node,
    )


async def estimate_command(ls: OomLanguageServer, args: EstimateArgs) -> dict[str, Any]:
    require_trusted_workspace(ls, "an estimate")
    check_trace_args(args)
    world_size, _ = _world_size(ls, args)
    notebook = _notebook_path(ls, args.uri)
    if notebook is not None:
        # A notebook runs in one process; the oomLsp.worldSize setting is for the project's scripts.
        if args.world_size is not None:
            raise JsonRpcInvalidParams("a notebook runs in one process: worldSize is for torchrun-style scripts")
        return await _estimate_notebook(ls, args, notebook)
    script = script_of(args.uri)
    gpu = target_gpu(ls, args, script)
    job = Job(ls, f"Estimating {script.name}", "estimate", script)
    options = file_options(ls, args, script, gpu, job)
    # The code actions need the largest batch that fits: searched by default
    # whenever there is a target to fit.
    search = args.find_max_batch if args.find_max_batch is not None else gpu is not None
    if search and gpu is None:
        raise JsonRpcInvalidParams("findMaxBatch needs a target: gpu, gpuMemory, or oomLsp.gpu / gpu-memory")
    version = document_version(ls, args.uri)
    traces = [0]
    answers: list[tuple[FollowUp, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        """The work-done progress says which trace and how many optimizer steps it reached."""
        kind = event.get("event")
        if kind == "run-start":
            traces[0] += 1
            job.report(f"trace {traces[0]}: running the script")
        elif kind == "step":
            job.report(f"trace {traces[0]}: {event.get('step')} of 2 optimizer steps traced")
        elif kind == "search-check":
            job.report(f"checking batch {event['batch_size']:,} ({event['check']} of at most {event['of']} fake runs)")

    options.on_event = on_event

    def work() -> dict[str, Any]:
        job.report("tracing two optimizer steps on fake tensors", 10)
        if search:
            outcome = find_max_batch(options, lambda message: job.report(message, 60))
            prediction = outcome["estimate"]
            prediction["max_batch"] = outcome["max_batch"]
        else:
            prediction = estimate(options, lambda message: job.report(message, 50))
            prediction["max_batch"] = None
        for follow_up in _follow_ups:
            answers.append((follow_up, follow_up.run(options, prediction, search, job)))
        return prediction

    try:
        prediction = await job.run(work)
    except EstimateError as error:
        raise RequestFailed(f"the estimate failed: {error}") from None
    report_path = write_result(ls, script, "estimate", f"{script.stem}.json", json.dumps(prediction, indent=2) + "\n")
    _show_estimate(ls, args.uri, script, prediction, str(report_path), version)
    result: dict[str, Any] = {
        "reportPath": str(report_path),
        "peakBytes": prediction["peak_bytes"],
        "reservedBytes": prediction.get("reserved_bytes"),
        "gpuMemoryBytes": gpu.memory if gpu else None,
        "verdict": _VERDICTS.get(prediction.get("verdict") or ""),
        "batchSize": prediction.get("batch_size"),
    }
    if gpu is not None:
        result["gpuName"] = gpu.name
    if world_size is not None:
        result["worldSize"] = world_size
    max_batch = (prediction.get("max_batch") or {}).get("max_batch")
    if max_batch is not None:
        result["maxBatch"] = max_batch
    for follow_up, answer in answers:
        if answer is not None:
            result[follow_up.key] = follow_up.report(ls, answer)
    return result


def _notebook_path(ls: OomLanguageServer, uri: str) -> Path | None:
    """The `.ipynb` file on disk of a notebook cell, or of a notebook's own URI."""
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    path = to_fs_path(notebook.uri if notebook is not None else uri)
    return Path(path) if path is not None and is_notebook_path(path) else None


async def _estimate_notebook(ls: OomLanguageServer, args: EstimateArgs, notebook: Path) -> dict[str, Any]:
    """The saved notebook's code cells run in order as one script (as `oom-lsp estimate
    nb.ipynb`); the report names cells. No inlay hint or OOM100: those sit on a
    batch-size literal of a `.py` file."""
    if not notebook.is_file():
        raise JsonRpcInvalidParams(f"{notebook}: no such file (save the notebook first)")
    gpu = target_gpu(ls, args, notebook)
    search = args.find_max_batch if args.find_max_batch is not None else gpu is not None
    job = Job(ls, f"Estimating {notebook.name}", "estimate", notebook)
    try:
        with notebook_as_script(notebook, notebook.name) as run:
            options = EstimateOptions(
                script=run.script,
                script_args=[str(arg) for arg in args.args or []],
                device=args.device,
                gpu=gpu,
                batch_size=args.batch_size,
                python=interpreter(ls, args.python),
                timeout=args.timeout or DEFAULT_ESTIMATE_TIMEOUT_S,
                cwd=run.cwd,
                cancel=job.cancel,
                margin=DEFAULT_MARGIN if args.margin is None else args.margin,
            )

            def work() -> dict[str, Any]:
                job.report("tracing two optimizer steps on fake tensors", 10)
                if search:
                    outcome = find_max_batch(
                        options, lambda message: job.report(run.places.text(message), 60)
                    )
                    prediction = outcome["estimate"]
                    prediction["max_batch"] = outcome["max_batch"]
                else:
                    prediction = estimate(options, lambda message: job.report(run.places.text(message), 50))
                    prediction["max_batch"] = None
                return run.report(prediction)

            try:
                prediction = await job.run(work)
            except EstimateError as error:
                raise RequestFailed(f"the estimate failed: {run.places.text(str(error))}") from None
            warning = run.built.warning()
    except NotebookError as error:
        raise RequestFailed(f"{notebook.name}: {error}") from None
    report_path = write_result(
        ls, notebook, "estimate", f"{notebook.stem}.json", json.dumps(prediction, indent=2) + "\n"
    )
    if warning:
        ls.window_log_message(
            types.LogMessageParams(type=types.MessageType.Warning, message=f"{notebook.name}: {warning}")
        )
    result: dict[str, Any] = {
        "reportPath": str(report_path),
        "peakBytes": prediction["peak_bytes"],
        "reservedBytes": prediction.get("reserved_bytes"),
        "gpuMemoryBytes": gpu.memory if gpu else None,
        "verdict": _VERDICTS.get(prediction.get("verdict") or ""),
        "batchSize": prediction.get("batch_size"),
    }
    if gpu is not None:
        result["gpuName"] = gpu.name
    max_batch = (prediction.get("max_batch") or {}).get("max_batch")
    if max_batch is not None:
        result["maxBatch"] = max_batch
    peak = prediction.get("peak_at") or {}
    if peak.get("cell") is not None:
        result["peakAt"] = {"cell": peak["cell"], "line": peak["line"]}
    return result


def _show_estimate(
    ls: OomLanguageServer,
    uri: str,
    script: Path,
    prediction: dict[str, Any],
    report_path: str,
    version: int | None,
) -> None:
    document: TextDocument = ls.workspace.get_text_document(uri)
    knobs = {
        int(knob["line"])
        for knob in prediction.get("batch_knobs") or []
        if knob.get("file") and Path(knob["file"]).resolve() == script.resolve()
    }
    literal = find_batch_literal(document.source, str(script), knobs, prediction.get("batch_size"))
    searched = prediction.get("max_batch") or {}
    fitting = searched.get("max_batch")
    gpu = prediction.get("gpu")
    distributed = prediction.get("distributed")
    verdict = _VERDICTS.get(prediction.get("verdict") or "")
    details = {
        "peakBytes": prediction["peak_bytes"],
        "batchSize": prediction.get("batch_size"),
        "gpu": gpu,
        "verdict": verdict,
        "maxBatch": fitting,
        "accumulation": searched.get("gradient_accumulation"),
        "literal": literal_dict(literal) if literal else None,
        "label": f"≈ {short_size(prediction['peak_bytes'])} peak"
        + (f" per rank of {distributed['world_size']}" if distributed else "")
        + f" at {prediction.get('batch_size')}"
        + _gpu_label(gpu),
    }
    found = []
    settings = ls.settings_for_uri(uri)
    if verdict == "oom" and literal is not None and settings is not None and OOM100 in settings.enabled:
        found.append(_oom100(ls, document, literal, details, settings))
    if fitting:
        ls.max_batch_by_uri[uri] = fitting
    status = {
        "uri": uri,
        "peakBytes": prediction["peak_bytes"],
        "gpuMemoryBytes": gpu["memory"] if gpu else None,
        "gpuName": gpu["name"] if gpu else None,
        "source": "estimate",
        "reportPath": report_path,
        "exceedsGpu": verdict == "oom",
    }
    store_result(
        ls,
        uri,
        FileResult(
            kind="estimate",
            report_path=report_path,
            version=version,
            diagnostics=found,
            status=status,
            details=details,
        ),
    )
    send_memory_status(ls, status)
    if ls.client_supports("workspace.inlay_hint.refresh_support"):
        ls.workspace_inlay_hint_refresh(None)


def predicted_oom_message(
    peak_bytes: int, batch_size: int | None, gpu_memory: int, gpu_name: str, fitting: int | None
) -> str:
    """OOM100's message: one line, under the editors' width (the GPU named without its vendor,
    a GPU given by its memory alone not named twice)."""
    name = gpu_name.removeprefix("NVIDIA ").removeprefix("GeForce ")
    target = short_size(gpu_memory) + ("" if name.startswith("GPU with ") else f" {name}")
    message = f"Predicted out of memory: ≈ {short_size(peak_bytes)} at batch {batch_size} > {target}"
    if fitting == 0:
        return message + "; batch size 1 does not fit either"
    return message + (f"; largest that fits: {fitting}" if fitting else "")


def literal_dict(literal: BatchLiteral) -> dict[str, int]:
    return {
        "line": literal.line,
        "start": literal.start,
        "end": literal.end,
        "statementLine": literal.statement_line,
    }


def literal_range(ls: OomLanguageServer, source: str, literal: dict[str, int]) -> types.Range:
    converter = PositionConverter(source, ls.position_encoding)
    return converter.range_to_lsp(
        Range(Position(literal["line"], literal["start"]), Position(literal["line"], literal["end"]))
    )


def _oom100(
    ls: OomLanguageServer,
    document: TextDocument,
    literal: BatchLiteral,
    details: dict[str, Any],
    settings: LintSettings,
) -> types.Diagnostic:
    gpu = details["gpu"]
    fitting = details["maxBatch"]
    return types.Diagnostic(
        range=literal_range(ls, document.source, literal_dict(literal)),
        severity=_SEVERITIES[settings.severity_of(OOM100, PREDICTED_OUT_OF_MEMORY.default_severity)],
        code=OOM100,
        code_description=types.CodeDescription(href=rule_url(OOM100, PREDICTED_OUT_OF_MEMORY.name)),
        source=SOURCE,
        message=predicted_oom_message(
            details["peakBytes"], details["batchSize"], gpu["memory"], gpu["name"], fitting
        ),
        # Not "version": the analysis's quick fixes read diagnostics with that key as theirs.
        data={
            "kind": "estimate",
            "documentVersion": document.version,
            "maxBatch": fitting,
            "accumulation": details["accumulation"],
            "statementLine": literal.statement_line,
        },
    )


# --- code actions ------------------------------------------------------------------------


async def estimate_actions(
    ls: OomLanguageServer, params: types.CodeActionParams, document: TextDocument
) -> list[types.CodeAction]:
    if not code_actions.kind_wanted(params.context.only, types.CodeActionKind.QuickFix):
        return []
    actions = []
    for diagnostic in params.context.diagnostics:
        data: Any = diagnostic.data
        if (
            diagnostic.code != OOM100
            or diagnostic.source != SOURCE
            or not isinstance(data, dict)
            or data.get("documentVersion") != document.version
            or "estimate" not in current_results(ls, document.uri)
        ):
            continue
        fitting = data.get("maxBatch")
        if fitting:
            actions.append(
                types.CodeAction(
                    title=f"Set batch size to {fitting} (largest that fits)",
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diagnostic],
                    is_preferred=True,
                    edit=code_actions.workspace_edit(
                        ls, document, [types.TextEdit(range=diagnostic.range, new_text=str(fitting))]
                    ),
                )
            )
        accumulation = data.get("accumulation")
        if accumulation and ACCUMULATION_CONSTANT not in document.source:
            actions.append(
                _accumulation_action(ls, document, diagnostic, accumulation, data["statementLine"])
            )
    return actions


def _accumulation_action(
    ls: OomLanguageServer,
    document: TextDocument,
    diagnostic: types.Diagnostic,
    accumulation: dict[str, int],
    statement_line: int,
) -> types.CodeAction:
    """The micro-batch on the literal and the number of steps as a constant
    above its statement; dividing the loss and stepping every k batches is
    the training loop's part, said in the constant's comment."""
    micro, steps = accumulation["micro_batch"], accumulation["steps"]
    text = split_lines(document.source)[statement_line - 1]
    indent = text[: len(text) - len(text.lstrip())]
    line = (
        f"{indent}{ACCUMULATION_CONSTANT} = {steps}  # effective batch {micro} x {steps} = "
        f"{accumulation['effective_batch']}: divide the loss by it, step the optimizer every {steps} batches\n"
    )
    insert_at = types.Position(line=statement_line - 1, character=0)
    edits = [
        types.TextEdit(range=types.Range(start=insert_at, end=insert_at), new_text=line),
        types.TextEdit(range=diagnostic.range, new_text=str(micro)),
    ]
    return types.CodeAction(
        title=f"Use gradient accumulation ({micro} x {steps})",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        edit=code_actions.workspace_edit(ls, document, edits),
    )


def register(server: OomLanguageServer) -> None:
    server.command(ESTIMATE_COMMAND)(estimate_command)
    code_actions.add_provider(estimate_actions)
