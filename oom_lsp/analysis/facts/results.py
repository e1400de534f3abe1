"""The typed answers of the size facts (`oom_lsp.analysis.facts.sizes`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Bytes per element of the dtypes the size facts name (torch's and NumPy's names agree).
ITEMSIZE: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class KnownInt:
    """An integer the code states, and where it comes from.

    `evidence` names the figures it was computed from, for messages:
    "batch_size=256 (argparse default)", "4 * 1024". `from_default` is True
    when one of them is a default that a caller or the command line may
    override (a parameter's default, an argparse default, a dataclass field
    filled in by an argument parser), so a rule may word its message as
    "at the default ...".
    """

    value: int
    evidence: str
    from_default: bool = False


@dataclass(frozen=True)
class TensorSize:
    """A tensor (or NumPy array) the code builds.

    `shape` holds None for a dimension the code does not state; `elements`
    is their product when all are known. `dtype` is torch's name
    ("float32", "int64", "bfloat16"), None when unknown.
    """

    shape: tuple[int | None, ...] | None
    elements: int | None
    dtype: str | None
    device: Device
    evidence: str
    from_default: bool = False
    numpy: bool = False

    @property
    def itemsize(self) -> int | None:
        return ITEMSIZE.get(self.dtype) if self.dtype else None

    @property
    def bytes(self) -> int | None:
        if self.elements is None or self.itemsize is None:
            return None
        return self.elements * self.itemsize


@dataclass(frozen=True)
class ModelSize:
    """A model the code builds or loads.

    `parameters` counts each parameter once (tied weights once, as
    `sum(p.numel() for p in model.parameters())` does). With `exact` False it
    is a lower bound: some submodules were not understood (a class of another
    file, an unknown library layer). The shape fields are filled when the
    model says them (a pretrained checkpoint's config, a transformer's
    constructor arguments); `family` is the architecture ("llama", "bert",
    "resnet", ...) for known models, `name` the checkpoint or architecture
    name it was loaded by.
    """

    parameters: int
    exact: bool
    evidence: str
    from_default: bool = False
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    family: str | None = None
    name: str | None = None
