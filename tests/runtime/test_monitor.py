"""memory_monitor on the CPU (the live-storage counter), and its framework adapters with
stand-in frameworks (neither Lightning nor transformers is installed in the test environment)."""

from __future__ import annotations

import logging
import sys
from types import ModuleType

import pytest
import torch

from oom_lsp.runtime import memory_monitor

EPOCHS = 5


def make_data(
    seed: int,
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    train = [
        (torch.randn(128, 32, generator=generator), torch.randint(0, 10, (128,), generator=generator))
        for _ in range(4)
    ]
    val = [
        (torch.randn(128, 32, generator=generator), torch.randint(0, 10, (128,), generator=generator))
        for _ in range(4)
    ]
    return train, val


def train(keep_graph: bool, monitor: object) -> None:
    """A training loop with a validation pass per epoch whose loss is summed over the whole run,
    either with its graph (`total += loss`: every validation forward's activations stay alive)
    or as a number (`total += loss.item()`)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train_batches, val_batches = make_data(0)
    total = 0.0
    for _ in range(EPOCHS):
        model.train()
        for x, y in train_batches:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step()  # type: ignore[attr-defined]
        model.eval()
        for x, y in val_batches:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            total += loss if keep_graph else loss.item()
        monitor.epoch_end()  # type: ignore[attr-defined]


def test_leak_warning_fires_on_a_loss_kept_with_its_graph() -> None:
    lines: list[str] = []
    with memory_monitor(log=lines.append) as monitor:
        train(keep_graph=True, monitor=monitor)
    assert monitor.measured_with == "live-storage-counter"
    assert [window.label for window in monitor.windows] == [f"epoch {n}" for n in range(1, EPOCHS + 1)]
    assert all(window.grew for window in monitor.windows[1:])
    assert len(monitor.warnings) == 1
    warning = monitor.warnings[0]
    assert "the peak grew 3 times in a row" in warning
    assert "OOM301" in warning and "OOM302" in warning and "OOM305" in warning
    assert lines[1].startswith("oom-lsp memory: epoch 2: peak allocated ") and "since epoch 1)" in lines[1]
    assert lines.index(warning) == 4  # logged right after epoch 4, the third growth in a row


def test_quiet_on_the_fixed_loop() -> None:
    lines: list[str] = []
    with memory_monitor(log=lines.append) as monitor:
        train(keep_graph=False, monitor=monitor)
    assert monitor.warnings == []
    assert len(lines) == EPOCHS
    assert not any(window.grew for window in monitor.windows)
    later_peaks = {window.peak_allocated for window in monitor.windows[1:]}
    assert max(later_peaks) - min(later_peaks) < 64 * 1024


def test_the_counter_follows_storages_to_the_byte() -> None:
    monitor = memory_monitor(log=None)
    try:
        before = monitor._meter.read()[2]
        block = torch.empty(256, 1024)  # 1 MiB
        view = block[:10]
        assert monitor._meter.read()[2] - before == 1024 * 1024
        del block
        assert monitor._meter.read()[2] - before == 1024 * 1024  # the view keeps the storage alive
        del view
        assert monitor._meter.read()[2] == before
        assert monitor._meter.read()[0] >= before + 1024 * 1024
    finally:
        monitor.close()


def test_the_counter_skips_tensors_without_storage() -> None:
    with memory_monitor(log=None):
        sparse = torch.eye(4).to_sparse()  # its untyped_storage() raises NotImplementedError
        assert (sparse * 2).to_dense().trace().item() == 8.0


def test_every_n_steps_windows_catch_a_leak_inside_one_epoch(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("training")
    kept = []
    with (
        caplog.at_level(logging.INFO, logger="training"),
        memory_monitor(every_n_steps=2, log=logger) as monitor,
    ):
        for _ in range(9):
            kept.append(torch.randn(512, 1024, requires_grad=True) * 2)  # 2 MiB kept per step
            monitor.step()
        monitor.epoch_end()
    labels = [window.label for window in monitor.windows]
    assert labels == ["steps 1-2", "steps 3-4", "steps 5-6", "steps 7-8", "epoch 1 (steps 9-9)"]
    assert [record.levelno for record in caplog.records].count(logging.WARNING) == 1
    assert "steps 1-2 -> " in monitor.warnings[0]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="every_n_steps"):
        memory_monitor(every_n_steps=0)


class _StandInCallback:
    def __init__(self) -> None:
        self.base_initialised = True


def test_lightning_adapter_with_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    lightning = ModuleType("lightning")
    pytorch = ModuleType("lightning.pytorch")
    pytorch.Callback = _StandInCallback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning", lightning)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", pytorch)
    monitor = memory_monitor(log=None)
    callback = monitor.lightning_callback()
    assert isinstance(callback, _StandInCallback) and callback.base_initialised
    for batch_index in range(3):
        callback.on_train_batch_end(None, None, None, None, batch_index)
    callback.on_train_epoch_end(None, None)
    callback.on_fit_end(None, None)
    assert monitor.total_steps == 3 and [w.label for w in monitor.windows] == ["epoch 1"]
    assert not monitor._meter._open  # type: ignore[union-attr]


def test_huggingface_adapter_with_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = ModuleType("transformers")
    transformers.TrainerCallback = _StandInCallback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monitor = memory_monitor(every_n_steps=2, log=None)
    callback = monitor.huggingface_callback()
    for _ in range(4):
        callback.on_step_end(None, None, None, model=None)
    callback.on_epoch_end(None, None, None)
    callback.on_train_end(None, None, None)
    assert [w.label for w in monitor.windows] == ["steps 1-2", "steps 3-4"]


def test_adapters_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError
    monitor = memory_monitor(log=None)
    try:
        with pytest.raises(ImportError, match="pip install lightning"):
            monitor.lightning_callback()
        with pytest.raises(ImportError, match="pip install transformers"):
            monitor.huggingface_callback()
    finally:
        monitor.close()
