"""Generated inputs that have killed, or could kill, a parser: nesting of every kind to
100,000 levels, lines of hundreds of kilobytes, every byte value, notebooks of random JSON
(and of nbformat with such cells). Deterministic for a seed. bench/fuzz_inputs.py runs the
whole corpus through `oom-lsp --check` and the server; tests/test_fuzz_inputs.py a part.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

DEPTHS = (10, 199, 201, 500, 1_500, 3_000, 10_000, 100_000)

NESTINGS: dict[str, Callable[[int], str]] = {
    "parens": lambda n: "x = " + "(" * n + "1" + ")" * n,
    "lists": lambda n: "x = " + "[" * n + "]" * n,
    "dicts": lambda n: "x = " + "{1: " * n + "1" + "}" * n,
    "calls": lambda n: "x = f" + "(" * n + ")" * n,
    "unary": lambda n: "x = " + "-" * n + "y",
    "not": lambda n: "x = " + "not " * n + "y",
    "attributes": lambda n: "x = y" + ".a" * n,
    "subscripts": lambda n: "x = y" + "[0]" * n,
    "chained_calls": lambda n: "x = y" + "()" * n,
    "power": lambda n: "x = " + "**".join(["y"] * n),
    "sum": lambda n: "x = " + "+".join(["y"] * n),
    "lambdas": lambda n: "x = " + "lambda: " * n + "y",
    "conditionals": lambda n: "x = " + "y if z else " * n + "y",
    "fstrings": lambda n: "x = " + "f'{" * min(n, 50) + "y" + "}'" * min(n, 50) + " + (" * n + "1" + ")" * n,
    "blocks": lambda n: "".join(" " * level + "if x:\n" for level in range(min(n, 1_000))) + " " * min(n, 1_000) + "pass",
    "unclosed": lambda n: "x = " + "(" * n,
    "unopened": lambda n: "x = 1" + ")" * n,
}


def _nesting_files() -> Iterator[tuple[str, str]]:
    for kind, make in NESTINGS.items():
        for depth in DEPTHS:
            yield f"nest_{kind}_{depth}.py", "import torch\n" + make(depth) + "\n"
        # Deep nesting after an ordinary syntax error, which CPython reports first.
        yield f"nest_{kind}_after_error.py", "import torch\ndef broken(:\n" + make(20_000) + "\n"


def _huge_lines() -> Iterator[tuple[str, str]]:
    size = 400_000
    yield "line_name.py", "import torch\nx = " + "a" * size + "\n"
    yield "line_string.py", "import torch\nx = '" + "b" * size + "'\n"
    yield "line_tuple.py", "import torch\nx = " + ", ".join(["1"] * (size // 3)) + "\n"
    yield "line_comment.py", "import torch\n#" + "c" * size + "\n"
    yield "line_calls.py", "import torch\n" + "; ".join(["torch.cat([x])"] * (size // 15)) + "\n"
    yield "line_no_newline.py", "import torch\nx = [" + "1," * (size // 2) + "]"


def _byte_files(generator: random.Random) -> Iterator[tuple[str, bytes]]:
    for value in range(256):
        yield f"byte_{value:03d}.py", b"import torch\nx = 1" + bytes([value]) * 64 + b"\nloss.backward()\n"
    every = bytes(range(256))
    yield "bytes_every.py", every * 16
    yield "bytes_every_after_code.py", b"import torch\n" + every * 16
    for index in range(8):
        yield f"bytes_random_{index}.py", bytes(generator.randrange(256) for _ in range(4_096))
    yield "bytes_bom_and_cookie.py", b"\xef\xbb\xbf# -*- coding: latin-1 -*-\nimport torch\n"
    yield "bytes_unknown_cookie.py", b"# -*- coding: no-such-codec -*-\nimport torch\n"
    yield "bytes_utf16.py", "import torch\nx = 1\n".encode("utf-16")


def _random_json(generator: random.Random, depth: int = 0) -> object:
    kinds = ["null", "bool", "int", "float", "string", "list", "dict"] if depth < 6 else ["string", "int"]
    kind = generator.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return generator.random() < 0.5
    if kind == "int":
        return generator.choice([0, -1, 2**63, 10**400, generator.randrange(-1000, 1000)])
    if kind == "float":
        return generator.choice([0.5, -1e308, 1e-320])
    if kind == "string":
        return "".join(chr(generator.randrange(0x20, 0x2FFF)) for _ in range(generator.randrange(0, 40)))
    if kind == "list":
        return [_random_json(generator, depth + 1) for _ in range(generator.randrange(0, 5))]
    keys = ["cells", "source", "cell_type", "metadata", "nbformat", "nbformat_minor", "outputs", "x"]
    return {generator.choice(keys): _random_json(generator, depth + 1) for _ in range(generator.randrange(0, 5))}


def _notebooks(generator: random.Random) -> Iterator[tuple[str, str | bytes]]:
    for index in range(40):
        yield f"nb_random_{index}.ipynb", json.dumps(_random_json(generator))
    for index in range(20):  # nbformat's shape, random values inside
        cells = [
            {
                "cell_type": generator.choice(["code", "markdown", "raw", 7, None]),
                "source": generator.choice(
                    [_random_json(generator), "import torch\nx = 1\n", ["import torch\n", 3], None]
                ),
                "metadata": generator.choice([{}, [], None, "x"]),
                "outputs": generator.choice([[], None, {}]),
            }
            for _ in range(generator.randrange(0, 6))
        ]
        document = {"cells": cells, "metadata": {}, "nbformat": generator.choice([4, 3, "4", None]), "nbformat_minor": 5}
        yield f"nb_shaped_{index}.ipynb", json.dumps(document)
    for kind in ("parens", "subscripts", "unary"):
        source = "import torch\n" + NESTINGS[kind](100_000)
        yield f"nb_deep_{kind}.ipynb", json.dumps(code_notebook([source, "loss.backward()\n"]))
    yield "nb_deep_json.ipynb", "[" * 100_000 + "]" * 100_000
    yield "nb_not_utf8.ipynb", b'{"cells": [\xff\xfe]}'
    yield "nb_truncated.ipynb", json.dumps(code_notebook(["import torch\n"]))[:-7]


def code_notebook(sources: list[str]) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}
            for source in sources
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def corpus(seed: int = 28) -> Iterator[tuple[str, str | bytes]]:
    """(file name, content) of every generated input."""
    generator = random.Random(seed)
    yield from _nesting_files()
    yield from _huge_lines()
    yield from _byte_files(generator)
    yield from _notebooks(generator)


def write_corpus(folder: Path, seed: int = 28, only: Callable[[str], bool] | None = None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in corpus(seed):
        if only is not None and not only(name):
            continue
        path = folder / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


def _notebook_cells(raw: bytes) -> list[str] | None:
    """The code cells an editor would show of a file, or None when no editor opens it as a
    notebook (not JSON, not nbformat's shape)."""
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    cells = document.get("cells") if isinstance(document, dict) else None
    if not isinstance(cells, list):
        return None
    sources = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source")
        if isinstance(source, list):
            source = "".join(part for part in source if isinstance(part, str))
        sources.append(source if isinstance(source, str) else "")
    return sources


def open_each_in_server(files: list[Path], root: Path, timeout: float = 120) -> dict:
    """Open every file in the real server over stdio, as an editor would (a .py as a text
    document, an .ipynb that an editor can open as a notebook with its code cells), then
    ask for its diagnostics and a hover and close it. The server must be alive and answer
    after every file; a death is counted and the server started again."""
    import time

    from tests.server.stdio_client import StdioServer

    outcome: dict = {"opened": 0, "skipped": 0, "deaths": [], "unanswered": [], "slowest": (0.0, "")}

    def start() -> StdioServer:
        server = StdioServer(root, settings={"debounceMs": 0})
        server.initialize()
        return server

    server = start()
    try:
        for path in files:
            raw = path.read_bytes()
            started = time.perf_counter()
            try:
                if path.suffix == ".ipynb":
                    cells = _notebook_cells(raw)
                    if cells is None:
                        outcome["skipped"] += 1
                        continue
                    uri = path.as_uri()
                    cell_uris = [f"vscode-notebook-cell:{path}#W{index}" for index in range(len(cells))]
                    server.notify(
                        "notebookDocument/didOpen",
                        {
                            "notebookDocument": {
                                "uri": uri,
                                "notebookType": "jupyter-notebook",
                                "version": 0,
                                "cells": [{"kind": 2, "document": cell} for cell in cell_uris],
                            },
                            "cellTextDocuments": [
                                {"uri": cell, "languageId": "python", "version": 1, "text": text}
                                for cell, text in zip(cell_uris, cells)
                            ],
                        },
                    )
                    asked = cell_uris[0] if cell_uris else uri
                    answer = server.call(
                        "textDocument/hover",
                        {"textDocument": {"uri": asked}, "position": {"line": 0, "character": 0}},
                        timeout,
                    )
                    server.notify("notebookDocument/didClose", {"notebookDocument": {"uri": uri}, "cellTextDocuments": [{"uri": cell} for cell in cell_uris]})
                else:
                    uri = server.open(path, raw.decode("utf-8", errors="replace"))
                    server.diagnostics(uri, timeout)
                    answer = server.call(
                        "textDocument/hover",
                        {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}},
                        timeout,
                    )
                    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
                outcome["opened"] += 1
                if "result" not in answer:
                    outcome["unanswered"].append((path.name, answer.get("error")))
            except AssertionError as problem:  # the client's timeout, or the server closed its output
                if server.process.poll() is not None:
                    outcome["deaths"].append((path.name, server.process.returncode))
                    server.close()
                    server = start()
                else:
                    outcome["unanswered"].append((path.name, str(problem)[:200]))
            elapsed = time.perf_counter() - started
            if elapsed > outcome["slowest"][0]:
                outcome["slowest"] = (elapsed, path.name)
            if server.process.poll() is not None:
                outcome["deaths"].append((path.name, server.process.returncode))
                server.close()
                server = start()
        answer = server.call("shutdown")
        outcome["shutdown"] = "result" in answer
        server.notify("exit")
        outcome["exit_code"] = server.exit_code()
    finally:
        server.close()
    return outcome
