"""A catalogue of accelerators: name -> memory, for `--gpu NAME`.

Memory is the vendor's specification. NVIDIA and AMD datasheets say "GB" for
memory that is a power-of-two size in GiB (an "80GB" H100 has 80 GiB of HBM,
nvidia-smi shows about 81559 MiB of it), so those sizes are stored in GiB;
the few whose stated size is not a power-of-two multiple keep the stated
number in GiB as well (H200 141, H100 NVL 94), which is what the driver
reports to within 1-2 %. `arch` is the CUDA compute capability where there
is one: it keys the cuBLAS workspace sizes (see cuda_terms.py).
No torch import: used by the CLI and the editor.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from oom_lsp.config import parse_memory_size
from oom_lsp.units import format_bytes

GIB = 2**30


@dataclass(frozen=True)
class Gpu:
    name: str
    memory: int  # bytes
    vendor: str  # "nvidia", "amd", "apple", "intel"
    arch: tuple[int, int] | None = None  # CUDA compute capability
    aliases: tuple[str, ...] = ()


def _gpu(name: str, gib: float, vendor: str, arch: tuple[int, int] | None, *aliases: str) -> Gpu:
    return Gpu(name, int(gib * GIB), vendor, arch, aliases)


CATALOGUE: tuple[Gpu, ...] = (
    # NVIDIA consumer (GeForce)
    _gpu("GeForce RTX 5090", 32, "nvidia", (12, 0), "5090"),
    _gpu("GeForce RTX 5080", 16, "nvidia", (12, 0), "5080"),
    _gpu("GeForce RTX 4090", 24, "nvidia", (8, 9), "4090"),
    _gpu("GeForce RTX 4080", 16, "nvidia", (8, 9), "4080", "RTX 4080 Super"),
    _gpu("GeForce RTX 4070 Ti Super", 16, "nvidia", (8, 9), "4070 Ti Super"),
    _gpu("GeForce RTX 4070 Ti", 12, "nvidia", (8, 9), "4070 Ti"),
    _gpu("GeForce RTX 4070", 12, "nvidia", (8, 9), "4070"),
    _gpu("GeForce RTX 4060 Ti 16GB", 16, "nvidia", (8, 9), "4060 Ti 16GB"),
    _gpu("GeForce RTX 4060 Ti 8GB", 8, "nvidia", (8, 9), "4060 Ti", "4060 Ti 8GB"),
    _gpu("GeForce RTX 4060", 8, "nvidia", (8, 9), "4060"),
    _gpu("GeForce RTX 3090 Ti", 24, "nvidia", (8, 6), "3090 Ti"),
    _gpu("GeForce RTX 3090", 24, "nvidia", (8, 6), "3090"),
    _gpu("GeForce RTX 3080 Ti", 12, "nvidia", (8, 6), "3080 Ti"),
    _gpu("GeForce RTX 3080 12GB", 12, "nvidia", (8, 6), "3080 12GB"),
    _gpu("GeForce RTX 3080", 10, "nvidia", (8, 6), "3080", "3080 10GB"),
    _gpu("GeForce RTX 3070", 8, "nvidia", (8, 6), "3070"),
    _gpu("GeForce RTX 3060", 12, "nvidia", (8, 6), "3060"),
    _gpu("GeForce RTX 2080 Ti", 11, "nvidia", (7, 5), "2080 Ti"),
    _gpu("Titan RTX", 24, "nvidia", (7, 5)),
    # NVIDIA workstation
    _gpu("RTX PRO 6000 Blackwell", 96, "nvidia", (12, 0), "RTX PRO 6000"),
    _gpu("RTX 6000 Ada", 48, "nvidia", (8, 9), "RTX 6000 Ada Generation"),
    _gpu("RTX 5000 Ada", 32, "nvidia", (8, 9)),
    _gpu("RTX 4000 Ada", 20, "nvidia", (8, 9)),
    _gpu("RTX A6000", 48, "nvidia", (8, 6), "A6000"),
    _gpu("RTX A5000", 24, "nvidia", (8, 6), "A5000"),
    _gpu("RTX A4000", 16, "nvidia", (8, 6), "A4000"),
    # NVIDIA datacenter
    _gpu("B200", 180, "nvidia", (10, 0), "B200 180GB"),
    _gpu("H200", 141, "nvidia", (9, 0), "H200 SXM", "H200 141GB", "H200 NVL"),
    _gpu("H100 NVL", 94, "nvidia", (9, 0), "H100 94GB"),
    _gpu("H100 SXM", 80, "nvidia", (9, 0), "H100", "H100 80GB", "H100 PCIe"),
    _gpu("A100 80GB", 80, "nvidia", (8, 0), "A100 80G", "A100 SXM 80GB", "A100 PCIe 80GB"),
    _gpu("A100 40GB", 40, "nvidia", (8, 0), "A100", "A100 40G"),
    _gpu("A40", 48, "nvidia", (8, 6)),
    _gpu("A30", 24, "nvidia", (8, 0)),
    _gpu("A10G", 24, "nvidia", (8, 6)),
    _gpu("A10", 24, "nvidia", (8, 6)),
    _gpu("A2", 16, "nvidia", (8, 6)),
    _gpu("L40S", 48, "nvidia", (8, 9)),
    _gpu("L40", 48, "nvidia", (8, 9)),
    _gpu("L4", 24, "nvidia", (8, 9)),
    _gpu("T4", 16, "nvidia", (7, 5), "Tesla T4"),
    _gpu("V100 32GB", 32, "nvidia", (7, 0), "V100 32G", "Tesla V100 32GB"),
    _gpu("V100 16GB", 16, "nvidia", (7, 0), "V100", "V100 16G", "Tesla V100"),
    _gpu("P100 16GB", 16, "nvidia", (6, 0), "P100", "Tesla P100"),
    # AMD
    _gpu("Instinct MI325X", 256, "amd", None, "MI325X"),
    _gpu("Instinct MI300X", 192, "amd", None, "MI300X"),
    _gpu("Instinct MI250X", 128, "amd", None, "MI250X"),
    _gpu("Instinct MI210", 64, "amd", None, "MI210"),
    _gpu("Radeon RX 7900 XTX", 24, "amd", None, "7900 XTX"),
    # Apple (unified memory, the largest configuration of each chip)
    _gpu("Apple M1 Max 64GB", 64, "apple", None, "M1 Max"),
    _gpu("Apple M2 Max 96GB", 96, "apple", None, "M2 Max"),
    _gpu("Apple M2 Ultra 192GB", 192, "apple", None, "M2 Ultra"),
    _gpu("Apple M3 Max 128GB", 128, "apple", None, "M3 Max"),
    # Intel
    _gpu("Intel Gaudi 2", 96, "intel", None, "Gaudi 2", "Gaudi2"),
    _gpu("Intel Data Center GPU Max 1550", 128, "intel", None, "Max 1550"),
)

_NOISE = re.compile(r"\b(nvidia|geforce|tesla|amd|instinct|radeon|intel)\b")


def _key(name: str) -> str:
    """Lower case, vendor words dropped, spaces/dashes/underscores removed:
    "NVIDIA GeForce RTX-3090" -> "rtx3090"."""
    text = _NOISE.sub(" ", name.lower())
    text = re.sub(r"[\s_\-]+", "", text)
    return text.replace("gib", "gb")


def _index() -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for gpu in CATALOGUE:
        for name in (gpu.name, *gpu.aliases):
            key = _key(name)
            index.setdefault(key, gpu)
            if key.startswith("rtx"):
                index.setdefault(key[3:], gpu)  # "3090" for "RTX 3090"
    return index


_INDEX = _index()


class UnknownGpuError(ValueError):
    pass


def find_gpu(name: str, configured: Mapping[str, int] | None = None) -> Gpu:
    """The entry for `name` (case, spaces and vendor words ignored) among the
    `configured` GPUs (`[tool.oom-lsp.gpus]`, name -> bytes, which win) and
    the catalogue; UnknownGpuError with a "did you mean" otherwise."""
    key = _key(name)
    extra = {_key(known): Gpu(known, size, "nvidia", None) for known, size in (configured or {}).items()}
    gpu = extra.get(key) or _INDEX.get(key)
    if gpu is not None:
        return gpu
    index = {**_INDEX, **extra}
    close = difflib.get_close_matches(key, list(index), n=3, cutoff=0.6)
    names = list(dict.fromkeys(index[match].name for match in close))
    hint = f"; did you mean {' or '.join(repr(n) for n in names)}?" if names else ""
    raise UnknownGpuError(
        f"unknown GPU {name!r}{hint} (`oom-lsp estimate --list-gpus` lists them; --gpu-memory 24GiB sets any size)"
    )


def custom_gpu(memory: str | int) -> Gpu:
    """A target given by its memory only (`--gpu-memory 24GiB`)."""
    size = parse_memory_size(memory)
    return Gpu(f"GPU with {format_bytes(size)}", size, "nvidia", None)
