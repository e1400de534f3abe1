"""Typed estimate results for the tests that need one without running an estimate."""

from __future__ import annotations

from typing import Any

from oom_lsp.estimate.results import (
    Breakdown,
    Category,
    GpuTarget,
    PeakAt,
    Prediction,
    Verdict,
    WhatIfBaseline,
    WhatIfRow,
    WhatIfTable,
)


def prediction(**fields: Any) -> Prediction:
    """A CPU prediction of 1000 bytes for train.py unless `fields` say otherwise."""
    values: dict[str, Any] = dict(
        script="train.py",
        args=[],
        device="cpu",
        batch_size=8,
        peak_bytes=1000,
        breakdown=Breakdown({Category.PARAMETERS: 400, Category.ACTIVATIONS: 600}),
        reserved_bytes=None,
        context_bytes=None,
        process_bytes=None,
        peak_at=PeakAt("aten.mm.default", "Linear", "forward", "train.py", 12),
        top_modules=[("fc", 600)],
        top_lines=[("train.py:12", 600)],
        gpu=None,
        verdict=None,
        corrections=[],
        steps_traced=2,
        seconds=0.5,
        method="fake-tensor trace of two optimizer steps",
        torch="2.13.0",
        batch_knobs=[],
        data_spread=None,
        peak_batch=None,
        batches_traced=None,
    )
    values.update(fields)
    return Prediction(**values)


def cuda_prediction(**fields: Any) -> Prediction:
    """On CUDA: allocated 1000, reserved 2 MiB, the context 400 MiB, a 24 GiB target."""
    reserved, context = 2**21, 400 * 2**20
    values: dict[str, Any] = dict(
        device="cuda",
        reserved_bytes=reserved,
        context_bytes=context,
        process_bytes=reserved + context,
        gpu=GpuTarget("GPU with 24.00 GiB", 24 * 2**30),
        verdict=Verdict.FITS,
    )
    values.update(fields)
    return prediction(**values)


def what_if_row(key: str, title: str, needed: int | None, saving: int = 0, **fields: Any) -> WhatIfRow:
    values: dict[str, Any] = dict(
        key=key,
        title=title,
        how=title,
        safety="safe",
        code=None,
        line=None,
        source_digest=None,
        autocast_dtype=None,
        batch_size=None,
    )
    if needed is not None:
        values.update(
            needed_bytes=needed,
            peak_bytes=needed,
            saving_bytes=saving,
            saving_percent=round(100 * saving / (needed + saving), 1) if needed + saving else 0.0,
        )
    values.update(fields)
    return WhatIfRow(**values)


def what_if_table(script: str, rows: list[WhatIfRow], **fields: Any) -> WhatIfTable:
    values: dict[str, Any] = dict(
        script=script,
        device="cpu",
        gpu=None,
        gpu_memory=None,
        batch_size=8,
        source_digest="",
        batch_option=None,
        autocast_option=None,
        world_size_option=None,
        baseline=WhatIfBaseline(2000, 2000, None, None, None, None),
        changes=rows,
        not_applicable=[],
    )
    values.update(fields)
    return WhatIfTable(**values)
