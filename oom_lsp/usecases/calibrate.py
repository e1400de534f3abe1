"""Calibrate: measure this machine's CUDA terms once (the CUDA context, the cuBLAS workspace, the
caching allocator's segments) and keep them for the estimates whose target is this GPU.

`oom-lsp calibrate` (oom_lsp.cli.calibrate) calls `calibrate` or `stored`; the measuring script
runs under the user's interpreter (estimate/calibrate_probe.py, through estimate/calibration.py),
and the per-user file it writes is read by every later estimate, from any face. A machine without
a GPU has nothing to measure: CalibrationError says so in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp.estimate import calibration
from oom_lsp.estimate.calibration import CalibrationError

__all__ = ["Calibration", "CalibrationError", "StoredCalibrations", "calibrate", "stored"]


@dataclass
class Calibration:
    """One measurement (the measuring script's entry, as the calibration file keeps it) and where
    it was stored (None: a dry run on the CPU, which stores nothing)."""

    entry: dict[str, Any]
    stored: Path | None

    def lines(self) -> list[str]:
        return calibration.describe(self.entry)

    def to_json(self) -> dict[str, Any]:
        return {"calibration": self.entry, "stored": str(self.stored) if self.stored else None}


@dataclass
class StoredCalibrations:
    """The calibrations kept for this user, one per GPU model, CUDA and PyTorch release."""

    file: Path
    entries: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"file": str(self.file), "gpus": self.entries}


def calibrate(python: str, dry_run: bool = False) -> Calibration:
    """Runs the measuring script under `python` and stores what it measured (not in a dry run).
    Raises CalibrationError (no CUDA device, no torch, the script failed)."""
    entry = calibration.run_probe(python, dry_run)
    return Calibration(entry, None if dry_run else calibration.store(entry, calibration.calibration_file()))


def stored() -> StoredCalibrations:
    """What is stored (raises CalibrationError for a file that cannot be read as one)."""
    path = calibration.calibration_file()
    return StoredCalibrations(path, calibration.load(path))
