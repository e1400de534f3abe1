"""On a machine with a CUDA GPU: the CUDA-mode estimate against real steps.

For each case of the zoo (bench/estimate_accuracy.py) at its middle batch
size: `oom-lsp estimate --device cuda` (fake trace on the CPU + CUDA terms),
then the same script run for real on the GPU for two optimizer steps in a
fresh interpreter by a minimal runner (GPU_RUNNER below, no oom_lsp code in
the measured process), reading torch.cuda.max_memory_allocated() and
max_memory_reserved() at the end. Goal (issue 4): within 10 %.

    python bench/gpu_estimate_check.py [--cases mlp,gpt_sdpa] [--json out.json]

With --distributed, the cases of bench/distributed_accuracy.py (DDP, FSDP2) on
every GPU of the machine (or --nproc of them): `torchrun --standalone
--nproc_per_node N` runs the script, unchanged, with DIST_RUNNER around it on
every rank (two optimizer steps, then each rank's max_memory_allocated(),
max_memory_reserved() and the device memory in use, CUDA context and NCCL's
buffers included), against `oom-lsp estimate --world-size N` for that GPU:
rank 0's allocated and reserved peaks, the process total against the GPU's
used memory (what calibrates the context and NCCL terms), and the spread
between ranks (what the rank asymmetry statements claim).

    python bench/gpu_estimate_check.py --distributed [--nproc 4] [--cases ddp,fsdp2] [--json out.json]

Needs a CUDA build of torch and a GPU (several for --distributed); prints the
GPU name and the date so that the figures can go into the README as measured.
The distributed mode has not run yet: no machine with several GPUs so far.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from distributed_accuracy import CASES as DISTRIBUTED_CASES
from distributed_accuracy import FIXTURES as DISTRIBUTED_FIXTURES
from estimate_accuracy import FIXTURES, ZOO

from oom_lsp.estimate.estimator import EstimateOptions, estimate
from oom_lsp.estimate.gpus import Gpu

MIB = 2**20

# Runs the script for real on the GPU, stops after two optimizer steps, and
# prints the allocator's peaks. Kept free of oom_lsp so that it measures
# nothing but the script.
GPU_RUNNER = r"""
import json, runpy, sys, torch, torch.optim.optimizer as opt
script, batch, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = [script, "--batch-size", str(batch), *sys.argv[4:]]
steps = 0
class Stop(BaseException):
    pass
def post(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps >= 2:
        raise Stop()
opt.register_optimizer_step_post_hook(post)
torch.cuda.init()
try:
    runpy.run_path(script, run_name="__main__")
except Stop:
    pass
torch.cuda.synchronize()
json.dump({"allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved(),
           "steps": steps, "name": torch.cuda.get_device_name(), "memory": torch.cuda.get_device_properties(0).total_memory,
           "capability": list(torch.cuda.get_device_capability())}, open(out, "w"))
"""


def real_gpu_step(script: Path, args: list[str], batch: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peak.json"
        subprocess.run(
            [sys.executable, "-c", GPU_RUNNER, str(script), str(batch), str(out), *args],
            check=True,
            timeout=600,
        )
        return json.loads(out.read_text())


# Every rank of a torchrun launch: the script, unchanged, for two optimizer steps, then the
# allocator's peaks and the device memory in use (CUDA context and NCCL buffers included,
# which the allocator does not see), one JSON file per rank. Kept free of oom_lsp.
DIST_RUNNER = r"""
import json, os, runpy, sys, torch, torch.optim.optimizer as opt
script, out_dir = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
rank = int(os.environ["RANK"])
steps = 0
class Stop(BaseException):
    pass
def post(optimizer, args, kwargs):
    global steps
    steps += 1
    if steps >= 2:
        raise Stop()
opt.register_optimizer_step_post_hook(post)
try:
    runpy.run_path(script, run_name="__main__")
except Stop:
    pass
device = torch.cuda.current_device()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info(device)
json.dump({"rank": rank, "device": device, "steps": steps,
           "allocated": torch.cuda.max_memory_allocated(device), "reserved": torch.cuda.max_memory_reserved(device),
           "used": total - free, "name": torch.cuda.get_device_name(device), "memory": total,
           "capability": list(torch.cuda.get_device_capability(device))},
          open(os.path.join(out_dir, f"rank{rank}.json"), "w"))
os._exit(0)  # the script's process group is left as it was; torchrun only needs the exit code
"""


def gpu_count() -> int:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return int(probe.stdout.strip().splitlines()[-1])


def real_distributed_steps(script: Path, args: list[str], nproc: int) -> list[dict]:
    """Each rank's figures, rank order."""
    with tempfile.TemporaryDirectory() as tmp:
        runner = Path(tmp) / "dist_runner.py"
        runner.write_text(DIST_RUNNER)
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
            + [str(runner), str(script), tmp, *args],
            check=True,
            timeout=1200,
        )
        ranks = [json.loads((Path(tmp) / f"rank{rank}.json").read_text()) for rank in range(nproc)]
    for rank in ranks:
        if rank["steps"] < 2:
            raise RuntimeError(
                f"{script.name}: rank {rank['rank']} stopped after {rank['steps']} optimizer steps"
            )
    return ranks


def distributed_main(cases: list[str], nproc: int, json_out: Path | None) -> int:
    rows = []
    gpu = None
    for name in cases:
        script, args, note = DISTRIBUTED_CASES[name]
        ranks = real_distributed_steps(DISTRIBUTED_FIXTURES / script, args, nproc)
        if gpu is None:
            major, minor = ranks[0]["capability"]
            gpu = Gpu(ranks[0]["name"], ranks[0]["memory"], "nvidia", (major, minor))
        prediction = estimate(
            EstimateOptions(script=DISTRIBUTED_FIXTURES / script, script_args=args, gpu=gpu, world_size=nproc)
        )
        allocated = [rank["allocated"] for rank in ranks]
        rows.append(
            {
                "case": name,
                "note": note,
                "ranks": nproc,
                "real_allocated": ranks[0]["allocated"],
                "estimate_allocated": prediction["peak_bytes"],
                "real_reserved": ranks[0]["reserved"],
                "estimate_reserved": prediction["reserved_bytes"],
                "real_used": ranks[0]["used"],
                "estimate_process": prediction["process_bytes"],
                "rank_spread": max(allocated) - min(allocated),
                "largest_rank": allocated.index(max(allocated)),
            }
        )
    print(f"{gpu.name if gpu else '-'} x {nproc}, {datetime.date.today().isoformat()}")
    print(
        "| case | ranks | rank 0 max_memory_allocated MiB | estimate MiB | error | max_memory_reserved MiB "
        "| estimate MiB | error | device memory used MiB | estimate process MiB | error | spread between ranks "
        "MiB (largest) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        errors = [
            (row[f"estimate_{estimate_key}"] - row[f"real_{real_key}"]) / row[f"real_{real_key}"]
            for estimate_key, real_key in (
                ("allocated", "allocated"),
                ("reserved", "reserved"),
                ("process", "used"),
            )
        ]
        print(
            f"| {row['case']} | {row['ranks']} | {row['real_allocated'] / MIB:.1f} | {row['estimate_allocated'] / MIB:.1f} "
            f"| {100 * errors[0]:+.1f} % | {row['real_reserved'] / MIB:.1f} | {row['estimate_reserved'] / MIB:.1f} "
            f"| {100 * errors[1]:+.1f} % | {row['real_used'] / MIB:.1f} | {row['estimate_process'] / MIB:.1f} "
            f"| {100 * errors[2]:+.1f} % | {row['rank_spread'] / MIB:.1f} (rank {row['largest_rank']}) |"
        )
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: every case)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--distributed", action="store_true", help="DDP and FSDP2 over torchrun on several GPUs"
    )
    parser.add_argument("--nproc", type=int, default=None, help="GPUs for --distributed (default: all)")
    options = parser.parse_args()
    if options.distributed:
        nproc = options.nproc or gpu_count()
        if nproc < 2:
            parser.error(f"--distributed needs at least 2 GPUs, this machine has {nproc}")
        cases = options.cases.split(",") if options.cases else list(DISTRIBUTED_CASES)
        return distributed_main(cases, nproc, options.json)
    options.cases = options.cases or ",".join(ZOO)
    rows = []
    gpu = None
    for name in options.cases.split(","):
        script, args, batch_sizes, _ = ZOO[name]
        batch = batch_sizes[1]
        real = real_gpu_step(FIXTURES / script, args, batch)
        if gpu is None:
            major, minor = real["capability"]
            gpu = Gpu(real["name"], real["memory"], "nvidia", (major, minor))
        prediction = estimate(
            EstimateOptions(script=FIXTURES / script, script_args=args, batch_size=batch, gpu=gpu)
        )
        rows.append(
            {
                "case": name,
                "batch": batch,
                "real_allocated": real["allocated"],
                "estimate_allocated": prediction["peak_bytes"],
                "real_reserved": real["reserved"],
                "estimate_reserved": prediction["reserved_bytes"],
            }
        )
    print(f"{gpu.name if gpu else '-'}, {datetime.date.today().isoformat()}")
    print(
        "| case | bs | max_memory_allocated MiB | estimate MiB | error | max_memory_reserved MiB | estimate MiB | error |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        allocated_error = (row["estimate_allocated"] - row["real_allocated"]) / row["real_allocated"]
        reserved_error = (row["estimate_reserved"] - row["real_reserved"]) / row["real_reserved"]
        print(
            f"| {row['case']} | {row['batch']} | {row['real_allocated'] / MIB:.1f} | "
            f"{row['estimate_allocated'] / MIB:.1f} | {100 * allocated_error:+.1f} % | "
            f"{row['real_reserved'] / MIB:.1f} | {row['estimate_reserved'] / MIB:.1f} | {100 * reserved_error:+.1f} % |"
        )
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
