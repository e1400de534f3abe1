"""`memory_monitor`: the peak memory of each epoch (or each N steps), and a warning when it
keeps growing, the signature of something kept from one step to the next.

    monitor = memory_monitor()                      # every_n_steps=None, log=print
    for epoch in range(epochs):
        for x, y in loader:
            ...
            optimizer.step()
            monitor.step()
        monitor.epoch_end()
    # Lightning: Trainer(callbacks=[monitor.lightning_callback()])
    # Hugging Face: Trainer(..., callbacks=[monitor.huggingface_callback()])

What is measured:

* CUDA: `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` over the window, then
  `reset_peak_memory_stats()` so that the next window has its own peak (this resets the
  process-wide peak counters: a script that reads them itself sees per-window peaks too).
* CPU (torch has no CPU allocator statistics outside the profiler): a live-storage counter,
  a `TorchDispatchMode` that registers the storage of every op's output once, with a weakref
  finaliser that subtracts its bytes when the storage dies (shared/notes/memory-estimation.md
  §2: byte-exact against the profiler's replay of the c10 CPU allocator events, except
  scratch buffers a kernel allocates and frees inside itself, e.g. oneDNN convolutions). It is
  active from `memory_monitor()` until `close()` (or the end of a `with` block) on the thread
  that made it, and counts only storages created or returned by an op since then.

Growth: a window's peak grew when it exceeds the previous window's by more than
`min_growth_bytes` and `min_growth_fraction` of it; after `patience` growths in a row the
monitor warns once (again only after the streak has been broken).
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oom_lsp.units import short_bytes

DEFAULT_PATIENCE = 3
DEFAULT_MIN_GROWTH_BYTES = 1024 * 1024
DEFAULT_MIN_GROWTH_FRACTION = 0.01
LEAK_RULES = (
    "a loss or output accumulated with its graph (OOM301, `total += loss`)",
    "outputs or losses stored without .detach() (OOM302)",
    "a recurrent hidden state carried across batches (OOM305)",
    "an evaluation pass outside torch.no_grad() whose results are kept (OOM303)",
)


@dataclass(frozen=True)
class MemoryWindow:
    """One epoch (or one `every_n_steps` window)."""

    label: str  # "epoch 3" or "steps 201-300"
    steps: int
    peak_allocated: int
    peak_reserved: int | None  # CUDA only
    allocated: int  # live at the end of the window
    change: int | None  # peak_allocated minus the previous window's; None for the first
    grew: bool


class _CudaMeter:
    name = "cuda-allocator"

    def __init__(self, torch: Any, device: Any) -> None:
        self.cuda = torch.cuda
        self.device = device
        self.cuda.reset_peak_memory_stats(device)

    def read(self) -> tuple[int, int | None, int]:
        return (
            int(self.cuda.max_memory_allocated(self.device)),
            int(self.cuda.max_memory_reserved(self.device)),
            int(self.cuda.memory_allocated(self.device)),
        )

    def reset(self) -> None:
        self.cuda.reset_peak_memory_stats(self.device)

    def close(self) -> None:
        pass


def _live_storage_mode(torch: Any) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveStorageCounter(TorchDispatchMode):
        """Bytes of the storages produced by ops that are still alive, and their peak."""

        def __init__(self) -> None:
            super().__init__()
            self.live = 0
            self.peak = 0
            self._finalizers: dict[int, weakref.finalize] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            # Most ops return a tensor or a flat tuple of them: skip the general pytree walk then.
            if isinstance(out, torch.Tensor):
                self._register(out)
                return out
            values = out if isinstance(out, (tuple, list)) else tree_flatten(out)[0]
            for value in values:
                if isinstance(value, torch.Tensor):
                    self._register(value)
                elif isinstance(value, (tuple, list, dict)):
                    for leaf in tree_flatten(value)[0]:
                        if isinstance(leaf, torch.Tensor):
                            self._register(leaf)
            return out

        def _register(self, tensor: Any) -> None:
            # One Python object per StorageImpl: its weakref dies exactly when the storage does.
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # sparse, nested and other storage-less tensors
                return
            key = id(storage)
            if key in self._finalizers:
                return
            size = storage.nbytes()
            finalizer = weakref.finalize(storage, self._release, key, size)
            finalizer.atexit = False  # nothing to count once the interpreter exits
            self._finalizers[key] = finalizer
            self.live += size
            if self.live > self.peak:
                self.peak = self.live

        def _release(self, key: int, size: int) -> None:
            self._finalizers.pop(key, None)
            self.live -= size

    return LiveStorageCounter()


class _CpuMeter:
    name = "live-storage-counter"

    def __init__(self, torch: Any) -> None:
        self.mode = _live_storage_mode(torch)
        self.mode.__enter__()
        self._open = True

    def read(self) -> tuple[int, int | None, int]:
        return self.mode.peak, None, self.mode.live

    def reset(self) -> None:
        self.mode.peak = self.mode.live

    def close(self) -> None:
        if self._open:
            self._open = False
            self.mode.__exit__(None, None, None)


class MemoryMonitor:
    def __init__(
        self,
        every_n_steps: int | None = None,
        log: Callable[[str], Any] | logging.Logger | None = print,
        *,
        device: Any = None,
        patience: int = DEFAULT_PATIENCE,
        min_growth_bytes: int = DEFAULT_MIN_GROWTH_BYTES,
        min_growth_fraction: float = DEFAULT_MIN_GROWTH_FRACTION,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError("every_n_steps must be at least 1 (or None: once per epoch)")
        if patience < 1:
            raise ValueError("patience must be at least 1")
        import torch

        self.every_n_steps = every_n_steps
        self.patience = patience
        self.min_growth_bytes = min_growth_bytes
        self.min_growth_fraction = min_growth_fraction
        self._log = log
        target = torch.device(device) if device is not None else None
        use_cuda = target.type == "cuda" if target is not None else torch.cuda.is_available()
        self._meter: _CudaMeter | _CpuMeter = _CudaMeter(torch, target) if use_cuda else _CpuMeter(torch)
        self.measured_with = self._meter.name
        self.windows: list[MemoryWindow] = []
        self.warnings: list[str] = []
        self.epoch = 0
        self.total_steps = 0
        self._window_steps = 0
        self._growths = 0

    # --- the loop's calls ---------------------------------------------------------------------

    def step(self) -> MemoryWindow | None:
        """After each optimizer step; closes a window every `every_n_steps` steps."""
        self.total_steps += 1
        self._window_steps += 1
        if self.every_n_steps is not None and self._window_steps >= self.every_n_steps:
            first = self.total_steps - self._window_steps + 1
            return self._close_window(f"steps {first}-{self.total_steps}")
        return None

    def epoch_end(self) -> MemoryWindow | None:
        """At the end of each epoch. With `every_n_steps`, closes the partial window, if any."""
        self.epoch += 1
        if self.every_n_steps is not None:
            if self._window_steps == 0:
                return None
            first = self.total_steps - self._window_steps + 1
            return self._close_window(f"epoch {self.epoch} (steps {first}-{self.total_steps})")
        return self._close_window(f"epoch {self.epoch}")

    def close(self) -> None:
        """Stop measuring (the CPU counter leaves the dispatch stack)."""
        self._meter.close()

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # --- adapters ----------------------------------------------------------------------------

    def lightning_callback(self) -> Any:
        """A `lightning.pytorch.Callback` (or `pytorch_lightning.Callback`) driving this monitor."""
        from oom_lsp.runtime.adapters import lightning_callback

        return lightning_callback(self)

    def huggingface_callback(self) -> Any:
        """A `transformers.TrainerCallback` driving this monitor."""
        from oom_lsp.runtime.adapters import huggingface_callback

        return huggingface_callback(self)

    # --- windows -----------------------------------------------------------------------------

    def _close_window(self, label: str) -> MemoryWindow:
        peak, reserved, live = self._meter.read()
        self._meter.reset()
        previous = self.windows[-1] if self.windows else None
        change = peak - previous.peak_allocated if previous else None
        grew = (
            change is not None
            and change > self.min_growth_bytes
            and change > self.min_growth_fraction * previous.peak_allocated  # type: ignore[union-attr]
        )
        window = MemoryWindow(label, self._window_steps, peak, reserved, live, change, grew)
        self.windows.append(window)
        self._window_steps = 0
        self._emit(self._describe(window, previous), warning=False)
        self._growths = self._growths + 1 if grew else 0
        if self._growths == self.patience:
            first = self.windows[-1 - self.patience]
            message = (
                f"oom-lsp memory: the peak grew {self.patience} times in a row, "
                f"{short_bytes(first.peak_allocated)} at {first.label} -> {short_bytes(peak)} at {label}: "
                "something is kept from one step to the next. Likely: "
                + "; ".join(LEAK_RULES)
                + ". `oom-lsp check` on the training script points at these."
            )
            self.warnings.append(message)
            self._emit(message, warning=True)
        return window

    def _describe(self, window: MemoryWindow, previous: MemoryWindow | None) -> str:
        text = f"oom-lsp memory: {window.label}: peak allocated {short_bytes(window.peak_allocated)}"
        if window.change is not None and previous is not None:
            sign = "+" if window.change >= 0 else "-"
            text += f" ({sign}{short_bytes(abs(window.change))} since {previous.label})"
        if window.peak_reserved is not None:
            text += f", peak reserved {short_bytes(window.peak_reserved)}"
        return text + f", allocated now {short_bytes(window.allocated)}"

    def _emit(self, message: str, warning: bool) -> None:
        log = self._log
        if log is None:
            return
        if isinstance(log, logging.Logger):
            (log.warning if warning else log.info)(message)
        elif log is print:
            print(message, file=sys.stderr if warning else sys.stdout, flush=True)
        else:
            log(message)


def memory_monitor(
    every_n_steps: int | None = None,
    log: Callable[[str], Any] | logging.Logger | None = print,
    **options: Any,
) -> MemoryMonitor:
    """A MemoryMonitor: `step()` after each optimizer step, `epoch_end()` after each epoch."""
    return MemoryMonitor(every_n_steps, log, **options)
