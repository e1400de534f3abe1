"""Issue 32's goal on the estimate benchmarks' scripts: for each, run
`oom-lsp estimate --format json --snapshot --html`, then PyTorch's own
`python -m torch.cuda._memory_viz trace_plot` on the pickle, and print whether the page's peak and
the pickle's replayed peak equal the estimate's to the byte, `explain`'s top lines against the
estimate's, the file sizes and the time with and without the timeline.

    .venv/bin/python bench/timeline_exports.py [SCRIPT.py ...]      # default: fixtures/estimate/'s 8
    .venv/bin/python bench/timeline_exports.py --real-scripts [--cases nanogpt,mnist]
    .venv/bin/python bench/timeline_exports.py --distributed [--cases ddp,fsdp2]

--real-scripts: bench/real_zoo.py's public scripts (bench/estimate_accuracy.py --real-scripts),
prepared as there and estimated as there (--device cpu, their arguments); cases whose modules are
missing are listed as skipped. --distributed: bench/distributed_accuracy.py's DDP and FSDP2 cases,
rank 0 of 4 (--world-size 4 --device cpu).
"""

from __future__ import annotations

import argparse
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
HEADER = (
    "script               peak (B)     page=  viz=  plain=  explain gap  events     pickle    page     s plain/timeline"
)


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    return result, time.perf_counter() - started


def check(script: Path, label: str = "", options: tuple[str, ...] = (), args: tuple[str, ...] = (),
          folder: Path | None = None) -> dict:
    """One script: copied into a fresh folder, or run in `folder` (a prepared real-zoo case)."""
    if folder is not None:
        return _check(folder, str(script.relative_to(folder)), label or script.name, options, args)
    with tempfile.TemporaryDirectory(prefix="oom-lsp-timeline-") as tmp:
        shutil.copy(script, tmp)
        return _check(Path(tmp), script.name, label or script.name, options, args)


def _check(folder: Path, name: str, label: str, options: tuple[str, ...], args: tuple[str, ...]) -> dict:
    tail = [*options, "--", *args] if args else list(options)
    plain, plain_s = _run([*OOM_LSP, "estimate", name, "--format", "json", *tail], folder)
    drawn, drawn_s = _run(
        [*OOM_LSP, "estimate", name, "--format", "json", "--snapshot", "s.pickle", "--html", "p.html", *tail],
        folder,
    )
    try:
        estimate = json.loads(drawn.stdout)
    except json.JSONDecodeError:
        estimate = {"error": (drawn.stdout + drawn.stderr).strip().splitlines()[-1:]}
    if "error" in estimate or not (folder / "p.html").exists():
        said = [line for line in drawn.stderr.splitlines() if "no memory timeline" in line]
        return {"script": label, "error": str(estimate.get("error") or said[-1:] or drawn.stderr[-300:])[:300]}
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
        "script": label,
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


def _real_scripts(cases: str | None) -> tuple[list[dict], list[str]]:
    sys.path.insert(0, str(ROOT / "bench"))
    import real_zoo

    rows, skipped = [], []
    zoo = real_zoo.load_cases()
    work = Path(tempfile.mkdtemp(prefix="oom-lsp-timeline-zoo-"))
    try:
        for name in cases.split(",") if cases else zoo:
            case = zoo[name]
            missing = real_zoo.missing_modules(case, sys.executable)
            if missing:
                skipped.append(f"{name} (missing {', '.join(missing)})")
                continue
            try:
                folder = real_zoo.prepare(case, work, sys.executable)
            except real_zoo.CaseError as error:
                rows.append({"script": name, "error": str(error)})
                continue
            rows.append(check(folder / case.script, name, ("--device", "cpu"), tuple(case.args), folder))
            print(_row(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows, skipped


def _distributed(cases: str | None) -> list[dict]:
    sys.path.insert(0, str(ROOT / "bench"))
    import distributed_accuracy

    rows = []
    for name in cases.split(",") if cases else distributed_accuracy.CASES:
        script, args, _ = distributed_accuracy.CASES[name]
        rows.append(
            check(distributed_accuracy.FIXTURES / script, f"{name} rank 0/4", ("--world-size", "4", "--device", "cpu"),
                  tuple(args))
        )
        print(_row(rows[-1]), flush=True)
    return rows


def _ok(row: dict) -> bool:
    return "error" not in row and row["page_equal"] and row["memory_viz_equal"] and (
        row["explain_top_lines_worst_gap"] <= 0.01
    )


def _row(row: dict) -> str:
    if "error" in row:
        return f"{row['script']:<20} error: {row['error']}"
    return (
        f"{row['script']:<20} {row['peak']:>12,}  {'yes' if row['page_equal'] else 'NO':<5} "
        f"{'yes' if row['memory_viz_equal'] else 'NO':<5} {'yes' if row['plain_peak_equal'] else 'NO':<6} "
        f"{100 * row['explain_top_lines_worst_gap']:>9.2f} %  {row['events']:>6}  {row['pickle_bytes']:>9,}  "
        f"{row['page_bytes']:>8,}  {row['seconds_plain']:>5} / {row['seconds_with_timeline']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scripts", nargs="*", type=Path)
    parser.add_argument("--real-scripts", action="store_true", help="bench/real_zoo.py's public scripts")
    parser.add_argument("--distributed", action="store_true", help="bench/distributed_accuracy.py's cases")
    parser.add_argument("--cases", help="comma-separated case names (with --real-scripts or --distributed)")
    options = parser.parse_args()
    skipped: list[str] = []
    if options.real_scripts or options.distributed:
        print(HEADER, flush=True)
        rows = []
        if options.real_scripts:
            found, skipped = _real_scripts(options.cases)
            rows += found
        if options.distributed:
            rows += _distributed(options.cases if not options.real_scripts else None)
        print("--- all rows")
    else:
        scripts = options.scripts or [ROOT / "fixtures" / "estimate" / name for name in SCRIPTS]
        rows = [check(script) for script in scripts]
    print(HEADER)
    failures = 0
    for row in rows:
        failures += not _ok(row)
        print(_row(row))
    for name in skipped:
        print(f"skipped: {name}")
    print(
        f"{len(rows) - failures} of {len(rows)} scripts: page, memory_viz and explain agree with the estimate"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
