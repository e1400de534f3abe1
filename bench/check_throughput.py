"""Throughput benchmark: `oom-lsp --check` against TorchFix and Ruff on real training code.

A benchmark, not a test: it prints figures and never asserts on them.

It downloads a pinned `transformers` wheel (`pip download --no-deps`), unpacks
its training code (generation/, loss/, distributed/, trainer*.py,
training_args.py, optimization.py, modeling_utils.py, cache_utils.py; about
60 files and 50k lines) into bench/.work/, installs TorchFix and Ruff into
their own virtual environments there, and times, over the same files and with
every core:

- `oom-lsp --check --no-cache`              (cold)
- `oom-lsp --check` with an empty cache      (prime: a cold run that also writes the cache)
- `oom-lsp --check` again                    (warm: answered from the cache)
- `torchfix --select ALL`
- `ruff check --select ALL --no-cache`

For each run: wall time, CPU time (user + sys of the process and every
descendant it reaped, from `os.wait4`), peak RSS summed over the process tree
(sampled from /proc every 0.1 s, so a spike shorter than that can be missed)
and the largest single process's peak RSS (`ru_maxrss`, exact), the number of
findings and the exit code. With several rounds the tools run interleaved and
the median is reported. Usage:

    .venv/bin/python bench/check_throughput.py [--rounds N] [--skip-torchfix] [--skip-ruff] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

TRANSFORMERS_VERSION = "5.24.0"
TORCHFIX_VERSION = "0.7.0"
RUFF_VERSION = "0.17.6"

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK = REPO_ROOT / "bench" / ".work"
CORPUS = WORK / f"corpus-transformers-{TRANSFORMERS_VERSION}"
LOGS = WORK / "logs"

# The training half of transformers: what a PyTorch training script resembles most.
TRAINING_FOLDERS = ("generation/", "loss/", "distributed/")
TRAINING_FILES = ("training_args.py", "optimization.py", "modeling_utils.py", "cache_utils.py")

SAMPLE_INTERVAL_S = 0.1
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

TORCHFIX_FINDING_RE = re.compile(r"^\S.*:\d+:\d+: TOR\d+ ", re.MULTILINE)
RUFF_FINDING_RE = re.compile(r"^\S.*:\d+:\d+: [A-Z]+[0-9]+ ", re.MULTILINE)


@dataclass
class Measurement:
    tool: str
    round: int
    wall_s: float
    cpu_s: float
    tree_peak_rss_mb: float  # sampled sum over the process tree
    largest_process_rss_mb: float  # exact, from ru_maxrss
    max_processes: int
    exit_code: int
    findings: int | None
    log: str


@dataclass
class Corpus:
    files: list[Path]
    lines: int
    bytes: int


@dataclass
class Summary:
    tool: str
    runs: list[Measurement] = field(default_factory=list)

    def median(self, attribute: str) -> float:
        return statistics.median(getattr(run, attribute) for run in self.runs)


# ---------------------------------------------------------------- setup


def run_setup_command(command: list[str]) -> None:
    print("  $", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def prepare_corpus() -> Corpus:
    if not (CORPUS / "pyproject.toml").exists():
        wheel_dir = WORK / "wheels"
        wheel = wheel_dir / f"transformers-{TRANSFORMERS_VERSION}-py3-none-any.whl"
        if not wheel.exists():
            run_setup_command(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--quiet",
                    f"transformers=={TRANSFORMERS_VERSION}",
                    "-d",
                    str(wheel_dir),
                ]
            )
        if CORPUS.exists():
            shutil.rmtree(CORPUS)
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if is_training_file(member):
                    archive.extract(member, CORPUS)
        # Its own project root and git work tree: no configuration, cache or
        # .gitignore of the enclosing repository (which ignores bench/.work/) applies.
        (CORPUS / "pyproject.toml").write_text(
            f'[project]\nname = "transformers-training-subset"\nversion = "{TRANSFORMERS_VERSION}"\n'
        )
        run_setup_command(["git", "init", "--quiet", str(CORPUS)])
    files = sorted(CORPUS.rglob("*.py"))
    texts = [path.read_bytes() for path in files]
    return Corpus(files=files, lines=sum(text.count(b"\n") for text in texts), bytes=sum(map(len, texts)))


def is_training_file(member: str) -> bool:
    if not member.startswith("transformers/") or not member.endswith(".py"):
        return False
    relative = member[len("transformers/") :]
    if relative.startswith(TRAINING_FOLDERS):
        return True
    return "/" not in relative and (relative.startswith("trainer") or relative in TRAINING_FILES)


def tool_venv(name: str, requirement: str, executable: str) -> Path:
    venv = WORK / f"venv-{name}"
    binary = venv / "bin" / executable
    marker = venv / "requirement.txt"
    if not binary.exists() or not marker.exists() or marker.read_text() != requirement:
        run_setup_command([sys.executable, "-m", "venv", "--clear", str(venv)])
        run_setup_command([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement])
        marker.write_text(requirement)
    return binary


def oom_lsp_command() -> list[str]:
    """The console script of the interpreter running this benchmark, installed from this checkout."""
    script = Path(sys.executable).parent / "oom-lsp"
    if not script.exists():
        sys.exit(f"{script} not found: install the package first (pip install -e .)")
    return [str(script)]


# ---------------------------------------------------------------- measuring


def process_tree(root: int) -> list[int]:
    """`root` and its live descendants, from /proc/<pid>/task/<tid>/children."""
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited between two reads
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
            except OSError:
                continue
    return tree


def resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0  # exited, or a zombie with no memory left


def measure(tool: str, round_number: int, command: list[str], cwd: Path, count_findings) -> Measurement:
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{tool.replace(' ', '-')}-round{round_number}.out"
    errors = log.with_suffix(".err")
    with open(log, "wb") as out, open(errors, "wb") as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err)
        tree_peak, max_processes = 0, 1
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            pids = process_tree(process.pid)
            max_processes = max(max_processes, len(pids))
            tree_peak = max(tree_peak, sum(resident_bytes(p) for p in pids))
            time.sleep(SAMPLE_INTERVAL_S)
        wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    output = log.read_text(errors="replace")
    return Measurement(
        tool=tool,
        round=round_number,
        wall_s=wall,
        cpu_s=usage.ru_utime + usage.ru_stime,
        tree_peak_rss_mb=tree_peak / 2**20,
        largest_process_rss_mb=usage.ru_maxrss / 1024,
        max_processes=max_processes,
        exit_code=process.returncode,
        findings=count_findings(output, errors.read_text(errors="replace")),
        log=str(log.relative_to(REPO_ROOT)),
    )


def oom_lsp_findings(stdout: str, stderr: str) -> int | None:
    parsed = parse_oom_lsp_json(stdout)
    return None if parsed is None else len(parsed)


def parse_oom_lsp_json(stdout: str) -> list[dict] | None:
    try:
        parsed = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, list) else None


# ---------------------------------------------------------------- the runs


def plan(args: argparse.Namespace) -> list[tuple[str, list[str], object, object]]:
    """(tool, command, count_findings, before) for each run of one round, in order."""
    oom = oom_lsp_command()
    cache = CORPUS / ".oom_lsp_cache"

    def fresh_cache() -> None:
        shutil.rmtree(cache, ignore_errors=True)

    runs = [
        ("oom-lsp cold", [*oom, "--check", ".", "--no-cache", "--format", "json"], oom_lsp_findings, None),
        ("oom-lsp prime", [*oom, "--check", ".", "--format", "json"], oom_lsp_findings, fresh_cache),
        ("oom-lsp warm", [*oom, "--check", ".", "--format", "json"], oom_lsp_findings, None),
    ]
    if not args.skip_torchfix:
        torchfix = tool_venv("torchfix", f"torchfix=={TORCHFIX_VERSION}", "torchfix")
        runs.append(
            (
                "torchfix",
                [str(torchfix), "--select", "ALL", "."],
                lambda stdout, stderr: len(TORCHFIX_FINDING_RE.findall(stdout + stderr)),
                None,
            )
        )
    if not args.skip_ruff:
        ruff = tool_venv("ruff", f"ruff=={RUFF_VERSION}", "ruff")
        runs.append(
            (
                "ruff",
                [str(ruff), "check", "--select", "ALL", "--no-cache", "--output-format", "concise", "."],
                lambda stdout, stderr: len(RUFF_FINDING_RE.findall(stdout)),
                None,
            )
        )
    return runs


def machine_description() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({model or platform.machine()}), {memory:.0f} GiB, "
        f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at start"
    )


def print_table(summaries: dict[str, Summary], corpus: Corpus) -> None:
    header = (
        f"{'tool':<14} {'files':>5} {'lines':>7} {'wall s':>8} {'CPU s':>8} {'files/s':>8} "
        f"{'lines/CPU-s':>11} {'peak RSS tree/largest MB':>25} {'procs':>5} {'findings':>8} {'exit':>4}"
    )
    print(header)
    print("-" * len(header))
    for name, summary in summaries.items():
        wall, cpu = summary.median("wall_s"), summary.median("cpu_s")
        last = summary.runs[-1]
        findings = "?" if last.findings is None else str(last.findings)
        exits = ",".join(sorted({str(run.exit_code) for run in summary.runs}))
        print(
            f"{name:<14} {len(corpus.files):>5} {corpus.lines:>7} {wall:>8.2f} {cpu:>8.2f} "
            f"{len(corpus.files) / wall:>8.1f} {corpus.lines / max(cpu, 1e-9):>11,.0f} "
            f"{summary.median('tree_peak_rss_mb'):>14.0f} / {summary.median('largest_process_rss_mb'):<8.0f} "
            f"{max(run.max_processes for run in summary.runs):>5} {findings:>8} {exits:>4}"
        )
    if any(len(summary.runs) > 1 for summary in summaries.values()):
        print("\nper round (wall s / CPU s):")
        for name, summary in summaries.items():
            print(f"  {name:<14} " + "  ".join(f"{run.wall_s:.2f}/{run.cpu_s:.2f}" for run in summary.runs))


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.1f}x" if denominator > 0 else "n/a"


def print_ratios(summaries: dict[str, Summary]) -> None:
    cold, warm = summaries["oom-lsp cold"], summaries["oom-lsp warm"]
    print("\nratios (medians; CPU time is the fairer figure on a shared machine):")
    if "torchfix" in summaries:
        torchfix = summaries["torchfix"]
        print(
            f"  cold oom-lsp throughput vs TorchFix: {ratio(torchfix.median('cpu_s'), cold.median('cpu_s'))} by CPU, "
            f"{ratio(torchfix.median('wall_s'), cold.median('wall_s'))} by wall (goal >= 5x, stretch 10x)"
        )
        print(
            f"  peak memory, cold oom-lsp / TorchFix: tree "
            f"{cold.median('tree_peak_rss_mb'):.0f} / {torchfix.median('tree_peak_rss_mb'):.0f} MB, largest process "
            f"{cold.median('largest_process_rss_mb'):.0f} / {torchfix.median('largest_process_rss_mb'):.0f} MB "
            f"(goal: no higher)"
        )
    print(
        f"  warm vs cold oom-lsp: {ratio(cold.median('cpu_s'), warm.median('cpu_s'))} by CPU, "
        f"{ratio(cold.median('wall_s'), warm.median('wall_s'))} by wall (goal >= 20x)"
    )
    if "ruff" in summaries:
        ruff = summaries["ruff"]
        print(f"  cold oom-lsp CPU / Ruff CPU: {ratio(cold.median('cpu_s'), ruff.median('cpu_s'))}")


def print_oom_lsp_findings(corpus: Corpus, log: Path) -> list[dict]:
    findings = parse_oom_lsp_json(log.read_text(errors="replace")) or []
    per_kline = 1000 * len(findings) / corpus.lines
    print(f"\noom-lsp findings on this tree: {len(findings)} ({per_kline:.2f} per 1,000 lines); judge each:")
    for finding in findings:
        path = finding.get("path", "?")
        print(f"  {path}:{finding.get('line')} {finding.get('code')} {finding.get('message')}")
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; medians are reported")
    parser.add_argument("--skip-torchfix", action="store_true", help="TorchFix takes minutes of CPU")
    parser.add_argument("--skip-ruff", action="store_true")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every measurement to OUT")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    print("setting up in", WORK.relative_to(REPO_ROOT), flush=True)
    corpus = prepare_corpus()
    runs = plan(args)
    print(f"\nmachine: {machine_description()}")
    print(
        f"corpus: transformers {TRANSFORMERS_VERSION} training subset, {len(corpus.files)} files, "
        f"{corpus.lines:,} lines, {corpus.bytes / 1e6:.2f} MB ({CORPUS.relative_to(REPO_ROOT)})\n",
        flush=True,
    )

    summaries = {tool: Summary(tool) for tool, *_ in runs}
    for round_number in range(1, args.rounds + 1):
        for tool, command, count_findings, before in runs:
            if before is not None:
                before()
            print(f"round {round_number}: {tool} ...", end=" ", flush=True)
            result = measure(tool, round_number, command, CORPUS, count_findings)
            summaries[tool].runs.append(result)
            unparsed = "" if result.findings is not None else f" -- output not understood, see {result.log}"
            print(
                f"{result.wall_s:.2f} s wall, {result.cpu_s:.2f} s CPU, exit {result.exit_code}{unparsed}",
                flush=True,
            )

    print()
    print_table(summaries, corpus)
    print_ratios(summaries)
    findings = print_oom_lsp_findings(corpus, REPO_ROOT / summaries["oom-lsp cold"].runs[-1].log)

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "machine": machine_description(),
                    "versions": {
                        "transformers": TRANSFORMERS_VERSION,
                        "torchfix": TORCHFIX_VERSION,
                        "ruff": RUFF_VERSION,
                    },
                    "corpus": {"files": len(corpus.files), "lines": corpus.lines, "bytes": corpus.bytes},
                    "runs": [asdict(run) for summary in summaries.values() for run in summary.runs],
                    "oom_lsp_findings": findings,
                },
                indent=2,
            )
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
