"""The parent side of `oom-lsp estimate`: run the harness under the user's
interpreter (through the profiling runner: own process group, timeout,
cancellation), then turn its trace into a prediction for the target GPU.

No torch import here: this runs in the CLI and, later, in the language server.

What the trace gives (harness.py): the peak of live storages over the first
two optimizer steps, its breakdown and location, and the allocation log.
What is added here for `device="cuda"` (each listed in `corrections`):
cuBLAS/cuBLASLt workspaces, the caching allocator's segments (reserved), the
CUDA context; the kernel choices (SDPA, foreach, cuDNN RNN reserve, 512 B
rounding) were already applied inside the trace.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.estimate.allocator import simulate
from oom_lsp.estimate.gpus import Gpu, format_bytes
from oom_lsp.profiling.runner import NO_TORCH_EXIT, ProfileError, ProfileRequest, ProfileRun

HARNESS = Path(__file__).resolve().parent / "harness.py"
MIB, GIB = 2**20, 2**30
# Not in memory_allocated/reserved, only in nvidia-smi: ~300 MB with CUDA's lazy
# module loading (the default since CUDA 12.2), 200-700 MB by machine.
CUDA_CONTEXT = 400 * MIB
TIGHT_MARGIN = 0.10
CUBLAS_WORKSPACE_PRE_HOPPER = 8_519_680  # CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8
CUBLAS_WORKSPACE_HOPPER = 32 * MIB
_NO_KNOB = (
    "cannot change the script's batch size: it is set neither by an argparse option (--batch-size, "
    "--batch_size, --bs...) nor by DataLoader(batch_size=...); pass it one of those ways"
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
    # Set from another thread (the editor) to stop every run of this estimate.
    cancel: threading.Event | None = None


class _HarnessRun(ProfileRun):
    """The profiling runner (process group, timeout, cancellation, output tail)
    with this package's harness and result file."""

    def __init__(
        self, request: ProfileRequest, payload: dict[str, Any], cancel: threading.Event | None
    ) -> None:
        super().__init__(request, cancel=cancel)
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
        run = _HarnessRun(request, payload, cancel or options.cancel)
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


def verdict(required: int, capacity: int) -> str:
    if required > capacity:
        return "will run out of memory"
    if required > capacity * (1 - TIGHT_MARGIN):
        return "tight"
    return "fits"


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
    if trace.get("stubbed_scalars"):
        corrections.append(
            _note(
                "data-dependent-values",
                f"{trace['stubbed_scalars']} read(s) of a value only a real run knows (.item(), if tensor:) "
                "were answered 0/False",
            )
        )
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
        workspaces = cublas_workspaces(options.gpu, trace.get("torch", "")) if trace.get("matmuls") else []
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
        context = CUDA_CONTEXT
        corrections.append(
            _note(
                "cuda-context",
                f"CUDA context ~{format_bytes(CUDA_CONTEXT)} (outside PyTorch's counters; 200-700 MB by machine)",
                CUDA_CONTEXT,
            )
        )
    capacity = options.gpu.memory if options.gpu else None
    required = allocated + (context or 0)
    prediction = {
        "script": str(options.script),
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
    }
    if capacity is not None:
        prediction["verdict"] = verdict(required, capacity)
        if (
            prediction["verdict"] == "fits"
            and reserved is not None
            and reserved + (context or 0) > capacity * (1 - TIGHT_MARGIN)
        ):
            prediction["verdict"] = "tight"
    if trace.get("steps", 0) < 2 and trace.get("status") != "stopped":
        prediction["warning"] = (
            f"the script finished after {trace.get('steps', 0)} optimizer step(s): the steady-state peak "
            "(with optimizer state) may be higher"
        )
    return prediction


def _note(name: str, detail: str, size: int | None = None) -> dict[str, Any]:
    note: dict[str, Any] = {"name": name, "detail": detail}
    if size is not None:
        note["bytes"] = size
    return note


def _failure_error(trace: dict[str, Any]) -> EstimateError:
    failure = trace.get("failure") or {}
    where = failure.get("where") or {}
    location = f"{where.get('file')}:{where.get('line')}: " if where else ""
    code = f"\n    {where['code']}" if where.get("code") else ""
    tail = _last_lines(failure.get("traceback", ""), 6)
    return EstimateError(
        f"the script crashed: {location}{failure.get('type')}: {failure.get('message')}{code}\n{tail}"
    )


# --- Commands ----------------------------------------------------------------------


Progress = Callable[[str], None]


def estimate(options: EstimateOptions, progress: Progress | None = None) -> dict[str, Any]:
    """One prediction; falls back to real CPU steps when the script cannot be faked."""
    (trace,) = run_harness(options, [{"batch_size": options.batch_size}])
    if trace["status"] != "failed":
        if options.batch_size is not None and not trace.get("override_applied"):
            raise EstimateError(_NO_KNOB)
        return predict(trace, options)
    if (trace.get("failure") or {}).get("kind") not in ("data-dependent", "unsupported-operator"):
        raise _failure_error(trace)
    if progress:
        progress("the script cannot run on fake tensors; measuring real CPU steps instead")
    return _fallback(options, trace)


def _fallback(options: EstimateOptions, fake_trace: dict[str, Any]) -> dict[str, Any]:
    """Real CPU steps at a quarter and half of the target batch, the peak
    scaled linearly to the target."""
    failure = fake_trace["failure"]
    where = failure.get("where") or {}
    reason = (
        f"{failure.get('type')} at {where.get('file')}:{where.get('line')} ({where.get('code', '')}): "
        f"{failure.get('message')}"
        if where
        else f"{failure.get('type')}: {failure.get('message')}"
    )
    target = options.batch_size or fake_trace.get("batch_size")
    if fake_trace.get("batch_knobs") and target and target >= 4:
        sizes = fallback_batches(target)
        traces = run_harness(options, [{"batch_size": size} for size in sizes], mode="real")
        for trace in traces:
            if trace["status"] == "failed":
                raise _failure_error(trace)
        intercept, slope = _fit(traces)
        prediction = predict(traces[-1], options)
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
        (trace,) = run_harness(options, [{"batch_size": options.batch_size}], mode="real")
        if trace["status"] == "failed":
            raise _failure_error(trace)
        prediction = predict(trace, options)
        prediction["method"] = "a real CPU step at the script's own batch size"
        uncertainty = "CPU kernels, not CUDA's (attention math path, no cuDNN)"
    if options.gpu is not None:
        context = prediction["context_bytes"] or 0
        prediction["verdict"] = verdict(prediction["peak_bytes"] + context, options.gpu.memory)
        if prediction["reserved_bytes"] is not None:
            prediction["reserved_bytes"] = max(prediction["reserved_bytes"], prediction["peak_bytes"])
            prediction["process_bytes"] = prediction["reserved_bytes"] + context
    prediction["fallback"] = {"reason": reason, "uncertainty": uncertainty}
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


_MAX_CHECKS = 6


def _search_largest_fitting(
    options: EstimateOptions,
    base: dict[str, Any],
    base_batch: int,
    candidate: int,
    budget: int,
    progress: Progress | None,
) -> tuple[int, dict[str, Any] | None]:
    """Check the line's answer with fake runs and refine it.

    The peak is affine in the batch size only while it happens at the same
    place: a small batch can peak in the optimizer step and a large one in
    the backward pass, with a much steeper slope. So each check that does not
    fit becomes a new point of a secant through the largest batch known to
    fit, and the search stays between the two bounds.
    """
    fitting: tuple[int, dict[str, Any]] | None = None
    if base["verdict"] != "will run out of memory":
        fitting = (base_batch, base)
    too_large: tuple[int, dict[str, Any]] | None = None
    for _ in range(_MAX_CHECKS):
        if progress:
            progress(f"checking batch size {candidate} with a fake run")
        (trace,) = run_harness(options, [{"batch_size": candidate}])
        if trace["status"] == "failed":
            raise _failure_error(trace)
        checked = predict(trace, options)
        if checked["verdict"] != "will run out of memory":
            fitting = (candidate, checked)
            if too_large is None or candidate + 1 >= too_large[0]:
                break
        else:
            too_large = (candidate, checked)
            if candidate == 1:
                break
        if fitting is None:
            candidate = max(1, candidate // 2)
            continue
        low_batch, low = fitting
        high_batch, high = too_large  # type: ignore[misc]
        slope = (high["peak_bytes"] - low["peak_bytes"]) / (high_batch - low_batch)
        step = math.floor((budget - low["peak_bytes"]) / slope) if slope > 0 else 0
        candidate = min(high_batch - 1, low_batch + max(1, step))
        if candidate <= low_batch:
            break
    if fitting is None:
        return 0, None
    return fitting


def find_max_batch(options: EstimateOptions, progress: Progress | None = None) -> dict[str, Any]:
    """The largest batch that fits the target: two fake traces give
    peak(bs) = a + b*bs, solved for the GPU's memory, then checked (and
    refined where the line does not hold) by fake runs."""
    if options.gpu is None:
        raise EstimateError("--find-max-batch needs a target: --gpu NAME or --gpu-memory SIZE")
    traces = run_harness(options, [{"batch_size": options.batch_size}, {"batch_size": "double"}])
    base = traces[0]
    if base["status"] == "failed":
        raise _failure_error(base)
    if not base.get("batch_knobs") or not base.get("batch_size"):
        raise EstimateError(_NO_KNOB)
    if len(traces) < 2 or traces[1]["status"] == "failed" or not traces[1].get("override_applied"):
        raise EstimateError(
            "the second trace (at twice the batch size) failed; see --format json of each run"
        )
    first, second = predict(traces[0], options), predict(traces[1], options)
    slope = (second["peak_bytes"] - first["peak_bytes"]) / (traces[1]["batch_size"] - traces[0]["batch_size"])
    intercept = first["peak_bytes"] - slope * traces[0]["batch_size"]
    budget = options.gpu.memory - (first["context_bytes"] or 0)
    result: dict[str, Any] = {
        "fit": {
            "intercept_bytes": int(intercept),
            "bytes_per_sample": int(slope),
            "batch_sizes": [traces[0]["batch_size"], traces[1]["batch_size"]],
        },
        "script_batch_size": base.get("batch_size"),
        "gradient_accumulation": None,
    }
    if slope <= 0:
        result.update(max_batch=None, reason="the peak does not grow with the batch size")
        return {"estimate": first, "max_batch": result}
    largest = math.floor((budget - intercept) / slope)
    if largest < 1:
        result.update(
            max_batch=0, reason="even batch size 1 does not fit: the model states alone exceed the GPU"
        )
        return {"estimate": first, "max_batch": result}
    largest, verified = _search_largest_fitting(
        options, first, traces[0]["batch_size"], largest, budget, progress
    )
    if verified is None:
        result.update(max_batch=0, reason="no batch size checked by a fake run fits the GPU")
        return {"estimate": first, "max_batch": result}
    result.update(max_batch=largest, verified=verified)
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
