"""`oom_guard`: catch the evidence of an out-of-memory error at the moment it exists.

    from oom_lsp.runtime import oom_guard

    with oom_guard():                 # or oom_guard(record_history=True, ask=True, project_root=...)
        train(model, loader)

    @oom_guard                        # or @oom_guard(...)
    def train(model, loader): ...

When a `torch.OutOfMemoryError` (or a RuntimeError whose message is a CUDA/HIP/MPS/CPU
allocator OOM, the form of torch < 2.0) leaves the guarded code, the guard writes the report
(oom_lsp.runtime.capture) and lets the SAME exception object continue with its traceback
untouched: `__exit__` returns False, nothing is wrapped or chained. Any other exception, and
a normal exit, cost one comparison.

Decorating a coroutine function guards each awaited call. Generator and async generator
functions are refused: their body runs after the call has returned, outside the wrapper,
so put `with oom_guard():` inside them instead.

Importing this module imports neither torch nor libcst; the recording imports them only
when an OOM has happened.
"""

from __future__ import annotations

import functools
import inspect
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_HISTORY_ENTRIES = 100_000
_last_recorded: tuple[int, int] | None = None  # (id of the exception, id of its innermost traceback entry)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def is_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    from oom_lsp.profiling.oom_messages import parse_message

    return parse_message(str(exc)) is not None


class OomGuard:
    """A context manager (and, called on a function, a decorator) that records OOMs.

    project_root: where `.oom_lsp/last_oom/` goes (default: OOM_LSP_PROJECT_ROOT, else the
        nearest folder with a pyproject.toml or .git above the script).
    out: the folder to write to instead of `<root>/.oom_lsp/last_oom`.
    record_history: turn on `torch.cuda.memory._record_memory_history` at entry (CUDA only)
        and dump a snapshot beside the report on an OOM; turned off again at exit.
    ask: with `[tool.oom-lsp.llm] enabled = true`, ask the model for a diagnosis and write
        it to answer.md. The code is never edited.
    log: where the guard's one-line messages go (default: stderr).
    """

    def __init__(
        self,
        *,
        project_root: str | Path | None = None,
        out: str | Path | None = None,
        record_history: bool = False,
        history_entries: int = DEFAULT_HISTORY_ENTRIES,
        ask: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.project_root = Path(project_root) if project_root is not None else None
        self.out = Path(out) if out is not None else None
        self.record_history = record_history
        self.history_entries = history_entries
        self.ask = ask
        self.log = log or _stderr
        self.report_path: Path | None = None  # set once a report has been written
        self._history_on = False

    def _options(self) -> dict[str, Any]:
        return {
            "project_root": self.project_root,
            "out": self.out,
            "record_history": self.record_history,
            "history_entries": self.history_entries,
            "ask": self.ask,
            "log": self.log,
        }

    def __enter__(self) -> OomGuard:
        if self.record_history:
            self._history_on = _start_history(self.history_entries, self.log)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and is_out_of_memory(exc):
            self._record(exc)
        if self._history_on:
            _stop_history(self.log)
            self._history_on = False
        return False  # re-raise the original exception, traceback and all

    def _record(self, exc: BaseException) -> None:
        global _last_recorded
        # Nested guards (a decorated function called inside `with oom_guard()`) see the same
        # exception: record it once. Exceptions take no weak references and a strong one would keep
        # the failing frames (and their tensors) alive, so identify it by its id and the id of its
        # innermost traceback entry, which it keeps alive as long as it lives.
        innermost = exc.__traceback__
        while innermost is not None and innermost.tb_next is not None:
            innermost = innermost.tb_next
        identity = (id(exc), id(innermost))
        if identity == _last_recorded:
            return
        _last_recorded = identity
        from oom_lsp.runtime.capture import CaptureOptions, record_oom

        options = CaptureOptions(
            project_root=self.project_root,
            out=self.out,
            snapshot=self._history_on,
            ask=self.ask,
            log=self.log,
        )
        try:
            self.report_path = record_oom(exc, options)
        except Exception:  # noqa: BLE001 - a bug in the recording must never replace the user's OOM
            self.log(
                "oom-lsp: could not write the out-of-memory report (the OOM itself follows):\n"
                + traceback.format_exc()
            )

    def __call__(self, func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"oom_guard cannot decorate the generator {func.__qualname__}: its body runs after the call "
                "returns; put `with oom_guard():` inside it instead"
            )
        options = self._options()
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def guarded_coroutine(*args: Any, **kwargs: Any) -> Any:
                with OomGuard(**options):
                    return await func(*args, **kwargs)

            return guarded_coroutine  # type: ignore[return-value]

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with OomGuard(**options):  # a guard per call: re-entrant and thread-safe
                return func(*args, **kwargs)

        return guarded  # type: ignore[return-value]


def oom_guard(func: F | None = None, /, **options: Any) -> Any:
    """`with oom_guard(...):`, `@oom_guard` or `@oom_guard(...)`; see OomGuard for the options."""
    if func is not None:
        if not callable(func):
            raise TypeError("oom_guard takes keyword options only: oom_guard(record_history=True, ...)")
        return OomGuard(**options)(func)
    return OomGuard(**options)


def _start_history(entries: int, log: Callable[[str], None]) -> bool:
    import torch

    if not torch.cuda.is_available():
        log("oom-lsp: record_history=True needs a CUDA device; no memory history is recorded")
        return False
    torch.cuda.memory._record_memory_history(max_entries=entries)
    return True


def _stop_history(log: Callable[[str], None]) -> None:
    import torch

    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except RuntimeError as problem:  # the CUDA context is gone (a fatal CUDA error): nothing to stop
        log(f"oom-lsp: could not stop the memory history: {problem}")
