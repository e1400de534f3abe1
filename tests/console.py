"""Driving the installed `oom-lsp` console script as a person does: a
subprocess in a process group of its own (a shell job, so that a signal to
the group is what Ctrl-C in a terminal sends), and the processes of the
user's script, found by their ids, checked gone afterwards."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

OOM_LSP = str(Path(sys.executable).parent / "oom-lsp")

# A training script that records its own pid and its child's, then hangs:
# only a kill of its whole process group ends both.
HANGS_WITH_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open({pids!r}, "w") as record:
    record.write(f"{{os.getpid()}} {{child.pid}}\\n")
time.sleep(600)
"""


def write_hanging_script(folder: Path, name: str = "train.py") -> tuple[Path, Path]:
    """The script and the file where it will write its pids."""
    pids = folder / f"{name}.pids"
    script = folder / name
    script.write_text(HANGS_WITH_CHILD.format(pids=str(pids)))
    return script, pids


def start(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [OOM_LSP, *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def run(args: list[str], cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OOM_LSP, *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@contextlib.contextmanager
def started(
    args: list[str], cwd: Path, record: Path, **kwargs
) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """oom-lsp running `args`, once the script has recorded its pids. Whatever
    the test found, nothing is left running after it."""
    process = start(args, cwd, **kwargs)
    pids: list[int] = []
    try:
        pids = wait_for_pids(record, process)
        yield process, pids
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)


def wait_for_pids(record: Path, process: subprocess.Popen[str], timeout: float = 180) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if record.is_file() and record.read_text().endswith("\n"):
            return [int(pid) for pid in record.read_text().split()]
        if process.poll() is not None:
            raise AssertionError(f"oom-lsp ended first ({process.returncode}): {process.communicate()}")
        time.sleep(0.1)
    raise AssertionError("the script never recorded its pids")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie is only an exit status left to read


def members_of_session(session: int) -> list[int]:
    """Live processes whose process group or session is `session`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, group, sid = fields[0], int(fields[2]), int(fields[3])
        if state not in ("Z", "X") and session in (group, sid):
            found.append(int(entry))
    return found


def assert_all_gone(pids: list[int], groups: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in pids if alive(pid)] + [p for g in groups for p in members_of_session(g)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes left behind: {sorted(set(left))}")
        time.sleep(0.1)


def killed_groups(stderr: str) -> list[int]:
    """The process groups oom-lsp says it killed (its last words on stderr)."""
    match = re.search(r"killed process group ([\d, ]+)", stderr)
    return [int(group) for group in match.group(1).split(", ")] if match else []


def run_on_a_terminal(args: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str, str]:
    """oom-lsp with its stderr on a pseudo-terminal (stdout a pipe): exit code, stdout,
    and everything written to the terminal."""
    import pty
    import select

    master, slave = pty.openpty()
    process = subprocess.Popen(
        [OOM_LSP, *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, text=True
    )
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other side closed: the process ended
                    break
                if not chunk:
                    break
                screen += chunk
            elif process.poll() is not None:
                break
        out, _ = process.communicate(timeout=max(1, deadline - time.monotonic()))
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, out, screen.decode("utf-8", errors="replace")
