"""The child's half of a run's lifetime: a harness ends itself, with its whole process
group, when its deadline passes or its parent dies.

The parent (oom_lsp.profiling.runner) enforces the timeout and kills the group on cancel,
but a parent that is itself killed (SIGKILL to the language server, an editor that
crashed) can do neither: the run went on for its whole timeout, or forever for a script
that hangs. So the parent also passes, in the environment, the read end of a pipe whose
write end only it holds, and the deadline; `arm_from_environment` (the first thing each
harness does) starts a thread that waits on both. End of file on the pipe means the
parent is gone, however it died, on any POSIX system (PR_SET_PDEATHSIG is Linux only and
fires when the parent *thread* that spawned the child exits, which a server's worker
threads do). The deadline is the parent's timeout plus `GRACE_S`, so that a living
parent, which writes the report, always acts first.

Standard library only: the estimate harness loads this file by path (it imports nothing
from oom_lsp).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time

PARENT_FD_ENV = "OOM_LSP_PARENT_FD"
DEADLINE_ENV = "OOM_LSP_DEADLINE_S"
GRACE_S = 10.0


def child_environment(read_fd: int, timeout: float | None) -> dict[str, str]:
    """What the parent adds to the child's environment."""
    env = {PARENT_FD_ENV: str(read_fd)}
    if timeout is not None:
        env[DEADLINE_ENV] = f"{timeout + GRACE_S:.3f}"
    return env


def arm_from_environment(environ: dict[str, str] | None = None) -> bool:
    """Start watching the parent and the deadline the environment names (removed from it:
    the user's script and its own subprocesses do not see them). False when there is
    nothing to watch (the harness was started by hand)."""
    environ = os.environ if environ is None else environ
    fd_text = environ.pop(PARENT_FD_ENV, None)
    deadline_text = environ.pop(DEADLINE_ENV, None)
    fd = int(fd_text) if fd_text and fd_text.isdigit() else None
    deadline = time.monotonic() + float(deadline_text) if deadline_text else None
    if fd is None and deadline is None:
        return False
    if fd is not None:
        os.set_inheritable(fd, False)  # the script's own subprocesses must not hold it
    threading.Thread(target=_watch, args=(fd, deadline), name="oom-lsp-watchdog", daemon=True).start()
    return True


def _watch(fd: int | None, deadline: float | None) -> None:
    while True:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if fd is None:
            time.sleep(remaining or 0.0)
            _end("its deadline passed")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            _end("its deadline passed")
        if not os.read(fd, 512):
            _end("the process that started it is gone")


def _end(why: str) -> None:
    try:
        sys.stderr.write(f"oom-lsp: stopping the run: {why}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # nobody reads it any more
    if os.getpgrp() == os.getpid():  # the runner's session: the script's workers go too
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
