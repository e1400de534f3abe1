"""Analyses in several threads at once, as the language server runs them (a big document
has a worker of its own): CPython 3.11 < 3.11.8 and 3.12 < 3.12.2 share the depth count
of their AST conversion between threads, and a garbage collection that runs a finalizer
in the middle of one conversion lets another thread in: `SystemError: AST constructor
recursion depth mismatch`, and the document got no diagnostics (python/cpython#106905)."""

from __future__ import annotations

import gc
import threading
import time

from oom_lsp.analysis import default_settings
from oom_lsp.analysis.incremental import IncrementalParser
from oom_lsp.checker import analyze_text

TEXT = "import torch\n" + "".join(
    f"def step_{n}(model, batch):\n    print(f'step {{n}}', r'\\d')\n    return model(batch) * {n}\n\n"
    for n in range(300)
)


class _Finalized:
    """Freed only by the collector (a cycle), and its finalizer lets other threads run."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def test_analyses_in_threads_do_not_break_each_others_parse() -> None:
    errors: list[BaseException] = []
    stop = time.monotonic() + 4
    thresholds = gc.get_threshold()

    def analyse() -> None:
        parser = IncrementalParser()
        while time.monotonic() < stop and not errors:
            garbage = [_Finalized() for _ in range(20)]
            del garbage
            try:
                analyze_text(TEXT, default_settings(), "train.py", parser.parse)
            except SystemError as error:
                errors.append(error)

    gc.set_threshold(50, 2, 2)  # collections in the middle of the conversions
    try:
        threads = [threading.Thread(target=analyse) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*thresholds)
    assert errors == []


# --- libcst's parse without validating what its own parser built -----------------------------

import libcst as cst  # noqa: E402
import pytest  # noqa: E402

from oom_lsp import python_ast  # noqa: E402


def test_a_parse_does_not_validate_the_nodes_its_parser_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: cst.CSTNode) -> None:
        raise AssertionError("validated")

    text = "loss = model(x)\ntotal += loss  # keep\n"
    expected = cst.parse_module(text)
    monkeypatch.setattr(cst.Name, "_validate", refuse)
    module = python_ast.parse_cst(text)
    assert module.code == text
    assert module.deep_equals(expected)
    with pytest.raises(AssertionError, match="validated"):
        cst.Name("built_by_hand")  # outside a parse: validated


def test_nodes_built_outside_a_parse_are_still_validated() -> None:
    python_ast.parse_cst("x = 1\n")
    with pytest.raises(cst.CSTValidationError):
        cst.SimpleWhitespace("not whitespace")


def test_a_parse_in_one_thread_does_not_switch_off_validation_in_another() -> None:
    python_ast.parse_cst("x = 1\n")  # the hook is installed
    raised: list[BaseException] = []
    python_ast._PARSING.active = True  # this thread is parsing
    try:

        def build() -> None:
            try:
                cst.SimpleWhitespace("not whitespace")
            except cst.CSTValidationError as error:
                raised.append(error)

        thread = threading.Thread(target=build)
        thread.start()
        thread.join()
    finally:
        python_ast._PARSING.active = False
    assert len(raised) == 1
