"""The parent side of profiling: run the harness under the user's interpreter and collect its report.

No torch import here: this runs in the CLI and in the language server. The harness runs as
`<python> -m oom_lsp.profiling.harness` in its own process group (a new session), with a
timeout, its stdout and stderr captured, and progress read as JSON lines from a pipe. Timeout
and cancellation kill the whole group, so a script that hangs or forks workers leaves nothing
behind (a process that starts its own session on purpose is out of reach, as with any tool).
The parent never waits on the child without a deadline, whatever the script does.

Every process group started here is kept in a registry until it is gone, so that the CLI's
handler of SIGINT/SIGTERM/SIGHUP (oom_lsp.cli) kills them all whatever its main thread was
doing: `kill_live_groups()`. A signal that arrives while a group is being started is held
until the group is in the registry (`spawning()`, `deliver_held_signal()`).

The child watches its parent and its own deadline (oom_lsp.profiling.watchdog), so a parent that
is killed itself leaves nothing running either.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from oom_lsp import safe_files
from oom_lsp.profiling import watchdog
from oom_lsp.profiling.report import DeviceInfo, Report, ReportError, read_report

NO_TORCH_EXIT = 3  # the harness's exit code when `import torch` fails
OUTPUT_TAIL_LINES = 200
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent.parent)
# Kineto (torch.profiler) writes `USDT:2026-12-01 22:15:35 2686:2686 SyncActivityProfilerHandler.cpp:52]
# profiler_start` to stderr whatever its log level.
_PROFILER_LOG_LINE = re.compile(r"[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")


# Process groups started and not yet known to be gone (the leader's pid is the group id).
_live_groups: set[int] = set()
# While a group is being started it is not in the registry yet: a signal handler that sees
# `_spawning` holds the signal in `_held_signals`, delivered again once the group is in.
_spawning = threading.local()
_held_signals: list[int] = []


def kill_live_groups() -> list[int]:
    """SIGKILL every process group this process started that may still run; their ids.
    Safe to call from a signal handler."""
    killed = []
    for group in list(_live_groups):
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            _live_groups.discard(group)  # gone already
            continue
        killed.append(group)
    return killed


def spawning() -> bool:
    """True while this thread is between starting a process group and registering it."""
    return getattr(_spawning, "active", False)


def hold_signal(signum: int) -> None:
    _held_signals.append(signum)


def deliver_held_signal() -> None:
    if _held_signals:
        signum = _held_signals.pop(0)
        _held_signals.clear()
        signal.raise_signal(signum)


def _reap(process: subprocess.Popen) -> None:
    """Wait for a killed child without Popen's lock: a signal handler that raises between
    Popen taking its waitpid lock and its `try` leaves the lock held, and `process.wait()`
    then blocks forever (Ctrl-C hung `oom-lsp estimate --what-if` so, once in a CI run)."""
    if process.returncode is not None:
        return
    try:
        _, status = os.waitpid(process.pid, 0)
    except ChildProcessError:  # reaped by a poll() the signal interrupted after its waitpid
        return
    process.returncode = os.waitstatus_to_exitcode(status)


class ProfileError(RuntimeError):
    """The run could not start, or the interpreter cannot profile (e.g. it has no torch)."""


@dataclass
class ProfileRequest:
    script: Path
    out: Path
    script_args: list[str] = field(default_factory=list)
    steps: int = 3
    device: str = "auto"  # "auto", "cpu" or "cuda"
    python: str = sys.executable
    timeout: float | None = 600.0
    cwd: Path | None = None  # where the script runs; default: the current directory
    # The project no symbolic link may lead `out` out of (oom_lsp.safe_files); default: the
    # folder of the `.oom_lsp` that `out` is in, else the current directory.
    root: Path | None = None


ProgressCallback = Callable[[dict[str, Any]], None]
OutputCallback = Callable[[str], None]


class ProfileRun:
    """One profiling subprocess: `start()`, then `wait()`; `cancel()` from any thread."""

    def __init__(
        self,
        request: ProfileRequest,
        on_progress: ProgressCallback | None = None,
        on_output: OutputCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.request = request
        self._on_progress = on_progress
        self._on_output = on_output
        self._process: subprocess.Popen[bytes] | None = None
        self._cancelled = cancel if cancel is not None else threading.Event()
        self._tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._events: list[dict[str, Any]] = []
        self._threads: list[threading.Thread] = []
        self._parent_fd: int | None = None  # the write end of the child's watchdog pipe
        self.created_folders: list[Path] = []  # by start(), outermost first

    def command(self, progress_fd: int) -> list[str]:
        request = self.request
        return [
            request.python, "-m", "oom_lsp.profiling.harness",
            "--out", str(request.out.resolve()),
            "--steps", str(request.steps),
            "--device", request.device,
            "--progress-fd", str(progress_fd),
            str(request.script.resolve()), "--", *request.script_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # The harness must be importable from the user's interpreter, which may not have oom-lsp.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if self.request.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the script's own "cuda if available" picks the CPU
        return env

    def start(self) -> None:
        request = self.request
        try:
            root = request.root or safe_files.results_root(request.out) or Path.cwd()
            self.created_folders = safe_files.make_folder(request.out, root)
        except OSError as error:
            raise ProfileError(f"cannot write the results to {request.out}: {error.strerror or error}") from None
        (request.out / "report.json").unlink(missing_ok=True)  # a stale report must not pass for this run's
        read_end, write_end = os.pipe()
        # Held open by this process only: its end of file tells the child its parent is gone.
        watch_read, self._parent_fd = os.pipe()
        env = {**self.environment(), **watchdog.child_environment(watch_read, request.timeout)}
        _spawning.active = True
        try:
            self._process = subprocess.Popen(
                self.command(write_end),
                cwd=request.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_end, watch_read),
                start_new_session=True,
            )
            _live_groups.add(self._process.pid)
        except OSError as exc:
            os.close(read_end)
            self._close_parent_fd()
            raise ProfileError(f"cannot run {request.python}: {exc.strerror or exc}") from exc
        finally:
            _spawning.active = False
            os.close(write_end)
            os.close(watch_read)
        deliver_held_signal()
        self._threads = [
            threading.Thread(target=self._read_progress, args=(read_end,), daemon=True),
            threading.Thread(target=self._read_output, args=(self._process.stdout,), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def wait(self) -> Report:
        """Wait for the end (or the timeout, or a cancel) and return the run's report."""
        if self._process is None:
            raise ProfileError("wait() before start()")
        process = self._process
        deadline = time.monotonic() + self.request.timeout if self.request.timeout is not None else None  # from wait()
        outcome = None
        try:
            while process.poll() is None:
                if self._cancelled.is_set():
                    outcome = "cancelled"
                elif deadline is not None and time.monotonic() >= deadline:
                    outcome = "timeout"
                if outcome:
                    break
                time.sleep(0.05)
        finally:
            # Also on the way out of an exception (the CLI's signal handler raises one here):
            # workers or grandchildren the script left in the group go too.
            self._kill_group()
            _reap(process)
            _live_groups.discard(process.pid)
            self._close_parent_fd()
        for thread in self._threads:
            thread.join(timeout=5)
        return self._report(outcome, process.returncode)

    def _close_parent_fd(self) -> None:
        if self._parent_fd is not None:
            os.close(self._parent_fd)
            self._parent_fd = None

    def _kill_group(self) -> None:
        assert self._process is not None
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # the session leader's pid is the group id
        except ProcessLookupError:
            pass  # the group is already empty

    def _read_progress(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as stream:
            for line in stream:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a script that writes to our descriptor by accident
                self._events.append(event)
                if self._on_progress:
                    self._on_progress(event)

    def _read_output(self, stream: Any) -> None:
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if _PROFILER_LOG_LINE.match(line):
                    continue  # the profiler's own start/stop log, not the script's output
                self._tail.append(line)
                if self._on_output:
                    self._on_output(line)

    def _report(self, outcome: str | None, returncode: int) -> Report:
        request = self.request
        tail = "\n".join(self._tail)
        path = request.out / "report.json"
        said_no_torch = any(e.get("event") == "error" and e.get("kind") == "no-torch" for e in self._events)
        if said_no_torch or (outcome is None and returncode == NO_TORCH_EXIT and not path.exists()):
            raise ProfileError(f"{request.python} has no torch: install torch in that environment or pass --python")
        report: Report | None = None
        if outcome is None and path.exists():
            try:
                report = read_report(path)
            except ReportError:
                report = None
        if report is None:
            status = outcome or "crashed"
            report = Report(
                script=str(request.script.resolve()),
                argv=list(request.script_args),
                status=status,
                device=DeviceInfo(request.device),
                steps_requested=request.steps,
            )
            if status == "timeout":
                report.notes.append(f"killed after {request.timeout:g} s (the whole process group)")
            elif status == "cancelled":
                report.notes.append("cancelled: the whole process group was killed")
            elif returncode < 0:
                report.notes.append(f"the interpreter died from signal {-returncode} before writing a report")
            else:
                report.notes.append(f"the interpreter exited with code {returncode} before writing a report")
            steps = [e for e in self._events if e.get("event") == "step"]
            if steps:
                report.notes.append(f"{len(steps)} step(s) had completed")
        if report.status != "exited":
            report.exit_code = returncode
        report.output_tail = tail
        report.write(path, root=request.out)
        return report

    def remove_created_folders(self) -> None:
        """Remove the folders start() created that are still empty (a run that was stopped)."""
        for folder in reversed(self.created_folders):
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (or gone): neither are the folders around it


def profile(
    request: ProfileRequest,
    on_progress: ProgressCallback | None = None,
    on_output: OutputCallback | None = None,
    cancel: threading.Event | None = None,
) -> Report:
    """Run one profile to the end; `cancel.set()` from another thread stops it."""
    run = ProfileRun(request, on_progress, on_output, cancel)
    try:
        run.start()
        return run.wait()
    except BaseException:  # Ctrl-C, a failure to start: no empty results folder is left behind
        run.remove_created_folders()
        raise
