"""The server under sustained edits (issue 28): are requests answered, is memory flat, are
the last diagnostics right?

A benchmark, not a test: it prints figures and asserts nothing (tests/server/test_load.py
checks the behaviour on a small scale).

It starts the installed console script (`oom-lsp`, next to this Python) over stdio with the
client of bench/lsp_latency.py, opens a real training script (fixtures/estimate/real/
pytorch_examples/imagenet/main.py, 392 lines, our own code after pytorch/examples) and makes
N random edits as a typist does: a word typed character by character somewhere in a line,
often deleted again; a line pasted or cut; a pause now and then. Between the edits, without
waiting for the answers, it asks what an editor asks: code actions at the cursor (with the
diagnostics it last got for that line), hovers, code lenses, inlay hints and, in pull mode,
the document's diagnostics. Then, after the last edit, it asks for the diagnostics once more.

In notebook mode the same script is a notebook (its top-level sections, split at two blank
lines, are 14 cells, opened with notebookDocument/didOpen as VS Code's notebook editor does)
and the edits go to the cell of `def train(`, as notebookDocument/didChange; the requests go
to that cell, and one in four to another cell (its findings depend on the edited one: the
notebook is one program). Its diagnostics are pushed per cell.

Printed, for push mode (a client without pull diagnostics, debounce 0), pull mode and
notebook mode:
- requests: how many, answered with a result / ContentModified (-32801) / another error,
  left unanswered 1 s after the last edit, never answered; latency p50 / p95 / max;
- the last diagnostics: time from the last edit, and whether they equal `oom-lsp --check
  --format json` run on the same text in the same project (the whole notebook's, per cell, in
  notebook mode);
- the server's RSS after a warm-up (the first 10 % of the edits) and at the end, its growth.
Goals: every request answered within 1 s of the last edit, RSS growth under 10 %, the last
diagnostics equal to the CLI's.

    .venv/bin/python bench/sustained_edits.py [--edits 20000] [--seed 28] [--modes push pull]
        [--keystroke-ms 4] [--server PATH/TO/oom-lsp] [--keep DIR]
    .venv/bin/python bench/sustained_edits.py --modes push notebook   # a file and a notebook side by side
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsp_latency import capabilities, percentile

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "estimate" / "real" / "pytorch_examples" / "imagenet" / "main.py"
SERVER = Path(sys.executable).with_name("oom-lsp")
EDITED_CELL = "def train("  # notebook mode: the cell typed in
WORD_CHARS = "abcdefghijklmnopqrstuvwxyz_0123456789"
TYPED = ["x", "loss", ".item()", "torch.zeros(8)", " + 1", "(", ")", ", ", "model", ".cuda()", "[0]"]
PASTED = [
    "        total = total + loss.item()\n",
    "    buffer = torch.empty(1024, 1024, device='cuda')\n",
    "# a note\n",
    "\n",
    "history.append(loss)\n",
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Requests:
    sent: int = 0
    results: int = 0
    content_modified: int = 0
    other_errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    answered_at: list[float] = field(default_factory=list)
    pending: set[int] = field(default_factory=set)


class Typist:
    """The document's text on the client's side, and random edits of it (LSP ranges, UTF-16
    columns: the edits are ASCII)."""

    def __init__(self, text: str, rng: random.Random) -> None:
        self.lines = text.splitlines(keepends=True)
        self.rng = rng
        self.cursor = (0, 0)
        self.typed: list[tuple[int, int]] = []  # characters typed at the cursor, to delete again

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def _insert(self, line: int, column: int, text: str) -> types.TextDocumentContentChangePartial:
        position = types.Position(line=line, character=column)
        if line == len(self.lines):
            self.lines.append("")
        old = self.lines[line]
        new_lines = (old[:column] + text + old[column:]).splitlines(keepends=True) or [""]
        self.lines[line : line + 1] = new_lines
        return types.TextDocumentContentChangePartial(
            range=types.Range(start=position, end=position), text=text
        )

    def _delete(self, line: int, start: int, end: int) -> types.TextDocumentContentChangePartial:
        old = self.lines[line]
        self.lines[line] = old[:start] + old[end:]
        return types.TextDocumentContentChangePartial(
            range=types.Range(
                start=types.Position(line=line, character=start), end=types.Position(line=line, character=end)
            ),
            text="",
        )

    def edits(self) -> list[types.TextDocumentContentChangePartial]:
        """One burst: a word typed character by character (often deleted again), or a line
        pasted or cut."""
        rng = self.rng
        choice = rng.random()
        if choice < 0.1 and len(self.lines) > 200:  # cut a line
            line = rng.randrange(len(self.lines))
            end = types.Position(line=line + 1, character=0)
            change = types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=line, character=0), end=end), text=""
            )
            del self.lines[line]
            return [change]
        if choice < 0.2:  # paste a line
            line = rng.randrange(len(self.lines) + 1)
            return [self._insert(line, 0, rng.choice(PASTED))]
        line = rng.randrange(len(self.lines))
        content = self.lines[line].rstrip("\r\n")
        column = rng.randint(0, len(content))
        self.cursor = (line, column)
        word = (
            rng.choice(TYPED) if rng.random() < 0.5 else "".join(rng.choices(WORD_CHARS, k=rng.randint(1, 8)))
        )
        changes = [self._insert(line, column + index, char) for index, char in enumerate(word)]
        if rng.random() < 0.7:  # deleted again, backspace by backspace
            for index in range(len(word), 0, -1):
                changes.append(self._delete(line, column + index - 1, column + index))
        return changes


async def run(
    mode: str, edits: int, seed: int, workspace: Path, server: Path, keystroke_s: float = 0.004
) -> dict[str, Any]:
    pull = mode == "pull"
    notebook = mode == "notebook"
    rng = random.Random(seed)
    client = LanguageClient("oom-lsp-sustained-edits", "1")
    diagnostics: dict[int, list[types.Diagnostic]] = {}
    published_version: list[int] = [0]
    # Notebook mode: the cells' texts (the edited one is the typist's), URIs, and the
    # diagnostics last published for each.
    cells = SCRIPT.read_text().split("\n\n\n") if notebook else [SCRIPT.read_text()]
    edited = (
        next(index for index, cell in enumerate(cells) if cell.startswith(EDITED_CELL)) if notebook else 0
    )
    path = workspace / (f"train_{mode}.ipynb" if notebook else f"train_{mode}.py")
    cell_uris = (
        [_cell_uri(path.as_uri(), index) for index in range(len(cells))] if notebook else [path.as_uri()]
    )
    uri = cell_uris[edited]
    cell_diagnostics: dict[str, list[types.Diagnostic]] = {}

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_publish(params: types.PublishDiagnosticsParams) -> None:
        cell_diagnostics[params.uri] = params.diagnostics
        if params.version is not None and params.uri == uri:
            diagnostics[params.version] = params.diagnostics
            published_version[0] = max(published_version[0], params.version)

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        pass

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def on_show(params: types.ShowMessageParams) -> None:
        print(f"  server says: {params.message}")

    await client.start_io(str(server))
    pid = client._server.pid  # type: ignore[union-attr]
    await client.initialize_async(
        types.InitializeParams(
            capabilities=_notebook_capabilities(capabilities(pull)) if notebook else capabilities(pull),
            root_uri=workspace.as_uri(),
            initialization_options={"debounceMs": 0},
        )
    )
    client.initialized(types.InitializedParams())
    document = types.TextDocumentIdentifier(uri=uri)
    typist = Typist(cells[edited], rng)
    if notebook:
        client.notebook_document_did_open(
            types.DidOpenNotebookDocumentParams(
                notebook_document=types.NotebookDocument(
                    uri=path.as_uri(),
                    notebook_type="jupyter-notebook",
                    version=0,
                    cells=[
                        types.NotebookCell(kind=types.NotebookCellKind.Code, document=cell)
                        for cell in cell_uris
                    ],
                ),
                cell_text_documents=[
                    types.TextDocumentItem(uri=cell, language_id="python", version=1, text=text)
                    for cell, text in zip(cell_uris, cells)
                ],
            )
        )
    else:
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri, language_id="python", version=1, text=typist.text
                )
            )
        )

    def did_change(version: int, change: types.TextDocumentContentChangePartial) -> None:
        identifier = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
        if not notebook:
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(text_document=identifier, content_changes=[change])
            )
            return
        client.notebook_document_did_change(
            types.DidChangeNotebookDocumentParams(
                notebook_document=types.VersionedNotebookDocumentIdentifier(
                    uri=path.as_uri(), version=version
                ),
                change=types.NotebookDocumentChangeEvent(
                    cells=types.NotebookDocumentCellChanges(
                        text_content=[
                            types.NotebookDocumentCellContentChanges(document=identifier, changes=[change])
                        ]
                    )
                ),
            )
        )

    requests = Requests()
    tasks: set[asyncio.Task[None]] = set()
    last_diagnostics: list[types.Diagnostic] = []

    async def ask(method: str, params: Any) -> None:
        nonlocal last_diagnostics
        requests.sent += 1
        started = time.perf_counter()
        key = id(params)
        requests.pending.add(key)
        try:
            result = await client.protocol.send_request_async(method, params)
        except JsonRpcException as error:
            if error.code == -32801:
                requests.content_modified += 1
            else:
                requests.other_errors.append(f"{method}: {error.code} {error}")
        else:
            requests.results += 1
            if method == types.TEXT_DOCUMENT_DIAGNOSTIC and result is not None:
                last_diagnostics = list(getattr(result, "items", None) or [])
        answered = time.perf_counter()
        requests.pending.discard(key)
        requests.latencies.append(answered - started)
        requests.answered_at.append(answered)

    def send(method: str, params: Any) -> None:
        task = asyncio.get_running_loop().create_task(ask(method, params))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def current_diagnostics() -> list[types.Diagnostic]:
        if pull:
            return last_diagnostics
        return diagnostics.get(published_version[0], [])

    def interleave() -> None:
        line, column = typist.cursor
        target = document
        if notebook and rng.random() < 0.25:  # a request on another cell, somewhere in it
            other = rng.choice([index for index in range(len(cells)) if index != edited])
            target = types.TextDocumentIdentifier(uri=cell_uris[other])
            line = rng.randrange(cells[other].count("\n") + 1)
            column = 4
        position = types.Position(line=line, character=column)
        here = types.Range(start=position, end=position)
        roll = rng.random()
        if roll < 0.10:
            shown = current_diagnostics() if target is document else cell_diagnostics.get(target.uri, [])
            on_line = [d for d in shown if d.range.start.line <= line <= d.range.end.line]
            send(
                types.TEXT_DOCUMENT_CODE_ACTION,
                types.CodeActionParams(
                    text_document=target, range=here, context=types.CodeActionContext(diagnostics=on_line)
                ),
            )
        elif roll < 0.15:
            send(types.TEXT_DOCUMENT_HOVER, types.HoverParams(text_document=target, position=position))
        elif roll < 0.17:
            send(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensParams(text_document=target))
        elif roll < 0.19:
            whole = types.Range(
                start=types.Position(line=0, character=0),
                end=types.Position(line=len(typist.lines), character=0),
            )
            send(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintParams(text_document=target, range=whole))
        if pull and rng.random() < 0.2:
            send(types.TEXT_DOCUMENT_DIAGNOSTIC, types.DocumentDiagnosticParams(text_document=target))

    warm_up = max(1, edits // 10)
    rss_warm = 0
    version = 1
    started = time.perf_counter()
    sent_edits = 0
    last_edit = started
    while sent_edits < edits:
        for change in typist.edits():  # the whole burst: the typist's text is after it
            version += 1
            sent_edits += 1
            did_change(version, change)
            last_edit = time.perf_counter()
            interleave()
            # between keystrokes (0: only yield to the client's loop)
            await asyncio.sleep(rng.expovariate(1 / keystroke_s) if keystroke_s > 0 else 0)
            if sent_edits == warm_up:
                await asyncio.sleep(1.0)
                rss_warm = rss_kib(pid)
        await asyncio.sleep(rng.choice([0, 0, 0, 0.05, 0.2]))  # a pause between words
    edit_seconds = last_edit - started
    # The last diagnostics, as the client gets them after the typing stops.

    async def diagnostics_of(version: int, since: float) -> tuple[list[types.Diagnostic], float]:
        if pull:
            try:
                answer = await asyncio.wait_for(
                    client.text_document_diagnostic_async(
                        types.DocumentDiagnosticParams(text_document=document)
                    ),
                    60,
                )
            except asyncio.TimeoutError:
                return [], float("nan")  # not answered within 60 s
            return list(answer.items), time.perf_counter() - since  # type: ignore[union-attr]
        while published_version[0] < version and time.perf_counter() - since < 60:
            await asyncio.sleep(0.005)
        if published_version[0] < version:
            return [], float("nan")
        return diagnostics.get(version, []), time.perf_counter() - since

    final_items, final_seconds = await diagnostics_of(version, last_edit)
    await asyncio.sleep(max(0.0, last_edit + 1.0 - time.perf_counter()))
    unanswered_after_1s = len(requests.pending)
    late = sum(1 for answered in requests.answered_at if answered > last_edit + 1.0)
    deadline = time.perf_counter() + 30
    while requests.pending and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    never = len(requests.pending)
    await asyncio.sleep(1.0)
    rss_end = rss_kib(pid)
    final_text = typist.text
    cells[edited] = final_text
    expected, got = (
        compare_notebook(server, workspace, path, cells, cell_uris, cell_diagnostics)
        if notebook
        else compare(server, workspace, path, final_text, final_items)
    )
    # Then the whole text replaced by the script as it was (an undo to the start): its real
    # findings, not only the syntax error the random typing usually leaves.
    version += 1
    last = typist.lines[-1] if typist.lines else ""
    if last.endswith(("\n", "\r")):
        end = types.Position(line=len(typist.lines), character=0)
    else:
        end = types.Position(line=len(typist.lines) - 1, character=len(last))
    original = SCRIPT.read_text().split("\n\n\n")[edited] if notebook else SCRIPT.read_text()
    did_change(
        version,
        types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=0, character=0), end=end), text=original
        ),
    )
    undo_items, _ = await diagnostics_of(version, time.perf_counter())
    if notebook:
        await asyncio.sleep(1.0)  # the other cells' publications, when the undo changed their findings
        cells[edited] = original
        undo_expected, undo_got = compare_notebook(
            server, workspace, path, cells, cell_uris, cell_diagnostics
        )
    else:
        undo_expected, undo_got = compare(server, workspace, path, original, undo_items)
    for task in list(tasks):
        task.cancel()
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "mode": mode,
        "edits": sent_edits,
        "edit_seconds": edit_seconds,
        "requests": requests,
        "unanswered_after_1s": unanswered_after_1s,
        "late": late,
        "never": never,
        "final_seconds": final_seconds,
        "equal": expected == got,
        "undo_equal": undo_expected == undo_got,
        "text": final_text,
        "undo_got": undo_got,
        "expected": expected,
        "got": got,
        "rss_warm": rss_warm,
        "rss_end": rss_end,
        "lines": len(typist.lines),
    }


def _cell_uri(notebook_uri: str, index: int) -> str:
    return f"vscode-notebook-cell:{notebook_uri.removeprefix('file://')}#W{index}sZmlsZQ%3D%3D"


def _notebook_capabilities(base: types.ClientCapabilities) -> types.ClientCapabilities:
    base.notebook_document = types.NotebookDocumentClientCapabilities(
        synchronization=types.NotebookDocumentSyncClientCapabilities()
    )
    return base


def compare_notebook(
    server: Path,
    workspace: Path,
    path: Path,
    cells: list[str],
    cell_uris: list[str],
    published: dict[str, list[types.Diagnostic]],
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """compare() for a notebook: (the CLI's findings on the .ipynb, the diagnostics last
    published for each cell), with the cell's number first."""
    document = nbformat.v4.new_notebook()
    document.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(document, path)
    expected = sorted(
        (f["code"], f["cell"], *_finding_place(f)) for f in _cli_findings(server, workspace, path)
    )
    got = sorted(
        (str(d.code), number, *_diagnostic_place(d))
        for number, cell in enumerate(cell_uris, start=1)
        for d in published.get(cell, [])
        if d.source == "oom-lsp" and d.code is not None
    )
    return expected, got


def _cli_findings(server: Path, workspace: Path, path: Path) -> list[dict[str, Any]]:
    """`oom-lsp --check --format json` on the file, run in the workspace."""
    cli = subprocess.run(
        [str(server), "--check", "--format", "json", "--no-cache", path.name],
        cwd=workspace,
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(cli.stdout or "[]")


def _finding_place(finding: dict[str, Any]) -> tuple[Any, ...]:
    """Start, end (1-based) and message of the CLI's finding."""
    return (
        finding["line"],
        finding["column"],
        finding["end_line"],
        finding["end_column"],
        finding["message"],
    )


def _diagnostic_place(diagnostic: types.Diagnostic) -> tuple[Any, ...]:
    """Start, end (1-based) and message of the server's diagnostic."""
    return (
        diagnostic.range.start.line + 1,
        diagnostic.range.start.character + 1,
        diagnostic.range.end.line + 1,
        diagnostic.range.end.character + 1,
        diagnostic.message,
    )


def compare(
    server: Path, workspace: Path, path: Path, text: str, items: list[types.Diagnostic]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(the CLI's findings for `text`, the server's diagnostics): code, start, end (1-based), message."""
    path.write_text(text)
    expected = sorted((f["code"], *_finding_place(f)) for f in _cli_findings(server, workspace, path))
    got = sorted(
        (str(d.code), *_diagnostic_place(d)) for d in items if d.source == "oom-lsp" and d.code is not None
    )
    return expected, got


def report(figures: dict[str, Any]) -> None:
    requests: Requests = figures["requests"]
    latencies = requests.latencies or [0.0]
    growth = (
        (figures["rss_end"] - figures["rss_warm"]) / figures["rss_warm"] * 100
        if figures["rss_warm"]
        else float("nan")
    )
    print(
        f"\n{figures['mode']} mode: {figures['edits']:,} edits in {figures['edit_seconds']:.0f} s "
        f"({figures['edits'] / figures['edit_seconds']:.0f}/s), the "
        f"{'edited cell' if figures['mode'] == 'notebook' else 'text'} now {figures['lines']} lines"
    )
    print(
        f"  requests: {requests.sent:,} sent, {requests.results:,} answered with a result, "
        f"{requests.content_modified:,} ContentModified, {len(requests.other_errors)} other errors"
    )
    for error in requests.other_errors[:5]:
        print(f"    {error}")
    print(
        f"  unanswered 1 s after the last edit: {figures['unanswered_after_1s']}; answered later than that: "
        f"{figures['late']}; never answered (30 s): {figures['never']}"
    )
    print(
        f"  latency p50 {percentile(latencies, 0.5) * 1000:.0f} ms, p95 {percentile(latencies, 0.95) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms, mean {statistics.mean(latencies) * 1000:.0f} ms"
    )
    print(
        f"  last diagnostics {figures['final_seconds'] * 1000:.0f} ms after the last edit; "
        f"{len(figures['got'])} findings, equal to `oom-lsp --check --format json`: {figures['equal']}"
    )
    print(f"    codes: {', '.join(row[0] for row in figures['got']) or 'none'}")
    if not figures["equal"]:
        print(f"    server: {figures['got'][:5]}\n    CLI:    {figures['expected'][:5]}")
    print(
        f"  after an undo to the start: {len(figures['undo_got'])} findings "
        f"({', '.join(row[0] for row in figures['undo_got'])}), equal to the CLI's: {figures['undo_equal']}"
    )
    print(
        f"  server RSS after the warm-up {figures['rss_warm'] / 1024:.1f} MiB, at the end "
        f"{figures['rss_end'] / 1024:.1f} MiB: growth {growth:+.1f} %"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--edits", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument(
        "--modes", nargs="+", choices=["push", "pull", "notebook"], default=["push", "pull", "notebook"]
    )
    parser.add_argument(
        "--keystroke-ms", type=float, default=4.0, help="mean time between two edits of a burst (default 4)"
    )
    parser.add_argument(
        "--keep", type=Path, help="copy the texts whose diagnostics differ from the CLI's here"
    )
    parser.add_argument(
        "--server",
        type=Path,
        default=SERVER,
        help="the console script (default: the one next to this Python)",
    )
    args = parser.parse_args()
    # The CLI runs in the workspace (compare): a relative path would not name the console script there.
    args.server = args.server.absolute()
    print(
        f"server: {args.server}; script: {SCRIPT.relative_to(ROOT)} ({SCRIPT.read_text().count(chr(10))} lines)"
    )
    with tempfile.TemporaryDirectory(prefix="oom-lsp-sustained-") as folder:
        workspace = Path(folder)
        (workspace / "pyproject.toml").write_text('[project]\nname = "bench"\n')
        for mode in args.modes:
            figures = await run(mode, args.edits, args.seed, workspace, args.server, args.keystroke_ms / 1000)
            report(figures)
            if args.keep and not figures["equal"]:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"{mode}_final.py").write_text(figures["text"])


if __name__ == "__main__":
    asyncio.run(main())
