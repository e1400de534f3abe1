"""What a process holds on a GPU outside what PyTorch's allocator counts, and the figure the
verdict judges by (parent side, no torch).

The CUDA context: the driver's own state and the kernels loaded into the GPU. Before CUDA 11.7
every kernel of every library was loaded when the library was (over 1 GB with PyTorch's); with lazy
module loading (CUDA 11.7+, PyTorch's default since 1.13, CUDA's own default since 12.2) a kernel is
loaded the first time it runs. So the context depends on the CUDA release of the target's PyTorch,
on `CUDA_MODULE_LOADING`, and less on the GPU generation and driver. The table below holds the
sizes measured in public (each row names its source); `oom-lsp calibrate` measures the machine it
runs on, and a calibration of the target GPU replaces the table (calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oom_lsp.estimate.gpus import Gpu, format_bytes

MIB = 2**20
# The CUDA release assumed when neither the target's PyTorch nor the user says: PyTorch 2.x's wheels.
DEFAULT_CUDA = "12.4"


@dataclass(frozen=True)
class ContextSize:
    """One measured CUDA context: for CUDA releases in [cuda_from, cuda_below), with kernels
    loaded lazily or eagerly, on GPUs of compute capability >= arch_from."""

    cuda_from: tuple[int, int]
    cuda_below: tuple[int, int]
    lazy: bool
    arch_from: tuple[int, int]
    bytes: int
    source: str


CONTEXT_SIZES: tuple[ContextSize, ...] = (
    # The narrowest rows first: the first row that applies is used.
    ContextSize(
        (12, 0), (99, 0), True, (8, 0), 426 * MIB,
        "426 MiB: RTX 6000 Ada (sm 8.9), PyTorch 2.10+cu130, nvidia-smi after the context was made "
        "(unslothai/unsloth-zoo#1053); about 400 MB with lazy loading (pytorch/pytorch#109888)",
    ),
    ContextSize(
        (11, 7), (99, 0), True, (0, 0), 266_076_160,
        "254 MiB: PyTorch 1.13, CUDA 11.7, lazy loading: 287,047,680 B in use after a 6.4 MB tensor (its "
        "20 MiB segment taken off) (pytorch/pytorch#86509)",
    ),
    ContextSize(
        (11, 7), (99, 0), False, (0, 0), 645_660_672,
        "616 MiB: the same with CUDA_MODULE_LOADING=DEFAULT, every kernel loaded at once: 666,632,192 B "
        "(pytorch/pytorch#86509)",
    ),
    ContextSize(
        (0, 0), (11, 7), False, (0, 0), 1343 * MIB,
        "1343 MiB: Tesla V100-SXM2 16GB (sm 7.0), driver 460.91.03, CUDA 11.2 (before lazy loading), "
        "nvidia-smi after torch.ones((1, 1)).to('cuda') (Hugging Face's 'Efficient Training on a Single "
        "GPU', transformers v4.21 docs)",
    ),
)


def parse_cuda(version: str | None) -> tuple[int, int]:
    """'12.4' -> (12, 4); anything unreadable is the default release."""
    text = version or DEFAULT_CUDA
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        major, minor = DEFAULT_CUDA.split(".")
        return int(major), int(minor)


def loads_lazily(cuda: tuple[int, int], module_loading: str | None) -> bool:
    """Lazy module loading exists from CUDA 11.7; PyTorch sets LAZY when the variable is unset."""
    if cuda < (11, 7):
        return False
    return (module_loading or "LAZY").strip().upper() == "LAZY"


def cuda_context(gpu: Gpu | None, cuda_version: str | None, module_loading: str | None) -> tuple[int, str]:
    """The context's bytes, and the sentence that says which row gave them and why."""
    cuda = parse_cuda(cuda_version)
    lazy = loads_lazily(cuda, module_loading)
    # A target given by its memory alone is taken for a current GPU, as the harness answers its
    # compute capability (sm 9.0).
    arch = gpu.arch if gpu is not None and gpu.arch else (9, 0)
    for row in CONTEXT_SIZES:
        if row.cuda_from <= cuda < row.cuda_below and row.lazy == lazy and arch >= row.arch_from:
            break
    else:  # pragma: no cover - the last row covers every release before 11.7
        row = CONTEXT_SIZES[0]
    given = "given by --cuda-version" if cuda_version else "assumed: the script's torch is not a CUDA build"
    how = "kernels loaded lazily" if lazy else "every kernel loaded at once"
    target = f"{gpu.name} (sm {arch[0]}.{arch[1]})" if gpu is not None and gpu.arch else "the target"
    return row.bytes, (
        f"CUDA context {format_bytes(row.bytes)} for {target} with CUDA {cuda[0]}.{cuda[1]} ({given}), {how}: "
        f"outside PyTorch's counters, in nvidia-smi's; measured in public as {row.source}; "
        "`oom-lsp calibrate` measures it on a machine with the GPU"
    )


def verdict_basis(prediction: dict[str, Any], capacity: int) -> dict[str, Any]:
    """The figure the verdict judged by: on CUDA the modelled reserved memory plus the CUDA context
    (what the process holds, as nvidia-smi shows it: the allocator cannot hand out more than the card
    less the context, and its segments are the unit it asks the driver for); on the CPU the allocated
    peak. `allocated_bytes` is the allocated peak with the context, for comparison."""
    reserved = prediction.get("reserved_bytes")
    context = prediction.get("context_bytes") or 0
    if reserved is not None:
        figure, judged = "reserved + CUDA context", reserved + context
    else:
        figure, judged = "allocated", prediction["peak_bytes"]
    return {
        "figure": figure,
        "bytes": judged,
        "capacity_bytes": capacity,
        "allocated_bytes": prediction["peak_bytes"] + context,
    }


def verdict_words(prediction: dict[str, Any]) -> str:
    """`WILL RUN OUT OF MEMORY: reserved + CUDA context 43.10 GiB > 40.00 GiB (allocated + context
    38.50 GiB, 96%)`: the verdict and the figure it judged by."""
    basis = prediction["verdict_basis"]
    judged, capacity = basis["bytes"], basis["capacity_bytes"]
    relation = ">" if judged > capacity else "of"
    share = f"{100 * judged / capacity:.0f}%"
    text = (
        f"{prediction['verdict'].upper()}: {basis['figure']} {format_bytes(judged)} {relation} "
        f"{format_bytes(capacity)}"
        + (f" ({share})" if judged <= capacity else "")
    )
    if basis["figure"] != "allocated":
        text += (
            f"; allocated + context {format_bytes(basis['allocated_bytes'])}, "
            f"{100 * basis['allocated_bytes'] / capacity:.0f}%"
        )
    return text
