"""Framework callbacks that drive a MemoryMonitor. Each framework is imported only when its
adapter is asked for, so `oom_lsp.runtime` works without Lightning or transformers installed.

* Lightning: `on_train_batch_end` -> `step()`, `on_train_epoch_end` -> `epoch_end()`,
  `on_fit_end` -> `close()`. `lightning.pytorch` (Lightning 2.x) first, else `pytorch_lightning`.
* Hugging Face `Trainer`: `on_step_end` (after each optimizer step, so once per gradient
  accumulation cycle) -> `step()`, `on_epoch_end` -> `epoch_end()`, `on_train_end` -> `close()`.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol


class Monitor(Protocol):
    """What a callback drives: `oom_lsp.runtime.monitor.MemoryMonitor` (which imports this module
    when it is asked for an adapter, so this module names only the methods it calls)."""

    def step(self) -> Any: ...

    def epoch_end(self) -> Any: ...

    def close(self) -> Any: ...


def _import_first(names: tuple[str, ...], attribute: str, install: str) -> Any:
    missing = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as problem:
            missing.append(f"{name} ({problem})")
            continue
        return getattr(module, attribute)
    raise ImportError(f"{attribute} needs {install}; could not import {', '.join(missing)}")


def lightning_callback(monitor: Monitor) -> Any:
    base = _import_first(("lightning.pytorch", "pytorch_lightning"), "Callback", "`pip install lightning`")

    class MemoryMonitorCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.monitor = monitor

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.monitor.step()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.monitor.epoch_end()

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self.monitor.close()

    return MemoryMonitorCallback()


def huggingface_callback(monitor: Monitor) -> Any:
    base = _import_first(("transformers",), "TrainerCallback", "`pip install transformers`")

    class MemoryMonitorCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.monitor = monitor

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.monitor.step()

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.monitor.epoch_end()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.monitor.close()

    return MemoryMonitorCallback()
