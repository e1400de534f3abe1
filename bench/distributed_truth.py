"""Ground truth of the distributed estimate: a torchrun-style script run for real, on CPU
tensors, as rank 0 of N under PyTorch's fake process group, until its Nth optimizer step ends.

Kept apart from oom-lsp's estimate harness on purpose (no module tracker, no dispatcher
mode, no CUDA shims: the script sees this machine as it is, no GPU, so it takes its CPU
and gloo path). What it adds is only what one process needs to be rank 0 of N:

- RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT as torchrun sets them;
- `init_process_group(...)` (whatever backend and init method) becomes
  `init_process_group("fake", rank=0, world_size=N, store=FakeStore())`: collectives
  complete at once and move nothing, which is what rank 0 holds (a collective's buffers
  are the caller's);
- the fake group's futures carry no tensor: a DDP without a communication hook gets one
  that does what DDP's default does to the bucket (divide in place, return it), and
  `all_reduce(..., async_op=True)` futures return their tensor, as gloo's and NCCL's do;

and, as bench/real_steps.py does for one process: one intra-op thread (gloo's and the
profiler's worker threads aside, the profiler misses frees made on other threads), a seed,
a global optimizer step post hook that stops the script after `--steps` steps, and with
`--profile` the peak of the running sum of the profiler's memory events (every c10 CPU
allocation, kernel scratch included).

    python bench/distributed_truth.py --world-size 4 [--steps 2] [--profile] --out r.json -- SCRIPT ARGS...
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import traceback


class StopAfterSteps(BaseException):
    """Raised from the optimizer step post hook once enough steps ran."""


def profile_peak(prof) -> int:
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


def as_rank_zero(world_size: int) -> None:
    """What one process needs to be rank 0 of `world_size` (see the module's docstring)."""
    import torch
    import torch.distributed as dist
    import torch.nn.parallel.distributed as ddp_module
    from torch.distributed import distributed_c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29500",
    )
    original_init = distributed_c10d.init_process_group

    def init_process_group(*args, **kwargs):
        return original_init("fake", rank=0, world_size=world_size, store=FakeStore())

    dist.init_process_group = distributed_c10d.init_process_group = init_process_group

    original_all_reduce = distributed_c10d.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        work = original_all_reduce(tensor, op=op, group=group, async_op=async_op)
        if not async_op or work is None:
            return work
        future = torch.futures.Future()
        future.set_result([tensor])
        return torch._C._distributed_c10d._create_work_from_future(future)

    dist.all_reduce = distributed_c10d.all_reduce = all_reduce

    ddp_class = ddp_module.DistributedDataParallel
    original_pre_forward = ddp_class._pre_forward

    def pre_forward(self, *inputs, **kwargs):
        if not getattr(self, "_truth_hooked", False):
            self._truth_hooked = True
            if not self._comm_hooks:
                world = self.process_group.size()

                def allreduce_average(state, bucket):
                    bucket.buffer().div_(world)
                    future = torch.futures.Future()
                    future.set_result(bucket.buffer())
                    return future

                dist._register_comm_hook(self.reducer, None, allreduce_average)
        return original_pre_forward(self, *inputs, **kwargs)

    ddp_class._pre_forward = pre_forward


def run(script: str, args: list[str], world_size: int, steps: int, profile: bool, threads: int, seed: int):
    import random

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    torch.set_num_threads(threads)
    random.seed(seed)
    torch.manual_seed(seed)
    as_rank_zero(world_size)
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
    try:
        if prof is not None:
            prof.start()
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            if prof is not None:
                prof.stop()
    except StopAfterSteps:
        result["status"] = "stopped"
    except SystemExit as exit_:
        result["status"] = "ended" if exit_.code in (None, 0) else "failed"
    except Exception as error:  # noqa: BLE001 - the script's own failure, reported with its traceback
        result["status"] = "failed"
        result["error"] = "".join(traceback.format_exception(type(error), error, error.__traceback__))[-3000:]
    ended = time.perf_counter()
    hook.remove()
    result["steps"] = done["steps"]
    result["seconds"] = (done["last_step_end"] if result["status"] == "stopped" else ended) - started
    if prof is not None:
        result["peak_bytes"] = profile_peak(prof)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="measure the peak with the profiler")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="write the result here (JSON)")
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the script after --: ... -- SCRIPT ARGS...")
    split = argv.index("--")
    options = parser.parse_args(argv[:split])
    script, *args = argv[split + 1 :]
    out = os.path.abspath(options.out)
    result = run(
        script, args, options.world_size, options.steps, options.profile, options.threads, options.seed
    )
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
