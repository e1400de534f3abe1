"""On a CUDA machine only: a real OOM, provoked on purpose by allocating past the card's capacity
inside the guard, gives a report whose figures are the allocator's at the failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from oom_lsp.profiling.report import read_report
from oom_lsp.runtime import oom_guard

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def fill_the_card(chunk_bytes: int) -> list[torch.Tensor]:
    inputs = torch.empty(64, chunk_bytes // 64, dtype=torch.uint8, device="cuda")
    kept = [inputs]
    while True:
        kept.append(torch.empty(chunk_bytes, dtype=torch.uint8, device="cuda"))


def test_a_real_oom_matches_the_allocator_statistics(tmp_path: Path) -> None:
    capacity = torch.cuda.get_device_properties(0).total_memory
    chunk = capacity // 16
    torch.cuda.reset_peak_memory_stats()
    seen: dict[str, object] = {}
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with oom_guard(project_root=tmp_path, record_history=True, log=lambda message: None):
            try:
                fill_the_card(chunk)
            except torch.OutOfMemoryError as error:
                seen["stats"] = torch.cuda.memory_stats()
                seen["error"] = error
                raise
    assert caught.value is seen["error"]
    stats = seen["stats"]
    folder = tmp_path / ".oom_lsp" / "last_oom"
    report = read_report(folder / "report.json")
    assert report.oom is not None
    assert report.oom.memory_state == {
        "allocated": stats["allocated_bytes.all.current"],
        "reserved": stats["reserved_bytes.all.current"],
        "max_allocated": stats["allocated_bytes.all.peak"],
        "max_reserved": stats["reserved_bytes.all.peak"],
    }
    assert report.peak_allocated == stats["allocated_bytes.all.peak"]
    assert report.device.total_memory == capacity
    assert report.oom.error.tried_to_allocate is not None
    assert abs(report.oom.error.tried_to_allocate - chunk) <= 0.01 * chunk  # the message rounds to 2 decimals
    assert report.oom.error.failing_frame.function == "fill_the_card"  # type: ignore[union-attr]
    assert report.batch_size == 64
    assert report.memory_summary and "Allocated memory" in report.memory_summary
    assert report.artifacts.snapshot == "snapshot.pickle" and (folder / "snapshot.pickle").stat().st_size > 0
    tensors = json.loads((folder / "report.json").read_text())["failing_frame_tensors"]
    assert any(tensor["name"] == "inputs" and tensor["device"] == "cuda:0" for tensor in tensors)
    del caught, seen
    torch.cuda.empty_cache()
