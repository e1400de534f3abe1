"""The parent side of `oom-lsp estimate`: run the harness under the user's
interpreter (through the profiling runner: own process group, timeout,
cancellation), read its result into a Trace, and make the prediction for the
target GPU (prediction.py), or say in a few lines why there is none; when the
script cannot run on fake tensors, real CPU steps scaled to its batch. The
largest batch that fits is search.py's.

No torch import here: this runs in the CLI and in the language server.

What the trace gives (the harness/ package): the peak of live storages over the first
two optimizer steps, its breakdown and location, and the allocation log.
What is added for `device="cuda"` (each listed in `corrections`, prediction.py):
cuBLAS/cuBLASLt workspaces, the caching allocator's segments (reserved), the
CUDA context; the kernel choices (SDPA, foreach, cuDNN RNN reserve, 512 B
rounding) were already applied inside the trace.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.estimate import distributed
from oom_lsp.estimate.failures import REAL_STEP_KINDS, data_dependent_hint, fallback_reason, library_line
from oom_lsp.estimate.gpus import Gpu
from oom_lsp.estimate.prediction import DEFAULT_MARGIN, _place, _set_verdict, predict
from oom_lsp.estimate.results import Correction, Fallback, Prediction, Trace
from oom_lsp.profiling.runner import NO_TORCH_EXIT, ProfileError, ProfileRequest, ProfileRun

# Started by path (harness/__main__.py explains why): the user's interpreter need not have oom_lsp.
HARNESS = Path(__file__).resolve().parent / "harness" / "__main__.py"
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
    # --snapshot/--html: the harness records each allocation with its op, phase, line and module.
    timeline: bool = False


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
            "timeline": options.timeline,
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



def _failure_error(trace: Trace) -> EstimateError:
    """The crash in one line, then the script's own frames (not runpy's, torch's or ours)."""
    failure = trace.failure
    where = failure.where
    location = f" at {_place(where['file'], where['line'])}" if where else ""
    if failure.kind == "needs-download":
        # A Hub name with no local copy (the harness runs offline): what is needed, in one line.
        return EstimateError(f"no estimate{location}: {failure.message}")
    lines = [f"the script crashed{location}: {failure.type}: {failure.message}"]
    lines += [f"  {line}" for line in (library_line(failure), data_dependent_hint(failure, _place)) if line]
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
    prediction = prediction_from(trace, options, progress)
    if options.timeline and not trace.failed and trace.timeline is not None:
        from .timeline import Timeline

        prediction.timeline = Timeline.from_trace(trace, prediction)
    return prediction


def prediction_from(trace: Trace, options: EstimateOptions, progress: Progress | None = None) -> Prediction:
    """The prediction for a fake run of the script, or for real CPU steps when it could not be faked."""
    if not trace.failed:
        _require_two_steps(trace)
        if options.batch_size is not None and not trace.override_applied:
            raise EstimateError(_NO_KNOB)
        return predict(trace, options)
    if trace.failure.kind not in REAL_STEP_KINDS:
        raise _failure_error(trace)
    if progress:
        progress("the script cannot run on fake tensors; measuring real CPU steps instead")
    return _fallback(options, trace)


def _fallback(options: EstimateOptions, fake_trace: Trace) -> Prediction:
    """Real CPU steps at a quarter and half of the target batch, the peak
    scaled linearly to the target."""
    reason = fallback_reason(fake_trace.failure, _place)
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


