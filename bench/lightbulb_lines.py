"""How many lines of a file show a light bulb as the cursor moves over them.

A benchmark, not a test: it prints figures and never asserts on them.

VS Code asks for code actions on every cursor move (`triggerKind` Automatic,
no `only`) and shows a light bulb when any enabled action comes back. This
starts the real server over stdio (`python -m oom_lsp`) with VS Code 1.139.1's
capabilities, opens the file, pulls its diagnostics, then for every line puts
the cursor at its first non-blank character and asks as VS Code does: the
range is the cursor, the context carries the diagnostics touching that line.
It prints how many lines got an action, how many of those have no diagnostic
(a light bulb with nothing wrong on the line), and the titles seen. With
`--invoked` it asks as Ctrl+. does (`triggerKind` Invoked) instead.

    .venv/bin/python bench/lightbulb_lines.py path/to/train.py [--invoked] [-v]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parent.parent
VSCODE_INITIALIZE = (
    ROOT / "tests" / "server" / "client_capabilities" / "code-server-4.139.1-vscode-1.139.1.initialize.json"
)


def vscode_capabilities(client: LanguageClient) -> types.ClientCapabilities:
    raw = json.loads(VSCODE_INITIALIZE.read_text())
    raw = raw.get("params", raw)
    return client.protocol._converter.structure(raw["capabilities"], types.ClientCapabilities)


async def count(path: Path, invoked: bool, verbose: bool) -> None:
    text = path.read_text()
    lines = text.splitlines()
    client = LanguageClient("oom-lsp-lightbulb", "1")

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        pass

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def on_message(params: types.ShowMessageParams) -> None:
        print(f"server: {params.message}", file=sys.stderr)

    @client.feature(types.CLIENT_REGISTER_CAPABILITY)
    def on_register(params: types.RegistrationParams) -> None:
        return None

    @client.feature(types.WORKSPACE_CONFIGURATION)
    def on_configuration(params: types.ConfigurationParams) -> list[object]:
        return [None for _ in params.items]

    await client.start_io(sys.executable, "-m", "oom_lsp")
    with tempfile.TemporaryDirectory(prefix="oom-lsp-lightbulb-") as folder:
        workspace = Path(folder)
        await client.initialize_async(
            types.InitializeParams(capabilities=vscode_capabilities(client), root_uri=workspace.as_uri())
        )
        client.initialized(types.InitializedParams())
        uri = (workspace / path.name).as_uri()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
            )
        )
        document = types.TextDocumentIdentifier(uri=uri)
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=document)
        )
        diagnostics = list(getattr(report, "items", None) or [])
        trigger = types.CodeActionTriggerKind.Invoked if invoked else types.CodeActionTriggerKind.Automatic
        with_action, without_diagnostic = [], []
        titles: collections.Counter[str] = collections.Counter()
        for number, line in enumerate(lines):
            column = len(line) - len(line.lstrip())
            cursor = types.Position(line=number, character=column)
            touching = [d for d in diagnostics if d.range.start.line <= number <= d.range.end.line]
            actions = await client.text_document_code_action_async(
                types.CodeActionParams(
                    text_document=document,
                    range=types.Range(start=cursor, end=cursor),
                    context=types.CodeActionContext(diagnostics=touching, trigger_kind=trigger),
                )
            )
            shown = [a for a in actions or [] if isinstance(a, types.CodeAction) and a.disabled is None]
            if not shown:
                continue
            with_action.append(number + 1)
            if not touching:
                without_diagnostic.append(number + 1)
            titles.update(action.title for action in shown)
            if verbose:
                print(f"{number + 1:5d}: {', '.join(a.title for a in shown)}")
        await client.shutdown_async(None)
        client.exit(None)
    await client.stop()
    request = "invoked (Ctrl+.)" if invoked else "automatic (cursor move)"
    print(f"{path}: {len(lines)} lines, {len(diagnostics)} diagnostics, {request} requests")
    print(f"  lines with a code action: {len(with_action)} of {len(lines)}")
    print(f"  of which with no diagnostic on the line: {len(without_diagnostic)}")
    for title, seen in titles.most_common():
        print(f"  {seen:5d} x {title}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", type=Path)
    parser.add_argument("--invoked", action="store_true", help="ask as Ctrl+. does (triggerKind Invoked)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list each line's actions")
    args = parser.parse_args()
    asyncio.run(count(args.path, args.invoked, args.verbose))


if __name__ == "__main__":
    main()
