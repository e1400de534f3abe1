"""The words both faces use for the estimate's figures: the CLI's text and the editor's hints,
diagnostics, titles and what-if page say one figure the same way (oom_lsp.units formats it).

Which peak a line shows is named: the allocated peak (what torch.cuda.max_memory_allocated()
would show) or the peak the verdict holds against the GPU (on CUDA the modelled reserved memory
and the CUDA context, what nvidia-smi would show for the process; on the CPU the allocated one).
"""

from __future__ import annotations

from oom_lsp.estimate.results import (
    GpuTarget,
    Prediction,
    WhatIfBaseline,
    WhatIfCheck,
    WhatIfRow,
    WhatIfTable,
)
from oom_lsp.estimate.whatif_record import AGREEMENT
from oom_lsp.units import format_bytes, format_percent, short_bytes, signed_bytes

# What the what-if's "peak" column and the verdict hold: said under the CLI's table and the page.
NEEDED_PEAK = "what the estimate's verdict uses (reserved memory and the CUDA context on cuda)"


def gpu_words(gpu: GpuTarget, short: bool = True) -> str:
    """ "24 GiB RTX 3090", or "24 GiB" for a target given by its memory alone."""
    name = gpu.name.removeprefix("NVIDIA ").removeprefix("GeForce ")
    size = short_bytes(gpu.memory) if short else format_bytes(gpu.memory)
    return f"{size} {name}" if gpu.named else size


# How the editor's hint and lens name the two peaks (their tooltip, the docs).
PEAKS_NAMED = (
    "allocated: the peak of live tensors, what torch.cuda.max_memory_allocated() would show; "
    "process total: the caching allocator's reserved memory plus the CUDA context, what nvidia-smi "
    "would show for the process and what the verdict holds against the GPU"
)
NO_TARGET = "no target GPU (set oomLsp.gpu, or gpu-memory in [tool.oom-lsp])"


def peak_words(prediction: Prediction) -> str:
    """Both peaks, named: "≈ 91 MiB allocated, 506 MiB process total" (one where they are one, on
    the CPU), per rank of a distributed run."""
    words = f"≈ {short_bytes(prediction.peak_bytes)} allocated"
    if prediction.needed_bytes != prediction.peak_bytes:
        words += f", {short_bytes(prediction.needed_bytes)} process total"
    launch = prediction.distributed
    return words + (f" per rank of {launch.world_size}" if launch is not None else "")


def target_words(prediction: Prediction) -> str:
    """The target and the verdict against it, as the CLI judges: " / 24 GiB RTX 3090: fits"
    ("tight", "will run out of memory"); nothing without a target."""
    if prediction.gpu is None:
        return ""
    verdict = f": {prediction.verdict.value}" if prediction.verdict is not None else ""
    return f" / {gpu_words(prediction.gpu)}{verdict}"


def hint_label(prediction: Prediction) -> str:
    """The editor's inlay hint after the batch-size literal: the verdict first (VS Code cuts a
    hint past 43 characters), then the target and both peaks, named: "fits on 24 GiB RTX 3090:
    ≈ 91 MiB allocated, 506 MiB process total at 64"; without a target, the peaks alone."""
    peaks = f"{peak_words(prediction)} at {prediction.batch_size}"
    if prediction.gpu is None:
        return peaks
    verdict = f"{prediction.verdict.value} " if prediction.verdict is not None else ""
    return f"{verdict}on {gpu_words(prediction.gpu)}: {peaks}"


def lens_result(prediction: Prediction) -> str:
    """The estimate lens's title while its result holds for the text:
    "Estimated ≈ 91 MiB allocated, 506 MiB process total / 24 GiB RTX 3090: fits"."""
    return f"Estimated {peak_words(prediction)}{target_words(prediction)}"


def estimate_message(prediction: Prediction, max_batch: int | None, name: str) -> str:
    """The one line every editor shows after an estimate (window/showMessage, the palette's
    notification): "Estimated peak of mlp.py at batch 32: ≈ 91 MiB allocated, 506 MiB process
    total / 24 GiB RTX 3090: fits. Largest batch that fits: 512." The figures and the verdict
    are the CLI's (`oom-lsp estimate`), in the hint's words."""
    batch = f" at batch {prediction.batch_size:,}" if prediction.batch_size else ""
    message = f"Estimated peak of {name}{batch}: {peak_words(prediction)}{target_words(prediction)}"
    if prediction.gpu is None:
        message += f"; {NO_TARGET}"
    if max_batch:
        message += f". Largest batch that fits: {max_batch:,}"
    return message + "."


def predicted_oom_message(prediction: Prediction, fitting: int | None) -> str:
    """OOM100's message: one line, under the editors' width, with the peak the verdict held
    against the target (the GPU named without its vendor, a GPU given by its memory alone not
    named twice)."""
    assert prediction.gpu is not None
    message = (
        f"Predicted out of memory: ≈ {short_bytes(prediction.needed_bytes)} at batch {prediction.batch_size} "
        f"> {gpu_words(prediction.gpu)}"
    )
    if fitting == 0:
        return message + "; batch size 1 does not fit either"
    return message + (f"; largest that fits: {fitting}" if fitting else "")


# --- the what-if ------------------------------------------------------------------------------------


def percent_words(row: WhatIfRow) -> str:
    """The change in peak as a share: "−38.0 %" (a typographic minus, as the editor's titles show it)."""
    return format_percent(-(row.saving_percent or 0.0), signed=True) if row.saving_bytes else "0 %"


def delta_words(row: WhatIfRow) -> str:
    return signed_bytes(-(row.saving_bytes or 0))


def saving_words(row: WhatIfRow) -> str:
    """What a code action's title carries: "−38.0 % peak (1.19 GiB → 642.00 MiB)"."""
    if not row.measured:
        return "not measured"
    return f"{percent_words(row)} peak ({format_bytes(row.needed_before)} → {format_bytes(row.needed_bytes)})"


def allocated_words(base: WhatIfBaseline) -> str:
    """Beside the what-if's peak of the step as it is, the allocated peak the estimate's hint shows
    first: " (759.30 MiB allocated)"; nothing where they are one (on the CPU)."""
    return f" ({format_bytes(base.peak_bytes)} allocated)" if base.peak_bytes != base.needed_bytes else ""


def growth_words(base: WhatIfBaseline) -> str | None:
    """ "grows 322.39 MiB at every step: out of memory after about 70 steps", for a baseline that grows."""
    if not base.growth_per_step:
        return None
    after = f": out of memory after about {base.steps_to_oom:,} steps" if base.steps_to_oom else ""
    return f"grows {format_bytes(base.growth_per_step)} at every step{after}"


def fits_words(row: WhatIfRow, table: WhatIfTable) -> str:
    """yes, no, or for how many steps (a fit that still grows at every step runs out later)."""
    if not row.fits:
        return "no"
    if row.growth_per_step and table.gpu_memory is not None and row.needed_bytes is not None:
        steps = max(0, (table.gpu_memory - row.needed_bytes) // row.growth_per_step)
        return f"~{steps:,} step{'s' if steps != 1 else ''}"
    return "yes"


def comparison_words(check: WhatIfCheck) -> str:
    predicted, estimated = format_bytes(check.predicted_bytes), format_bytes(check.estimated_bytes)
    if check.agrees:
        return (
            f"what-if check: {check.change}: predicted {predicted}, estimated now {estimated} "
            f"({check.difference_percent:+.1f} %, within {AGREEMENT:.0%})"
        )
    return (
        f"what-if check: {check.change}: predicted {predicted}, estimated now {estimated} "
        f"({check.difference_percent:+.1f} %): the what-if's prediction is off by more than {AGREEMENT:.0%}, "
        "a bug in oom-lsp; please report it with this output"
    )
