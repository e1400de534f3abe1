"""Accuracy and speed of `oom-lsp estimate --world-size N --device cpu` on DDP and FSDP2 scripts.

For each case of fixtures/estimate/distributed/ at 2, 4 and 8 ranks: the estimate (the script
traced as rank 0 of N on fake tensors and PyTorch's fake process group, in one child
interpreter for the three sizes, as a sweep runs) and its ground truth, the same script run
for real on CPU tensors as rank 0 of N under the fake process group by
bench/distributed_truth.py (no oom-lsp code in that process, one intra-op thread): rank 0's
peak from the profiler's allocation events, then the same run again without the profiler for
its time. Times: the traced two steps against the real two steps (script start to the end of
the second optimizer step, imports before the script excluded), and each whole process
end to end (what a user waits for).

    .venv/bin/python bench/distributed_accuracy.py [--cases ddp,fsdp2] [--sizes 2,4,8] [--json out.json]

Goal (issue 18): within 2 % of the truth, and the estimate faster than the real-tensor run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oom_lsp.estimate import distributed
from oom_lsp.estimate.estimator import EstimateError, EstimateOptions, run_harness

FIXTURES = ROOT / "fixtures" / "estimate" / "distributed"
TRUTH = ROOT / "bench" / "distributed_truth.py"
MIB = 2**20

# name: (script, script arguments, note)
CASES: dict[str, tuple[str, list[str], str]] = {
    "ddp": ("ddp_mlp.py", [], "DDP, default buckets"),
    "ddp_bucket_view": ("ddp_mlp.py", ["--bucket-view"], "DDP, gradient_as_bucket_view=True"),
    "fsdp2": ("fsdp2_gpt.py", [], "FSDP2, fp32"),
    "fsdp2_bf16": ("fsdp2_gpt.py", ["--mixed-precision"], "FSDP2, bf16 MixedPrecisionPolicy"),
    "fsdp2_ac": ("fsdp2_gpt.py", ["--checkpointing"], "FSDP2, activation checkpointing per block"),
}


def real_run(script: Path, args: list[str], world_size: int, profile: bool, python: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "truth.json"
        started = time.perf_counter()
        subprocess.run(
            [python, str(TRUTH), "--world-size", str(world_size), "--out", str(out)]
            + (["--profile"] if profile else [])
            + ["--", str(script), *args],
            cwd=tmp,
            check=True,
            capture_output=True,
            timeout=900,
        )
        result = json.loads(out.read_text())
        result["wall_s"] = time.perf_counter() - started
    if result["status"] != "stopped":
        raise EstimateError(
            f"{script.name} {args} at {world_size}: the real run {result['status']}: {result['error']}"
        )
    return result


def run_case(name: str, sizes: list[int], python: str) -> list[dict]:
    script, args, note = CASES[name]
    options = EstimateOptions(
        script=FIXTURES / script, script_args=args, device="cpu", python=python, timeout=900
    )
    started = time.perf_counter()
    traces = run_harness(options, [{"distributed": distributed.launch(size, None)} for size in sizes])
    estimate_wall = time.perf_counter() - started
    rows = []
    for size, trace in zip(sizes, traces):
        if trace["status"] != "stopped":
            raise EstimateError(f"{name} at {size}: the estimate {trace['status']}: {trace.get('failure')}")
        truth = real_run(FIXTURES / script, args, size, profile=True, python=python)
        bare = real_run(FIXTURES / script, args, size, profile=False, python=python)
        rows.append(
            {
                "case": name,
                "ranks": size,
                "note": note,
                "real_bytes": truth["peak_bytes"],
                "estimate_bytes": trace["peak_bytes"],
                "error": (trace["peak_bytes"] - truth["peak_bytes"]) / truth["peak_bytes"],
                "estimate_s": trace["seconds"],
                "real_s": bare["seconds"],
                "real_wall_s": bare["wall_s"],
                "peak_at": f"{trace['peak_op']} ({trace['peak_phase']})",
            }
        )
    # One interpreter traced the three sizes: its wall time, shared out, next to each real process's.
    for row in rows:
        row["estimate_wall_s"] = estimate_wall / len(rows)
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "| case | ranks | rank 0 real peak MiB | estimate MiB | error | estimate s | two real steps s | speed-up "
        "| process s (estimate / real) | peak at |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['ranks']} | {row['real_bytes'] / MIB:.2f} | {row['estimate_bytes'] / MIB:.2f} "
            f"| {100 * row['error']:+.2f} % | {row['estimate_s']:.2f} | {row['real_s']:.2f} "
            f"| {row['real_s'] / row['estimate_s']:.1f}x | {row['estimate_wall_s']:.1f} / {row['real_wall_s']:.1f} "
            f"| {row['peak_at']} |"
        )
    if rows:
        worst = max(rows, key=lambda row: abs(row["error"]))
        print(f"\nworst error: {100 * worst['error']:+.2f} % ({worst['case']} at {worst['ranks']} ranks)")
        within = sum(abs(row["error"]) <= 0.02 for row in rows)
        faster = sum(row["estimate_s"] < row["real_s"] for row in rows)
        print(f"within 2 %: {within}/{len(rows)}; estimate faster than the real steps: {faster}/{len(rows)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--sizes", default="2,4,8", help="world sizes")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    options = parser.parse_args()
    sizes = distributed.parse_world_sizes(options.sizes)
    rows: list[dict] = []
    for name in options.cases.split(","):
        try:
            case_rows = run_case(name, sizes, options.python)
        except EstimateError as error:
            print(f"{name}: failed: {error}", file=sys.stderr)
            continue
        rows += case_rows
        print(f"{name}: done", file=sys.stderr)
    print_table(rows)
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
