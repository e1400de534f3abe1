"""Editor latency benchmark: from `didChange` to the diagnostics of that version.

A benchmark, not a test: it prints figures and never asserts on them.

For fixtures of about 200, 1,000 and 5,000 lines (the risky training scripts
of fixtures/ repeated until long enough), it starts the real server over
stdio (`python -m oom_lsp`), opens the file and makes N edits, one at a time
(a comment line inserted in the middle of the file, then removed again: the
file is re-checked whole either way). For each edit it times:

- push: `didChange` -> the `publishDiagnostics` carrying that version, with
  the debounce set to 0 (a client without pull diagnostics: Neovim 0.7);
- pull: `didChange` + `textDocument/diagnostic` -> its answer (VS Code,
  Neovim 0.11);

and prints p50 / p95 next to, on the same texts in the same run,
`libcst.parse_module` alone and the in-process analysis
(`oom_lsp.analysis.analyze`), with a whole parse and with the server's
incremental parse (only the top-level statements an edit touched are parsed
again), so the server's own overhead is visible. The first check after
`didOpen` parses every statement: its time is printed too.
Goals: p95 <= 100 ms at 1,000 lines; the pipeline at most 3x the bare parse.
The default 75 ms debounce (`oomLsp.debounceMs`) comes on top in push mode.

Ruff's server (`ruff server`, the bench extra) gets the same edits of the same
texts in the same run, push and pull, its rows printed under oom-lsp's with the
ratio of the p95s (oom-lsp / Ruff); in the notebook it gets the same
`notebookDocument/didChange` (push: Ruff pushes a notebook's cells). `--no-ruff`
skips it.

Then a notebook of 50 code cells made of the same 1,000-line text (cut at
top-level statements), opened with LSP 3.17 notebook sync as VS Code does,
with N edits in its middle cell (a comment line inserted at the top of the
cell, then removed: the cell's findings move by a line each time). It times
`notebookDocument/didChange` -> the pushed diagnostics of the edited cell's
new version (push: a client without pull diagnostics; pull: a client with
them, which also pulls the edited cell after each change, as VS Code does;
cells are always pushed, a pull answers empty), next to `analyze_cells` in
process with a whole parse and as the server does (`IncrementalNotebook`:
only the edited cell is masked, compiled and parsed again).
Goal: p95 <= 150 ms for the 50-cell notebook.

    .venv/bin/python bench/lsp_latency.py [--edits 30] [--sizes 200 1000 5000] [--cells 50] [--no-ruff]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import libcst
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from oom_lsp.analysis import analyze, default_settings
from oom_lsp.analysis.incremental import IncrementalParser
from oom_lsp.gc_tuning import tune_for_analysis
from oom_lsp.notebooks.program import CellText, IncrementalNotebook, analyze_cells

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def realistic_text(lines: int) -> str:
    """Risky training scripts from fixtures/, repeated up to about `lines`."""
    sources = [path.read_text() for path in sorted(FIXTURES.glob("*_risky.py"))]
    if not sources:
        raise SystemExit(f"no *_risky.py training scripts in {FIXTURES}")
    chunks: list[str] = []
    total = 0
    index = 0
    while total < lines:
        source = sources[index % len(sources)]
        chunks.append(source if source.endswith("\n") else source + "\n")
        total += source.count("\n") + 1
        index += 1
    return "\n".join(chunks)


def edited(text: str, edit: int, middle: int) -> tuple[str, types.TextDocumentContentChangePartial]:
    """Edit number `edit`: even ones insert a comment line before line
    `middle`, odd ones remove it again."""
    start = types.Position(line=middle, character=0)
    if edit % 2 == 0:
        inserted = f"# edit {edit}\n"
        change = types.TextDocumentContentChangePartial(
            range=types.Range(start=start, end=start), text=inserted
        )
        lines = text.splitlines(keepends=True)
        return "".join([*lines[:middle], inserted, *lines[middle:]]), change
    end = types.Position(line=middle + 1, character=0)
    change = types.TextDocumentContentChangePartial(range=types.Range(start=start, end=end), text="")
    lines = text.splitlines(keepends=True)
    return "".join([*lines[:middle], *lines[middle + 1 :]]), change


def middle_line(text: str) -> int:
    return text.count("\n") // 2


def oom_lsp_command() -> list[str]:
    return [sys.executable, "-m", "oom_lsp"]


def ruff_command() -> list[str] | None:
    """`ruff server` beside this interpreter (the bench extra), else on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.exists() else shutil.which("ruff")
    return [found, "server"] if found else None


def is_ruff(command: list[str]) -> bool:
    return command[-1] == "server"


def new_client() -> LanguageClient:
    client = LanguageClient("oom-lsp-bench", "1")
    # lsprotocol cannot read back the `notebookSelector` of Ruff's answer to `initialize`
    # (`{"notebook": "*"}`); the bench reads nothing in it.
    client.protocol._converter.register_structure_hook(types.NotebookDocumentSyncOptions, lambda obj, _: None)
    return client


def init_options(command: list[str]) -> dict:
    """No debounce: oom-lsp's `debounceMs` 0; Ruff's server has none."""
    return {} if is_ruff(command) else {"debounceMs": 0}


class Arrivals:
    """The diagnostics pushed for each document: by (uri, version), and the count per uri (Ruff
    pushes a notebook cell's diagnostics with the notebook's version, not the cell's)."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, int | None], asyncio.Event] = {}
        self.counts: dict[str, int] = {}
        self.changed = asyncio.Event()

    def arrived(self, params: types.PublishDiagnosticsParams) -> None:
        self.versions.setdefault((params.uri, params.version), asyncio.Event()).set()
        self.counts[params.uri] = self.counts.get(params.uri, 0) + 1
        self.changed.set()
        self.changed = asyncio.Event()

    async def version(self, uri: str, version: int) -> None:
        await asyncio.wait_for(self.versions.setdefault((uri, version), asyncio.Event()).wait(), 120)

    async def after(self, uri: str, count: int) -> None:
        """The first publication for `uri` past its `count`-th."""
        while self.counts.get(uri, 0) <= count:
            await asyncio.wait_for(self.changed.wait(), 120)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def capabilities(pull: bool) -> types.ClientCapabilities:
    text_document = types.TextDocumentClientCapabilities(
        publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
        diagnostic=types.DiagnosticClientCapabilities() if pull else None,
    )
    return types.ClientCapabilities(text_document=text_document)


async def measure_server(
    text: str, edits: int, pull: bool, workspace: Path, command: list[str]
) -> tuple[float, list[float]]:
    """(didOpen -> its diagnostics, [didChange -> its diagnostics, ...])"""
    client = new_client()
    arrivals = Arrivals()
    client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(lambda params: arrivals.arrived(params))

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        pass

    await client.start_io(*command)
    await client.initialize_async(
        types.InitializeParams(
            capabilities=capabilities(pull),
            root_uri=workspace.as_uri(),
            initialization_options=init_options(command),
        )
    )
    client.initialized(types.InitializedParams())
    uri = (workspace / f"bench_{len(text)}.py").as_uri()
    document = types.TextDocumentIdentifier(uri=uri)
    opened = time.perf_counter()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        )
    )
    if pull:
        await client.text_document_diagnostic_async(types.DocumentDiagnosticParams(text_document=document))
    else:
        await arrivals.version(uri, 1)
    open_seconds = time.perf_counter() - opened
    timings = []
    current = text
    for edit in range(edits):
        version = edit + 2
        current, change = edited(current, edit, middle_line(text))
        started = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[change],
            )
        )
        if pull:
            await client.text_document_diagnostic_async(
                types.DocumentDiagnosticParams(text_document=document)
            )
        else:
            await arrivals.version(uri, version)
        timings.append(time.perf_counter() - started)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return open_seconds, timings


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a running process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_first_diagnostics(text: str, workspace: Path, runs: int = 3) -> str:
    """Time to first diagnostics, as an editor opening its first file sees it: the server
    spawned, `initialize` answered, `initialized`, `didOpen`, then the pulled diagnostics
    (VS Code's and Neovim 0.11's way). Medians of fresh servers; the server's CPU next to
    the wall time (the machine's load inflates the wall time, not the CPU)."""
    phases: dict[str, list[float]] = {"initialize": [], "diagnostics": [], "cpu": []}
    for run in range(runs):
        client = LanguageClient("oom-lsp-bench", "1")

        @client.feature(types.WINDOW_LOG_MESSAGE)
        def on_log(params: types.LogMessageParams) -> None:
            pass

        started = time.perf_counter()
        await client.start_io(sys.executable, "-m", "oom_lsp")
        await client.initialize_async(
            types.InitializeParams(capabilities=capabilities(pull=True), root_uri=workspace.as_uri())
        )
        initialized = time.perf_counter()
        client.initialized(types.InitializedParams())
        uri = (workspace / f"first_{run}.py").as_uri()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
            )
        )
        await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        done = time.perf_counter()
        phases["cpu"].append(_cpu_seconds(client._server.pid))
        phases["initialize"].append(initialized - started)
        phases["diagnostics"].append(done - started)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    first, answered, cpu = (statistics.median(phases[key]) for key in ("diagnostics", "initialize", "cpu"))
    return (
        f"time to first diagnostics: {first * 1000:.0f} ms (initialize answered at {answered * 1000:.0f} ms; "
        f"server CPU {cpu * 1000:.0f} ms), median of {runs} fresh servers"
    )


def measure_in_process(text: str, edits: int) -> tuple[list[float], list[float], list[float]]:
    parse, whole, incremental = [], [], []
    settings = default_settings()
    parser = IncrementalParser()
    analyze(text, settings, "bench.py", parse=parser.parse)
    current = text
    for edit in range(edits):
        current, _ = edited(current, edit, middle_line(text))
        started = time.perf_counter()
        libcst.parse_module(current)
        parse.append(time.perf_counter() - started)
        started = time.perf_counter()
        analyze(current, settings, "bench.py")
        whole.append(time.perf_counter() - started)
        started = time.perf_counter()
        analyze(current, settings, "bench.py", parse=parser.parse)
        incremental.append(time.perf_counter() - started)
    return parse, whole, incremental


def notebook_cells(text: str, count: int) -> list[str]:
    """`text` cut into `count` cells of about the same number of top-level
    statements (a decorator stays with its function)."""
    lines = text.splitlines(keepends=True)
    starts = []
    for statement in ast.parse(text).body:
        decorators = getattr(statement, "decorator_list", None) or []
        starts.append(min([statement.lineno, *(decorator.lineno for decorator in decorators)]))
    count = min(count, len(starts))
    cuts = sorted({1, *(starts[round(index * len(starts) / count)] for index in range(1, count))})
    return ["".join(lines[start - 1 : end - 1]) for start, end in zip(cuts, [*cuts[1:], len(lines) + 1])]


def edited_cell(source: str, edit: int) -> tuple[str, types.TextDocumentContentChangePartial]:
    """Edit number `edit` of a cell: even ones insert a comment line at its
    top, odd ones remove it again."""
    start = types.Position(line=0, character=0)
    if edit % 2 == 0:
        inserted = f"# edit {edit}\n"
        return inserted + source, types.TextDocumentContentChangePartial(
            range=types.Range(start=start, end=start), text=inserted
        )
    end = types.Position(line=1, character=0)
    return source.split("\n", 1)[1], types.TextDocumentContentChangePartial(
        range=types.Range(start=start, end=end), text=""
    )


async def measure_notebook_server(
    cells: list[str], edits: int, pull: bool, workspace: Path, command: list[str]
) -> tuple[float, list[float]]:
    """(didOpen -> the diagnostics of every cell, [didChange -> the edited cell's diagnostics, ...])

    oom-lsp pushes each cell's diagnostics with the cell's version; Ruff's server with the
    notebook's: for Ruff the edited cell's next publication counts."""
    client = new_client()
    arrivals = Arrivals()
    client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)(lambda params: arrivals.arrived(params))
    by_version = not is_ruff(command)

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        pass

    await client.start_io(*command)
    await client.initialize_async(
        types.InitializeParams(
            capabilities=capabilities(pull),
            root_uri=workspace.as_uri(),
            initialization_options=init_options(command),
        )
    )
    client.initialized(types.InitializedParams())
    notebook = (workspace / f"bench_{len(cells)}.ipynb").as_uri()
    uris = [
        f"vscode-notebook-cell:{notebook.removeprefix('file://')}#W{index}" for index in range(len(cells))
    ]
    opened = time.perf_counter()
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook,
                notebook_type="jupyter-notebook",
                version=0,
                cells=[types.NotebookCell(kind=types.NotebookCellKind.Code, document=uri) for uri in uris],
            ),
            cell_text_documents=[
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
                for uri, text in zip(uris, cells)
            ],
        )
    )
    for uri in uris:
        if by_version:
            await arrivals.version(uri, 1)
        else:
            await arrivals.after(uri, 0)
    open_seconds = time.perf_counter() - opened
    middle = len(cells) // 2
    uri, current = uris[middle], cells[middle]
    timings = []
    for edit in range(edits):
        version = edit + 2
        current, change = edited_cell(current, edit)
        seen = arrivals.counts.get(uri, 0)
        started = time.perf_counter()
        client.notebook_document_did_change(
            types.DidChangeNotebookDocumentParams(
                notebook_document=types.VersionedNotebookDocumentIdentifier(uri=notebook, version=edit + 1),
                change=types.NotebookDocumentChangeEvent(
                    cells=types.NotebookDocumentCellChanges(
                        text_content=[
                            types.NotebookDocumentCellContentChanges(
                                document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                                changes=[change],
                            )
                        ]
                    )
                ),
            )
        )
        if pull:
            await client.text_document_diagnostic_async(
                types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
            )
        if by_version:
            await arrivals.version(uri, version)
        else:
            await arrivals.after(uri, seen)
        timings.append(time.perf_counter() - started)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return open_seconds, timings


def measure_notebook_in_process(cells: list[str], edits: int) -> tuple[list[float], list[float]]:
    whole, incremental = [], []
    settings = default_settings()
    notebook = IncrementalNotebook()
    texts = [CellText(index, source, index + 1) for index, source in enumerate(cells)]
    notebook.analyze(texts, settings, "bench.ipynb")
    middle = len(cells) // 2
    current = cells[middle]
    for edit in range(edits):
        current, _ = edited_cell(current, edit)
        texts[middle] = CellText(middle, current, middle + 1)
        started = time.perf_counter()
        analyze_cells(texts, settings, "bench.ipynb")
        whole.append(time.perf_counter() - started)
        started = time.perf_counter()
        notebook.analyze(texts, settings, "bench.ipynb")
        incremental.append(time.perf_counter() - started)
    return whole, incremental


def bare_parse(text: str, edits: int) -> list[float]:
    """`libcst.parse_module` of the whole text, `edits` times (the p50/parse column's unit)."""
    timings = []
    for _ in range(edits):
        started = time.perf_counter()
        libcst.parse_module(text)
        timings.append(time.perf_counter() - started)
    return timings


def row(label: str, values: list[float], parse_p50: float) -> str:
    p50, p95 = percentile(values, 0.5) * 1000, percentile(values, 0.95) * 1000
    return f"  {label:<34} p50 {p50:8.1f} ms   p95 {p95:8.1f} ms   p50/parse {p50 / (parse_p50 * 1000):5.2f}x"


def ratio(mode: str, ours: list[float], theirs: list[float]) -> str:
    mine, ruffs = percentile(ours, 0.95) * 1000, percentile(theirs, 0.95) * 1000
    return f"  {mode}: oom-lsp p95 {mine:.1f} ms / Ruff p95 {ruffs:.1f} ms = {mine / ruffs:.1f}x"


def ruff_version(command: list[str]) -> str:
    done = subprocess.run([command[0], "--version"], check=False, capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or "ruff"


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--edits", type=int, default=30, help="edits per fixture and mode (default 30)")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[200, 1000, 5000], help="fixture sizes in lines"
    )
    parser.add_argument(
        "--cells",
        type=int,
        default=50,
        help="code cells of the notebook made of the 1,000-line text (0: none)",
    )
    parser.add_argument("--no-ruff", action="store_true", help="oom-lsp alone, without Ruff's server")
    args = parser.parse_args()
    ours = oom_lsp_command()
    ruff = None if args.no_ruff else ruff_command()
    if ruff is None and not args.no_ruff:
        print("ruff not found (pip install ruff): oom-lsp alone", file=sys.stderr)
    # The server tunes its garbage collector at start; measure the in-process
    # rows (the bare parse included) under the same settings.
    tune_for_analysis()
    with tempfile.TemporaryDirectory(prefix="oom-lsp-bench-") as folder:
        workspace = Path(folder)
        (workspace / "pyproject.toml").write_text('[project]\nname = "bench"\n')
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        versions = f"python {sys.version.split()[0]}, libcst {metadata.version('libcst')}"
        if ruff is not None:
            versions += f", {ruff_version(ruff)}"
        print(f"{versions}, {os.cpu_count()} CPUs, load average {load}")
        print(await measure_first_diagnostics(realistic_text(200), workspace))
        for size in args.sizes:
            text = realistic_text(size)
            findings = analyze(text, default_settings(), "bench.py")
            parse, whole, incremental = measure_in_process(text, args.edits)
            push_open, push = await measure_server(text, args.edits, False, workspace, ours)
            pull_open, pull = await measure_server(text, args.edits, True, workspace, ours)
            parse_p50 = percentile(parse, 0.5)
            print(f"\n{text.count(chr(10))} lines, {len(findings)} findings, {args.edits} edits")
            print(row("libcst.parse_module alone", parse, parse_p50))
            print(row("analyze(), whole parse", whole, parse_p50))
            print(row("analyze(), incremental parse", incremental, parse_p50))
            print(row("server, push (debounce 0)", push, parse_p50))
            print(row("server, pull", pull, parse_p50))
            push_mean, pull_mean = statistics.mean(push) * 1000, statistics.mean(pull) * 1000
            print(f"  mean push {push_mean:.1f} ms, mean pull {pull_mean:.1f} ms")
            print(
                f"  first check after didOpen: push {push_open * 1000:.1f} ms, pull {pull_open * 1000:.1f} ms"
            )
            if ruff is not None:
                _, ruff_push = await measure_server(text, args.edits, False, workspace, ruff)
                _, ruff_pull = await measure_server(text, args.edits, True, workspace, ruff)
                print(row("ruff server, push", ruff_push, parse_p50))
                print(row("ruff server, pull", ruff_pull, parse_p50))
                print(ratio("push", push, ruff_push))
                print(ratio("pull", pull, ruff_pull))
        if args.cells:
            text = realistic_text(1000)
            cells = notebook_cells(text, args.cells)
            texts = [CellText(index, source, index + 1) for index, source in enumerate(cells)]
            findings = analyze_cells(texts, default_settings(), "bench.ipynb").all_findings()
            parse_p50 = percentile(bare_parse(text, args.edits), 0.5)
            whole, incremental = measure_notebook_in_process(cells, args.edits)
            push_open, push = await measure_notebook_server(cells, args.edits, False, workspace, ours)
            pull_open, pull = await measure_notebook_server(cells, args.edits, True, workspace, ours)
            lines = text.count(chr(10))
            print(
                f"\nnotebook: {len(cells)} code cells, {lines} lines, {len(findings)} findings, {args.edits} edits"
            )
            print(row("analyze_cells(), whole parse", whole, parse_p50))
            print(row("IncrementalNotebook.analyze()", incremental, parse_p50))
            print(row("server, push (debounce 0)", push, parse_p50))
            print(row("server, pull", pull, parse_p50))
            print(
                f"  first check after didOpen: push {push_open * 1000:.1f} ms, pull {pull_open * 1000:.1f} ms"
            )
            if ruff is not None:
                _, ruff_push = await measure_notebook_server(cells, args.edits, False, workspace, ruff)
                print(row("ruff server, push", ruff_push, parse_p50))
                print(ratio("push", push, ruff_push))


if __name__ == "__main__":
    asyncio.run(main())
