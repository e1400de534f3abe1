"""One run of the user's script under the shims and the tracker, and the
harness's entry point (`main`, called by `__main__.py`).

Modes (`mode` in the request):
- "fake": the script runs under FakeTensorMode on the fake *cpu* device
  (faking `cuda` on a CPU-only wheel aborts the process in backward, see
  docs/estimate.md). Tensors have shapes and dtypes but no storage; a
  dispatcher-level live-storage tracker counts what a real run would hold.
- "real": the same shims and tracker on real CPU tensors (the fallback when
  something cannot be faked), optionally with the profiler's alloc/free
  replay (`profile_replay`), the ground truth of tests and benchmarks; with
  `track: false`, no tracker either: a bare real run, which benchmarks time.

With `device="cuda"` the script believes it has a GPU: `torch.cuda.is_available()`
is True, and `device="cuda"`, `.cuda()`, `.to("cuda")`, `autocast("cuda")` are
rewritten to the CPU; with `device="cpu"` it sees none (but in a distributed
request), and what it puts on "cuda" regardless runs on the CPU (cuda.py).
With `count="device"` only storages the script put on the GPU (and whatever is
computed from them, or allocated inside a training step) count; with
`count="all"` every storage counts (what a real CPU step measures).

Each run starts from `seed` (default 0, see seeding.py). With `draws: N`, a
fake run whose first batch's shapes depend on the draw of the data is run
again with the next N - 1 seeds, and their peaks are reported (`data_spread`).

The result is one JSON object written to `output`; the script's own stdout
and stderr are left alone.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import sys
import time
import traceback

import torch

from . import progress, quantized
from .common import CATEGORIES, StopEstimate
from .context import Context
from .cpu_kernels import (
    make_conv_scratch,
    make_cublas_copies,
    make_loss_buffers,
    make_matmul_copies,
    make_onednn_rnn_backward_scratch,
    make_onednn_rnn_workspace,
    profile_replay_peak,
)
from .cuda import CudaRedirect, gpu_visible
from .cuda_kernels import (
    install_flex_route,
    install_sdpa_route,
    make_cudnn_rnn_reserve,
    make_flex_route,
    make_sdpa_route,
)
from .data import LISTED_BATCHES
from .distributed import CATEGORIES as DISTRIBUTED_CATEGORIES
from .failures import classify_failure, library_frame, user_frames
from .fakes import make_fake_mode
from .knobs import run_script
from .memo import FakeDispatchMemo
from .pretrained import missing_download
from .seeding import seed_everything
from .shims import Shims, install_shims
from .tracker import MATMUL_PACKETS, StorageTracker


def run(request: dict) -> dict:
    script = os.path.abspath(request["script"])
    script_dir = os.path.dirname(script)
    mode = request.get("mode", "fake")
    cuda = request.get("device", "cuda") == "cuda"
    torch.set_num_threads(max(1, int(request.get("threads", 1))))
    context = Context(script_dir)
    sdpa_notes: dict = {}
    rnn_notes: dict = {}
    rnn_backward_notes: dict = {}
    models: dict = {}
    conv_notes: dict = {}
    matmul_notes: dict = {}
    loss_notes: dict = {}
    # Real tensors already carry their real workspaces: models only under fake mode.
    if mode == "fake":
        models["rnn_workspace"] = (make_cudnn_rnn_reserve if cuda else make_onednn_rnn_workspace)(rnn_notes)
        if not cuda:
            models["conv_scratch"] = make_conv_scratch(conv_notes)
            models["rnn_backward_scratch"] = make_onednn_rnn_backward_scratch(rnn_backward_notes)
        models["matmul_copies"] = make_cublas_copies(matmul_notes) if cuda else make_matmul_copies(matmul_notes, add=True)
        models["loss_buffers"] = make_loss_buffers(loss_notes, add=not cuda)
    tracker = StorageTracker(context, count_all=not cuda, round_cuda=cuda, kernel_models=models)
    if request.get("timeline") and not request.get("worst_batches"):
        tracker.timeline = []  # the main run's picture only, not its worst-case rerun's
    state: dict = {"seed": int(request.get("seed", 0))}
    shims = Shims()
    result: dict = {"mode": mode, "device": "cuda" if cuda else "cpu", "torch": torch.__version__}

    fake_mode = None
    if mode == "fake":
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils.weak import WeakIdKeyDictionary

        fake_mode = make_fake_mode()
        state["fake_mode"] = fake_mode
        tracker.shadows = WeakIdKeyDictionary()
        tracker.draws = {"elements": 0, "skipped": 0}
        tracker.fake_tensor_type = FakeTensor
        tracker.fake_mode = fake_mode
        # How fake dispatches are cached: "memo" (FakeDispatchMemo), "fake-tensor-mode"
        # (FakeTensorMode's own cache) or "none"; the last two for comparisons.
        fake_cache = request.get("fake_cache", "memo")
        if fake_cache == "memo":
            tracker.fake_memo = FakeDispatchMemo(fake_mode)
        elif fake_cache == "none":
            fake_mode.cache_enabled = False
    request = dict(request, cuda_foreach=cuda)
    install_shims(shims, request, tracker, context, state)

    redirect = CudaRedirect(tracker, gpu_visible=gpu_visible(request))
    if cuda and mode == "fake":
        install_sdpa_route(shims, make_sdpa_route(sdpa_notes))
        install_flex_route(shims, make_flex_route(sdpa_notes))

    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script, *request.get("args", [])]
    # As `python train.py` has it: the script's folder first, symbolic links resolved.
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    # Without numpy, torch.sym_max (which the meta kernel of each op met with
    # new shapes calls, often several times) tries `import numpy` on every
    # call: a search of sys.path, as a failed import is not remembered. None in
    # sys.modules makes the import fail at once, as it would fail anyway.
    numpy_missing = "numpy" not in sys.modules and importlib.util.find_spec("numpy") is None
    if numpy_missing:
        sys.modules["numpy"] = None
    seed_everything(state["seed"])
    # What an earlier run in this interpreter left in reference cycles (a batch-size search runs
    # the script several times) is freed now, not by a collection in the middle of this run,
    # where the profiler of a real run would count its frees as this run's.
    gc.collect()
    prof = None
    if request.get("profile_replay"):
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    status = "finished"
    failure = None
    started = time.perf_counter()
    try:
        if prof is not None:
            prof.start()
        try:
            if fake_mode is not None:
                with fake_mode, tracker, redirect:
                    run_script(script, request, context, state)
            elif request.get("track", True):
                with tracker, redirect:
                    run_script(script, request, context, state)
            else:
                # A bare real run, to time the steps the estimate replaces:
                # nothing counted at the dispatcher.
                with redirect:
                    run_script(script, request, context, state)
        finally:
            if prof is not None:
                prof.stop()
    except StopEstimate:
        status = "stopped"
    except SystemExit as exit_:
        status = "finished" if exit_.code in (None, 0) else "script-exit"
        if status == "script-exit":
            frames = user_frames(exit_.__traceback__, script_dir)
            failure = {
                "kind": "script-error",
                "message": f"the script called sys.exit({exit_.code!r})",
                "exit_code": exit_.code,
                "where": frames[-1] if frames else None,
            }
    except Exception as error:  # noqa: BLE001 - the user's code: every failure is reported, classified
        status = "failed"
        state["quantized_failure"] = quantized.library_in(error.__traceback__)
        frames = user_frames(error.__traceback__, script_dir)
        reads = tracker.stubbed_scalars + tracker.value_arrays if fake_mode is not None else 0
        failure = {
            "kind": classify_failure(error, reads),
            "type": type(error).__name__,
            "message": str(error).strip().splitlines()[0][:500]
            if str(error).strip()
            else type(error).__name__,
            "where": frames[-1] if frames else None,
            "frames": frames,
            "library": library_frame(error.__traceback__, script_dir),
            "data_dependent_reads": reads,
            "last_data_dependent_read": list(tracker.last_stubbed_read) if tracker.last_stubbed_read else None,
            "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))[-4000:],
        }
        download = missing_download(error)
        if download is not None:
            failure.update(kind="needs-download", message=download)
    finally:
        elapsed = time.perf_counter() - started
        sys.argv, sys.path[:] = old_argv, old_path
        if numpy_missing and sys.modules.get("numpy", False) is None:
            del sys.modules["numpy"]
        for hook in state.get("hooks", []):
            hook.remove()
        shims.undo()

    peak = tracker.peak_info
    result.update(
        status=status,
        failure=failure,
        steps=state["steps"],
        seconds=elapsed,
        step_seconds=_step_seconds(started, state["step_ends"]),
        peak_bytes=tracker.peak,
        breakdown={
            category: peak.get("by_category", {}).get(category, 0)
            for category in CATEGORIES + (DISTRIBUTED_CATEGORIES if request.get("distributed") else ())
        },
        peak_op=peak.get("op", ""),
        peak_module=peak.get("module", ""),
        peak_phase=peak.get("phase", ""),
        peak_line=list(peak["line"]) if peak.get("line") else None,
        top_modules=_top(peak.get("by_module", {})),
        top_lines=_top(peak.get("by_line", {})),
        events=tracker.events,
        timeline=tracker.timeline,
        matmuls=sum(tracker.op_counts[name] for name in MATMUL_PACKETS),
        first_matmul_line=tracker.first_matmul_line or "",
        convolutions=sum(
            tracker.op_counts[name] for name in ("convolution", "mkldnn_convolution", "_convolution")
        ),
        stubbed_scalars=tracker.stubbed_scalars,
        value_reads=tracker.value_reads,
        # The CUDA release of the script's torch (None on a CPU build) and its kernel loading: the
        # CUDA context's size depends on them (estimate/cuda_terms.py).
        torch_cuda=torch.version.cuda,
        cuda_module_loading=os.environ.get("CUDA_MODULE_LOADING"),
        value_arrays=tracker.value_arrays,
        checks_passed=tracker.checks_passed,
        fake_memo_hits=tracker.fake_memo.hits if tracker.fake_memo is not None else None,
        sdpa=sdpa_notes,
        rnn_workspace=rnn_notes,
        rnn_backward_scratch=rnn_backward_notes,
        conv_scratch=conv_notes,
        matmul_copies=matmul_notes,
        loss_buffers=loss_notes,
        quantized_layers=state.get("quantized_layers", {}),
        quantized_failure=state.get("quantized_failure"),
        draws_not_replayed=tracker.draws["skipped"] if tracker.draws else 0,
        compiled=state.get("compiled", 0),
        script_autocast=request.get("autocast_dtype")
        if request.get("autocast_dtype") not in (None, "fp32")
        else None,
        autocast_regions=state.get("autocast_regions", 0),
        autocast_dtypes=sorted(state.get("autocast_dtypes", ())),
        foreach_pinned=bool(state.get("foreach_pinned")),
        batch_size=state.get("loader_batch") or state.get("argparse_batch") or state.get("knob_batch"),
        override_applied=state["override_applied"],
        batch_knobs=list(state["batch_knobs"].values()),
        batch_padded=state.get("batch_padded"),
        seed=state["seed"],
        data_varies=bool(state.get("data_varies")),
        bf16_emulated=bool(state.get("bf16_emulated")),
        loaders=state["loaders"],
        distributed=state.get("distributed"),
        live_after_steps=state["live_after_steps"],
        optimizers=[{"class": name, "fused": fused} for name, fused in sorted(state["optimizers"])],
        accumulation=state.get("accumulation"),
        checkpointed_blocks=state.get("checkpointed_blocks"),
        optimizer_change=sorted(state.get("optimizer_change", ())),
        cuda_kept_on_cpu=[
            {"file": where[0] if where else None, "line": where[1] if where else None, "calls": calls}
            for where, calls in redirect.kept_on_cpu.items()
        ],
        **_batches(state, peak.get("batch")),
    )
    if prof is not None:
        result["profile_replay_peak"] = profile_replay_peak(prof)
    return result


def _batches(state: dict, peak_batch) -> dict:
    """The batches the loaders gave (fake runs), the one the peak happened with, and the longest
    batch of each loader whose batches differ in shape, when it is longer than every batch traced
    (`_worst_batches`: real batches for the worst-case run, not written out)."""
    trace = state.get("batch_trace")
    if trace is None:
        return {}
    largest: dict[int, int] = {}
    for record in trace.batches:
        rank = next(index for index, known in enumerate(state["loaders"]) if known is record["loader"])
        elements = sum(math.prod(shape) for shape in record["shapes"].values())
        largest[rank] = max(largest.get(rank, 0), elements)
    worst = {
        rank: found
        for rank, found in state["worst_found"].items()
        if found["elements"] > largest.get(rank, 0)
    }
    return {
        "peak_batch": trace.describe(peak_batch),
        "batches_traced": len(trace.batches),
        "traced_batches": [trace.describe(record) for record in trace.batches[:LISTED_BATCHES]],
        "_worst_batches": worst,
    }


def _worst_case(options: dict, first: dict) -> dict | None:
    """The same run with the longest batch each varying loader can produce, for every batch."""
    worst = first.pop("_worst_batches", None)
    if not worst:
        return None
    progress.emit("run-start", batch_size=options["batch_size"])
    again = run(
        {**options, "seed": first["seed"], "worst_batches": {r: w["batch"] for r, w in worst.items()}}
    )
    again.pop("_worst_batches", None)
    progress.emit("run", batch_size=again["batch_size"], status=again["status"])
    loaders = first["loaders"]
    again["longest_batches"] = [
        {
            "loader": {"file": loaders[rank]["file"], "line": loaders[rank]["line"]},
            "shapes": found["shapes"],
            "samples": found["samples"],
            "scanned": found["scanned"],
            "batch_size": found["batch_size"],
            "drop_last": found["drop_last"],
        }
        for rank, found in worst.items()
    ]
    return again


def _step_seconds(started: float, step_ends: list[float]) -> float | None:
    return step_ends[-1] - started if step_ends else None


def _top(counter: dict, limit: int = 8) -> list[list]:
    items = [(name, size) for name, size in counter.items() if size > 0]
    items.sort(key=lambda item: -item[1])
    return [[name, size] for name, size in items[:limit]]


def _arm_watchdog() -> None:
    """oom_lsp/profiling/watchdog.py, loaded by path like this package: the run ends itself if
    its parent dies or its deadline passes."""
    oom_lsp_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(oom_lsp_dir, "profiling", "watchdog.py")
    spec = importlib.util.spec_from_file_location("oom_lsp_watchdog", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.arm_from_environment()


def _spread(options: dict, first: dict) -> dict:
    """The peak under other seeds, when the draw of the data decided the first batch's shapes
    (the run says so: data_varies): the same run again, seeded with the next seeds."""
    seeds, peaks = [first["seed"]], [first["peak_bytes"]]
    for offset in range(1, int(options["draws"])):
        progress.emit("run-start", batch_size=options["batch_size"])
        again = run({**options, "seed": first["seed"] + offset, "worst_case": False})
        again.pop("_worst_batches", None)
        progress.emit("run", batch_size=again["batch_size"], status=again["status"])
        if again["status"] == "stopped":
            seeds.append(again["seed"])
            peaks.append(again["peak_bytes"])
    return {"seeds": seeds, "peak_bytes": peaks}


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Estimates the peak memory of a training script's first optimizer steps."
    )
    parser.add_argument(
        "--request", required=True, help="JSON file: script, args, mode, device, runs, output"
    )
    parser.add_argument(
        "--progress-fd", type=int, default=None, help="write progress here, one JSON line per event"
    )
    options = parser.parse_args()
    _arm_watchdog()
    with open(options.request, encoding="utf-8") as handle:
        request = json.load(handle)
    if options.progress_fd is not None:
        progress.open_channel(options.progress_fd)
    progress.emit("ready")
    results = []
    previous_batch = None
    # Each run executes the script afresh; "double" asks for twice the
    # previous run's batch size (known only once the script has run).
    for run_request in request.get("runs", [{}]):
        batch_size = run_request.get("batch_size")
        if batch_size == "double":
            if not previous_batch:
                break
            batch_size = 2 * previous_batch
        progress.emit("run-start", batch_size=batch_size)
        run_options = {**request, **run_request, "batch_size": batch_size}
        result = run(run_options)
        if int(run_options.get("draws", 1)) > 1 and result["data_varies"] and result["status"] == "stopped":
            result["data_spread"] = _spread(run_options, result)
        if run_options.get("worst_case") and result["status"] == "stopped":
            result["worst_case"] = _worst_case({**run_options, "worst_case": False}, result)
        result.pop("_worst_batches", None)
        results.append(result)
        progress.emit("run", batch_size=result["batch_size"], status=result["status"])
        previous_batch = result["batch_size"] if result["status"] != "failed" else None
    with open(request["output"], "w", encoding="utf-8") as handle:
        json.dump({"runs": results}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
