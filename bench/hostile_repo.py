"""The hostile repository of issue 28, measured: how many times each command a user runs in a
fresh clone executes the repository's code, and how many files outside it it writes.

A benchmark, not a test: it prints figures and asserts nothing (tests/test_hostile_project.py
asserts the same zeros). The repository (tests/hostile_repo.py) plants a pyproject.toml whose
memory budget gate names a script that writes a marker holding AWS_SECRET_ACCESS_KEY; a
`platform.py`, `json.py`, `torch.py`, `sitecustomize.py` and `usercustomize.py` that write
markers when imported; a snapshot pickle that runs `touch` when loaded; symbolic links to the
user's files at every place oom-lsp writes (`.oom_lsp/...`, the cache, the fix log's
temporary name) and a symlinked training script outside it; a file of 1,500 nested brackets.

For each command (the installed console script, run in the clone with the user's
environment and no user configuration: nothing trusted) and for the language server over
stdio (every planted .py opened, its diagnostics, lenses and code actions asked for, then
the OOM explanation written under `.oom_lsp/explain`), it prints: the exit code, the code
executions (markers written), the writes outside the repository (entries of the user's
folders created, changed or removed), whether the user's key appears in the output, and the
wall time. Goal: 0 executions and 0 outside writes everywhere, the server alive after every
file.

    .venv/bin/python bench/hostile_repo.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hostile_repo import CLI_COMMANDS, SECRET, HostileRepo, open_in_server, plant  # noqa: E402


def _outside_writes(before: dict, after: dict) -> int:
    return sum(1 for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def _row(name: str, code: object, executions: int, writes: int, leaked: bool, seconds: float) -> str:
    return f"{name:<26} {code!s:>6} {executions:>11} {writes:>15} {'yes' if leaked else 'no':>11} {seconds:>8.1f}"


def main() -> int:
    header = f"{'command':<26} {'exit':>6} {'executions':>11} {'outside writes':>15} {'key leaked':>11} {'time s':>8}"
    print(header)
    print("-" * len(header))
    totals = [0, 0]
    with tempfile.TemporaryDirectory(prefix="oom-lsp-hostile-") as folder:
        repo: HostileRepo = plant(Path(folder))
        for name, argv in CLI_COMMANDS.items():
            before, markers = repo.outside(), len(repo.markers_written())
            started = time.perf_counter()
            done = repo.run(*argv)
            elapsed = time.perf_counter() - started
            executions = len(repo.markers_written()) - markers
            writes = _outside_writes(before, repo.outside()) - executions  # markers are counted once
            totals[0] += executions
            totals[1] += writes
            leaked = SECRET in done.stdout + done.stderr
            print(_row(f"oom-lsp {name}", done.returncode, executions, writes, leaked, elapsed))
        before, markers = repo.outside(), len(repo.markers_written())
        started = time.perf_counter()
        answered = open_in_server(repo)
        elapsed = time.perf_counter() - started
        executions = len(repo.markers_written()) - markers
        writes = _outside_writes(before, repo.outside()) - executions
        totals[0] += executions
        totals[1] += writes
        print(_row("server (open all)", answered.get("exit_code"), executions, writes, False, elapsed))
        files = answered["files"]
        print(
            f"\nserver: {len(files)} files opened, alive and answering after each: "
            f"{'yes' if answered['alive_after_each'] else 'NO'}; deep.py: {files['deep.py']['codes']}"
        )
    print(f"total: {totals[0]} executions of the repository's code, {totals[1]} writes outside it (goal: 0, 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
