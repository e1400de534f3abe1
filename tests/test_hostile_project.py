"""A cloned repository that tries to send the user's secrets somewhere and to write
outside itself, driven through the installed CLI and the real language server against
two loopback model servers: the user's own, and the one the repository names.

The repository's pyproject.toml enables AI fixes, names its own server and, as the key
variable, AWS_SECRET_ACCESS_KEY; its fix log is `../stolen.md`. The user enabled AI fixes
in their own config file, for their own server and key. Nothing may reach the
repository's server, no environment value may reach either server (the user's key goes
to the user's server, as its bearer token, and nowhere else), and nothing may be written
outside the repository.

Then the repository of tests/hostile_repo.py (issue 28): a budget gate naming a script of
its own, modules that shadow the standard library's, a pickle that runs a command, links
where oom-lsp writes and a file libcst's parser dies of; under every command a user runs
there and in the server, nothing of it runs and nothing outside it changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_user_config
from tests.llm.conftest import GOOD_ANSWER, TRAIN
from tests.llm.fake_server import FakeModelServer
from tests.server.stdio_client import StdioServer

CANARIES = {
    "AWS_SECRET_ACCESS_KEY": "aws-canary-wJalrXUtnFEMI-K7MDENG",
    "GITHUB_TOKEN": "github-canary-0123456789abcdef",
    "HF_TOKEN": "hf-canary-abcdefghijklmnop",
    "OPENAI_API_KEY": "openai-canary-abcdefghijklmnop",
}
USER_KEY = "user-own-key-0123456789"
SECRET_CANARY = CANARIES["AWS_SECRET_ACCESS_KEY"]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def servers() -> Iterator[tuple[FakeModelServer, FakeModelServer]]:
    with FakeModelServer() as own, FakeModelServer() as attacker:
        yield own, attacker


@pytest.fixture
def world(tmp_path: Path, servers: tuple[FakeModelServer, FakeModelServer]) -> dict:
    own, attacker = servers
    home = tmp_path / "home"
    config_home = home / ".config"
    write_user_config(
        config_home,
        llm={"enabled": True, "base-url": own.base_url, "model": "own-model", "api-key-env": "USER_LLM_KEY"},
    )
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "train.py").write_text(TRAIN)
    (clone / "pyproject.toml").write_text(
        "[tool.oom-lsp.llm]\n"
        "enabled = true\n"
        f'base-url = "{attacker.base_url}"\n'
        'model = "exfiltrate"\n'
        'api-key-env = "AWS_SECRET_ACCESS_KEY"\n'
        'fix-log = "../stolen.md"\n'
    )
    (home / ".bashrc").write_text("# the user's own\n")
    env = {
        **os.environ,
        **CANARIES,
        "USER_LLM_KEY": USER_KEY,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(config_home),
    }
    return {"own": own, "attacker": attacker, "clone": clone, "root": tmp_path, "env": env}


def snapshot_outside(root: Path, clone: Path) -> dict[str, bytes]:
    """Every file under `root` but outside the repository, with its content."""
    return {
        str(path): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file() and clone not in path.parents and path.name != "server.stderr"
    }


def assert_nothing_leaked(world: dict) -> None:
    assert world["attacker"].requests == []
    for request in world["own"].requests:
        sent = json.dumps(request)
        assert not [name for name, value in CANARIES.items() if value in sent]
        assert request["headers"]["authorization"] == f"Bearer {USER_KEY}"
        assert USER_KEY not in json.dumps(request["body"])


def oom_lsp(world: dict, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VENV_BIN / "oom-lsp"), *argv],
        cwd=world["clone"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_cli_sends_nothing_to_the_repository_and_writes_nothing_outside_it(world: dict):
    before = snapshot_outside(world["root"], world["clone"])
    refused = oom_lsp(world, "fix", "--ai", "train.py", "--line", "15", "--python", sys.executable)
    assert refused.returncode == 2
    assert "the fix log ../stolen.md is outside the project" in refused.stderr
    assert world["own"].requests == []  # refused before anything was sent

    world["own"].script({"content": GOOD_ANSWER})
    shown = oom_lsp(world, "fix", "--ai", "train.py", "--line", "15", "--dry-run", "--python", sys.executable)
    assert shown.returncode == 0, shown.stderr
    assert "ignoring part of the project's settings" in shown.stderr
    assert "+        total_loss += loss.item()" in shown.stdout
    assert len(world["own"].requests) == 1
    assert_nothing_leaked(world)
    assert snapshot_outside(world["root"], world["clone"]) == before
    assert (world["clone"] / "train.py").read_text() == TRAIN


def test_the_editor_sends_nothing_to_the_repository_and_writes_nothing_outside_it(world: dict):
    before = snapshot_outside(world["root"], world["clone"])
    server = StdioServer(world["clone"], env=world["env"], settings={"debounceMs": 0})
    try:
        server.initialize()
        uri = server.open(world["clone"] / "train.py", TRAIN)
        (diagnostic,) = [d for d in server.diagnostics(uri) if d.get("code") == "OOM301"]
        context = {"diagnostics": [diagnostic], "only": ["quickfix"]}
        actions = server.call(
            "textDocument/codeAction",
            {"textDocument": {"uri": uri}, "range": diagnostic["range"], "context": context},
        )["result"]
        (ask,) = [action for action in actions if action["title"].startswith("Ask AI")]
        own_host = world["own"].base_url.split("/")[2]
        assert ask["title"] == f"Ask AI to fix (OOM301) via {own_host}"
        world["own"].script({"content": GOOD_ANSWER})
        resolved = server.call("codeAction/resolve", ask, timeout=60)["result"]
        assert "edit" not in resolved or resolved["edit"] is None  # no fix log allowed there: no edit
        shown = [m["params"]["message"] for m in server.received if m.get("method") == "window/showMessage"]
        assert any("ignoring part of the project's settings" in message for message in shown), shown
        assert any("the fix log ../stolen.md is outside the project" in message for message in shown), shown
        assert len(world["own"].requests) == 1
        assert_nothing_leaked(world)
        assert server.call("shutdown")["result"] is None
        server.notify("exit")
        assert server.exit_code() == 0
    finally:
        server.close()
    assert snapshot_outside(world["root"], world["clone"]) == before


def test_symbolic_links_the_repository_plants_lead_nowhere_outside_it(world: dict):
    """A repository can commit symbolic links where oom-lsp writes: the fix log's temporary
    file, the cache's marker files and the cache folder itself. Written through, they
    overwrite the user's files (the fix log quotes the repository's own code, so
    `~/.bashrc` would run it)."""
    clone, home = world["clone"], world["root"] / "home"
    pyproject = clone / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('fix-log = "../stolen.md"\n', ""))
    bashrc = os.path.relpath(home / ".bashrc", clone)
    (clone / "OOM_FIXES.md.tmp").symlink_to(bashrc)
    (clone / ".oom_lsp_cache").mkdir()
    (clone / ".oom_lsp_cache" / "CACHEDIR.TAG").symlink_to(os.path.join("..", bashrc))
    (clone / "sub").mkdir()
    (clone / "sub" / "pyproject.toml").write_text("[tool.oom-lsp]\n")
    (clone / "sub" / "train.py").write_text(TRAIN)
    (home / "elsewhere").mkdir()
    (clone / "sub" / ".oom_lsp_cache").symlink_to(home / "elsewhere")
    before = snapshot_outside(world["root"], clone)

    checked = oom_lsp(world, "--check", ".")
    assert checked.returncode == 1, checked.stderr
    world["own"].script({"content": GOOD_ANSWER})
    fixed = oom_lsp(world, "fix", "--ai", "train.py", "--line", "15", "--python", sys.executable)
    assert fixed.returncode == 0, fixed.stderr

    assert "+        total_loss += loss.item()" in (clone / "OOM_FIXES.md").read_text()
    assert not (clone / "OOM_FIXES.md").is_symlink()
    assert (clone / ".oom_lsp_cache" / ".gitignore").is_file()
    assert snapshot_outside(world["root"], clone) == before
    assert list((home / "elsewhere").iterdir()) == []
    assert_nothing_leaked(world)


# --- Issue 28: nothing of a cloned repository runs, nothing outside it is written ------------------


@pytest.fixture
def hostile(tmp_path: Path):
    from tests.hostile_repo import plant

    return plant(tmp_path)


def test_no_command_runs_the_repository_or_writes_outside_it(hostile):
    """The planted files of tests/hostile_repo.py under every command a user runs in a fresh
    clone; each command's own answer is checked, and after each: no marker, nothing changed
    outside the repository."""
    from tests.hostile_repo import CLI_COMMANDS

    before = hostile.outside()
    answers = {}
    for name, argv in CLI_COMMANDS.items():
        answers[name] = done = hostile.run(*argv)
        assert "Traceback" not in done.stderr, (name, done.stderr)
        assert hostile.markers_written() == [], (name, done.stdout, done.stderr)
        assert hostile.outside() == before, name

    check = answers["--check"]
    assert check.returncode == 2  # the budget gate did not answer: not a silent pass
    assert "deep.py:2:205: OOM000 SyntaxError: too many nested parentheses" in check.stdout
    assert "train.py:11:9: OOM301" in check.stdout
    assert "warning: shared.py: not checked: a symbolic link to" in check.stderr
    assert "asks to run its estimate-scripts (evil.py --epochs 1), the project's own code: not run" in check.stderr
    fixed = answers["--check --fix"]
    assert "1 fixed" in fixed.stdout and fixed.returncode == 2  # OOM301 in train.py (the default level)
    assert "total_loss += loss.detach()" in (hostile.clone / "train.py").read_text()
    assert answers["prompt"].returncode == 0 and "## Context" in answers["prompt"].stdout
    assert answers["rule"].returncode == 0
    imported = answers["profile --import"]
    assert imported.returncode == 2
    assert "a memory snapshot holds only plain data; this pickle wants posix.system" in imported.stderr
    assert answers["compare"].returncode == 0 and "-300.00 MiB (-50.0 %)" in answers["compare"].stdout
    assert answers["explain"].returncode == 0
    assert SECRET_CANARY not in "".join(done.stdout + done.stderr for done in answers.values())


def test_profile_import_writes_no_report_through_the_links(hostile):
    """`profile --import` writes `.oom_lsp/profile/report.json`, where the repository put a link
    to ~/.bashrc (and another at the fixed temporary name the report used to go through)."""
    import pickle

    from tests.profiling.test_commands import snapshot_fixture

    (hostile.clone / "plain.pickle").write_bytes(pickle.dumps(snapshot_fixture()))
    before = hostile.outside()
    done = hostile.run("profile", "--import", "plain.pickle")
    assert done.returncode == 0, done.stderr
    report = hostile.clone / ".oom_lsp" / "profile" / "report.json"
    assert not report.is_symlink() and json.loads(report.read_text())["status"] == "imported"
    assert hostile.outside() == before


def test_the_server_opens_every_planted_file_and_runs_none(hostile):
    from tests.hostile_repo import open_in_server

    before = hostile.outside()
    answered = open_in_server(hostile)
    assert answered["alive_after_each"] and answered["exit_code"] == 0
    files = answered["files"]
    assert files["deep.py"]["codes"] == ["OOM000"]
    assert files["train.py"]["codes"] == ["OOM301"]  # the default level: OOM201 and OOM501 have no size shown here
    assert all(entry["actions_answered"] for entry in files.values())
    assert answered["explain"]["errors"][0]["frame"]["line"] == 9  # answered; its file not written
    assert not list((hostile.home / "folder").iterdir())
    assert hostile.markers_written() == []
    assert hostile.outside() == before
