"""Runs a training script for real, as `python SCRIPT ARGS` would, until its Nth optimizer step ends.

The ground truth of bench/real_zoo.py, kept apart from oom-lsp's estimate harness on
purpose: no shims (the script sees this machine as it is: no GPU), no module tracker, no
dispatcher mode, nothing that could keep a tensor alive or change what the script does.
What it adds: the thread count (the estimate's child uses one thread), a seed for torch's,
Python's and NumPy's global generators (an unseeded script, shuffling for instance, would draw
other batches in each run: the truth is the draw of `--seed`), a global optimizer
step post hook that stops the script after `--steps` steps (a BaseException, so the
script's `except Exception` does not swallow it), and with `--profile` the profiler's
memory events: the peak of their running sum in time order is the peak of live CPU
tensor bytes (every c10 CPU allocation, kernel scratch included), from the script's first
line to the end of the last step.

    python bench/real_steps.py [--steps 2] [--profile] [--lines] [--threads 1] [--seed 0] --out result.json -- SCRIPT ARGS...

Runs in the current directory (scripts read their data relative to it). The result is
one JSON object: status ("stopped" after the steps, "ended" when the script finished or
exited first, "failed"), steps, seconds (script start to the last step's end, or to the
end), peak_bytes (with --profile), lines (with --lines: "path:line" of every line of the files
under the current folder that ran), error (the last lines of the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
import time
import traceback


class StopAfterSteps(BaseException):
    """Raised from the optimizer step post hook once enough steps ran."""


def profile_peak(prof) -> int:
    """Peak of the running sum of the profiler's allocation events (+size, -size) in time order."""
    events = sorted(
        (event.start_ns(), index, event.nbytes())
        for index, event in enumerate(prof.profiler.kineto_results.events())
        if event.name() == "[memory]"
    )
    current = peak = 0
    for _, _, size in events:
        current += size
        peak = max(peak, current)
    return peak


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def line_tracer(root: str):
    """The lines of the files under `root` that run (sys.settrace: what the oracle asks of a
    finding's code, whether it ran before the run stopped); (executed, the global tracer)."""
    executed: set[tuple[str, int]] = set()
    root = os.path.abspath(root) + os.sep

    def local(frame, event, arg):
        if event == "line":
            executed.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def enter(frame, event, arg):
        if frame.f_code.co_filename.startswith(root):
            executed.add((frame.f_code.co_filename, frame.f_lineno))
            return local
        return None

    return executed, enter


def run(script: str, args: list[str], steps: int, profile: bool, threads: int, seed: int,
        lines: bool = False) -> dict:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(threads)
    seed_everything(seed)
    done = {"steps": 0, "last_step_end": None}

    def after_step(optimizer, args, kwargs) -> None:
        done["steps"] += 1
        done["last_step_end"] = time.perf_counter()
        if done["steps"] >= steps:
            raise StopAfterSteps()

    hook = register_optimizer_step_post_hook(after_step)
    prof = None
    if profile:
        from torch.profiler import ProfilerActivity

        prof = torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    script = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    result: dict = {"status": "ended", "error": None}
    started = time.perf_counter()
    executed, tracer = line_tracer(os.getcwd()) if lines else (None, None)
    try:
        if prof is not None:
            prof.start()
        if tracer is not None:
            threading.settrace(tracer)
            sys.settrace(tracer)
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            if tracer is not None:
                sys.settrace(None)
                threading.settrace(None)
            if prof is not None:
                prof.stop()
    except StopAfterSteps:
        result["status"] = "stopped"
    except SystemExit as exit_:
        result["status"] = "ended" if exit_.code in (None, 0) else "failed"
        if result["status"] == "failed":
            result["error"] = f"the script called sys.exit({exit_.code!r})"
    except Exception as error:  # noqa: BLE001 - the script's own failure, reported with its traceback
        result["status"] = "failed"
        result["error"] = "".join(traceback.format_exception(type(error), error, error.__traceback__))[-3000:]
    ended = time.perf_counter()
    hook.remove()
    result["steps"] = done["steps"]
    result["seconds"] = (done["last_step_end"] if result["status"] == "stopped" else ended) - started
    if prof is not None:
        result["peak_bytes"] = profile_peak(prof)
    if executed is not None:
        here = os.getcwd()
        result["lines"] = sorted(f"{os.path.relpath(name, here)}:{line}" for name, line in executed)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="measure the peak with the profiler")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of torch's, Python's and NumPy's generators"
    )
    parser.add_argument("--out", required=True, help="write the result here (JSON)")
    parser.add_argument(
        "--lines", action="store_true", help="also list the lines of the files under the current folder that ran"
    )
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the script after --: ... -- SCRIPT ARGS...")
    split = argv.index("--")
    options = parser.parse_args(argv[:split])
    script, *args = argv[split + 1 :]
    out = os.path.abspath(options.out)
    result = run(script, args, options.steps, options.profile, options.threads, options.seed, options.lines)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
