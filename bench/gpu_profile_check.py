"""On a machine with a CUDA GPU: `oom-lsp profile` against the allocator's own counters.

For each case of the zoo (bench/estimate_accuracy.py) at its middle batch
size: `oom-lsp profile --device cuda --steps 2` (the profiling harness), then
the same script run for real on the GPU for two optimizer steps in a fresh
interpreter by the minimal runner of bench/gpu_estimate_check.py (no oom_lsp
code in the measured process), reading torch.cuda.max_memory_allocated() and
max_memory_reserved() at the end. The report's peak over its steps must
equal those counters (issue 5): the harness resets the peak counters per
step and adds nothing to the GPU.

    python bench/gpu_profile_check.py [--cases mlp,gpt_sdpa] [--json out.json]

Needs a CUDA build of torch and a GPU; prints the GPU name and the date so
that the figures can go into the README as measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from estimate_accuracy import FIXTURES, ZOO
from gpu_estimate_check import real_gpu_step

from oom_lsp.profiling.runner import ProfileRequest, profile

MIB = 2**20


def profiled_peaks(script: Path, args: list[str], batch: int) -> tuple[int, int | None]:
    with tempfile.TemporaryDirectory() as tmp:
        report = profile(
            ProfileRequest(
                script=script,
                out=Path(tmp),
                script_args=["--batch-size", str(batch), *args],
                steps=2,
                device="cuda",
            )
        )
    if report.device.type != "cuda":
        raise SystemExit("the profile did not run on CUDA: is this torch a CUDA build, and is a GPU visible?")
    allocated = max(step.peak_allocated for step in report.steps)
    reserved = [step.peak_reserved for step in report.steps if step.peak_reserved is not None]
    return allocated, max(reserved) if reserved else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(ZOO))
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    rows = []
    gpu_name = None
    for name in options.cases.split(","):
        script, args, batch_sizes, _ = ZOO[name]
        batch = batch_sizes[1]
        real = real_gpu_step(FIXTURES / script, args, batch)
        gpu_name = gpu_name or real["name"]
        allocated, reserved = profiled_peaks(FIXTURES / script, args, batch)
        rows.append(
            {
                "case": name,
                "batch": batch,
                "real_allocated": real["allocated"],
                "profile_allocated": allocated,
                "real_reserved": real["reserved"],
                "profile_reserved": reserved,
            }
        )
    print(f"{gpu_name or '-'}, {datetime.date.today().isoformat()}")
    print("| case | bs | max_memory_allocated MiB | profile MiB | equal | max_memory_reserved MiB | profile MiB |")
    print("|---|---|---|---|---|---|---|")
    mismatches = 0
    for row in rows:
        equal = row["real_allocated"] == row["profile_allocated"]
        mismatches += not equal
        reserved = row["profile_reserved"]
        print(
            f"| {row['case']} | {row['batch']} | {row['real_allocated'] / MIB:.2f} | "
            f"{row['profile_allocated'] / MIB:.2f} | {'yes' if equal else 'NO'} | "
            f"{row['real_reserved'] / MIB:.2f} | {reserved / MIB if reserved is not None else float('nan'):.2f} |"
        )
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
