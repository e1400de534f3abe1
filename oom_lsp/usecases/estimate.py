"""The estimate: a training step's peak memory without a GPU, the same for every face.

`oom-lsp estimate` (oom_lsp.cli.estimate), the editor's `oom-lsp.estimate` (its lens, its
palette command and Neovim's; oom_lsp.server.estimate) and the budget gate describe what to
estimate with an `EstimateRequest`, the target resolved by `resolve_target` from the same
sources in the same order, and call `run_estimate`. It checks what only a run can refuse (a
DeepSpeed script, an accelerate config), runs a notebook as the script of its code cells,
estimates one world size (with the largest batch that fits when asked) or sweeps several, and
compares the estimate of a text a what-if predicted with that prediction. The faces render the
typed result (oom_lsp.estimate.results): text or JSON, inlay hints, diagnostics and actions.

Progress and cancellation go through a `Listener`: the harness's events, progress lines (a
notebook's named by its cells), warnings, and the event that stops every run.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.estimate import distributed
from oom_lsp.estimate.estimator import DEFAULT_MARGIN, EstimateError, EstimateOptions, estimate
from oom_lsp.estimate.gpus import Gpu, UnknownGpuError, custom_gpu, find_gpu
from oom_lsp.estimate.results import EstimateResult, Prediction, Sweep, WhatIfCheck
from oom_lsp.estimate.search import find_max_batch
from oom_lsp.estimate.whatif_record import compare_with_record, load_record, source_digest

DEFAULT_TIMEOUT_S = 300.0


class EstimateInputError(ValueError):
    """A request no run can answer (an unknown GPU, a DeepSpeed script, a notebook that does not
    compile...): one line for the user, said before anything runs."""


@dataclass
class EstimateRequest:
    """What to estimate, every setting resolved by the face that asks."""

    script: Path  # a .py script or a .ipynb notebook
    script_args: list[str] = field(default_factory=list)
    device: str = "cuda"  # "cuda": predict the GPU; "cpu": the trace as a real CPU step measures it
    gpu: Gpu | None = None  # the target (resolve_target)
    batch_size: int | None = None  # None: the script's own
    dtype: str | None = None  # the whole step under torch.autocast with this dtype (bf16, fp16)
    margin: float = DEFAULT_MARGIN  # the share of the GPU kept free
    python: str = sys.executable  # the user's interpreter, with their torch
    timeout: float = DEFAULT_TIMEOUT_S
    cwd: Path | None = None  # where the script runs (a notebook: its folder)
    world_sizes: list[int] | None = None  # torchrun-style: rank 0 of each size (several: a sweep)
    nproc_per_node: int | None = None
    accelerate_config: Path | None = None  # `accelerate launch --config_file`'s variables
    cuda_version: str | None = None  # the target's CUDA release (the context); None: the script's torch's
    find_max_batch: bool = False
    # Compare with a what-if's prediction for this text (a fix applied): every face does; the
    # budget gate has no use for it.
    compare_with_what_if: bool = True
    root: Path | None = None  # the project's root (the what-if's record); None: found from the script
    display: str | None = None  # how messages name the script (a notebook: as the user gave it)
    timeline: bool = False  # record the step's allocations in order (--snapshot, --html)

    @property
    def shown(self) -> str:
        return self.display or self.script.name


@dataclass
class Listener:
    """What a run tells its face while it runs, and how the face stops it."""

    on_event: Callable[[dict[str, Any]], None] | None = None  # the harness's: starting, run-start, step...
    on_message: Callable[[str], None] | None = None  # a progress line
    on_warning: Callable[[str], None] | None = None  # said once, before the run
    cancel: threading.Event | None = None  # set: every run of this estimate stops

    def message(self, text: str) -> None:
        if self.on_message is not None:
            self.on_message(text)


def resolve_target(
    config: Any, gpu: str | None = None, gpu_memory: str | None = None, configured: str | None = None
) -> Gpu | None:
    """The target GPU: one named (`--gpu`, the command's `gpu`), else a memory (`--gpu-memory`,
    `gpuMemory`), else the editor's `oomLsp.gpu` setting (`configured`), else the project's
    `gpu-memory` (under the editor's `oomLsp.gpuMemory`). `config`: the file's ProjectConfig
    (its `[tool.oom-lsp.gpus]` table names more GPUs)."""
    try:
        if gpu:
            return find_gpu(gpu, config.gpus)
        if gpu_memory:
            return custom_gpu(gpu_memory)
        if configured:
            return find_gpu(configured, config.gpus)
        return custom_gpu(config.gpu_memory) if config.gpu_memory else None
    except (UnknownGpuError, ValueError) as error:
        raise EstimateInputError(str(error)) from None


def options_for(request: EstimateRequest, script: Path, listener: Listener) -> EstimateOptions:
    """The estimator's options for one script of the request (the notebook's script, a what-if's copy)."""
    sizes = request.world_sizes or []
    launcher = None
    if request.accelerate_config is not None and sizes:
        try:
            launcher = distributed.accelerate_environment(
                request.python, request.accelerate_config, sizes[-1], request.nproc_per_node
            )
        except distributed.WorldSizeError as error:
            raise EstimateInputError(str(error)) from None
    return EstimateOptions(
        script=script,
        script_args=list(request.script_args),
        device=request.device,
        gpu=request.gpu,
        batch_size=request.batch_size,
        python=request.python,
        timeout=request.timeout,
        cwd=request.cwd,
        autocast_dtype=request.dtype,
        margin=request.margin,
        cancel=listener.cancel,
        world_size=sizes[0] if len(sizes) == 1 else None,
        nproc_per_node=request.nproc_per_node,
        launcher_environment=launcher,
        cuda_version=request.cuda_version,
        on_event=listener.on_event,
        timeline=request.timeline,
    )


def check_distributed(request: EstimateRequest, script: Path) -> None:
    """A DeepSpeed script is out of reach of the fake process group: said before anything runs."""
    if not request.world_sizes:
        return
    deepspeed = distributed.deepspeed_call(script)
    if deepspeed:
        raise EstimateInputError(
            f"no estimate: {request.script.name}:{deepspeed[0]} calls {deepspeed[1]}: DeepSpeed "
            "(ZeRO) partitions through its own communication layer and CUDA kernels, out of reach of the "
            "fake process group; the distributed estimate covers DDP and FSDP2"
        )


def run_estimate(request: EstimateRequest, listener: Listener | None = None) -> EstimateResult | Sweep:
    """The estimate of a script or a notebook: a Sweep for several world sizes, else one result.
    Raises EstimateInputError (nothing ran) or EstimateError (the estimate failed)."""
    listener = listener or Listener()
    from oom_lsp.notebooks import is_notebook_path

    if is_notebook_path(str(request.script)):
        return _estimate_notebook(request, listener)
    check_distributed(request, request.script)
    return _estimate_script(request, request.script, listener)


def _estimate_script(request: EstimateRequest, script: Path, listener: Listener) -> EstimateResult | Sweep:
    options = options_for(request, script, listener)
    if request.world_sizes and len(request.world_sizes) > 1:
        from oom_lsp.estimate.sweep import sweep

        return sweep(options, request.world_sizes, request.find_max_batch, listener.message)
    if request.find_max_batch:
        result = find_max_batch(options, listener.message)
    else:
        result = EstimateResult(estimate(options, listener.message))
    if request.compare_with_what_if:
        result.what_if_check = what_if_check(request, options, result)
        # The plain estimate's JSON always says it (null: no what-if predicted this text); a
        # search's only when a what-if did.
        result.what_if_checked = not request.find_max_batch or result.what_if_check is not None
    return result


def _estimate_notebook(request: EstimateRequest, listener: Listener) -> EstimateResult:
    """The saved notebook's code cells run in order as one script in its folder (as its kernel
    would); every place the result names is a cell and a line in it."""
    from oom_lsp.notebooks.document import NotebookError
    from oom_lsp.notebooks.run import notebook_as_script

    try:
        with notebook_as_script(request.script, request.display) as run:
            warning = run.built.warning()
            if warning and listener.on_warning is not None:
                listener.on_warning(warning)
            named = dataclasses.replace(
                listener,
                on_message=(lambda text: listener.message(run.places.text(text)))
                if listener.on_message
                else None,
            )
            check_distributed(request, run.script)
            in_folder = dataclasses.replace(request, cwd=run.cwd, compare_with_what_if=False)
            try:
                result = _estimate_script(in_folder, run.script, named)
            except EstimateError as error:
                raise EstimateError(run.places.text(str(error))) from None
            assert isinstance(result, EstimateResult)
            return EstimateResult.from_json(run.report(result.to_json()))
    except NotebookError as error:
        raise EstimateInputError(f"{request.shown}: {error}") from None


def what_if_check(
    request: EstimateRequest, options: EstimateOptions, result: EstimateResult
) -> WhatIfCheck | None:
    """How this estimate compares with a what-if's prediction for exactly this script text
    (decoded as the what-if decoded it: its line endings and without a byte-order mark). The
    search's first trace is not the estimate's worst case: when the text is one the what-if
    predicted, the plain estimate runs too, like with like."""
    check = _compare(request, options, result.prediction)
    if check is not None and request.find_max_batch:
        if options.on_event is not None:
            options.on_event({"event": "comparing", "change": check.change})
        check = _compare(request, options, estimate(options))
    return check


def _compare(
    request: EstimateRequest, options: EstimateOptions, prediction: Prediction
) -> WhatIfCheck | None:
    from oom_lsp.checker import decode_source
    from oom_lsp.config import ConfigError, ConfigResolver

    script = options.script
    try:
        root = request.root if request.root is not None else ConfigResolver().resolve(script).root
        record = load_record(root, str(script))
        text = decode_source(script.read_bytes()).text
    except (ConfigError, OSError):
        return None
    if record is None or text is None:
        return None
    return compare_with_record(
        record,
        source_digest(text),
        options.batch_size,
        options.autocast_dtype,
        options.world_size,
        prediction.needed_bytes,
    )
