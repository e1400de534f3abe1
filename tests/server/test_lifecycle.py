"""No path leaves a process: `shutdown` in the middle of a profile or an estimate is
answered and stops the run, `exit` ends the server, and a server killed outright (its
jobs' parent gone) takes its runs with it, through the harness's own watch of its parent.
The script profiled starts a child and sleeps 600 s: only a kill of its group ends it."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.stdio_client import StdioServer, alive, descendants, wait_until

# Reads /proc and kills the server: timing-sensitive, so scripts/test.sh runs these in its
# serial pass, after the parallel one.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
HANGS = ROOT / "fixtures" / "profiling" / "hangs.py"
JOBS = {
    "profile": ("oom-lsp.profile", {"device": "cpu"}),
    "estimate": ("oom-lsp.estimate", {"device": "cpu"}),
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[StdioServer]:
    shutil.copy(HANGS, tmp_path / "hangs.py")
    running = StdioServer(tmp_path)
    running.initialize()
    yield running
    running.close()


def start_job(server: StdioServer, kind: str) -> tuple[int, set[int]]:
    """Start the job on hangs.py; its request id and the processes it runs, once the
    script's own sleeping child exists."""
    name, arguments = JOBS[kind]
    msg_id = server.request(
        "workspace/executeCommand",
        {"command": name, "arguments": [{"uri": (server.root / "hangs.py").as_uri(), **arguments}]},
    )

    def sleeping_child() -> bool:
        return any("time.sleep(600)" in _command_line(pid) for pid in descendants(server.process.pid))

    wait_until(sleeping_child, 120, "the script's child runs")
    return msg_id, descendants(server.process.pid)


def _command_line(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes()).replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


@pytest.mark.parametrize("kind", list(JOBS))
def test_shutdown_during_a_job_answers_and_exit_leaves_nothing(server: StdioServer, kind: str):
    msg_id, processes = start_job(server, kind)
    assert server.call("shutdown")["result"] is None  # no "dictionary changed size" error
    (job,) = [message for message in server.received if message.get("id") == msg_id]
    assert job["error"]["code"] == -32800, job  # the job's request: cancelled, answered first
    server.notify("exit")
    assert server.exit_code(timeout=30) == 0
    wait_until(lambda: not any(alive(pid) for pid in processes), 30, f"the {kind}'s processes are gone")


@pytest.mark.parametrize("kind", list(JOBS))
def test_a_killed_server_takes_its_jobs_with_it(server: StdioServer, kind: str):
    _, processes = start_job(server, kind)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    # Nobody is left to enforce the job's 300-600 s timeout: the harness notices alone.
    wait_until(lambda: not any(alive(pid) for pid in processes), 30, f"the {kind}'s processes are gone")
