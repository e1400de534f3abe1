"""Small helpers the harness's modules share."""

from __future__ import annotations

import os

import torch
from torch.utils import _pytree as pytree

aten = torch.ops.aten

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "inputs", "other")
CUDA_BLOCK = 512
# The harness's own files: never "the user's line", even when the script sits above this folder.
HARNESS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class StopEstimate(BaseException):
    """Raised from the optimizer's step post hook after the last traced step.
    A BaseException so that the user's `except Exception` does not swallow it."""


def is_harness_file(filename: str) -> bool:
    return filename.startswith(HARNESS_DIR)


def tensors_in(tree) -> list:
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def op_tensors(values, found: list) -> list:
    """Appends the tensors among an aten op's arguments or results to `found`:
    at the dispatcher those are tensors and (nested) lists and tuples of them,
    walked here in pytree's order, for a fraction of a pytree walk's cost."""
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            op_tensors(value, found)
    return found


def has_exact_values(tensor: torch.Tensor) -> bool:
    """Integer and bool tensors: the ones whose real values a fake run keeps
    (indices, targets), in `StorageTracker.shadows`."""
    return not (tensor.dtype.is_floating_point or tensor.dtype.is_complex)


def is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0].strip() == "cuda"
    # A bare integer is a CUDA ordinal in .to(0) / device=0.
    return isinstance(device, int) and not isinstance(device, bool)
