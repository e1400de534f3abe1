"""Lets `import torchvision` work next to the CPU-only torch wheel, without its C++ ops.

PyPI's Linux torchvision wheels are built against CUDA torch: next to the pinned
`torch==2.13.0+cpu` their extension (`torchvision/_C.so`, linked to libtorch_cuda)
does not load. torchvision copes with that everywhere (`torchvision.extension._has_ops()`
is False, and its ops then raise "Couldn't load custom C++ ops") but in one place:
`torchvision/_meta_registrations.py` registers fake kernels for `torchvision::nms` and
`torchvision::qnms` without checking, and `torch.library.register_fake` raises
"operator torchvision::nms does not exist", so `import torchvision` fails altogether.

With this module imported at interpreter start (a .pth file), that one module is
replaced by an empty one **only when the extension did not load**: the meta kernels it
would register are for ops that do not exist. Nothing is defined or faked: the C++ ops
(nms, roi_align, deform_conv2d, video decoding) stay missing and fail with torchvision's
own error if called. Image classification (datasets, transforms, models) needs none of
them, which is all the estimate zoo uses (pytorch/examples' MNIST and ImageNet, timm).
With a torchvision whose extension loads (a matching CPU build), this changes nothing.

    .venv/bin/python bench/torchvision_without_ops.py install   # into this interpreter's site-packages
    .venv/bin/python bench/torchvision_without_ops.py check     # import torchvision, build a ResNet

Install torchvision itself pinned to the torch release (0.28.0 for torch 2.13.0): an
unpinned one pulls a newer CUDA torch (gigabytes) in place of the CPU wheel.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import shutil
import sys
import sysconfig
from pathlib import Path

_SKIPPED = "torchvision._meta_registrations"
# Not named oom_lsp_*: it loads in every interpreter of the venv, the estimate's child included,
# which must import nothing of oom-lsp (tests/estimate/test_harness_launch.py checks the names).
_INSTALLED_NAME = "torchvision_without_ops"
_EARLIER_NAME = "oom_lsp_torchvision_without_ops"


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        module.__doc__ = (
            "Skipped by torchvision_without_ops: torchvision's C++ extension did not load, "
            "so there are no torchvision ops to register meta kernels for."
        )


class _SkipMetaRegistrationsWithoutOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _SKIPPED:
            return None
        # torchvision/__init__.py imports .extension (which tries to load _C) first.
        extension = sys.modules.get("torchvision.extension")
        if extension is None or extension._has_ops():
            return None
        return importlib.machinery.ModuleSpec(name, _EmptyModuleLoader())


def activate() -> None:
    if not any(isinstance(finder, _SkipMetaRegistrationsWithoutOps) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SkipMetaRegistrationsWithoutOps())


def install() -> Path:
    """Copy this file into the running interpreter's site-packages with a .pth that imports it."""
    site = Path(sysconfig.get_paths()["purelib"])
    for earlier in (site / f"{_EARLIER_NAME}.pth", site / f"{_EARLIER_NAME}.py"):
        earlier.unlink(missing_ok=True)
    shutil.copyfile(__file__, site / f"{_INSTALLED_NAME}.py")
    pth = site / f"{_INSTALLED_NAME}.pth"
    pth.write_text(f"import {_INSTALLED_NAME}; {_INSTALLED_NAME}.activate()\n", encoding="utf-8")
    return pth


def check() -> str:
    import torch
    import torchvision
    import torchvision.models

    model = torchvision.models.resnet18(num_classes=10).eval()
    out = model(torch.zeros(1, 3, 32, 32))
    return (
        f"torch {torch.__version__}, torchvision {torchvision.__version__} "
        f"(C++ ops {'loaded' if torchvision.extension._has_ops() else 'missing'}): resnet18 -> {tuple(out.shape)}"
    )


def main(argv: list[str]) -> int:
    if argv[1:] == ["install"]:
        print(f"installed {install()}")
        return 0
    if argv[1:] == ["check"]:
        print(check())
        return 0
    print(f"usage: {argv[0]} install|check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
