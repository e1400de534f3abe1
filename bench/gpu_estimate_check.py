"""On a machine with a CUDA GPU: the CUDA-mode estimate against real steps.

For each case of the zoo (bench/estimate_accuracy.py) at its middle batch
size: `oom-lsp estimate --device cuda` (fake trace on the CPU + CUDA terms),
then the same script run for real on the GPU for two optimizer steps in a
fresh interpreter by a minimal runner (GPU_RUNNER below, no oom_lsp code in
the measured process), reading torch.cuda.max_memory_allocated() and
max_memory_reserved() at the end. Goal (issue 4): within 10 %.

    python bench/gpu_estimate_check.py [--cases mlp,gpt_sdpa] [--json out.json]

Needs a CUDA build of torch and a GPU; prints the GPU name and the date so
that the figures can go into the README as measured.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(ZOO))
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
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
