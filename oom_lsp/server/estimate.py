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
Every client sees the verdict: `window/showMessage` says the CLI's figures in one line
(wording.estimate_message), unless the caller shows the command's `message` itself (VS Code's
palette command, `showResult: false`), and the estimate lens's title says them until the next
edit (lenses.py).
The estimate of a text a what-if predicted is compared with it (server/what_if.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from oom_lsp.analysis import LintSettings, Severity
from oom_lsp.analysis.registry import PREDICTED_OUT_OF_MEMORY
from oom_lsp.analysis.rule_links import rule_url
from oom_lsp.edits import Position, Range
from oom_lsp.notebooks import is_notebook_path
from oom_lsp.server import code_actions
from oom_lsp.server.diagnostics import SOURCE
from oom_lsp.server.jobs import (
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
from oom_lsp.server.positions import PositionConverter, split_lines
from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer

if TYPE_CHECKING:
    from oom_lsp.estimate.gpus import Gpu
    from oom_lsp.estimate.results import EstimateResult, WhatIfCheck
    from oom_lsp.usecases.estimate import EstimateRequest, Listener

# The estimate's modules (oom_lsp.estimate, oom_lsp.usecases.estimate) are imported by the
# functions that run it: the server's start-up, before the first diagnostics, does not pay them.

ESTIMATE_COMMAND = "oom-lsp.estimate"
OOM100 = "OOM100"
DEFAULT_ESTIMATE_TIMEOUT_S = 300.0
ACCUMULATION_CONSTANT = "GRADIENT_ACCUMULATION_STEPS"
_SEVERITIES = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
    Severity.HINT: types.DiagnosticSeverity.Hint,
}


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
    # False: the caller shows the answer's `message` itself (VS Code's palette command, with its
    # "Open report" button); else the server says it with window/showMessage (lenses, Neovim).
    show_result: bool = attrs.field(default=True, alias="showResult")


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

    # OOM101 as a locator of batch literals, not a finding shown: strict, so that a
    # literal is found whatever the size facts say about what is at stake.
    settings = LintSettings(enabled=frozenset({"OOM101"}), max_batch_size=1, strict=True)
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
    """The argument's GPU or memory, else the `oomLsp.gpu` setting, else `gpu-memory` of the
    project (or the `oomLsp.gpuMemory` setting): the use case's resolve_target."""
    if args.gpu and args.gpu_memory:
        raise JsonRpcInvalidParams("give gpu or gpuMemory, not both")
    from oom_lsp.usecases.estimate import EstimateInputError, resolve_target

    configured = command_setting(ls, "gpu")
    try:
        return resolve_target(
            ls.lint_settings.project_config(script),
            args.gpu,
            args.gpu_memory,
            configured if isinstance(configured, str) else None,
        )
    except EstimateInputError as error:
        raise JsonRpcInvalidParams(str(error)) from None


def _world_size(ls: OomLanguageServer, args: EstimateArgs) -> tuple[int | None, int | None]:
    """The command's worldSize (and nprocPerNode), else the `oomLsp.worldSize` setting."""
    world_size = args.world_size if args.world_size is not None else command_setting(ls, "worldSize")
    if world_size is None:
        if args.nproc_per_node is not None:
            raise JsonRpcInvalidParams("nprocPerNode needs worldSize")
        return None, None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise JsonRpcInvalidParams(
            f"worldSize must be a whole number of GPUs (1 or more), not {world_size!r}"
        )
    nproc = args.nproc_per_node
    if nproc is not None and not (1 <= nproc <= world_size):
        raise JsonRpcInvalidParams(f"nprocPerNode must be from 1 to worldSize ({world_size}), not {nproc!r}")
    return world_size, nproc


def check_trace_args(args: EstimateArgs) -> None:
    if args.device not in ("cuda", "cpu"):
        raise JsonRpcInvalidParams(f"device must be cuda or cpu, not {args.device!r}")
    if args.margin is not None and not 0 <= args.margin < 1:
        raise JsonRpcInvalidParams(
            f"margin must be from 0 to below 1 (0.1 keeps 10% free), not {args.margin!r}"
        )


def estimate_request(
    ls: OomLanguageServer, args: EstimateArgs, script: Path, gpu: Gpu | None, notebook: bool = False
) -> EstimateRequest:
    """What to estimate: the command's arguments over the `oomLsp` settings (`profile.args`,
    `interpreter`, `worldSize`: not for a notebook, which runs in one process) and the project's."""
    from oom_lsp.estimate.estimator import DEFAULT_MARGIN
    from oom_lsp.usecases.estimate import EstimateRequest

    world_size, nproc_per_node = (None, None) if notebook else _world_size(ls, args)
    profile_settings = command_setting(ls, "profile")
    default_args = (
        profile_settings.get("args") if isinstance(profile_settings, dict) and not notebook else None
    )
    root = ls.lint_settings.project_config(script).root
    return EstimateRequest(
        script=script,
        script_args=[str(arg) for arg in (args.args if args.args is not None else default_args or [])],
        device=args.device,
        gpu=gpu,
        batch_size=args.batch_size,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        python=interpreter(ls, args.python),
        timeout=args.timeout or DEFAULT_ESTIMATE_TIMEOUT_S,
        cwd=root,
        world_sizes=[world_size] if world_size is not None else None,
        nproc_per_node=nproc_per_node,
        root=root,
        display=script.name,
    )


def job_listener(job: Job, named: bool = False) -> Listener:
    """The work-done progress of an estimate: which trace and how many optimizer steps it reached."""
    from oom_lsp.usecases.estimate import Listener

    traces = [0]

    def on_event(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "run-start":
            traces[0] += 1
            job.report(f"trace {traces[0]}: running the script")
        elif kind == "step":
            job.report(f"trace {traces[0]}: {event.get('step')} of 2 optimizer steps traced")
        elif kind == "comparing":
            job.report(f"comparing with the what-if's prediction for {event.get('change')}", 90)
        elif kind == "search-check":
            job.report(f"checking batch {event['batch_size']:,} ({event['check']} of at most {event['of']} fake runs)")

    return Listener(on_event=on_event, on_message=lambda message: job.report(message, 60), cancel=job.cancel)


async def estimate_command(ls: OomLanguageServer, args: EstimateArgs) -> dict[str, Any]:
    from oom_lsp.estimate.estimator import EstimateError
    from oom_lsp.estimate.results import EstimateResult, Verdict
    from oom_lsp.usecases.estimate import EstimateInputError, run_estimate

    require_trusted_workspace(ls, "an estimate")
    check_trace_args(args)
    _world_size(ls, args)
    notebook = _notebook_path(ls, args.uri)
    if notebook is not None:
        # A notebook runs in one process; the oomLsp.worldSize setting is for the project's scripts.
        if args.world_size is not None:
            raise JsonRpcInvalidParams(
                "a notebook runs in one process: worldSize is for torchrun-style scripts"
            )
        if not notebook.is_file():
            raise JsonRpcInvalidParams(f"{notebook}: no such file (save the notebook first)")
        script = notebook
    else:
        script = script_of(args.uri)
    gpu = target_gpu(ls, args, script)
    # The code actions need the largest batch that fits: searched by default
    # whenever there is a target to fit.
    search = args.find_max_batch if args.find_max_batch is not None else gpu is not None
    if search and gpu is None:
        raise JsonRpcInvalidParams("findMaxBatch needs a target: gpu, gpuMemory, or oomLsp.gpu / gpu-memory")
    request = dataclasses.replace(
        estimate_request(ls, args, script, gpu, notebook=notebook is not None),
        find_max_batch=search,
        timeline=notebook is None,  # the page (`oom-lsp estimate --html`'s) beside the report
    )
    version = document_version(ls, args.uri)
    job = Job(ls, f"Estimating {script.name}", "estimate", script)
    listener = job_listener(job)
    warnings: list[str] = []
    listener.on_warning = warnings.append

    def work() -> EstimateResult:
        job.report("tracing two optimizer steps on fake tensors", 10)
        outcome = run_estimate(request, listener)
        assert isinstance(outcome, EstimateResult)  # one world size
        return outcome

    try:
        result = await job.run(work)
    except EstimateInputError as error:
        raise RequestFailed(str(error)) from None
    except EstimateError as error:
        raise RequestFailed(f"the estimate failed: {error}") from None
    for warning in warnings:
        ls.window_log_message(
            types.LogMessageParams(type=types.MessageType.Warning, message=f"{script.name}: {warning}")
        )
    report_path = write_result(
        ls, script, "estimate", f"{script.stem}.json", json.dumps(result.to_json(), indent=2) + "\n"
    )
    page_path = None
    if result.prediction.timeline is not None:
        from oom_lsp.estimate.page import render_page

        page_path = write_result(ls, script, "estimate", f"{script.stem}.html", render_page(result))
    if notebook is None:
        _show_estimate(ls, args.uri, script, result, str(report_path), version)
    answer = estimate_answer(ls, result, str(report_path), script.name)
    if page_path is not None:
        # VS Code opens it in a webview (the extension's executeCommand middleware); other clients
        # get its path in the message.
        answer["pagePath"] = str(page_path)
    if args.show_result:
        verdict = result.prediction.verdict
        kind = types.MessageType.Info if verdict in (None, Verdict.FITS) else types.MessageType.Warning
        page = f" Memory timeline: {page_path}" if page_path is not None else ""
        ls.window_show_message(types.ShowMessageParams(type=kind, message=f"oom-lsp: {answer['message']}{page}"))
    return answer


def estimate_answer(
    ls: OomLanguageServer, result: EstimateResult, report_path: str, name: str
) -> dict[str, Any]:
    """The command's result: the figures the CLI's JSON has, in the editor's words."""
    from oom_lsp.estimate.wording import estimate_message

    prediction = result.prediction
    fitting = result.max_batch.max_batch if result.max_batch is not None else None
    answer: dict[str, Any] = {
        "reportPath": report_path,
        "peakBytes": prediction.peak_bytes,
        "reservedBytes": prediction.reserved_bytes,
        # What the verdict holds against the GPU (reserved memory and the CUDA context on cuda):
        # the what-if's "peak".
        "neededBytes": prediction.needed_bytes,
        "gpuMemoryBytes": prediction.gpu.memory if prediction.gpu else None,
        "verdict": prediction.verdict.short if prediction.verdict else None,
        "batchSize": prediction.batch_size,
        # Which peak each figure is: peakBytes allocated, neededBytes the process total.
        "message": estimate_message(prediction, fitting, name),
    }
    if prediction.gpu is not None:
        answer["gpuName"] = prediction.gpu.name
    if prediction.distributed is not None:
        answer["worldSize"] = prediction.distributed.world_size
    if result.max_batch is not None and result.max_batch.max_batch is not None:
        answer["maxBatch"] = result.max_batch.max_batch
    if prediction.peak_at.cell is not None:
        answer["peakAt"] = {"cell": prediction.peak_at.cell, "line": prediction.peak_at.line}
    if result.what_if_check is not None:
        answer["whatIfCheck"] = report_comparison(ls, result.what_if_check)
    return answer


def report_comparison(ls: OomLanguageServer, check: WhatIfCheck) -> dict[str, Any]:
    """Within 5 %: a line in the log (and the result); beyond: a warning, it is oom-lsp's bug."""
    from oom_lsp.estimate.wording import comparison_words

    words = comparison_words(check)
    if check.agrees:
        ls.window_log_message(
            types.LogMessageParams(type=types.MessageType.Info, message=f"oom-lsp: {words}")
        )
    else:
        ls.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Warning, message=f"oom-lsp: {words}")
        )
    return {
        "change": check.change,
        "predictedBytes": check.predicted_bytes,
        "estimatedBytes": check.estimated_bytes,
        "differencePercent": check.difference_percent,
        "agrees": check.agrees,
        "message": words,
    }


def _notebook_path(ls: OomLanguageServer, uri: str) -> Path | None:
    """The `.ipynb` file on disk of a notebook cell, or of a notebook's own URI."""
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    path = to_fs_path(notebook.uri if notebook is not None else uri)
    return Path(path) if path is not None and is_notebook_path(path) else None


def _show_estimate(
    ls: OomLanguageServer,
    uri: str,
    script: Path,
    result: EstimateResult,
    report_path: str,
    version: int | None,
) -> None:
    """The hint on the batch-size literal, OOM100 when it does not fit, the memory status; OOM101's
    threshold becomes the largest batch that fits."""
    from oom_lsp.estimate.results import Verdict
    from oom_lsp.estimate.wording import hint_label, lens_result

    prediction = result.prediction
    document: TextDocument = ls.workspace.get_text_document(uri)
    knobs = {
        int(knob.place.line)
        for knob in prediction.batch_knobs
        if knob.place.file and knob.place.line and Path(knob.place.file).resolve() == script.resolve()
    }
    literal = find_batch_literal(document.source, str(script), knobs, prediction.batch_size)
    search = result.max_batch
    fitting = search.max_batch if search is not None else None
    found = []
    settings = ls.settings_for_uri(uri)
    oom = prediction.verdict is Verdict.OOM
    if oom and literal is not None and settings is not None and OOM100 in settings.enabled:
        found.append(_oom100(ls, document, literal, result, settings))
    if fitting:
        ls.max_batch_by_uri[uri] = fitting
    status = {
        "uri": uri,
        "peakBytes": prediction.peak_bytes,
        "neededBytes": prediction.needed_bytes,
        "gpuMemoryBytes": prediction.gpu.memory if prediction.gpu else None,
        "gpuName": prediction.gpu.name if prediction.gpu else None,
        "source": "estimate",
        "reportPath": report_path,
        "exceedsGpu": oom,
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
            details={
                "literal": literal_dict(literal) if literal else None,
                "label": hint_label(prediction),
                "lens": lens_result(prediction),
            },
        ),
    )
    send_memory_status(ls, status)
    if ls.client_supports("workspace.inlay_hint.refresh_support"):
        ls.workspace_inlay_hint_refresh(None)
    if ls.client_supports("workspace.code_lens.refresh_support"):
        ls.workspace_code_lens_refresh(None)  # the estimate lens's title says the result


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
    result: EstimateResult,
    settings: LintSettings,
) -> types.Diagnostic:
    from oom_lsp.estimate.wording import predicted_oom_message

    search = result.max_batch
    fitting = search.max_batch if search is not None else None
    accumulation = search.gradient_accumulation if search is not None else None
    return types.Diagnostic(
        range=literal_range(ls, document.source, literal_dict(literal)),
        severity=_SEVERITIES[settings.severity_of(OOM100, PREDICTED_OUT_OF_MEMORY.default_severity)],
        code=OOM100,
        code_description=types.CodeDescription(href=rule_url(OOM100, PREDICTED_OUT_OF_MEMORY.name)),
        source=SOURCE,
        message=predicted_oom_message(result.prediction, fitting),
        # Not "version": the analysis's quick fixes read diagnostics with that key as theirs.
        data={
            "kind": "estimate",
            "documentVersion": document.version,
            "maxBatch": fitting,
            "accumulation": accumulation.to_json() if accumulation else None,
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
    server.hooks.add_provider(estimate_actions)
