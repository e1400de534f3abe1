"""Driving the real server over stdio with pytest-lsp, as a real client would.

The client capabilities are the `initialize` params captured from real
clients (copied from `shared/fixtures/client-capabilities/`, see its README):
VS Code 1.139.1 (pull diagnostics, workspace/configuration, dynamic file
watching, documentChanges), Neovim 0.11.4 (pull, configuration, UTF-8
positions) and Neovim 0.7.2 (push only, no workspace/configuration).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.protocol import default_converter
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES

CAPABILITIES_DIR = Path(__file__).parent / "client_capabilities"
CLIENTS = {
    "vscode-1.139.1": "code-server-4.139.1-vscode-1.139.1",
    "neovim-0.11.4": "neovim-0.11.4",
    "neovim-0.7.2": "neovim-0.7.2",
}
SERVER_COMMAND = [sys.executable, "-m", "oom_lsp"]

# A small training script whose argparse default (line BATCH_LINE, 0-based)
# is the batch size: estimates of it take a few seconds on the CPU.
TRAINING_SCRIPT = textwrap.dedent(
    """\
    import argparse

    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--batch-size", type=int, default=64)
        args = parser.parse_args()
        data = TensorDataset(torch.randn(256, 1024), torch.randint(0, 10, (256,)))
        loader = DataLoader(data, batch_size=args.batch_size)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


    if __name__ == "__main__":
        main()
    """
)
BATCH_LINE = 8
# What a test waits for an answer before it fails. An AI action's resolve starts the
# user's interpreter to read its torch version: seconds on a loaded machine.
TIMEOUT_S = 60.0

_converter = get_converter()


def real_initialize_params(client: str) -> types.InitializeParams:
    """The client's captured params, its capabilities and clientInfo included."""
    data = json.loads((CAPABILITIES_DIR / f"{CLIENTS[client]}.initialize.json").read_text())
    return _converter.structure(data, types.InitializeParams)


def _make_client() -> LanguageClient:
    """pytest-lsp's client, but recording every publishDiagnostics with its
    version (its default handler keeps only the latest list per URI)."""
    client = LanguageClient(converter_factory=default_converter)
    client.published = []
    client.applied_edits = []
    for method, handler in DEFAULT_CLIENT_FEATURES.items():
        if method != types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS:
            client.feature(method)(handler)

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def record(params: types.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        client.published.append(params)

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def register_capability(params: types.RegistrationParams) -> None:
        client.registrations = [*getattr(client, "registrations", []), *params.registrations]

    return client


CONFIG = ClientServerConfig(server_command=SERVER_COMMAND, client_factory=_make_client)


async def start_session(
    client: LanguageClient,
    client_name: str,
    root: Path,
    *,
    initialization_options: dict[str, Any] | None = None,
    configuration: dict[str, Any] | None = None,
    adjust: Callable[[types.InitializeParams], None] | None = None,
) -> types.InitializeResult:
    """initialize + initialized with a real client's capabilities (changed by
    `adjust` where a test needs a client that differs); the `configuration`
    answers workspace/configuration (section oomLsp)."""
    if configuration is not None:
        client.set_configuration(configuration, section="oomLsp")
    params = real_initialize_params(client_name)
    if adjust is not None:
        adjust(params)
    params.root_uri = root.as_uri()
    params.root_path = str(root)
    params.workspace_folders = [types.WorkspaceFolder(uri=root.as_uri(), name=root.name)]
    params.initialization_options = initialization_options
    return await client.initialize_session(params)


def pulls(client: LanguageClient) -> bool:
    return client.capabilities is not None and client.capabilities.text_document.diagnostic is not None


def open_document(client: LanguageClient, uri: str, text: str, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        )
    )


def replace_text(client: LanguageClient, uri: str, version: int, text: str) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def close_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


async def wait_for_published(
    client: LanguageClient, uri: str, version: int | None, since: int = 0
) -> types.PublishDiagnosticsParams:
    """The first publishDiagnostics for (uri, version) recorded at index >= since."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while True:
        for params in client.published[since:]:
            if params.uri == uri and params.version == version:
                return params
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"no diagnostics for {uri} version {version}; got {client.published[since:]}"
            )
        await asyncio.sleep(0.02)


async def diagnostics_for(
    client: LanguageClient, uri: str, version: int, since: int = 0
) -> list[types.Diagnostic]:
    """The diagnostics of that version: pulled when the client pulls, else
    the pushed ones for exactly that version."""
    if pulls(client):
        report = await asyncio.wait_for(
            client.text_document_diagnostic_async(
                types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
            ),
            TIMEOUT_S,
        )
        assert report.kind == "full"
        return list(report.items)
    return list((await wait_for_published(client, uri, version, since)).diagnostics)


def codes(diagnostics: list[types.Diagnostic]) -> list[str]:
    return [str(diagnostic.code) for diagnostic in diagnostics]


def edits_of(action: types.CodeAction, uri: str) -> list[types.TextEdit]:
    """The text edits of an action for one document, whichever form the
    server chose for this client."""
    assert action.edit is not None
    if action.edit.document_changes is not None:
        changes = [change for change in action.edit.document_changes if change.text_document.uri == uri]
        return [edit for change in changes for edit in change.edits]
    assert action.edit.changes is not None
    return list(action.edit.changes[uri])


# The LSP's lines, written out here rather than imported from the server: this is
# the client's side of the contract (only \n, \r\n and \r end a line; a form feed
# or U+2028 does not, whatever str.splitlines says).
_CLIENT_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def apply_text_edits(text: str, edits: list[types.TextEdit], encoding: str = "utf-16") -> str:
    """Apply LSP edits as a client does (positions in the given encoding)."""
    lines = _CLIENT_LINE_RE.findall(text)

    def offset(position: types.Position) -> int:
        if position.line >= len(lines):
            return len(text)
        line = lines[position.line]
        units = 0
        for index, char in enumerate(line):
            if units >= position.character:
                return sum(len(previous) for previous in lines[: position.line]) + index
            if encoding == "utf-8":
                units += len(char.encode("utf-8"))
            elif encoding == "utf-16":
                units += len(char.encode("utf-16-le")) // 2
            else:
                units += 1
        return sum(len(previous) for previous in lines[: position.line]) + len(line.rstrip("\r\n"))

    spans = sorted(
        ((offset(edit.range.start), offset(edit.range.end), edit.new_text) for edit in edits), reverse=True
    )
    for start, end, new_text in spans:
        text = text[:start] + new_text + text[end:]
    return text
