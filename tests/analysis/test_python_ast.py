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
