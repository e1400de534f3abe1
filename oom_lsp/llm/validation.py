"""Before/after figures of a fix: read the measurement that came before (a profile
report.json or an `oom-lsp estimate --format json` output), take the same measurement of
the script as it is now, and compare the peaks.

The measurement runs the user's code in a subprocess under their interpreter (the
profiling runner or the estimator); this module never imports torch. Blocking: the
language server calls `measure_again` in a thread, with `cancel` for $/cancelRequest.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp.estimate.results import Prediction, Verdict
from oom_lsp.llm.fixlog import Figures


class MeasurementError(Exception):
    """The measurement could not be read or taken; the message is for the user."""


@dataclass(frozen=True)
class Measurement:
    kind: str  # "profile" (measured) or "estimate"
    data: Any  # a profiling Report, or the estimate's Prediction
    source: str  # where it came from, for messages

    @property
    def peak(self) -> int | None:
        return self.data.peak_allocated if self.kind == "profile" else self.data.peak_bytes

    @property
    def ran_out_of_memory(self) -> bool:
        if self.kind == "profile":
            return self.data.status == "oom"
        return self.data.verdict is Verdict.OOM

    @property
    def status(self) -> str:
        if self.kind == "profile":
            return self.data.status
        return self.data.verdict.value if self.data.verdict else "estimated"


def parse_measurement(data: object, source: str) -> Measurement:
    from oom_lsp.profiling.report import Report, ReportError

    if isinstance(data, dict) and "schema_version" in data:
        try:
            return Measurement("profile", Report.from_dict(data), source)
        except ReportError as error:
            raise MeasurementError(f"{source}: {error}") from None
    if isinstance(data, dict) and isinstance(data.get("peak_bytes"), int):
        try:
            return Measurement("estimate", Prediction.from_json(data), source)
        except (KeyError, TypeError, ValueError) as error:
            raise MeasurementError(
                f"{source}: not an `oom-lsp estimate --format json` output ({error})"
            ) from None
    raise MeasurementError(
        f"{source}: neither a profile report.json nor an `oom-lsp estimate --format json` output"
    )


def read_measurement(path: Path) -> Measurement:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise MeasurementError(f"{path}: {getattr(error, 'strerror', None) or error}") from None
    except json.JSONDecodeError as error:
        raise MeasurementError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from None
    return parse_measurement(data, str(path))


def measure_again(
    script: Path,
    before: Measurement,
    *,
    python: str,
    timeout: float,
    out: Path,
    cancel: threading.Event | None = None,
) -> Measurement:
    """The measurement `before` came from, taken again on `script` as it is now."""
    if before.kind == "profile":
        return _profile(script, before.data, python, timeout, out, cancel)
    return _estimate(script, before.data, python, timeout, cancel)


# How much two CPU profiles of the same unchanged script differ: 11 runs of each of
# fixtures/estimate/{mlp,vit}.py and fixtures/profiling/small_{cnn,transformer}.py (3 steps,
# --device cpu) gave the same peak to the byte but for the MLP, whose peak took three values
# 64.5 KiB apart (132 096 B, 0.44 % of its 29 MiB). A CUDA run has its own variation
# (workspaces, the allocator's segments); twice the spread seen, at least 256 KiB, covers both.
NOISE_SHARE = 0.01
NOISE_FLOOR = 256 * 1024


def noise_tolerance(before: Measurement) -> int:
    """Changes of a profiled peak this small are no change. An estimate is the same to the
    byte from run to run: no tolerance."""
    if before.kind != "profile" or before.peak is None:
        return 0
    return max(NOISE_FLOOR, int(before.peak * NOISE_SHARE))


def comparison_problems(before: Measurement, after: Measurement) -> list[Any]:
    """What the two measured differently (oom_lsp.profiling.report.Mismatch), for profiles."""
    if before.kind != "profile" or after.kind != "profile":
        return []
    from oom_lsp.profiling.report import mismatches

    return mismatches(before.data, after.data)


def figures(before: Measurement, after: Measurement) -> Figures | None:
    """None when either peak is unknown (a run that ended before its first step)."""
    if before.peak is None or after.peak is None:
        return None
    return Figures(
        before.peak, after.peak, "measured by profile" if before.kind == "profile" else "estimated"
    )


def _profile(
    script: Path, report: Any, python: str, timeout: float, out: Path, cancel: threading.Event | None
) -> Measurement:
    from oom_lsp.profiling.runner import ProfileError, ProfileRequest, profile

    device = report.device.type if report.device.type in ("cpu", "cuda") else "auto"
    request = ProfileRequest(
        script=script,
        out=out,
        script_args=list(report.argv),
        steps=report.steps_requested or 3,
        device=device,
        python=python,
        timeout=timeout,
    )
    try:
        return Measurement("profile", profile(request, cancel=cancel), str(out / "report.json"))
    except ProfileError as error:
        raise MeasurementError(str(error)) from None


def _estimate(
    script: Path, prediction: Prediction, python: str, timeout: float, cancel: threading.Event | None
) -> Measurement:
    from oom_lsp.estimate.estimator import EstimateError, EstimateOptions, estimate
    from oom_lsp.estimate.gpus import UnknownGpuError, custom_gpu, find_gpu

    target = prediction.gpu
    gpu = None
    if target:
        try:
            gpu = find_gpu(target.name)  # the catalogue entry knows the architecture, too
        except UnknownGpuError:
            gpu = custom_gpu(target.memory)
    # The script's own batch size, not the one estimated before: the fix may have changed it.
    options = EstimateOptions(
        script=script,
        script_args=list(prediction.args),
        device=prediction.device,
        gpu=gpu,
        python=python,
        timeout=timeout,
        cancel=cancel,
    )
    if cancel is not None and cancel.is_set():
        raise MeasurementError("cancelled")
    try:
        return Measurement("estimate", estimate(options), "a new estimate")
    except EstimateError as error:
        raise MeasurementError(str(error)) from None
