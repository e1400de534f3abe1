"""The parent side of `oom-lsp estimate`: run the harness under the user's
interpreter (through the profiling runner: own process group, timeout,
cancellation), then turn its trace into a prediction for the target GPU.

No torch import here: this runs in the CLI and, later, in the language server.

What the trace gives (the harness/ package): the peak of live storages over the first
two optimizer steps, its breakdown and location, and the allocation log.
What is added here for `device="cuda"` (each listed in `corrections`):
cuBLAS/cuBLASLt workspaces, the caching allocator's segments (reserved), the
CUDA context; the kernel choices (SDPA, foreach, cuDNN RNN reserve, 512 B
rounding) were already applied inside the trace.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.estimate import distributed
from oom_lsp.estimate.allocator import simulate
from oom_lsp.estimate.gpus import Gpu
from oom_lsp.estimate.results import (
    Accumulation,
    Breakdown,
    Category,
    Correction,
    EstimateResult,
    Fallback,
    GpuTarget,
    LinearFit,
    MaxBatchSearch,
    PeakAt,
    Prediction,
    Trace,
    Verdict,
    WorstCase,
)
from oom_lsp.profiling.runner import NO_TORCH_EXIT, ProfileError, ProfileRequest, ProfileRun
from oom_lsp.units import format_bytes

# Started by path (harness/__main__.py explains why): the user's interpreter need not have oom_lsp.
HARNESS = Path(__file__).resolve().parent / "harness" / "__main__.py"
MIB, GIB = 2**20, 2**30
# Not in memory_allocated/reserved, only in nvidia-smi: ~300 MB with CUDA's lazy
# module loading (the default since CUDA 12.2), 200-700 MB by machine.
CUDA_CONTEXT = 400 * MIB
DEFAULT_MARGIN = 0.10
CUBLAS_WORKSPACE_PRE_HOPPER = 8_519_680  # CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8
CUBLAS_WORKSPACE_HOPPER = 32 * MIB
# Traces of the estimate when the draw of the data decides the first batch's shapes (seeds 0, 1, 2).
DATA_DRAWS = 3
_NO_KNOB = (
    "cannot change the script's batch size: it is set neither by an argparse option (--batch-size, "
    "--batch_size, --bs...), DataLoader(batch_size=...), a module global (batch_size = 8), "
    "TrainingArguments(per_device_train_batch_size=...) nor a Lightning module's or data module's "
    "batch_size parameter; pass it one of those ways"
)


class EstimateError(RuntimeError):
    """The estimate could not be made; the message says why, for the user."""


@dataclass
class EstimateOptions:
    script: Path
    script_args: list[str] = field(default_factory=list)
    device: str = "cuda"  # "cuda": predict the GPU; "cpu": the trace as a real CPU step measures it
    gpu: Gpu | None = None
    batch_size: int | None = None
    python: str = sys.executable
    timeout: float = 300.0
    cwd: Path | None = None
    threads: int = 1
    autocast_dtype: str | None = None  # --dtype bf16/fp16: the step as if under torch.autocast
    # The share of the GPU kept free: "tight" above it, and the largest batch stays under it.
    margin: float = DEFAULT_MARGIN
    # Set from another thread (the editor) to stop every run of this estimate.
    cancel: threading.Event | None = None
    # torchrun-style scripts: traced as rank 0 of world_size (estimate/distributed.py).
    world_size: int | None = None
    nproc_per_node: int | None = None
    launcher_environment: dict[str, str] | None = None  # accelerate's, from --accelerate-config
    # Progress: {"event": "starting"} before each child interpreter, then the harness's own
    # events from a reader thread: "ready", "run-start", "step", "run" (harness/progress.py).
    on_event: Callable[[dict[str, Any]], None] | None = None


class _HarnessRun(ProfileRun):
    """The profiling runner (process group, timeout, cancellation, output tail)
    with this package's harness and result file."""

    def __init__(
        self,
        request: ProfileRequest,
        payload: dict[str, Any],
        cancel: threading.Event | None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(request, on_progress=on_event, cancel=cancel)
        self.payload = payload
        self.outcome: str | None = None
        self.returncode: int | None = None

    def command(self, progress_fd: int) -> list[str]:
        request_file = self.request.out / "request.json"
        request_file.write_text(json.dumps(self.payload), encoding="utf-8")
        return [
            self.request.python,
            str(HARNESS),
            "--request",
            str(request_file),
            "--progress-fd",
            str(progress_fd),
        ]

    def environment(self) -> dict[str, str]:
        # The profiling harness is found through PYTHONPATH; this one is started by path and
        # needs nothing there: the script gets the PYTHONPATH it would have had.
        env = super().environment()
        # What the harness seeds: Python's hash randomisation too (set order can order data).
        env.setdefault("PYTHONHASHSEED", "0")
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        else:
            env.pop("PYTHONPATH", None)
        return env

    def _report(self, outcome: str | None, returncode: int) -> Any:
        self.outcome, self.returncode = outcome, returncode
        return None

    def output_tail(self) -> str:
        return "\n".join(self._tail)


def run_harness(
    options: EstimateOptions,
    runs: list[dict[str, Any]],
    mode: str = "fake",
    profile_replay: bool = False,
    cancel: threading.Event | None = None,
) -> list[dict[str, Any]]:
    """Run the script once per entry of `runs` (each may set "batch_size", an
    int or "double") in one child interpreter; the harness results, in order."""
    with tempfile.TemporaryDirectory(prefix="oom-lsp-estimate-") as tmp:
        out = Path(tmp)
        payload = {
            "script": str(options.script.resolve()),
            "args": list(options.script_args),
            "mode": mode,
            "device": options.device,
            "runs": runs,
            "output": str(out / "result.json"),
            "profile_replay": profile_replay,
            "threads": options.threads,
            "autocast_dtype": options.autocast_dtype,
            "gpu_name": options.gpu.name if options.gpu else None,
            "gpu_memory": options.gpu.memory if options.gpu else None,
            "gpu_capability": list(options.gpu.arch) if options.gpu and options.gpu.arch else None,
            "distributed": distributed.launch(
                options.world_size, options.nproc_per_node, options.launcher_environment
            )
            if options.world_size
            else None,
        }
        request = ProfileRequest(
            script=options.script,
            out=out,
            script_args=list(options.script_args),
            device=options.device,
            python=options.python,
            timeout=options.timeout,
            cwd=options.cwd,
        )
        run = _HarnessRun(request, payload, cancel or options.cancel, options.on_event)
        if options.on_event:
            options.on_event({"event": "starting"})
        try:
            run.start()
        except ProfileError as error:
            raise EstimateError(str(error)) from None
        run.wait()
        tail = run.output_tail()
        if run.outcome == "timeout":
            raise EstimateError(
                f"the script did not reach its second optimizer step within {options.timeout:g} s "
                "(killed with its whole process group); raise --timeout, or check that it trains"
            )
        if run.outcome == "cancelled":
            raise EstimateError("cancelled")
        if run.returncode == NO_TORCH_EXIT:
            raise EstimateError(f"{options.python} cannot import torch: install torch there or pass --python")
        result_file = out / "result.json"
        if not result_file.exists():
            raise EstimateError(
                f"the interpreter exited with code {run.returncode} before reporting; its output ended with:\n"
                + _last_lines(tail, 15)
            )
        results = json.loads(result_file.read_text(encoding="utf-8"))["runs"]
        for result in results:
            result["output_tail"] = _last_lines(tail, 15)
        return results


def _last_lines(text: str, count: int) -> str:
    return "\n".join(text.splitlines()[-count:])


def traces(
    options: EstimateOptions,
    runs: list[dict[str, Any]],
    mode: str = "fake",
    cancel: threading.Event | None = None,
) -> list[Trace]:
    """`run_harness`, each result read into a Trace."""
    return [Trace.from_harness(result) for result in run_harness(options, runs, mode, cancel=cancel)]


# --- From a trace to a prediction ------------------------------------------------


def cublas_workspaces(gpu: Gpu | None, torch_version: str) -> list[tuple[str, int]]:
    """cuBLAS and cuBLASLt workspaces, allocated through the caching allocator
    at the first matmul and kept: sizes by GPU architecture and torch release
    (PyTorch PRs #89027/#91564, #120925; cuBLASLt shares cuBLAS's since 2.7)."""
    if gpu is not None and gpu.vendor != "nvidia":
        return []
    hopper = gpu is not None and gpu.arch is not None and gpu.arch >= (9, 0)
    sizes = [("cuBLAS", CUBLAS_WORKSPACE_HOPPER if hopper else CUBLAS_WORKSPACE_PRE_HOPPER)]
    if _version(torch_version) < (2, 7):
        if hopper:
            lt = 32 * MIB
        elif gpu is not None and gpu.arch is not None and gpu.arch >= (8, 0) and gpu.memory >= 24 * GIB:
            lt = 4 * MIB
        else:
            lt = 1 * MIB
        sizes.append(("cuBLASLt", lt))
    return sizes


def _version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def verdict(required: int, capacity: int, margin: float = DEFAULT_MARGIN) -> Verdict:
    if required > capacity:
        return Verdict.OOM
    if required > capacity * (1 - margin):
        return Verdict.TIGHT
    return Verdict.FITS


def needed_bytes(prediction: Prediction) -> int:
    """What must stay under the margin (Prediction.needed_bytes)."""
    return prediction.needed_bytes


def predict(trace: Trace, options: EstimateOptions) -> Prediction:
    """The prediction for one harness run (see docs/estimate.md for the fields): what the trace
    measured, the terms it needs (its own notes; on CUDA the kernels' and the allocator's; the
    distributed engines'), the verdict for the target, and the worst case of the data."""
    cuda = options.device == "cuda"
    breakdown = Breakdown(dict(trace.breakdown.sizes))
    corrections = trace_notes(trace, options)
    allocated, reserved, context = trace.peak_bytes, None, None
    if cuda:
        terms = cuda_terms(trace, options.gpu)
        corrections = [TRACED_ON_CPU, *corrections, *terms.notes]
        if terms.workspace_bytes:
            breakdown[Category.WORKSPACES] = terms.workspace_bytes
        allocated += terms.workspace_bytes
        reserved, context = terms.reserved_bytes, terms.context_bytes
    if trace.distributed:
        notes, reserved_extra, outside_allocator = distributed.terms(trace, cuda, options.script)
        corrections += notes
        if reserved is not None:
            reserved += reserved_extra
        if context is not None:
            context += outside_allocator
    prediction = _assemble(trace, options, allocated, breakdown, reserved, context, corrections)
    if options.gpu is not None:
        _set_verdict(prediction, options.gpu.memory, options.margin)
    worst = trace.worst_case
    if worst is not None and worst.reached_two_steps:
        prediction.worst_case = _worst_case(worst, options)
    return prediction


def trace_notes(trace: Trace, options: EstimateOptions) -> list[Correction]:
    """What the trace itself says needs saying: how it was traced (autocast, --dtype, compile),
    memory the kernels hold that it measured or modelled (cuDNN/oneDNN, operand copies, loss
    buffers), and what the data did (padded batches, the draws, values only a real run knows)."""
    cuda = options.device == "cuda"
    notes: list[Correction] = []
    if trace.autocast_regions:
        dtypes = "/".join(trace.autocast_dtypes or ["float16"])
        notes.append(
            Correction(
                "autocast",
                f'autocast("cuda", {dtypes}) traced as autocast("cpu", {dtypes}), whose weight-cast cache '
                "works as CUDA's (one low-precision copy per weight per autocast region)",
            )
        )
    if trace.script_autocast:
        notes.append(
            Correction(
                "dtype", f"--dtype {trace.script_autocast}: the whole script traced under torch.autocast"
            )
        )
    if trace.compiled:
        notes.append(
            Correction(
                "torch-compile",
                "torch.compile traced eagerly: compiled (fused) kernels keep fewer intermediates, "
                "so the real peak may be lower",
            )
        )
    notes += _kernel_notes(trace, cuda)
    if trace.batch_padded:
        got, wanted = trace.batch_padded
        notes.append(
            Correction(
                "batch-shaped",
                f"the dataset gave batches of {got}; the inputs were shaped as batches of {wanted}",
            )
        )
    if trace.bf16_emulated:
        gpu = options.gpu
        arch = gpu.arch if gpu else None
        target = f"{gpu.name} (sm {arch[0]}.{arch[1]})" if gpu and arch else "the target"
        notes.append(
            Correction(
                "bf16-emulated",
                f"{target} has no native bf16: torch.cuda.is_bf16_supported() answered True, as torch does "
                "there (it emulates bf16), so the script's bf16 path was traced",
            )
        )
    notes += _data_notes(trace, cuda)
    return notes


def _kernel_notes(trace: Trace, cuda: bool) -> list[Correction]:
    """Memory kernels hold inside themselves, invisible to a fake trace: measured on the real
    CPU kernels (added on the CPU), modelled or stated on CUDA."""
    notes = []
    rnn = trace.rnn_workspace
    if rnn.calls:
        if cuda:
            notes.append(
                Correction(
                    "cudnn-rnn-reserve",
                    f"cuDNN LSTM reserve space modelled (6 x hidden per element, not calibrated on a GPU; "
                    f"{format_bytes(rnn.bytes)} for the largest layer call); the meta kernel reports 0 bytes",
                    rnn.bytes,
                )
            )
        else:
            notes.append(
                Correction(
                    "onednn-rnn-workspace",
                    f"oneDNN LSTM workspace measured on the real kernel at sequence lengths 1 and 2 and "
                    f"extrapolated ({format_bytes(rnn.bytes)} for the largest layer call); the meta kernel "
                    "reports 0 bytes",
                    rnn.bytes,
                )
            )
    conv = trace.conv_scratch
    if conv.calls:
        notes.append(
            Correction(
                "onednn-conv-scratch",
                f"oneDNN convolution scratch (allocated inside the kernel, invisible to the trace) measured on "
                f"the real kernel at batch 2 and 4 for {conv.calls} distinct convolution(s) and extrapolated "
                f"(up to {format_bytes(conv.bytes)} at once)",
                conv.bytes,
            )
        )
    copies = trace.matmul_copies
    if copies.calls:
        what = (
            f"{copies.calls} matrix product(s) read an operand BLAS cannot read in place (a stride-0 "
            f"gradient, a column slice, a broadcast row), which the kernel copies and frees inside itself "
            f"(up to {format_bytes(copies.bytes)} at once)"
        )
        notes.append(
            Correction(
                "matmul-operand-copy",
                what
                + (
                    ": cuBLAS copies them too (PyTorch's source), not added: not checked on a GPU"
                    if cuda
                    else ": added at that op, as measured on the CPU kernels"
                ),
                None if cuda else copies.bytes,
            )
        )
    losses = trace.loss_buffers
    if losses.calls:
        notes.append(
            Correction(
                "loss-buffer",
                f"{losses.calls} reduced loss(es) (MSE, smooth L1, soft margin, BCE) keep their elementwise "
                f"buffer as their storage (up to {format_bytes(losses.bytes)}) for as long as the loss lives"
                + (
                    ": the CUDA kernels share that code, not added: not checked on a GPU"
                    if cuda
                    else ": added to each loss, as measured on the CPU kernels"
                ),
                None if cuda else losses.bytes,
            )
        )
    if cuda and trace.convolutions:
        notes.append(
            Correction(
                "cudnn-conv-workspace",
                "convolutions: cuDNN's workspaces are allocated inside the kernel and not modelled; cuDNN picks "
                "an algorithm whose workspace fits the free memory, so it shrinks rather than fails",
            )
        )
    return notes


def _data_notes(trace: Trace, cuda: bool) -> list[Correction]:
    """What the data did to the trace: its draw deciding the peak, tensors put on "cuda" by a
    script that saw no GPU, random numbers not drawn for real, values only a real run knows."""
    notes = []
    spread = trace.data_spread
    if spread and len(spread.peak_bytes) > 1:
        peaks = spread.peak_bytes
        notes.append(
            Correction(
                "data-draw",
                f"the draw of the data decides the peak: {len(peaks)} draws of what the harness seeds "
                f"(the DataLoader's shuffle, random, NumPy, torch) gave {format_bytes(min(peaks))} to "
                f"{format_bytes(max(peaks))} traced (this estimate: seed {spread.seeds[0]})",
                max(peaks) - min(peaks),
            )
        )
    kept = trace.cuda_kept_on_cpu
    if kept and not cuda:
        places = ", ".join(_place(spot["file"], spot["line"]) for spot in kept[:3] if spot["file"])
        notes.append(
            Correction(
                "cuda-kept-on-cpu",
                'the script saw no GPU (--device cpu) but put tensors on "cuda" without asking'
                + (f" ({places}{', ...' if len(kept) > 3 else ''})" if places else "")
                + ': traced on the CPU, where a CPU-only torch would stop with "Torch not compiled with '
                'CUDA enabled"',
            )
        )
    if trace.draws_not_replayed:
        notes.append(
            Correction(
                "draws-not-replayed",
                f"{trace.draws_not_replayed:,} random numbers drawn before the training step (a large "
                "random initialisation) were not drawn for real: what the script draws after them (a "
                "DataLoader's shuffle) may differ from a real run's",
            )
        )
    if trace.stubbed_scalars:
        notes.append(
            Correction(
                "data-dependent-values",
                f"{trace.stubbed_scalars} read(s) of a value only a real run knows (.item(), if tensor:) "
                "were answered 0/False",
            )
        )
    return notes


TRACED_ON_CPU = Correction(
    "traced-on-cpu",
    "traced on the fake CPU device (faking cuda on a CPU-only torch aborts in backward); "
    "CUDA's kernel choices applied below",
)


@dataclass
class CudaTerms:
    """What CUDA adds to a trace made on the CPU: the kernels it picks, its allocations'
    rounding, the cuBLAS workspaces (allocated), the caching allocator's segments (reserved)
    and the context (outside PyTorch's counters), each stated in `notes`."""

    notes: list[Correction]
    workspace_bytes: int
    reserved_bytes: int
    context_bytes: int


def cuda_terms(trace: Trace, gpu: Gpu | None) -> CudaTerms:
    notes = []
    sdpa = trace.sdpa
    if sdpa.get("sdpa_flash") or sdpa.get("sdpa_mem_efficient"):
        notes.append(
            Correction(
                "sdpa-cuda-kernels",
                f"scaled_dot_product_attention routed to CUDA's flash ({sdpa.get('sdpa_flash', 0)} calls) / "
                f"memory-efficient ({sdpa.get('sdpa_mem_efficient', 0)} calls) kernels instead of the CPU "
                "math path",
            )
        )
    if sdpa.get("sdpa_math_kept"):
        notes.append(
            Correction(
                "sdpa-math-kept",
                f"{sdpa['sdpa_math_kept']} attention call(s) with grouped-query heads kept on the math path "
                "(an over-estimate if CUDA picks a fused kernel)",
            )
        )
    if trace.foreach_pinned:
        notes.append(
            Correction(
                "foreach-optimizer",
                "optimizers without an explicit foreach/fused use foreach, as CUDA parameters do",
            )
        )
    notes.append(
        Correction("rounding", "every allocation rounded up to 512 B, as the CUDA caching allocator does")
    )
    workspaces = cublas_workspaces(gpu, trace.torch) if trace.matmuls else []
    events = [[-1 - index, size] for index, (_, size) in enumerate(workspaces)] + trace.events
    model = simulate(events)
    workspace_bytes = sum(size for _, size in workspaces)
    if workspaces:
        notes.append(
            Correction(
                "cublas-workspace",
                " + ".join(f"{name} {format_bytes(size)}" for name, size in workspaces)
                + " of workspace (kept from the first matmul)",
                workspace_bytes,
            )
        )
    allocated = trace.peak_bytes + workspace_bytes
    reserved = max(model.peak_reserved, allocated)
    notes.append(
        Correction(
            "allocator-segments",
            "reserved memory from a model of the caching allocator's segments (2 MiB / 20 MiB / rounded to "
            "2 MiB; not calibrated on a GPU)",
            reserved - allocated,
        )
    )
    notes.append(
        Correction(
            "cuda-context",
            f"CUDA context ~{format_bytes(CUDA_CONTEXT)} (outside PyTorch's counters; 200-700 MB by machine)",
            CUDA_CONTEXT,
        )
    )
    return CudaTerms(notes, workspace_bytes, reserved, CUDA_CONTEXT)


def _assemble(
    trace: Trace,
    options: EstimateOptions,
    allocated: int,
    breakdown: Breakdown,
    reserved: int | None,
    context: int | None,
    corrections: list[Correction],
) -> Prediction:
    line = trace.peak_line
    prediction = Prediction(
        script=str(options.script),
        args=list(options.script_args),
        device=options.device,
        batch_size=trace.batch_size,
        peak_bytes=allocated,
        breakdown=breakdown,
        reserved_bytes=reserved,
        context_bytes=context,
        process_bytes=reserved + context if reserved is not None and context is not None else None,
        peak_at=PeakAt(
            op=trace.peak_op,
            module=trace.peak_module,
            phase=trace.peak_phase,
            file=line[0] if line else None,
            line=line[1] if line else None,
        ),
        top_modules=list(trace.top_modules),
        top_lines=list(trace.top_lines),
        gpu=GpuTarget(options.gpu.name, options.gpu.memory) if options.gpu else None,
        verdict=None,
        corrections=corrections,
        steps_traced=trace.steps,
        seconds=trace.seconds,
        method="fake-tensor trace of two optimizer steps",
        torch=trace.torch,
        batch_knobs=list(trace.batch_knobs),
        data_spread=trace.data_spread,
        peak_batch=trace.peak_batch,
        batches_traced=trace.batches_traced,
    )
    if trace.distributed:
        prediction.distributed = distributed.describe(trace)
        prediction.method += f" as rank 0 of {trace.distributed['world_size']} (fake process group)"
    return prediction


def _worst_case(trace: Trace, options: EstimateOptions) -> WorstCase:
    """The run where each loader whose batches differ in shape gave, for every batch, the longest
    batch its data can produce: an upper bound over the draws, stated beside the estimate."""
    bound = predict(dataclasses.replace(trace, worst_case=None), options)
    return WorstCase(
        peak_bytes=bound.peak_bytes,
        reserved_bytes=bound.reserved_bytes,
        context_bytes=bound.context_bytes,
        process_bytes=bound.process_bytes,
        verdict=bound.verdict,
        peak_at=bound.peak_at,
        batches=list(trace.longest_batches),
    )


def _set_verdict(prediction: Prediction, capacity: int, margin: float) -> None:
    required = prediction.peak_bytes + (prediction.context_bytes or 0)
    prediction.verdict = verdict(required, capacity, margin)
    if prediction.verdict is Verdict.FITS and prediction.needed_bytes > capacity * (1 - margin):
        prediction.verdict = Verdict.TIGHT


def _place(file: str | None, line: int | None) -> str:
    """file:line, the file relative to the current folder when it is under it."""
    if not file:
        return "?"
    try:
        shown = str(Path(file).resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = file
    return f"{shown}:{line}"


def _failure_error(trace: Trace) -> EstimateError:
    """The crash in one line, then the script's own frames (not runpy's, torch's or ours)."""
    failure = trace.failure
    where = failure.where
    location = f" at {_place(where['file'], where['line'])}" if where else ""
    if failure.kind == "needs-download":
        # A Hub name with no local copy (the harness runs offline): what is needed, in one line.
        return EstimateError(f"no estimate{location}: {failure.message}")
    lines = [f"the script crashed{location}: {failure.type}: {failure.message}"]
    if failure.frames:
        lines.append("  the script's frames, innermost last:")
        for frame in failure.frames:
            lines.append(f"    {_place(frame['file'], frame['line'])}, in {frame['function']}")
            if frame.get("code"):
                lines.append(f"      {frame['code']}")
    else:  # raised where no frame is in the script's folder: the traceback's end is all there is
        lines += [f"  {line}" for line in _last_lines(failure.traceback, 6).splitlines()]
    return EstimateError("\n".join(lines))


def reached_two_steps(trace: Trace) -> bool:
    """The evidence an estimate needs: the harness stops the script at the end of its second step."""
    return trace.reached_two_steps


def _no_steps_error(trace: Trace, batch: int | None = None) -> EstimateError:
    """Why a run that did not reach two optimizer steps gives no estimate: one
    line, then what the script's data loaders gave and the end of its output."""
    steps = trace.steps
    when = "before its first optimizer step" if steps == 0 else f"after {steps} optimizer step"
    at_batch = f" at batch {batch}" if batch else ""
    if trace.status == "script-exit":
        where = trace.failure.where
        location = f" at {_place(where['file'], where['line'])}" if where else ""
        reason = f"the script exited with code {trace.failure.exit_code}{location}{at_batch} {when}"
    else:
        reason = f"the script ended{at_batch} {when}"
    lines = [f"no estimate: {reason}; an estimate needs two"]
    lines += [f"  {explanation}" for explanation in _short_loaders(trace)]
    tail = [line for line in trace.output_tail.splitlines() if line.strip()][-6:]
    if tail:
        lines.append("  the script's output ended with:")
        lines += [f"    | {line}" for line in tail]
    return EstimateError("\n".join(lines))


def _short_loaders(trace: Trace) -> list[str]:
    """DataLoaders that give fewer than two batches, in words."""
    found = []
    for loader in trace.loaders:
        if loader.batches is None or loader.batches >= 2:
            continue
        batches = loader.batches
        found.append(
            f"DataLoader at {_place(loader.place.file, loader.place.line)} gives {batches} "
            f"batch{'' if batches == 1 else 'es'}: {loader.samples} samples in batches of "
            f"{loader.batch_size}" + (", drop_last=True" if loader.drop_last else "")
        )
    return found


def _require_two_steps(trace: Trace, batch: int | None = None) -> None:
    if trace.failed:
        raise _failure_error(trace)
    if not trace.reached_two_steps:
        raise _no_steps_error(trace, batch)


# --- Commands ----------------------------------------------------------------------


Progress = Callable[[str], None]


def estimate(options: EstimateOptions, progress: Progress | None = None) -> Prediction:
    """One prediction; falls back to real CPU steps when the script cannot be faked."""
    (trace,) = traces(options, [{"batch_size": options.batch_size, "draws": DATA_DRAWS, "worst_case": True}])
    return prediction_from(trace, options, progress)


def prediction_from(trace: Trace, options: EstimateOptions, progress: Progress | None = None) -> Prediction:
    """The prediction for a fake run of the script, or for real CPU steps when it could not be faked."""
    if not trace.failed:
        _require_two_steps(trace)
        if options.batch_size is not None and not trace.override_applied:
            raise EstimateError(_NO_KNOB)
        return predict(trace, options)
    if trace.failure.kind not in ("data-dependent", "unsupported-operator"):
        raise _failure_error(trace)
    if progress:
        progress("the script cannot run on fake tensors; measuring real CPU steps instead")
    return _fallback(options, trace)


def _fallback(options: EstimateOptions, fake_trace: Trace) -> Prediction:
    """Real CPU steps at a quarter and half of the target batch, the peak
    scaled linearly to the target."""
    failure = fake_trace.failure
    where = failure.where or {}
    reason = (
        f"{failure.type} at {where.get('file')}:{where.get('line')} ({where.get('code', '')}): "
        f"{failure.message}"
        if where
        else f"{failure.type}: {failure.message}"
    )
    target = options.batch_size or fake_trace.batch_size
    if fake_trace.batch_knobs and target and target >= 4:
        sizes = fallback_batches(target)
        measured = traces(options, [{"batch_size": size} for size in sizes], mode="real")
        for size, trace in zip(sizes, measured):
            _require_two_steps(trace, size)
        intercept, slope = _fit(measured)
        prediction_trace = measured[-1]
        prediction = predict(prediction_trace, options)
        scaled = int(intercept + slope * target)
        prediction.peak_bytes += scaled - measured[-1].peak_bytes
        prediction.batch_size = target
        prediction.breakdown_batch_size = measured[-1].batch_size
        prediction.method = f"real CPU steps at batch {sizes[0]} and {sizes[1]}, scaled linearly to {target}"
        uncertainty = (
            "a lower bound: the peak is the largest of several phases, each linear in the batch, so a line "
            "through two smaller batches can only fall short when another phase takes over; CPU kernels, "
            "not CUDA's (attention math path, no cuDNN)"
        )
    else:
        (prediction_trace,) = traces(options, [{"batch_size": options.batch_size}], mode="real")
        _require_two_steps(prediction_trace)
        prediction = predict(prediction_trace, options)
        prediction.method = "a real CPU step at the script's own batch size"
        uncertainty = "CPU kernels, not CUDA's (attention math path, no cuDNN)"
    if options.gpu is not None:
        if prediction.reserved_bytes is not None:
            prediction.reserved_bytes = max(prediction.reserved_bytes, prediction.peak_bytes)
            prediction.process_bytes = prediction.reserved_bytes + (prediction.context_bytes or 0)
        _set_verdict(prediction, options.gpu.memory, options.margin)
    library = fake_trace.quantized_failure
    layers = prediction_trace.quantized_layers or fake_trace.quantized_layers
    if library or layers:
        named = ", ".join(f"{count} {name}" for name, count in sorted(layers.items())) or library
        uncertainty += (
            f"; quantized layers ({named})"
            + (
                f": the fake run failed inside {library} (no fake implementation of its layers or kernels)"
                if library
                else ""
            )
            + ", so this measures their library's CPU backend (its quantized weights, dequantized copies and "
            "buffers as on the CPU), not its CUDA kernels"
        )
    prediction.corrections = [
        Correction(
            note.name,
            "measured by real CPU steps (the script could not run on fake tensors); CUDA's "
            "allocator terms applied below",
            note.bytes,
        )
        if note.name == "traced-on-cpu"
        else note
        for note in prediction.corrections
    ]
    prediction.fallback = Fallback(reason, uncertainty)
    if prediction.distributed is not None:
        prediction.method += f" as rank 0 of {options.world_size} (fake process group)"
    return prediction


def fallback_batches(target: int) -> tuple[int, int]:
    """A quarter and a half of the target: close enough that the phase holding
    the peak is the same as at the target, small enough to run on a CPU."""
    return max(1, target // 4), max(2, target // 2)


def _fit(measured: list[Trace]) -> tuple[float, float]:
    (b1, p1), (b2, p2) = ((t.batch_size, t.peak_bytes) for t in measured[:2])
    slope = (p2 - p1) / (b2 - b1)
    return p1 - slope * b1, slope


def accumulation_steps(batch: int, largest: int) -> int:
    """Steps of gradient accumulation so that micro-batches fit: the fewest
    that divide `batch` exactly (same effective batch) if one is within twice
    the minimum, else the minimum (effective batch rounded up)."""
    minimum = math.ceil(batch / largest)
    for steps in range(minimum, 2 * minimum + 1):
        if batch % steps == 0:
            return steps
    return minimum


_MAX_CHECKS = 8


@dataclass
class _Search:
    """What the checks of a batch-size search found: the largest batch that
    fits the budget, the smallest that does not, the smallest at which the
    script did not reach two optimizer steps (each: batch, prediction or trace)."""

    budget: int
    fitting: tuple[int, Prediction] | None = None
    over: list[tuple[int, Prediction]] = field(default_factory=list)  # the checks over the budget
    no_steps: tuple[int, Trace] | None = None
    checks: int = 0

    @property
    def too_large(self) -> tuple[int, Prediction] | None:
        return min(self.over, key=lambda check: check[0]) if self.over else None

    def upper(self) -> tuple[str, int] | None:
        bounds = [("memory", self.too_large[0])] if self.too_large else []
        if self.no_steps:
            bounds.append(("data", self.no_steps[0]))
        return min(bounds, key=lambda bound: bound[1]) if bounds else None

    def next_candidate(self) -> int | None:
        """The next batch to check, or None when the search is done."""
        upper = self.upper()
        if upper is None:
            return None  # the line's answer fits, and nothing above it was asked
        kind, high_batch = upper
        low_batch = self.fitting[0] if self.fitting else 0
        if high_batch <= low_batch + 1:
            return None
        if kind == "data":
            assert self.no_steps is not None
            bound = _fewer_batches_above(self.no_steps[1])
            if bound is None:
                return (low_batch + high_batch) // 2 or None
            # Every batch above `bound` gives the loader as few batches per pass as the failed check.
            return bound if low_batch < bound < high_batch else None
        if self.fitting is None:
            return high_batch // 2 or None
        # Slopes of the allocated peak (the reserved memory grows in whole segments). With two
        # checks over the budget, the line through them (the regime of large batches: the peak
        # may have moved to another phase there, where it grows faster) is followed down from
        # the lower one; with one, the secant from the largest batch that fits is followed up.
        if high_batch - low_batch <= low_batch // 200:
            return None  # within 0.5 %: the reserved memory moves in whole segments anyway
        if len(self.over) >= 2:
            (below, lower), (above, upper_check) = sorted(self.over, key=lambda check: check[0])[:2]
            slope = (upper_check.peak_bytes - lower.peak_bytes) / (above - below)
            if slope > 0:
                candidate = below - math.ceil((lower.needed_bytes - self.budget) / slope)
                if low_batch < candidate < high_batch:
                    return candidate
        low, high = self.fitting[1], self.over_at(high_batch)
        slope = (high.peak_bytes - low.peak_bytes) / (high_batch - low_batch)
        room = self.budget - low.needed_bytes
        step = math.floor(room / slope) if slope > 0 else 0
        candidate = min(high_batch - 1, low_batch + max(1, step))
        return candidate if candidate > low_batch else None

    def over_at(self, batch: int) -> Prediction:
        return next(prediction for checked, prediction in self.over if checked == batch)


def _fewer_batches_above(trace: Trace) -> int | None:
    """For a run whose loaders gave too few batches: the largest batch at which
    each of them gives one batch more per pass (all samples in one batch when
    it gave none; two batches when it gave one)."""
    bounds = []
    for loader in trace.loaders:
        batches, samples = loader.batches, loader.samples
        if batches is None or batches >= 2 or not samples:
            continue
        if batches == 0:
            bounds.append(samples)
        else:
            bounds.append(samples // 2 if loader.drop_last else samples - 1)
    return min(bounds) if bounds else None


def _search_largest_fitting(
    options: EstimateOptions,
    base: Prediction,
    base_batch: int,
    candidate: int,
    budget: int,
    progress: Progress | None,
) -> _Search:
    """Check the line's answer with fake runs and refine it.

    The peak is affine in the batch size only while it happens at the same
    place: a small batch can peak in the optimizer step and a large one in
    the backward pass, with a much steeper slope. So each check that does not
    fit becomes a new point of a secant through the largest batch known to
    fit, and the search stays between the two bounds. A check at which the
    script does not reach two optimizer steps (a batch larger than its data)
    is no evidence either way: it bounds the search from above too.
    """
    search = _Search(budget)
    if base.needed_bytes <= budget:
        search.fitting = (base_batch, base)
    next_batch: int | None = candidate
    while next_batch is not None and search.checks < _MAX_CHECKS:
        if progress:
            progress(f"checking batch size {next_batch} with a fake run")
        (trace,) = traces(options, [{"batch_size": next_batch}])
        search.checks += 1
        if trace.failed:
            raise _failure_error(trace)
        if not trace.reached_two_steps:
            search.no_steps = (next_batch, trace)
        else:
            checked = predict(trace, options)
            if checked.needed_bytes <= budget:
                search.fitting = (next_batch, checked)
            else:
                search.over.append((next_batch, checked))
        next_batch = search.next_candidate()
    return search


def _budget_text(options: EstimateOptions, budget: int) -> str:
    assert options.gpu is not None
    held = "reserved memory + CUDA context" if options.device == "cuda" else "allocated memory"
    return (
        f"{held} within {budget_share(options.margin)} of {format_bytes(options.gpu.memory)} "
        f"({format_bytes(budget)}, a {100 * options.margin:g}% margin)"
    )


def budget_share(margin: float) -> str:
    return f"{100 * (1 - margin):g}%"


_PHASES = {"forward": "forward pass", "backward": "backward pass"}


def _why_not_the_line(
    search: _Search, answer: int, line_answer: int, base_batches: list[int], first: Prediction
) -> str | None:
    """Why the checked answer is not the line's, when they differ by more than a tenth."""
    upper = search.upper()
    if upper is None or abs(line_answer - answer) <= 0.1 * max(answer, 1):
        return None
    kind, high_batch = upper
    if kind == "data":
        assert search.no_steps is not None
        trace = search.no_steps[1]
        loaders = _short_loaders(trace)
        steps = trace.steps
        return (
            f"the memory line alone gives {line_answer:,}, but at batch {high_batch:,} the script reached "
            f"{steps} optimizer step{'' if steps == 1 else 's'}"
            + (f" ({loaders[0]})" if loaders else "")
            + f": {answer:,} is the largest batch checked with two"
        )
    assert search.too_large is not None and search.fitting is not None
    low_batch, low = search.fitting
    high = search.too_large[1]
    slope = (high.peak_bytes - low.peak_bytes) / max(high_batch - low_batch, 1)
    phases = [_PHASES.get(p, p) for p in (first.peak_at.phase, high.peak_at.phase)]
    moved = (
        f"the peak moves from the {phases[0]} (at batch {base_batches[0]:,}) to the {phases[1]} (at batch "
        f"{high_batch:,}), where it grows faster"
        if phases[0] and phases[1] and phases[0] != phases[1]
        else "the peak grows faster at large batches than between the two traces"
    )
    return (
        f"the line through batches {base_batches[0]:,} and {base_batches[1]:,} gives {line_answer:,}; "
        f"{moved}: {format_bytes(int(slope))} per sample between batches {low_batch:,} and {high_batch:,}, "
        f"so the checked answer is {answer:,}"
    )


def find_max_batch(options: EstimateOptions, progress: Progress | None = None) -> EstimateResult:
    """The largest batch that fits the target with a margin: two fake traces
    give peak(bs) = a + b*bs, solved for the budget, then checked (and refined
    where the line does not hold) by fake runs. The result's prediction is the first trace's."""
    if options.gpu is None:
        raise EstimateError("--find-max-batch needs a target: --gpu NAME or --gpu-memory SIZE")
    found = traces(
        options, [{"batch_size": options.batch_size, "draws": DATA_DRAWS}, {"batch_size": "double"}]
    )
    base = found[0]
    _require_two_steps(base, base.batch_size)
    if not base.batch_knobs or not base.batch_size:
        raise EstimateError(_NO_KNOB)
    if len(found) < 2 or not found[1].override_applied:
        raise EstimateError("the second trace (at twice the batch size) could not change the batch size")
    _require_two_steps(found[1], found[1].batch_size)
    first, second = predict(found[0], options), predict(found[1], options)
    batches = [found[0].batch_size, found[1].batch_size]
    slope = (second.peak_bytes - first.peak_bytes) / (batches[1] - batches[0])
    intercept = first.peak_bytes - slope * batches[0]
    budget = int(options.gpu.memory * (1 - options.margin))
    result = MaxBatchSearch(
        fit=LinearFit(int(intercept), int(slope), batches),
        margin=options.margin,
        budget_bytes=budget,
        limit=_budget_text(options, budget),
        script_batch_size=base.batch_size,
    )
    if slope <= 0:
        result.max_batch, result.reason = None, "the peak does not grow with the batch size"
        return EstimateResult(first, result)
    # The line is the allocated peak's; what the budget holds above it (reserved segments, the
    # context) is taken as at the first trace, and every answer is checked by a fake run.
    overhead = first.needed_bytes - first.peak_bytes
    line_answer = math.floor((budget - overhead - intercept) / slope)
    result.line_max_batch = line_answer
    if line_answer < 1:
        result.max_batch = 0
        result.reason = f"even batch size 1 does not keep {result.limit}: the model states alone need more"
        return EstimateResult(first, result)
    search = _search_largest_fitting(options, first, batches[0], line_answer, budget, progress)
    if search.fitting is None:
        reason = f"no batch size checked by a fake run keeps {result.limit}"
        if search.no_steps is not None and search.too_large is None:
            reason = (
                f"no batch size checked by a fake run reached two optimizer steps ({search.no_steps[0]:,})"
            )
        result.max_batch, result.reason = 0, reason
        return EstimateResult(first, result)
    largest, verified = search.fitting
    upper = search.upper()
    result.max_batch = largest
    result.verified = verified
    result.bound = upper[0] if upper else "memory"
    result.next_checked = upper[1] if upper else None
    result.checks = search.checks
    result.explanation = _why_not_the_line(search, largest, line_answer, batches, first)
    script_batch = base.batch_size
    if script_batch and script_batch > largest:
        steps = accumulation_steps(script_batch, largest)
        micro = math.ceil(script_batch / steps)
        result.gradient_accumulation = Accumulation(micro, steps, micro * steps)
    return EstimateResult(first, result)
