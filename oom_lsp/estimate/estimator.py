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
from oom_lsp.estimate.calibration import context_term, workspace_term
from oom_lsp.estimate.cuda_terms import verdict_basis
from oom_lsp.estimate.failures import (
    REAL_STEP_KINDS,
    data_dependent_hint,
    fallback_reason,
    library_line,
    value_notes,
)
from oom_lsp.estimate.gpus import Gpu, format_bytes
from oom_lsp.profiling.runner import NO_TORCH_EXIT, ProfileError, ProfileRequest, ProfileRun

# Started by path (harness/__main__.py explains why): the user's interpreter need not have oom_lsp.
HARNESS = Path(__file__).resolve().parent / "harness" / "__main__.py"
MIB, GIB = 2**20, 2**30
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
    # The CUDA release of the target's PyTorch (--cuda-version): the CUDA context's size depends on it.
    cuda_version: str | None = None
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


def verdict(required: int, capacity: int, margin: float = DEFAULT_MARGIN) -> str:
    if required > capacity:
        return "will run out of memory"
    if required > capacity * (1 - margin):
        return "tight"
    return "fits"


def needed_bytes(prediction: dict[str, Any]) -> int:
    """What must stay under the margin, and what the verdict judges: on CUDA the modelled reserved
    memory (the allocator's segments, fragmentation included) plus the context, as nvidia-smi would
    count the process; on the CPU the allocated peak."""
    return verdict_basis(prediction, 0)["bytes"]


def predict(trace: dict[str, Any], options: EstimateOptions) -> dict[str, Any]:
    """The prediction for one harness run (see docs/estimate.md for the fields)."""
    cuda = options.device == "cuda"
    corrections: list[dict[str, Any]] = []
    breakdown = dict(trace["breakdown"])
    allocated = trace["peak_bytes"]
    reserved = context = None
    if trace.get("autocast_regions"):
        dtypes = "/".join(trace.get("autocast_dtypes") or ["float16"])
        corrections.append(
            _note(
                "autocast",
                f'autocast("cuda", {dtypes}) traced as autocast("cpu", {dtypes}), whose weight-cast cache '
                "works as CUDA's (one low-precision copy per weight per autocast region)",
            )
        )
    if trace.get("script_autocast"):
        corrections.append(
            _note(
                "dtype", f"--dtype {trace['script_autocast']}: the whole script traced under torch.autocast"
            )
        )
    if trace.get("compiled"):
        corrections.append(
            _note(
                "torch-compile",
                "torch.compile traced eagerly: compiled (fused) kernels keep fewer intermediates, "
                "so the real peak may be lower",
            )
        )
    rnn = trace.get("rnn_workspace") or {}
    if rnn.get("calls"):
        if cuda:
            corrections.append(
                _note(
                    "cudnn-rnn-reserve",
                    f"cuDNN LSTM reserve space modelled (6 x hidden per element, not calibrated on a GPU; "
                    f"{format_bytes(rnn['bytes'])} for the largest layer call); the meta kernel reports 0 bytes",
                    rnn["bytes"],
                )
            )
        else:
            corrections.append(
                _note(
                    "onednn-rnn-workspace",
                    f"oneDNN LSTM workspace measured on the real kernel at sequence lengths 1 and 2 and extrapolated "
                    f"({format_bytes(rnn['bytes'])} for the largest layer call); the meta kernel reports 0 bytes",
                    rnn["bytes"],
                )
            )
    conv = trace.get("conv_scratch") or {}
    if conv.get("probes"):
        corrections.append(
            _note(
                "onednn-conv-scratch",
                f"oneDNN convolution scratch (allocated inside the kernel, invisible to the trace) measured on "
                f"the real kernel at batch 2 and 4 for {conv['probes']} distinct convolution(s) and extrapolated "
                f"(up to {format_bytes(conv['bytes'])} at once)",
                conv["bytes"],
            )
        )
    copies = trace.get("matmul_copies") or {}
    if copies.get("calls"):
        what = (
            f"{copies['calls']} matrix product(s) read an operand BLAS cannot read in place (a stride-0 "
            f"gradient, a column slice, a broadcast row), which the kernel copies and frees inside itself "
            f"(up to {format_bytes(copies['bytes'])} at once)"
        )
        corrections.append(
            _note(
                "matmul-operand-copy",
                what
                + (
                    ": added at that op, as PyTorch's prepare_matrix_for_cublas copies them before cuBLAS "
                    "runs (a batched operand whole); read from PyTorch's source, not measured on a GPU"
                    if cuda
                    else ": added at that op, as measured on the CPU kernels"
                ),
                copies["bytes"],
            )
        )
    losses = trace.get("loss_buffers") or {}
    if losses.get("calls"):
        corrections.append(
            _note(
                "loss-buffer",
                f"{losses['calls']} reduced loss(es) (MSE, smooth L1, soft margin, BCE) keep their elementwise "
                f"buffer as their storage (up to {format_bytes(losses['bytes'])}) for as long as the loss lives"
                + (
                    ": the CUDA kernels share that code, not added: not checked on a GPU"
                    if cuda
                    else ": added to each loss, as measured on the CPU kernels"
                ),
                None if cuda else losses["bytes"],
            )
        )
    if cuda and trace.get("convolutions"):
        corrections.append(
            _note(
                "cudnn-conv-workspace",
                "convolutions: cuDNN's workspaces are allocated inside the kernel and not modelled; cuDNN picks "
                "an algorithm whose workspace fits the free memory, so it shrinks rather than fails",
            )
        )
    if trace.get("batch_padded"):
        got, wanted = trace["batch_padded"]
        corrections.append(
            _note(
                "batch-shaped",
                f"the dataset gave batches of {got}; the inputs were shaped as batches of {wanted}",
            )
        )
    if trace.get("bf16_emulated"):
        arch = options.gpu.arch if options.gpu else None
        target = f"{options.gpu.name} (sm {arch[0]}.{arch[1]})" if options.gpu and arch else "the target"
        corrections.append(
            _note(
                "bf16-emulated",
                f"{target} has no native bf16: torch.cuda.is_bf16_supported() answered True, as torch does "
                "there (it emulates bf16), so the script's bf16 path was traced",
            )
        )
    spread = trace.get("data_spread")
    if spread and len(spread["peak_bytes"]) > 1:
        peaks = spread["peak_bytes"]
        corrections.append(
            _note(
                "data-draw",
                f"the draw of the data decides the peak: {len(peaks)} draws of what the harness seeds "
                f"(the DataLoader's shuffle, random, NumPy, torch) gave {format_bytes(min(peaks))} to "
                f"{format_bytes(max(peaks))} traced (this estimate: seed {spread['seeds'][0]})",
                max(peaks) - min(peaks),
            )
        )
    kept = trace.get("cuda_kept_on_cpu") or []
    if kept and not cuda:
        places = ", ".join(_place(spot["file"], spot["line"]) for spot in kept[:3] if spot["file"])
        corrections.append(
            _note(
                "cuda-kept-on-cpu",
                'the script saw no GPU (--device cpu) but put tensors on "cuda" without asking'
                + (f" ({places}{', ...' if len(kept) > 3 else ''})" if places else "")
                + ': traced on the CPU, where a CPU-only torch would stop with "Torch not compiled with '
                'CUDA enabled"',
            )
        )
    if trace.get("draws_not_replayed"):
        corrections.append(
            _note(
                "draws-not-replayed",
                f"{trace['draws_not_replayed']:,} random numbers drawn before the training step (a large "
                "random initialisation) were not drawn for real: what the script draws after them (a "
                "DataLoader's shuffle) may differ from a real run's",
            )
        )
    corrections += value_notes(trace)
    if cuda:
        corrections.insert(
            0,
            _note(
                "traced-on-cpu",
                "traced on the fake CPU device (faking cuda on a CPU-only torch aborts in backward); "
                "CUDA's kernel choices applied below",
            ),
        )
        sdpa = trace.get("sdpa") or {}
        if sdpa.get("sdpa_flash") or sdpa.get("sdpa_mem_efficient"):
            corrections.append(
                _note(
                    "sdpa-cuda-kernels",
                    f"scaled_dot_product_attention routed to CUDA's flash ({sdpa.get('sdpa_flash', 0)} calls) / "
                    f"memory-efficient ({sdpa.get('sdpa_mem_efficient', 0)} calls) kernels instead of the CPU math path",
                )
            )
        if sdpa.get("flex_attention"):
            corrections.append(
                _note(
                    "flex-attention-cuda",
                    f"{sdpa['flex_attention']} FlexAttention call(s) traced as its compiled CUDA kernels allocate "
                    "(the output and an fp32 logsumexp kept for backward; delta and the gradients in backward): "
                    "the CPU the trace runs on has no FlexAttention backward",
                )
            )
        if sdpa.get("sdpa_math_kept"):
            corrections.append(
                _note(
                    "sdpa-math-kept",
                    f"{sdpa['sdpa_math_kept']} attention call(s) with grouped-query heads kept on the math path "
                    "(an over-estimate if CUDA picks a fused kernel)",
                )
            )
        if trace.get("foreach_pinned"):
            corrections.append(
                _note(
                    "foreach-optimizer",
                    "optimizers without an explicit foreach/fused use foreach, as CUDA parameters do",
                )
            )
        corrections.append(
            _note("rounding", "every allocation rounded up to 512 B, as the CUDA caching allocator does")
        )
        workspaces = workspace_term(options, trace) if trace.get("matmuls") else []
        events = [[-1 - index, size] for index, (_, size) in enumerate(workspaces)] + trace["events"]
        model = simulate(events)
        workspace_bytes = sum(size for _, size in workspaces)
        if workspaces:
            corrections.append(
                _note(
                    "cublas-workspace",
                    " + ".join(f"{name} {format_bytes(size)}" for name, size in workspaces)
                    + " of workspace (kept from the first matmul)",
                    workspace_bytes,
                )
            )
            breakdown["workspaces"] = workspace_bytes
        allocated += workspace_bytes
        reserved = max(model.peak_reserved, allocated)
        corrections.append(
            _note(
                "allocator-segments",
                "reserved memory from a model of the caching allocator's segments (2 MiB / 20 MiB / rounded to "
                "2 MiB; not calibrated on a GPU)",
                reserved - allocated,
            )
        )
        context, detail = context_term(options, trace)
        corrections.append(_note("cuda-context", detail, context))
    if trace.get("distributed"):
        notes, reserved_extra, outside_allocator = distributed.terms(trace, cuda, options.script)
        corrections += notes
        if reserved is not None:
            reserved += reserved_extra
        if context is not None:
            context += outside_allocator
    capacity = options.gpu.memory if options.gpu else None
    prediction = {
        "script": str(options.script),
        "args": list(options.script_args),
        "device": options.device,
        "batch_size": trace.get("batch_size"),
        "peak_bytes": allocated,
        "breakdown": breakdown,
        "reserved_bytes": reserved,
        "context_bytes": context,
        "process_bytes": reserved + context if reserved is not None and context is not None else None,
        "peak_at": {
            "op": trace.get("peak_op"),
            "module": trace.get("peak_module"),
            "phase": trace.get("peak_phase"),
            "file": trace["peak_line"][0] if trace.get("peak_line") else None,
            "line": trace["peak_line"][1] if trace.get("peak_line") else None,
        },
        "top_modules": trace.get("top_modules", []),
        "top_lines": trace.get("top_lines", []),
        "gpu": {"name": options.gpu.name, "memory": options.gpu.memory} if options.gpu else None,
        "verdict": None,
        "corrections": corrections,
        "steps_traced": trace.get("steps"),
        "seconds": trace.get("seconds"),
        "method": "fake-tensor trace of two optimizer steps",
        "torch": trace.get("torch"),
        "batch_knobs": trace.get("batch_knobs", []),
        "data_spread": spread,
        "peak_batch": trace.get("peak_batch"),
        "batches_traced": trace.get("batches_traced"),
    }
    if trace.get("distributed"):
        prediction["distributed"] = distributed.describe(trace)
        prediction["method"] += f" as rank 0 of {trace['distributed']['world_size']} (fake process group)"
    if capacity is not None:
        _set_verdict(prediction, capacity, options.margin)
    worst = trace.get("worst_case")
    if worst and worst.get("status") == "stopped":
        prediction["worst_case"] = _worst_case(worst, options)
    return prediction


def _worst_case(trace: dict[str, Any], options: EstimateOptions) -> dict[str, Any]:
    """The run where each loader whose batches differ in shape gave, for every batch, the longest
    batch its data can produce: an upper bound over the draws, stated beside the estimate."""
    bound = predict({**trace, "worst_case": None}, options)
    return {
        key: bound[key]
        for key in ("peak_bytes", "reserved_bytes", "context_bytes", "process_bytes", "verdict", "peak_at")
    } | {"batches": trace.get("longest_batches") or []}


def _set_verdict(prediction: dict[str, Any], capacity: int, margin: float) -> None:
    """Judged by reserved memory + the CUDA context on CUDA (the allocated peak on the CPU): "will run
    out of memory" above the card, "tight" within the margin of it; `verdict_basis` names the figure."""
    prediction["verdict_basis"] = verdict_basis(prediction, capacity)
    prediction["verdict"] = verdict(prediction["verdict_basis"]["bytes"], capacity, margin)


def _note(name: str, detail: str, size: int | None = None) -> dict[str, Any]:
    note: dict[str, Any] = {"name": name, "detail": detail}
    if size is not None:
        note["bytes"] = size
    return note


def _place(file: str | None, line: int | None) -> str:
    """file:line, the file relative to the current folder when it is under it."""
    if not file:
        return "?"
    try:
        shown = str(Path(file).resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = file
    return f"{shown}:{line}"


def _failure_error(trace: dict[str, Any]) -> EstimateError:
    """The crash in one line, then the script's own frames (not runpy's, torch's or ours)."""
    failure = trace.get("failure") or {}
    where = failure.get("where")
    location = f" at {_place(where['file'], where['line'])}" if where else ""
    if failure.get("kind") == "needs-download":
        # A Hub name with no local copy (the harness runs offline): what is needed, in one line.
        return EstimateError(f"no estimate{location}: {failure.get('message')}")
    lines = [f"the script crashed{location}: {failure.get('type')}: {failure.get('message')}"]
    lines += [f"  {line}" for line in (library_line(failure), data_dependent_hint(failure, _place)) if line]
    frames = failure.get("frames") or []
    if frames:
        lines.append("  the script's frames, innermost last:")
        for frame in frames:
            lines.append(f"    {_place(frame['file'], frame['line'])}, in {frame['function']}")
            if frame.get("code"):
                lines.append(f"      {frame['code']}")
    else:  # raised where no frame is in the script's folder: the traceback's end is all there is
        lines += [f"  {line}" for line in _last_lines(failure.get("traceback", ""), 6).splitlines()]
    return EstimateError("\n".join(lines))


def reached_two_steps(trace: dict[str, Any]) -> bool:
    """The evidence an estimate needs: the harness stops the script at the end of its second step."""
    return trace["status"] == "stopped"


def _no_steps_error(trace: dict[str, Any], batch: int | None = None) -> EstimateError:
    """Why a run that did not reach two optimizer steps gives no estimate: one
    line, then what the script's data loaders gave and the end of its output."""
    steps = trace.get("steps", 0)
    when = "before its first optimizer step" if steps == 0 else f"after {steps} optimizer step"
    at_batch = f" at batch {batch}" if batch else ""
    failure = trace.get("failure") or {}
    if trace["status"] == "script-exit":
        where = failure.get("where")
        location = f" at {_place(where['file'], where['line'])}" if where else ""
        reason = f"the script exited with code {failure.get('exit_code')}{location}{at_batch} {when}"
    else:
        reason = f"the script ended{at_batch} {when}"
    lines = [f"no estimate: {reason}; an estimate needs two"]
    lines += [f"  {explanation}" for explanation in _short_loaders(trace)]
    tail = [line for line in (trace.get("output_tail") or "").splitlines() if line.strip()][-6:]
    if tail:
        lines.append("  the script's output ended with:")
        lines += [f"    | {line}" for line in tail]
    return EstimateError("\n".join(lines))


def _short_loaders(trace: dict[str, Any]) -> list[str]:
    """DataLoaders that give fewer than two batches, in words."""
    found = []
    for loader in trace.get("loaders") or []:
        if loader.get("batches") is None or loader["batches"] >= 2:
            continue
        batches = loader["batches"]
        found.append(
            f"DataLoader at {_place(loader['file'], loader['line'])} gives {batches} "
            f"batch{'' if batches == 1 else 'es'}: {loader['samples']} samples in batches of "
            f"{loader['batch_size']}" + (", drop_last=True" if loader["drop_last"] else "")
        )
    return found


def _require_two_steps(trace: dict[str, Any], batch: int | None = None) -> None:
    if trace["status"] == "failed":
        raise _failure_error(trace)
    if not reached_two_steps(trace):
        raise _no_steps_error(trace, batch)


# --- Commands ----------------------------------------------------------------------


Progress = Callable[[str], None]


def estimate(options: EstimateOptions, progress: Progress | None = None) -> dict[str, Any]:
    """One prediction; falls back to real CPU steps when the script cannot be faked."""
    (trace,) = run_harness(
        options, [{"batch_size": options.batch_size, "draws": DATA_DRAWS, "worst_case": True}]
    )
    return prediction_from(trace, options, progress)


def prediction_from(
    trace: dict[str, Any], options: EstimateOptions, progress: Progress | None = None
) -> dict[str, Any]:
    """The prediction for a fake run of the script, or for real CPU steps when it could not be faked."""
    if trace["status"] != "failed":
        _require_two_steps(trace)
        if options.batch_size is not None and not trace.get("override_applied"):
            raise EstimateError(_NO_KNOB)
        return predict(trace, options)
    if (trace.get("failure") or {}).get("kind") not in REAL_STEP_KINDS:
        raise _failure_error(trace)
    if progress:
        progress("the script cannot run on fake tensors; measuring real CPU steps instead")
    return _fallback(options, trace)


def _fallback(options: EstimateOptions, fake_trace: dict[str, Any]) -> dict[str, Any]:
    """Real CPU steps at a quarter and half of the target batch, the peak
    scaled linearly to the target."""
    reason = fallback_reason(fake_trace["failure"], _place)
    target = options.batch_size or fake_trace.get("batch_size")
    if fake_trace.get("batch_knobs") and target and target >= 4:
        sizes = fallback_batches(target)
        traces = run_harness(options, [{"batch_size": size} for size in sizes], mode="real")
        for size, trace in zip(sizes, traces):
            _require_two_steps(trace, size)
        intercept, slope = _fit(traces)
        prediction_trace = traces[-1]
        prediction = predict(prediction_trace, options)
        scaled = int(intercept + slope * target)
        prediction["peak_bytes"] += scaled - traces[-1]["peak_bytes"]
        prediction["batch_size"] = target
        prediction["breakdown_batch_size"] = traces[-1]["batch_size"]
        prediction["method"] = (
            f"real CPU steps at batch {sizes[0]} and {sizes[1]}, scaled linearly to {target}"
        )
        uncertainty = (
            "a lower bound: the peak is the largest of several phases, each linear in the batch, so a line "
            "through two smaller batches can only fall short when another phase takes over; CPU kernels, "
            "not CUDA's (attention math path, no cuDNN)"
        )
    else:
        (prediction_trace,) = run_harness(options, [{"batch_size": options.batch_size}], mode="real")
        _require_two_steps(prediction_trace)
        prediction = predict(prediction_trace, options)
        prediction["method"] = "a real CPU step at the script's own batch size"
        uncertainty = "CPU kernels, not CUDA's (attention math path, no cuDNN)"
    if options.gpu is not None:
        if prediction["reserved_bytes"] is not None:
            prediction["reserved_bytes"] = max(prediction["reserved_bytes"], prediction["peak_bytes"])
            prediction["process_bytes"] = prediction["reserved_bytes"] + (prediction["context_bytes"] or 0)
        _set_verdict(prediction, options.gpu.memory, options.margin)
    library = fake_trace.get("quantized_failure")
    layers = prediction_trace.get("quantized_layers") or fake_trace.get("quantized_layers") or {}
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
    for note in prediction["corrections"]:
        if note["name"] == "traced-on-cpu":
            note["detail"] = (
                "measured by real CPU steps (the script could not run on fake tensors); CUDA's "
                "allocator terms applied below"
            )
    prediction["fallback"] = {"reason": reason, "uncertainty": uncertainty}
    if prediction.get("distributed"):
        prediction["method"] += f" as rank 0 of {options.world_size} (fake process group)"
    return prediction


def fallback_batches(target: int) -> tuple[int, int]:
    """A quarter and a half of the target: close enough that the phase holding
    the peak is the same as at the target, small enough to run on a CPU."""
    return max(1, target // 4), max(2, target // 2)


def _fit(traces: list[dict[str, Any]]) -> tuple[float, float]:
    (b1, p1), (b2, p2) = ((t["batch_size"], t["peak_bytes"]) for t in traces[:2])
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
# The largest batch --find-max-batch tries. On a small model the memory line alone answers
# tens of thousands, and a fake run at such a batch still builds and collates every sample
# (over ten minutes for one check): past this the answer is "this many fit, the search stops
# here" (docs/estimate.md). Per-GPU batches of training recipes stay well below it.
MAX_SEARCHED_BATCH = 8192


@dataclass
class _Search:
    """What the checks of a batch-size search found: the largest batch that
    fits the budget, the smallest that does not, the smallest at which the
    script did not reach two optimizer steps (each: batch, prediction or trace)."""

    budget: int
    fitting: tuple[int, dict[str, Any]] | None = None
    over: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # the checks over the budget
    no_steps: tuple[int, dict[str, Any]] | None = None
    checks: int = 0

    @property
    def too_large(self) -> tuple[int, dict[str, Any]] | None:
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
            slope = (upper_check["peak_bytes"] - lower["peak_bytes"]) / (above - below)
            if slope > 0:
                candidate = below - math.ceil((needed_bytes(lower) - self.budget) / slope)
                if low_batch < candidate < high_batch:
                    return candidate
        low, high = self.fitting[1], self.over_at(high_batch)
        slope = (high["peak_bytes"] - low["peak_bytes"]) / (high_batch - low_batch)
        room = self.budget - needed_bytes(low)
        step = math.floor(room / slope) if slope > 0 else 0
        candidate = min(high_batch - 1, low_batch + max(1, step))
        return candidate if candidate > low_batch else None

    def over_at(self, batch: int) -> dict[str, Any]:
        return next(prediction for checked, prediction in self.over if checked == batch)


def _fewer_batches_above(trace: dict[str, Any]) -> int | None:
    """For a run whose loaders gave too few batches: the largest batch at which
    each of them gives one batch more per pass (all samples in one batch when
    it gave none; two batches when it gave one)."""
    bounds = []
    for loader in trace.get("loaders") or []:
        batches, samples = loader.get("batches"), loader.get("samples")
        if batches is None or batches >= 2 or not samples:
            continue
        if batches == 0:
            bounds.append(samples)
        else:
            bounds.append(samples // 2 if loader["drop_last"] else samples - 1)
    return min(bounds) if bounds else None


def _search_largest_fitting(
    options: EstimateOptions,
    base: dict[str, Any],
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
    if needed_bytes(base) <= budget:
        search.fitting = (base_batch, base)
    next_batch: int | None = candidate
    if progress:
        progress(
            f"searching for the largest batch that fits, up to {MAX_SEARCHED_BATCH:,} "
            f"(at most {_MAX_CHECKS} fake runs)"
        )
    while next_batch is not None and search.checks < _MAX_CHECKS:
        if options.on_event:  # the progress line (not one line per candidate)
            options.on_event(
                {"event": "search-check", "batch_size": next_batch, "check": search.checks + 1, "of": _MAX_CHECKS}
            )
        (trace,) = run_harness(options, [{"batch_size": next_batch}])
        search.checks += 1
        if trace["status"] == "failed":
            raise _failure_error(trace)
        if not reached_two_steps(trace):
            search.no_steps = (next_batch, trace)
        else:
            checked = predict(trace, options)
            if needed_bytes(checked) <= budget:
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
    search: _Search, answer: int, line_answer: int, base_batches: list[int], first: dict[str, Any]
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
        steps = trace.get("steps", 0)
        return (
            f"the memory line alone gives {line_answer:,}, but at batch {high_batch:,} the script reached "
            f"{steps} optimizer step{'' if steps == 1 else 's'}"
            + (f" ({loaders[0]})" if loaders else "")
            + f": {answer:,} is the largest batch checked with two"
        )
    assert search.too_large is not None and search.fitting is not None
    low_batch, low = search.fitting
    high = search.too_large[1]
    slope = (high["peak_bytes"] - low["peak_bytes"]) / max(high_batch - low_batch, 1)
    phases = [_PHASES.get(p, p) for p in (first["peak_at"].get("phase"), high["peak_at"].get("phase"))]
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


def find_max_batch(options: EstimateOptions, progress: Progress | None = None) -> dict[str, Any]:
    """The largest batch that fits the target with a margin: two fake traces
    give peak(bs) = a + b*bs, solved for the budget, then checked (and refined
    where the line does not hold) by fake runs."""
    if options.gpu is None:
        raise EstimateError("--find-max-batch needs a target: --gpu NAME or --gpu-memory SIZE")
    traces = run_harness(
        options, [{"batch_size": options.batch_size, "draws": DATA_DRAWS}, {"batch_size": "double"}]
    )
    base = traces[0]
    _require_two_steps(base, base.get("batch_size"))
    if not base.get("batch_knobs") or not base.get("batch_size"):
        raise EstimateError(_NO_KNOB)
    if len(traces) < 2 or not traces[1].get("override_applied"):
        raise EstimateError("the second trace (at twice the batch size) could not change the batch size")
    _require_two_steps(traces[1], traces[1].get("batch_size"))
    first, second = predict(traces[0], options), predict(traces[1], options)
    batches = [traces[0]["batch_size"], traces[1]["batch_size"]]
    slope = (second["peak_bytes"] - first["peak_bytes"]) / (batches[1] - batches[0])
    intercept = first["peak_bytes"] - slope * batches[0]
    budget = int(options.gpu.memory * (1 - options.margin))
    result: dict[str, Any] = {
        "fit": {"intercept_bytes": int(intercept), "bytes_per_sample": int(slope), "batch_sizes": batches},
        "margin": options.margin,
        "budget_bytes": budget,
        "limit": _budget_text(options, budget),
        "script_batch_size": base.get("batch_size"),
        "gradient_accumulation": None,
    }
    if slope <= 0:
        result.update(max_batch=None, reason="the peak does not grow with the batch size")
        return {"estimate": first, "max_batch": result}
    # The line is the allocated peak's; what the budget holds above it (reserved segments, the
    # context) is taken as at the first trace, and every answer is checked by a fake run.
    overhead = needed_bytes(first) - first["peak_bytes"]
    line_answer = math.floor((budget - overhead - intercept) / slope)
    result["line_max_batch"] = line_answer
    if line_answer < 1:
        result.update(
            max_batch=0,
            reason=f"even batch size 1 does not keep {result['limit']}: the model states alone need more",
        )
        return {"estimate": first, "max_batch": result}
    result["search_limit"] = MAX_SEARCHED_BATCH
    search = _search_largest_fitting(
        options, first, batches[0], min(line_answer, MAX_SEARCHED_BATCH), budget, progress
    )
    if search.fitting is None:
        reason = f"no batch size checked by a fake run keeps {result['limit']}"
        if search.no_steps is not None and search.too_large is None:
            reason = (
                f"no batch size checked by a fake run reached two optimizer steps ({search.no_steps[0]:,})"
            )
        result.update(max_batch=0, reason=reason)
        return {"estimate": first, "max_batch": result}
    largest, verified = search.fitting
    upper = search.upper()
    at_limit = upper is None and largest == MAX_SEARCHED_BATCH < line_answer
    result.update(
        max_batch=largest,
        # a copy: the script's own batch may be the answer, and the estimate gets this result
        verified=dict(verified),
        bound=upper[0] if upper else ("search limit" if at_limit else "memory"),
        next_checked=upper[1] if upper else None,
        checks=search.checks,
        explanation=_why_not_the_line(search, largest, line_answer, batches, first),
    )
    script_batch = base.get("batch_size")
    if script_batch and script_batch > largest:
        steps = accumulation_steps(script_batch, largest)
        micro = math.ceil(script_batch / steps)
        result["gradient_accumulation"] = {
            "micro_batch": micro,
            "steps": steps,
            "effective_batch": micro * steps,
        }
    return {"estimate": first, "max_batch": result}
