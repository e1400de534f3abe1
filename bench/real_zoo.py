"""`oom-lsp estimate --device cpu` on real public training scripts, against two real CPU steps.

The cases are listed in fixtures/estimate/real/zoo.toml: scripts written for oom-lsp after public ones
(nanoGPT, pytorch/examples, timm, the Hugging Face course and docs, Lightning's docs, PEFT), on random
data and small configs (what each follows: its header). For each case, in a fresh copy of
its folder (bench/.work/zoo/<case>/, or --work):

1. its `prepare` steps (random data files, small local checkpoints);
2. the truth: the script run for real by bench/real_steps.py (no oom-lsp code in that process:
   the script sees this CPU-only machine as it is) until its second optimizer step ends, under
   the profiler: the peak of live CPU tensor bytes (allocation events summed in time order);
3. the same real run again without the profiler, timed: "two real steps" (script start to the
   end of the second step, the script's imports included) and its whole process, end to end;
4. `oom-lsp estimate SCRIPT --device cpu --format json -- ARGS`, as a user runs it: the peak,
   the trace's time (script start to the second step, the same span) and the whole command.

Both sides use one thread and a seeded global RNG (the estimate's harness sets its own
thread count; an unseeded shuffle would otherwise draw other batches in every real run).

    .venv/bin/python bench/real_zoo.py [--cases nanogpt,mnist] [--python PATH] [--json out.json]
        [--harness-real]   # also the estimate harness's own real mode (diagnoses the harness)
    .venv/bin/python bench/real_zoo.py --table out.json   # print the table of a saved run again

Goal (issue 16): every case within 2 % of the real peak, and the estimate faster than the two
real steps wherever they take more than a second. Cases whose modules are missing from the
interpreter are skipped and listed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "fixtures" / "estimate" / "real"
REAL_STEPS = ROOT / "bench" / "real_steps.py"
MIB = 2**20
GOAL = 0.02


@dataclass
class Case:
    name: str
    folder: str
    script: str
    args: list[str]
    prepare: list[list[str]] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    note: str = ""


class CaseError(RuntimeError):
    """A step of a case failed; the message says which and why."""


def load_cases(manifest: Path = ZOO / "zoo.toml") -> dict[str, Case]:
    with manifest.open("rb") as handle:
        return {entry["name"]: Case(**entry) for entry in tomllib.load(handle)["case"]}


def missing_modules(case: Case, python: str) -> list[str]:
    """The modules of `needs` that `python` cannot import."""
    if not case.needs:
        return []
    probe = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    done = subprocess.run([python, "-c", probe, *case.needs], capture_output=True, text=True, check=True)
    return done.stdout.split()


def prepare(case: Case, work: Path, python: str) -> Path:
    """A fresh copy of the case's folder in `work`, its prepare steps run there; the folder."""
    folder = work / case.name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(ZOO / case.folder, folder)
    for step in case.prepare:
        command = [python, *(part.replace("{zoo}", str(ZOO)) for part in step)]
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CaseError(f"prepare step {' '.join(step)} failed: {_tail(done.stderr)}")
    return folder


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _timed(command: list[str], cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `command`; its result, wall seconds and CPU seconds (user + system, children included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, wall, cpu


def real_run(case: Case, folder: Path, python: str, profile: bool, timeout: float) -> dict:
    """The script run for real until its second optimizer step (bench/real_steps.py)."""
    with tempfile.TemporaryDirectory(prefix="oom-lsp-zoo-") as tmp:
        out = Path(tmp) / "real.json"
        command = [python, str(REAL_STEPS), "--out", str(out)]
        command += ["--profile"] if profile else []
        done, wall, cpu = _timed([*command, "--", case.script, *case.args], folder, timeout)
        if not out.exists():
            raise CaseError(f"real run exited with {done.returncode} before reporting: {_tail(done.stderr)}")
        result = json.loads(out.read_text(encoding="utf-8"))
    if result["status"] != "stopped":
        raise CaseError(
            f"real run {result['status']} after {result['steps']} step(s): {_tail(result['error'] or '')}"
        )
    return {**result, "wall_s": wall, "cpu_s": cpu}


def estimate(case: Case, folder: Path, python: str, timeout: float) -> dict:
    """`oom-lsp estimate --device cpu --format json`, the way a user runs it."""
    command = [
        sys.executable,
        "-m",
        "oom_lsp",
        "estimate",
        case.script,
        "--device",
        "cpu",
        "--format",
        "json",
    ]
    command += ["--python", python, "--timeout", str(int(timeout)), "--", *case.args]
    done, wall, cpu = _timed(command, folder, timeout + 60)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise CaseError(f"estimate exited with {done.returncode}: {_tail(done.stderr)}") from None
    if "error" in result:
        raise CaseError(f"estimate failed: {result['error']}")
    return {**result, "wall_s": wall, "cpu_s": cpu}


def harness_real(case: Case, folder: Path, python: str, timeout: float) -> int:
    """The peak of the estimate harness's own real mode (its shims and trackers on real tensors)."""
    sys.path.insert(0, str(ROOT))
    from oom_lsp.estimate.estimator import EstimateOptions, run_harness

    options = EstimateOptions(
        script=folder / case.script,
        script_args=case.args,
        device="cpu",
        python=python,
        timeout=timeout,
        cwd=folder,
    )
    (result,) = run_harness(options, [{"mode": "real", "profile_replay": True}])
    if result["status"] == "failed":
        raise CaseError(f"harness real mode failed: {result['failure']['message']}")
    return result["profile_replay_peak"]


def run_case(case: Case, work: Path, python: str, timeout: float, with_harness_real: bool = False) -> dict:
    folder = prepare(case, work, python)
    truth = real_run(case, folder, python, profile=True, timeout=timeout)
    bare = real_run(case, folder, python, profile=False, timeout=timeout)
    row = {
        "case": case.name,
        "note": case.note,
        "real_bytes": truth["peak_bytes"],
        "real_s": bare["seconds"],
        "real_wall_s": bare["wall_s"],
        "real_cpu_s": bare["cpu_s"],
    }
    try:
        predicted = estimate(case, folder, python, timeout)
    except CaseError as error:
        return {**row, "estimate_failure": str(error)}
    row.update(
        batch=predicted.get("batch_size"),
        estimate_bytes=predicted["peak_bytes"],
        error=(predicted["peak_bytes"] - truth["peak_bytes"]) / truth["peak_bytes"],
        estimate_s=predicted["seconds"],
        estimate_wall_s=predicted["wall_s"],
        estimate_cpu_s=predicted["cpu_s"],
        peak_at=predicted.get("peak_at"),
        corrections=[note["name"] for note in predicted.get("corrections", [])],
        # the peaks of the other seeds the estimate traced when the data's draw decides the peak
        spread_bytes=(predicted.get("data_spread") or {}).get("peak_bytes"),
        # the batch the peak happened with, and the peak with the longest batch the data can produce
        peak_batch=predicted.get("peak_batch"),
        worst_bytes=(predicted.get("worst_case") or {}).get("peak_bytes"),
        worst_shapes=[batch["shapes"] for batch in (predicted.get("worst_case") or {}).get("batches", [])],
    )
    if with_harness_real:
        row["harness_real_bytes"] = harness_real(case, folder, python, timeout)
    return row


def _spread(peaks: list[int] | None) -> str:
    """The traced seeds' peaks as `lowest–highest`, or nothing when the draw did not matter."""
    if not peaks:
        return ""
    return f"{min(peaks) / MIB:.2f}–{max(peaks) / MIB:.2f}"


def _batch_text(row: dict) -> str:
    """The batch the estimate's peak happened with, and its worst case when it traced one."""
    batch = row["peak_batch"]
    # the batch's widest tensor (input_ids rather than labels)
    shapes = "x".join(map(str, max(batch["shapes"].values(), key=len, default=[])))
    text = f"peak at step {batch['step']}, micro-batch {batch['micro_batch']} ({shapes})"
    if row.get("worst_bytes") is not None:
        longest = ", ".join(
            "x".join(map(str, max(shapes.values(), key=len))) for shapes in row["worst_shapes"] if shapes
        )
        text += f"; worst case {row['worst_bytes'] / MIB:.2f} MiB with the longest batches ({longest})"
    return text


def print_table(rows: list[dict], failures: dict[str, str], skipped: dict[str, list[str]]) -> None:
    with_harness = any("harness_real_bytes" in row for row in rows)
    print(
        "| case | bs | real CPU peak MiB | estimate MiB | error | seeds' spread MiB | estimate s "
        "| two real steps s | end to end: estimate s | real s | end to end CPU s: estimate | real |"
        + (" harness real mode MiB |" if with_harness else "")
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_harness else ""))
    for row in rows:
        if "estimate_failure" in row:
            print(
                f"| {row['case']} | | {row['real_bytes'] / MIB:.2f} | no estimate | | | | {row['real_s']:.2f} "
                f"| | {row['real_wall_s']:.2f} | | {row['real_cpu_s']:.2f} |" + (" |" if with_harness else "")
            )
            continue
        spread = row.get("spread_bytes")
        line = (
            f"| {row['case']} | {'' if row['batch'] is None else row['batch']} | {row['real_bytes'] / MIB:.2f} "
            f"| {row['estimate_bytes'] / MIB:.2f} "
            f"| {100 * row['error']:+.2f} % | {_spread(spread)} | {row['estimate_s']:.2f} | {row['real_s']:.2f} "
            f"| {row['estimate_wall_s']:.2f} | {row['real_wall_s']:.2f} "
            f"| {row['estimate_cpu_s']:.2f} | {row['real_cpu_s']:.2f} |"
        )
        if with_harness:
            line += f" {row['harness_real_bytes'] / MIB:.2f} |" if "harness_real_bytes" in row else " |"
        print(line)
    for name, message in failures.items():
        print(f"| {name} | | not measured | | | | | | | | | |" + (" |" if with_harness else ""))
    estimated = [row for row in rows if "estimate_failure" not in row]
    within = [row for row in estimated if abs(row["error"]) <= GOAL]
    print(f"\nwithin {100 * GOAL:.0f} % of the real peak: {len(within)} of {len(rows) + len(failures)} cases")
    slow = [row["case"] for row in estimated if row["real_s"] > 1 and row["estimate_s"] >= row["real_s"]]
    print(
        "estimate slower than two real steps taking more than 1 s: " + (", ".join(slow) if slow else "none")
    )
    for row in rows:
        if "estimate_failure" in row:
            print(f"{row['case']}: {row['estimate_failure'].splitlines()[0]}")
        elif row.get("peak_batch"):
            print(f"{row['case']}: {_batch_text(row)}")
    for name, message in failures.items():
        print(f"{name}: {message}")
    for name, modules in skipped.items():
        print(f"{name}: skipped, this interpreter lacks {', '.join(modules)}")


def main() -> int:
    cases = load_cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(cases), help="comma-separated case names")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the scripts run in")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / ".work" / "zoo")
    parser.add_argument("--harness-real", action="store_true", help="also the estimate harness's real mode")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--table", type=Path, help="print the table of a run saved with --json, and stop")
    options = parser.parse_args()
    if options.table:
        saved = json.loads(options.table.read_text(encoding="utf-8"))
        print_table(saved["rows"], saved["failures"], saved["skipped"])
        return 0
    options.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rows: list[dict] = []
    failures: dict[str, str] = {}
    skipped: dict[str, list[str]] = {}
    for name in options.cases.split(","):
        case = cases[name]
        missing = missing_modules(case, options.python)
        if missing:
            skipped[name] = missing
            continue
        started = time.perf_counter()
        try:
            rows.append(run_case(case, options.work, options.python, options.timeout, options.harness_real))
        except (CaseError, subprocess.TimeoutExpired) as error:
            failures[name] = str(error).splitlines()[0]
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print_table(rows, failures, skipped)
    if options.json:
        options.json.write_text(
            json.dumps({"rows": rows, "failures": failures, "skipped": skipped}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
