"""Start-up benchmark: how long until a file's first diagnostics, oom-lsp's server next to Ruff's.

A benchmark, not a test: it prints figures and never asserts on them.

What an editor does when you open a Python file with no server running yet (VS Code activates
the extension, Neovim attaches on FileType): it starts the server, sends `initialize`,
`initialized` and `didOpen`, and waits for the diagnostics. For each server, started as the
editors start it (`oom-lsp` from this checkout's environment, `ruff server`), on the same file,
in the same run, alternating between the two, this times from the process's start:

- `initialize`: the answer to `initialize`;
- `diagnostics`: the file's first diagnostics: the first `publishDiagnostics` for it, for a
  client that does not pull (`--client push`, as Neovim 0.7: both servers then push), or the
  answer to the `textDocument/diagnostic` the client sends right after `didOpen`, with the
  initialize parameters Neovim 0.11.4 and VS Code 1.139.1 send (`--client neovim`, `vscode`:
  tests/server/client_capabilities/), whichever comes first;

and, from `didOpen`, the diagnostics alone (the server already initialized).
Goal: oom-lsp's first diagnostics within 1.5 s of the start on a quiet machine.

The file: fixtures/*_risky.py joined until it has about `--lines` lines (default 1,000), a
training script of the size people write. Ruff: the `ruff` beside this interpreter (the bench
extra: `pip install ruff`), else on PATH; `--no-ruff` skips it.

    .venv/bin/python bench/startup.py [--runs 7] [--lines 1000] [--client push|neovim|vscode] [--no-ruff]
        [--checkout DIR]   # also another checkout's server (before/after), e.g. a worktree of main

Then, with `--imports`, what the server imports before its first analysis
(`python -X importtime`), the slowest first: where the start-up time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60.0


@dataclass
class Run:
    initialize_s: float
    diagnostics_s: float  # from the start of the process
    after_open_s: float  # from didOpen


class RawClient:
    """JSON-RPC over a server's stdio, as little client as possible: the figures are the server's."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.next_id = 0

    async def send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await self.process.stdin.drain()

    async def request(self, method: str, params: dict) -> int:
        self.next_id += 1
        await self.send({"id": self.next_id, "method": method, "params": params})
        return self.next_id

    async def receive(self) -> dict:
        assert self.process.stdout is not None
        length = 0
        while True:
            line = await self.process.stdout.readline()
            if not line:
                raise EOFError("the server closed its output")
            line = line.strip()
            if not line:
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return json.loads(await self.process.stdout.readexactly(length))

    async def answer_server_requests(self, message: dict) -> None:
        """workspace/configuration, progress tokens, registrations: answered as a client would."""
        if "id" in message and "method" in message:
            result: object = None
            if message["method"] == "workspace/configuration":
                result = [{} for _ in message["params"]["items"]]
            await self.send({"id": message["id"], "result": result})


CAPABILITIES = {
    # A push-only client: both servers publish diagnostics (no pull support announced).
    "textDocument": {
        "synchronization": {"didSave": True, "dynamicRegistration": False},
        "publishDiagnostics": {"relatedInformation": True, "versionSupport": True},
        "codeAction": {"codeActionLiteralSupport": {"codeActionKind": {"valueSet": ["quickfix"]}}},
        "hover": {"contentFormat": ["markdown", "plaintext"]},
    },
    "workspace": {"configuration": True, "workspaceFolders": True},
    "window": {"workDoneProgress": True},
    "general": {"positionEncodings": ["utf-16"]},
}


CAPTURED = REPO / "tests" / "server" / "client_capabilities"
CLIENTS = {
    "neovim": CAPTURED / "neovim-0.11.4.initialize.json",
    "vscode": CAPTURED / "code-server-4.139.1-vscode-1.139.1.initialize.json",
}


def client_capabilities(client: str) -> dict:
    if client == "push":
        return CAPABILITIES
    return json.loads(CLIENTS[client].read_text(encoding="utf-8"))["capabilities"]


async def one_run(command: list[str], root: Path, path: Path, text: str, client_name: str = "push") -> Run:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=root,
    )
    client = RawClient(process)
    uri = path.as_uri()
    try:
        initialize = await client.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": root.as_uri(),
                "workspaceFolders": [{"uri": root.as_uri(), "name": root.name}],
                "capabilities": client_capabilities(client_name),
                "initializationOptions": {},
            },
        )

        async def until(predicate) -> dict:
            while True:
                message = await client.receive()
                await client.answer_server_requests(message)
                if predicate(message):
                    return message

        await asyncio.wait_for(until(lambda m: m.get("id") == initialize and "method" not in m), TIMEOUT_S)
        initialized_s = time.perf_counter() - started
        await client.send({"method": "initialized", "params": {}})
        opened = time.perf_counter()
        await client.send(
            {
                "method": "textDocument/didOpen",
                "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}},
            }
        )
        pull = None
        if client_name != "push":  # Neovim 0.11 and VS Code pull a file's diagnostics once it is open
            pull = await client.request("textDocument/diagnostic", {"textDocument": {"uri": uri}})
        await asyncio.wait_for(
            until(
                lambda m: (
                    (m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri)
                    or (pull is not None and m.get("id") == pull and "method" not in m)
                )
            ),
            TIMEOUT_S,
        )
        done = time.perf_counter()
        shutdown = await client.request("shutdown", {})
        await asyncio.wait_for(until(lambda m: m.get("id") == shutdown and "method" not in m), TIMEOUT_S)
        await client.send({"method": "exit", "params": None})
        await asyncio.wait_for(process.wait(), TIMEOUT_S)
        return Run(initialized_s, done - started, done - opened)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def training_file(lines: int) -> str:
    """The risky training scripts of fixtures/ joined (each once, then again) to `lines` lines."""
    scripts = [path.read_text(encoding="utf-8") for path in sorted((REPO / "fixtures").glob("*_risky.py"))]
    text, index = "", 0
    while text.count("\n") < lines:
        text += scripts[index % len(scripts)].rstrip("\n") + "\n\n\n"
        index += 1
    return text


def ruff_command() -> list[str] | None:
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.exists() else shutil.which("ruff")
    return [found, "server"] if found else None


def oom_lsp_command() -> list[str]:
    beside = Path(sys.executable).parent / "oom-lsp"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "oom_lsp"]


def version_of(command: list[str]) -> str:
    base = command[:1] if command[-1] == "server" else command
    try:
        done = subprocess.run([*base, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return "?"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else "?"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def milliseconds(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.0f} {percentile(values, 0.95) * 1000:7.0f}"


def imports_before_the_first_analysis(path: Path) -> None:
    """`python -X importtime` of the server answering one initialize and didOpen: the modules
    imported, by cumulative time (the analysis worker's thread included, as it loads libcst)."""
    code = (
        "import sys, time, threading\n"
        "from oom_lsp.server.server import warm_up_analysis\n"
        "from oom_lsp.server.features import create_server\n"
        "create_server()\n"
        "warm_up_analysis()\n"
        "from oom_lsp.checker import analyze_text\n"
        "from oom_lsp.analysis import default_settings\n"
        f"analyze_text(open({str(path)!r}).read(), default_settings(), {str(path)!r})\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _self_us, cumulative_us, name = line.split(":", 1)[1].split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append((int(cumulative_us), depth, name.strip()))
    top = sorted((row for row in rows if row[1] <= 1), reverse=True)[:20]
    print("\nImports before the first analysis (-X importtime, cumulative, top level and one below):")
    for cumulative, depth, name in top:
        print(f"  {cumulative / 1000:8.1f} ms  {'  ' * depth}{name}")
    print(f"  torch imported: {done.stdout.strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--client", choices=["push", *CLIENTS], default="push")
    parser.add_argument("--no-ruff", action="store_true")
    parser.add_argument(
        "--checkout",
        action="append",
        default=[],
        metavar="DIR",
        help="also the server of another checkout (git worktree add DIR main), run as "
        "`PYTHONPATH=DIR python -m oom_lsp` with this interpreter: before/after in one run",
    )
    parser.add_argument("--imports", action="store_true")
    args = parser.parse_args()

    servers = {"oom-lsp": oom_lsp_command()}
    for checkout in args.checkout:
        folder = Path(checkout).resolve()
        servers[f"oom-lsp@{folder.name}"] = ["env", f"PYTHONPATH={folder}", sys.executable, "-m", "oom_lsp"]
    ruff = None if args.no_ruff else ruff_command()
    if ruff is not None:
        servers["ruff server"] = ruff
    elif not args.no_ruff:
        print("ruff not found (pip install ruff): oom-lsp alone", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="oom-startup-") as folder:
        root = Path(folder)
        (root / "pyproject.toml").write_text("[project]\nname = 'startup'\n", encoding="utf-8")
        text = training_file(args.lines)
        path = root / "train.py"
        path.write_text(text, encoding="utf-8")
        runs: dict[str, list[Run]] = {name: [] for name in servers}
        # One run of each first, not timed: the page cache and .pyc files are warm for both.
        for command in servers.values():
            asyncio.run(one_run(command, root, path, text, args.client))
        for _ in range(args.runs):
            for name, command in servers.items():  # alternating: both see the same machine
                runs[name].append(asyncio.run(one_run(command, root, path, text, args.client)))

        print(
            f"First diagnostics of a {text.count(chr(10)):,}-line training script, {args.runs} runs each, "
            f"alternating, client {args.client} (ms, median and p95)"
        )
        print(f"  {'server':<22} {'initialize':>15} {'diagnostics':>15} {'after didOpen':>15}  version")
        for name, command in servers.items():
            measured = runs[name]
            print(
                f"  {name:<22} {milliseconds([r.initialize_s for r in measured])} "
                f"{milliseconds([r.diagnostics_s for r in measured])} "
                f"{milliseconds([r.after_open_s for r in measured])}  {version_of(command)}"
            )
        if "ruff server" in runs:
            ours = statistics.median(r.diagnostics_s for r in runs["oom-lsp"])
            theirs = statistics.median(r.diagnostics_s for r in runs["ruff server"])
            print(f"  oom-lsp / Ruff, first diagnostics from the start: {ours / theirs:.1f}x")
        ours = statistics.median(r.diagnostics_s for r in runs["oom-lsp"])
        verdict = "met" if ours <= 1.5 else "not met"
        print(f"  goal: oom-lsp's first diagnostics <= 1500 ms: {verdict} ({ours * 1000:.0f} ms)")
        load = os.getloadavg()[0]
        print(f"  machine: {os.cpu_count()} cores, load average {load:.2f} (a busy machine reads slower)")
        if args.imports:
            imports_before_the_first_analysis(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
