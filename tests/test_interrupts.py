"""Ctrl-C, SIGTERM and SIGHUP on the installed console script while it runs a
user's script: the whole process tree of the script goes, and the exit status
says the command was interrupted. To the process group, as a terminal sends
Ctrl-C or a hang-up; to the process alone, as a parent (CI, an editor) does."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests import console

# Signals on a running console script, then a count of what it left: timing-sensitive,
# so scripts/test.sh runs these in its serial pass, after the parallel one.
pytestmark = pytest.mark.serial

pytest.importorskip("torch")

COMMANDS = {
    "profile": ["profile", "train.py", "--device", "cpu"],
    "estimate": ["estimate", "train.py", "--device", "cpu"],
    "validate": ["validate", "train.py", "--before", "before.json", "--no-log"],
}
CASES = [
    ("profile", signal.SIGINT, "group"),
    ("profile", signal.SIGTERM, "process"),
    ("profile", signal.SIGHUP, "group"),
    ("estimate", signal.SIGINT, "group"),
    ("estimate", signal.SIGINT, "process"),
    ("estimate", signal.SIGTERM, "process"),
    ("estimate", signal.SIGHUP, "group"),
    ("validate", signal.SIGTERM, "process"),
    ("validate", signal.SIGINT, "group"),
]


@pytest.mark.parametrize(
    ("command", "signum", "target"), CASES, ids=[f"{c}-{s.name}-{t}" for c, s, t in CASES]
)
def test_a_signal_kills_the_script_and_all_it_started(tmp_path, command, signum, target):
    script, record = console.write_hanging_script(tmp_path)
    before = {"script": str(script), "device": "cpu", "peak_bytes": 2**20, "gpu": None}
    (tmp_path / "before.json").write_text(json.dumps(before))
    with console.started(COMMANDS[command], tmp_path, record) as (process, script_pids):
        if target == "group":
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 128 + signum, err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"oom-lsp {command}: interrupted by {signum.name}; killed process group "), err
        groups = console.killed_groups(err)
        assert groups, err
        console.assert_all_gone(script_pids, groups)


@pytest.mark.parametrize("command", ["profile", "estimate"])
def test_a_timeout_kills_the_script_and_all_it_started(tmp_path, command):
    # The timeout leaves room for `import torch` on a loaded machine: the script
    # must record its pids before it.
    script, record = console.write_hanging_script(tmp_path)
    with console.started([*COMMANDS[command], "--timeout", "15"], tmp_path, record) as (process, script_pids):
        process.communicate(timeout=120)
        assert process.returncode == 2
        # The script runs inside the harness, its process group's leader: its pid is the group's.
        console.assert_all_gone(script_pids, [script_pids[0]])


@pytest.mark.parametrize("command", ["profile", "estimate"])
def test_a_terminal_that_hangs_up_kills_the_script_and_exits_129(tmp_path, command):
    """The terminal window closes (or the SSH connection drops) while the status line is
    drawn: the kernel sends SIGHUP to the command, the session leader of that terminal,
    and every write to the terminal fails from then on."""
    import fcntl
    import pty
    import subprocess
    import termios

    script, record = console.write_hanging_script(tmp_path)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [console.OOM_LSP, *COMMANDS[command]],
        cwd=tmp_path,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # the terminal of its session
    )
    os.close(slave)
    pids: list[int] = []
    try:
        pids = console.wait_for_pids(record, process)
        os.close(master)  # the hang-up
        master = -1
        assert process.wait(timeout=60) == 128 + signal.SIGHUP
        # The script runs inside the harness, its process group's leader: its pid is the group's.
        console.assert_all_gone(pids, [pids[0]])
    finally:
        if master >= 0:
            os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in pids:
            if console.alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_interrupted_profile_leaves_no_empty_folder_it_created(tmp_path):
    script, record = console.write_hanging_script(tmp_path)
    (tmp_path / "runs").mkdir()  # there before: stays
    args = ["profile", "train.py", "--device", "cpu", "--out", "runs/new/profile"]
    with console.started(args, tmp_path, record) as (process, script_pids):
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        console.assert_all_gone(script_pids, console.killed_groups(err))
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == []
