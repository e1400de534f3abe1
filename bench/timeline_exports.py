"""Issue 32's goal on the scripts we have: for each training script of fixtures/estimate/, run
`oom-lsp estimate --format json --snapshot --html`, then PyTorch's own
`python -m torch.cuda._memory_viz trace_plot` on the pickle, and print whether the page's peak and
the pickle's replayed peak equal the estimate's to the byte, `explain`'s top lines against the
estimate's, the file sizes and the time with and without the timeline.

    .venv/bin/python bench/timeline_exports.py [SCRIPT.py ...]

(The real public scripts of bench/real_zoo.py need the bench extra's packages; pass their paths.)
"""

from __future__ import annotations

import base64
import json
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oom_lsp.estimate.timeline import active_peak

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "mlp.py",
    "cnn.py",
    "gpt.py",
    "lstm.py",
    "unet.py",
    "vit.py",
    "encoder_bf16.py",
    "finetune_frozen.py",
]
OOM_LSP = [sys.executable, "-m", "oom_lsp"]


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    return result, time.perf_counter() - started


def check(script: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="oom-lsp-timeline-") as tmp:
        folder = Path(tmp)
        shutil.copy(script, folder)
        name = script.name
        plain, plain_s = _run([*OOM_LSP, "estimate", name, "--format", "json"], folder)
        drawn, drawn_s = _run(
            [*OOM_LSP, "estimate", name, "--format", "json", "--snapshot", "s.pickle", "--html", "p.html"],
            folder,
        )
        if drawn.returncode not in (0, 1):
            return {"script": name, "error": (drawn.stdout + drawn.stderr).strip().splitlines()[-1]}
        estimate = json.loads(drawn.stdout)
        page_peak = int(re.search(r'data-peak-bytes="(\d+)"', (folder / "p.html").read_text()).group(1))
        viz, _ = _run(
            [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", "s.pickle", "-o", "v.html"], folder
        )
        embedded = (
            re.search(r'"base64": "([^"]+)"', (folder / "v.html").read_text())
            if viz.returncode == 0
            else None
        )
        viz_peak = active_peak(pickle.loads(base64.b64decode(embedded.group(1)))) if embedded else None
        explained, _ = _run([*OOM_LSP, "explain", "s.pickle", "--format", "json"], folder)
        lines = {f"{u['file']}:{u['line']}": u["bytes"] for u in json.loads(explained.stdout)["top_lines"]}
        worst = max(
            (abs(lines.get(place, 0) - size) / size for place, size in estimate["top_lines"] if size),
            default=0.0,
        )
        return {
            "script": name,
            "peak": estimate["peak_bytes"],
            "page_equal": page_peak == estimate["peak_bytes"],
            "memory_viz_equal": viz_peak == estimate["peak_bytes"],
            "plain_peak_equal": json.loads(plain.stdout)["peak_bytes"] == estimate["peak_bytes"],
            "explain_top_lines_worst_gap": worst,
            "events": len(pickle.loads((folder / "s.pickle").read_bytes())["device_traces"][0]),
            "pickle_bytes": (folder / "s.pickle").stat().st_size,
            "page_bytes": (folder / "p.html").stat().st_size,
            "seconds_plain": round(plain_s, 1),
            "seconds_with_timeline": round(drawn_s, 1),
        }


def main() -> int:
    scripts = [Path(arg) for arg in sys.argv[1:]] or [
        ROOT / "fixtures" / "estimate" / name for name in SCRIPTS
    ]
    rows = [check(script) for script in scripts]
    header = "script               peak (B)     page=  viz=  plain=  explain gap  events  pickle    page     s plain/timeline"
    print(header)
    failures = 0
    for row in rows:
        if "error" in row:
            failures += 1
            print(f"{row['script']:<20} error: {row['error']}")
            continue
        ok = row["page_equal"] and row["memory_viz_equal"] and row["explain_top_lines_worst_gap"] <= 0.01
        failures += not ok
        print(
            f"{row['script']:<20} {row['peak']:>12,}  {'yes' if row['page_equal'] else 'NO':<5} "
            f"{'yes' if row['memory_viz_equal'] else 'NO':<5} {'yes' if row['plain_peak_equal'] else 'NO':<6} "
            f"{100 * row['explain_top_lines_worst_gap']:>9.2f} %  {row['events']:>6}  {row['pickle_bytes']:>8,}  "
            f"{row['page_bytes']:>8,}  {row['seconds_plain']:>5} / {row['seconds_with_timeline']}"
        )
    print(
        f"{len(rows) - failures} of {len(rows)} scripts: page, memory_viz and explain agree with the estimate"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
