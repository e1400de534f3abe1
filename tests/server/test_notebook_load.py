"""Notebook cells under bursts of edits (issue 28, bounded work under load), as
tests/server/test_load.py checks a file's: the real server over stdio with VS Code 1.139.1's
capabilities (the captured client with notebook sync). A notebook's analysis goes through the
server's analysis queue (server/scheduling.py) like a file's: a burst of cell edits with hovers
and code actions between them, on the edited cell and on another one, costs one analysis of
the notebook or a few, not one per request; every request is answered (a result for the
current cells, or ContentModified); the diagnostics published last are the CLI's for the
notebook after the burst.

The analyses are counted from the server's debug log ("Analysed <notebook URI> (N cells): ..."
once per analysis run of a notebook, sent as window/logMessage)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.server.stdio_client import StdioServer, frame
from tests.server.test_load import (
    CONTENT_MODIFIED,
    analyses,
    answer_to,
    change,
    cli_json,
    code_action_at,
    hover_at,
    request,
)

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "cnn_cifar_risky.py"
BURST = 40
EDITED = 0  # the cell typed in: the imports


def script_cells() -> list[str]:
    """The fixture's sections (separated by two blank lines) as cells: 5 cells, its OOM301
    (the loss accumulated with its graph) in the last one."""
    return [cell.strip("\n") for cell in SCRIPT.read_text().split("\n\n\n")]


def cell_uri(notebook_uri: str, index: int) -> str:
    return f"vscode-notebook-cell:{notebook_uri.removeprefix('file://')}#W{index}sZmlsZQ%3D%3D"


def open_notebook(server: StdioServer, name: str, sources: list[str]) -> tuple[str, list[str]]:
    notebook_uri = (server.root / name).as_uri()
    cells = [cell_uri(notebook_uri, index) for index in range(len(sources))]
    server.notify(
        "notebookDocument/didOpen",
        {
            "notebookDocument": {
                "uri": notebook_uri,
                "notebookType": "jupyter-notebook",
                "version": 0,
                "cells": [{"kind": 2, "document": uri} for uri in cells],
            },
            "cellTextDocuments": [
                {"uri": uri, "languageId": "python", "version": 1, "text": text}
                for uri, text in zip(cells, sources)
            ],
        },
    )
    return notebook_uri, cells


def cell_change(
    notebook_uri: str,
    version: int,
    cell: str,
    cell_version: int,
    line: int,
    text: str,
    end: int | None = None,
) -> dict[str, Any]:
    """A cell's text edited in place, as VS Code's notebook editor sends it: the edit a file's
    didChange carries (test_load.change), inside the notebook's."""
    edit = change(cell, cell_version, line, text, end)["params"]
    return {
        "jsonrpc": "2.0",
        "method": "notebookDocument/didChange",
        "params": {
            "notebookDocument": {"uri": notebook_uri, "version": version},
            "change": {
                "cells": {
                    "textContent": [{"document": edit["textDocument"], "changes": edit["contentChanges"]}]
                }
            },
        },
    }


def publications(server: StdioServer, uri: str, since: int = 0) -> list[dict[str, Any]]:
    return [
        message["params"]
        for message in server.received[since:]
        if message.get("method") == "textDocument/publishDiagnostics" and message["params"]["uri"] == uri
    ]


def published_version(server: StdioServer, uri: str, version: int) -> None:
    """Waits for the publication of the cell's `version` (perhaps already received)."""

    def of_version(message: dict[str, Any]) -> bool:
        params = message.get("params") or {}
        return (
            message.get("method") == "textDocument/publishDiagnostics"
            and params.get("uri") == uri
            and params.get("version") == version
        )

    if not any(of_version(message) for message in server.received):
        server.wait_for(of_version, 60)


def lsp_findings(server: StdioServer, cells: list[str]) -> list[tuple[int, str, int, int]]:
    """(1-based cell, code, line, column) of the last diagnostics published for each cell."""
    found = []
    for number, uri in enumerate(cells, start=1):
        published = publications(server, uri)
        for diagnostic in published[-1]["diagnostics"] if published else []:
            start = diagnostic["range"]["start"]
            found.append((number, diagnostic["code"], start["line"] + 1, start["character"] + 1))
    return sorted(found)


def cli_findings(folder: Path, name: str, sources: list[str]) -> list[tuple[int, str, int, int]]:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(notebook, folder / name)
    return sorted((f["cell"], f["code"], f["line"], f["column"]) for f in cli_json(folder, name))


def notebook_analyses(server: StdioServer, notebook_uri: str) -> list[str]:
    return [line for line in analyses(server) if line.startswith(f"Analysed {notebook_uri} ")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    root = tmp_path_factory.mktemp("notebook-load")
    (root / "pyproject.toml").write_text('[project]\nname = "notebook-load"\n')
    running = StdioServer(root, settings={"debounceMs": 0, "logLevel": "debug"})
    running.initialize("vscode-1.139.1")
    yield running
    running.close()


def test_a_burst_of_cell_edits_costs_one_analysis_and_every_request_is_answered(server: StdioServer) -> None:
    sources = script_cells()
    notebook, cells = open_notebook(server, "burst.ipynb", sources)
    last = cells[-1]
    accumulated = next(
        index for index, line in enumerate(sources[-1].splitlines()) if "total_loss +=" in line
    )
    published_version(server, last, 1)
    assert lsp_findings(server, cells) == cli_findings(server.root, "opened.ipynb", sources)
    before, received_before = len(notebook_analyses(server, notebook)), len(server.received)
    # BURST edits of the first cell (a comment line inserted, then removed again...), with a
    # hover and a code action on the last cell (not edited: its requests are not answered
    # ContentModified by the edit, so each would analyse the notebook again if nothing
    # bounded the work) and a hover on the edited cell after each: one write, as a fast
    # typist's editor sends them.
    lines = sources[EDITED].splitlines(keepends=True)
    messages: list[dict[str, Any]] = []
    ids: list[int] = []
    for index in range(BURST):
        version = 2 + index
        if index % 2 == 0:
            messages.append(cell_change(notebook, version, cells[EDITED], version, 2, f"# edit {index}\n"))
            lines.insert(2, f"# edit {index}\n")
        else:
            messages.append(cell_change(notebook, version, cells[EDITED], version, 2, "", end=3))
            del lines[2]
        for uri, method, params in (
            (last, "textDocument/hover", hover_at(accumulated, 10)),
            (last, "textDocument/codeAction", code_action_at(accumulated)),
            (cells[EDITED], "textDocument/hover", hover_at(0, 8)),
        ):
            msg_id = server.next_id()
            ids.append(msg_id)
            messages.append(request(msg_id, method, uri, **params))
    final_version = 2 + BURST
    messages.append(cell_change(notebook, final_version, cells[EDITED], final_version, 0, "# the end\n"))
    lines.insert(0, "# the end\n")
    server.write(b"".join(frame(message) for message in messages))

    answers = [answer_to(server, msg_id) for msg_id in ids]
    for answer in answers:
        assert "result" in answer or answer["error"]["code"] == CONTENT_MODIFIED, answer
    # The last cell's hover, answered with a result, is the current one: OOM301's summary.
    hovers = [answer for answer in answers[0::3] if "result" in answer]
    for hover in hovers:
        assert "OOM301" in json.dumps(hover["result"]), hover

    published_version(server, cells[EDITED], final_version)
    final = [*sources]
    final[EDITED] = "".join(lines)
    assert lsp_findings(server, cells) == cli_findings(server.root, "final.ipynb", final)
    # One analysis of the notebook for the cells after the burst (and perhaps one or three
    # that had started, or were asked for between the pieces the server read): not one per
    # request (120) or per edit (41).
    during = notebook_analyses(server, notebook)[before:]
    assert 1 <= len(during) <= 4, during
    # The edited cell's publications, newest last: none for a version a newer one replaced
    # after it.
    versions = [params["version"] for params in publications(server, cells[EDITED], received_before)]
    assert versions == sorted(versions) and versions[-1] == final_version, versions
    assert len(versions) <= len(during), (versions, during)


def test_requests_on_a_cell_edited_under_them_are_answered_content_modified(server: StdioServer) -> None:
    """Requests written together with the cell's edit that follows them: answered
    ContentModified at once, without analysing; a request on another cell is answered for the
    notebook as it is now (or ContentModified when the edit replaced its analysis)."""
    sources = script_cells()
    notebook, cells = open_notebook(server, "modified.ipynb", sources)
    published_version(server, cells[-1], 1)
    edited_ids = [server.next_id() for _ in range(5)]
    other_id = server.next_id()
    messages = [
        request(msg_id, "textDocument/hover", cells[EDITED], **hover_at(0, 8)) for msg_id in edited_ids
    ]
    accumulated = next(
        index for index, line in enumerate(sources[-1].splitlines()) if "total_loss +=" in line
    )
    messages.append(request(other_id, "textDocument/hover", cells[-1], **hover_at(accumulated, 10)))
    messages.append(cell_change(notebook, 2, cells[EDITED], 2, 0, "# typed\n"))
    before = len(notebook_analyses(server, notebook))
    server.write(b"".join(frame(message) for message in messages))
    answers = [answer_to(server, msg_id) for msg_id in edited_ids]
    assert [answer.get("error", {}).get("code") for answer in answers] == [CONTENT_MODIFIED] * 5, answers
    other = answer_to(server, other_id)
    if "error" in other:
        assert other["error"]["code"] == CONTENT_MODIFIED, other
    else:
        assert "OOM301" in json.dumps(other["result"]), other
    # The server goes on: the edited cell's next hover is answered, after one analysis or two.
    fresh = server.call(
        "textDocument/hover", {"textDocument": {"uri": cells[EDITED]}, **hover_at(1, 8)}, timeout=60
    )
    assert "result" in fresh, fresh
    assert 1 <= len(notebook_analyses(server, notebook)) - before <= 2
