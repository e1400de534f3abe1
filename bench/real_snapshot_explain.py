"""Issue 32's goal on real GPU snapshots published with their code: `oom-lsp explain` on the memory
snapshots of kkaitlyn111/cs336-a2-systems (memory_files/, recorded on one GPU) against
`oom-lsp estimate` on the same step (bench/real_snapshots/cs336/benchmark_memory.py, the code the
snapshots name, at the configuration each file name says).

    git clone https://github.com/kkaitlyn111/cs336-a2-systems /tmp/cs336-a2-systems
    .venv/bin/python bench/real_snapshot_explain.py --git-dir /tmp/cs336-a2-systems/.git
    .venv/bin/python bench/real_snapshot_explain.py --snapshots DIR     # a folder of memory_ctx*.pickle

Needs einops and jaxtyping (the model's imports). Per snapshot: explain's peak and the estimate's
(`--gpu H100`), then each top line (file name and line) with explain's bytes and the estimate's.
A line is "not recorded" when no allocation of the recording names it: the snapshot started
recording after the model and optimizer were built (so the parameters have no frames), and the
backward runs on the autograd engine's thread, whose allocations carry no Python frame (so the
gradients have no line either). "same top lines" compares the lines holding at least 1 % of the
peak in explain with those of the estimate that the recording could name.

The snapshots recorded one forward or one full step, the first (no warm-up); the estimate traces
two full steps, so besides its headline peak the estimate's own snapshot (`--snapshot`, each entry
with its phase) is replayed over the same window: up to the first loss for a forward snapshot, up to
the second step for a full one. That window is what the table compares. The mixed-precision full
steps were never pushed (their git objects are missing).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "bench" / "real_snapshots" / "cs336"
OOM_LSP = [sys.executable, "-m", "oom_lsp"]
COMMIT = "c1c174d195a52578ae28961723438628c8dcbb2d"  # added memory_files/
NAME = re.compile(r"memory_ctx(?P<ctx>\d+)_(?P<kind>forward|fullstep)(?P<suffix>_?(?:mixed)?)\.pickle$")
SHARE = 0.01  # a "top line" holds at least 1 % of the peak


def _json(args: list[str], cwd: Path) -> dict:
    result = subprocess.run(OOM_LSP + args, cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode not in (0, 1):
        raise SystemExit(
            f"oom-lsp {' '.join(args)}: exit {result.returncode}: {result.stderr.strip()[-800:]}"
        )
    return json.loads(result.stdout)


def _snapshots(args: argparse.Namespace, work: Path) -> list[Path]:
    if args.snapshots:
        return sorted(p for p in Path(args.snapshots).glob("memory_ctx*.pickle") if NAME.search(p.name))
    listing = subprocess.run(
        ["git", "--git-dir", args.git_dir, "ls-tree", "--name-only", COMMIT, "memory_files/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    paths = []
    for name in listing:
        blob = subprocess.run(
            ["git", "--git-dir", args.git_dir, "show", f"{COMMIT}:{name}"], capture_output=True, check=False
        )
        if blob.returncode:  # some were never pushed: "unable to read"
            print(f"{Path(name).name}: not readable in this clone ({blob.stderr.decode().strip()[:80]})")
            continue
        path = work / Path(name).name
        path.write_bytes(blob.stdout)
        paths.append(path)
    return sorted(p for p in paths if NAME.search(p.name))


def _recorded_lines(path: Path) -> set[tuple[str, int]]:
    """Every (file name, line) the recording names as the innermost user frame of an allocation."""
    import pickle  # our own copies of published plain-data snapshots; explain itself reads them restricted

    with path.open("rb") as handle:
        data = pickle.load(handle)
    return {
        line
        for trace in data["device_traces"]
        for entry in trace
        if (line := _user_line(entry.get("frames"))) is not None
    }


def _user_line(frames) -> tuple[str, int] | None:
    for frame in frames or ():
        filename = frame.get("filename", "")
        if filename.endswith(".py") and "/site-packages/" not in filename:
            return filename.rsplit("/", 1)[-1], frame.get("line")
    return None


def _estimate_windows(export: Path) -> dict[str, tuple[int, dict[tuple[str, int], int]]]:
    """The estimate's own snapshot (`--snapshot`, each entry with its phase) replayed over the
    windows a real recording of one step covers: the first forward (up to the loss) and the first
    full step (up to the second step's first allocation); and the whole run (two steps). Each:
    the peak and the bytes live there by line."""
    import pickle  # the file our estimate just wrote

    with export.open("rb") as handle:
        (trace,) = pickle.load(handle)["device_traces"]
    windows: dict[str, tuple[int, dict]] = {}
    live: dict[int, tuple[int, tuple[str, int] | None]] = {}
    total = peak = 0
    at_peak: dict = {}
    seen_forward = seen_optimizer = False
    open_windows = ["forward 1", "step 1"]

    def close(name: str) -> None:
        lines: dict[tuple[str, int], int] = {}
        for size, line in at_peak.values():
            if line is not None:
                lines[line] = lines.get(line, 0) + size
        windows[name] = (peak, lines)

    for entry in trace:
        action, phase = entry["action"], entry.get("phase")
        if action == "alloc":
            if "forward 1" in open_windows and seen_forward and phase != "forward":
                close("forward 1")
                open_windows.remove("forward 1")
            if "step 1" in open_windows and seen_optimizer and phase != "optimizer step":
                close("step 1")
                open_windows.remove("step 1")
            seen_forward |= phase == "forward"
            seen_optimizer |= phase == "optimizer step"
            total += entry["size"]
            live[entry["addr"]] = (entry["size"], _user_line(entry["frames"]))
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action == "free_completed":
            total -= entry["size"]
            live.pop(entry["addr"], None)
    for name in open_windows:
        close(name)
    close("whole run")
    return windows


def _pct(ours: int, theirs: int) -> str:
    return f"{(ours - theirs) / theirs * 100:+.2f} %" if theirs else "n/a"


def _lines(entries, key_file="file") -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for entry in entries:
        if isinstance(entry, dict):
            where, size = (Path(entry[key_file]).name, entry["line"]), entry["bytes"]
        else:  # the estimate's ["path:line", bytes]
            path, _, line = entry[0].rpartition(":")
            where, size = (Path(path).name, int(line)), entry[1]
        out[where] = out.get(where, 0) + size
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--git-dir", help="a clone of kkaitlyn111/cs336-a2-systems (its .git)")
    source.add_argument("--snapshots", help="a folder holding memory_ctx*.pickle")
    parser.add_argument("--gpu", default="H100", help="the estimate's --gpu (default H100)")
    parser.add_argument("--only", default="", help="comma-separated file names to check")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        snapshots = _snapshots(args, work)
        if args.only:
            snapshots = [p for p in snapshots if p.name in args.only.split(",")]
        estimates: dict[tuple[int, bool], dict] = {}
        for path in snapshots:
            match = NAME.search(path.name)
            ctx, full, mixed = int(match["ctx"]), match["kind"] == "fullstep", "mixed" in match["suffix"]
            config = f"2.7B, batch 4 x {ctx}, {'bf16 autocast' if mixed else 'fp32'}, {'full step' if full else 'forward'}"
            explain = _json(["explain", str(path), "--format", "json"], ROOT)
            peak = explain["peak_allocated_bytes"]
            print(f"\n{path.name}: {config}")
            print(
                f"  explain: peak {peak:,} B; held by: "
                + "; ".join(f"{h['holder']} {h['bytes']:,}" for h in explain["held_by"])
            )
            ours = _lines(explain["top_lines"])
            key = (ctx, mixed)
            if key not in estimates:
                export = work / f"estimate_{ctx}_{int(mixed)}.pickle"
                script_args = ["--context-length", str(ctx)] + (["--mixed-precision"] if mixed else [])
                data = _json(
                    [
                        "estimate",
                        "benchmark_memory.py",
                        "--gpu",
                        args.gpu,
                        "--format",
                        "json",
                        "--snapshot",
                        str(export),
                        "--",
                        *script_args,
                    ],
                    FIXTURE,
                )
                estimates[key] = (data, _estimate_windows(export))
            estimate, windows = estimates[key]
            window = "step 1" if full else "forward 1"
            est_peak, theirs = windows[window]
            assert windows["whole run"][0] == estimate["peak_bytes"], (
                windows["whole run"][0],
                estimate["peak_bytes"],
            )
            recorded = _recorded_lines(path)
            print(
                f"  estimate (two full steps): peak {estimate['peak_bytes']:,} B ({_pct(estimate['peak_bytes'], peak)}), "
                f"at {estimate['peak_at'].get('op')} in the {estimate['peak_at'].get('phase')}; breakdown: "
                + "; ".join(f"{k} {v:,}" for k, v in estimate["breakdown"].items() if v)
            )
            print(
                f"  estimate over what the recording covers ({window}): peak {est_peak:,} B ({_pct(est_peak, peak)})"
            )
            print(f"    {'line':<22} {'explain (B)':>15} {'estimate (B)':>15}  gap")
            shown = sorted(set(ours) | set(theirs), key=lambda w: -max(ours.get(w, 0), theirs.get(w, 0)))
            for where in shown[:12]:
                a, b = ours.get(where, 0), theirs.get(where, 0)
                note = (
                    "" if where in recorded else "  (not recorded: no allocation of the recording names it)"
                )
                print(
                    f"    {where[0] + ':' + str(where[1]):<22} {a:>15,} {b:>15,}  {_pct(b, a) if a else ''}{note}"
                )
            top_ours = {w for w, s in ours.items() if s >= SHARE * peak}
            top_theirs = {w for w, s in theirs.items() if s >= SHARE * est_peak and w in recorded}
            gaps = [abs(theirs.get(w, 0) - ours[w]) / ours[w] * 100 for w in top_ours]
            same = top_ours == top_theirs
            print(
                f"  top lines (>= 1 % of the peak, recordable): explain {len(top_ours)}, estimate {len(top_theirs)}: "
                f"{'same' if same else 'DIFFERENT ' + str(sorted(top_ours ^ top_theirs))}; "
                f"worst gap {max(gaps, default=0):.2f} %"
            )
            rows.append(
                (
                    path.name,
                    config,
                    peak,
                    est_peak,
                    estimate["peak_bytes"],
                    same,
                    len(top_ours),
                    max(gaps, default=0),
                )
            )
    print(
        "\n| snapshot | config | explain peak (B) | estimate, same window (B) | gap | same top lines (n) "
        "| worst line gap | estimate, two steps (B) |"
    )
    print("|---|---|--:|--:|--:|---|--:|--:|")
    for name, config, peak, est, whole, same, count, gap in rows:
        print(
            f"| {name} | {config} | {peak:,} | {est:,} | {_pct(est, peak)} | {'yes' if same else 'no'} ({count}) "
            f"| {gap:.2f} % | {whole:,} ({_pct(whole, peak)}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
