"""How `oom-lsp explain` scales with a snapshot's size (issue 32 asks a 2 GB snapshot in under
30 s and 1 GB of RSS): generates a snapshot of about --mb megabytes (allocations with five-frame
stacks, half freed), runs `oom-lsp explain FILE --format json` on it, and prints the seconds and the
child's peak RSS (from wait4), and the RSS per megabyte of pickle.

    .venv/bin/python bench/snapshot_explain_size.py --mb 100
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def generate(path: Path, megabytes: int) -> int:
    trace = []
    size = 0
    address = 0
    index = 0
    while True:
        frames = [
            {
                "filename": "/usr/lib/python3/site-packages/torch/nn/functional.py",
                "line": 2000 + index % 7,
                "name": "linear",
            },
            {
                "filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                "line": 125,
                "name": "forward",
            },
            {
                "filename": f"/home/user/project/model_{index % 13}.py",
                "line": 10 + index % 97,
                "name": "forward",
            },
            {"filename": "/home/user/project/train.py", "line": 40 + index % 5, "name": "step"},
            {"filename": "/home/user/project/train.py", "line": 90, "name": "<module>"},
        ]
        nbytes = 512 * (1 + index % 4096)
        trace.append({"action": "alloc", "addr": address, "size": nbytes, "stream": 0, "frames": frames})
        if index % 2:
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {"action": action, "addr": address, "size": nbytes, "stream": 0, "frames": frames}
                )
        address += nbytes
        index += 1
        if index % 20000 == 0:
            size = len(pickle.dumps(trace[-20000:], protocol=4)) * (index // 20000)
            if size >= megabytes * 2**20:
                break
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    return index


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oom-lsp-snapshot-size-") as tmp:
        path = Path(tmp) / "big.pickle"
        allocations = generate(path, args.mb)
        megabytes = path.stat().st_size / 2**20
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "oom_lsp", "explain", str(path), "--format", "json"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        rss_mb = usage.ru_maxrss / 1024
        print(
            f"snapshot: {megabytes:.0f} MiB, {allocations:,} allocations; exit {os.waitstatus_to_exitcode(status)}"
        )
        print(
            f"explain: {seconds:.1f} s, peak RSS {rss_mb:.0f} MiB ({rss_mb / megabytes:.1f} MiB per MiB of pickle)"
        )
        print(
            f"at this rate a 2 GiB snapshot: about {seconds * 2048 / megabytes:.0f} s and "
            f"{rss_mb * 2048 / megabytes / 1024:.1f} GiB (the goal: 30 s, 1 GB; explain reads the file whole)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
