"""OOM5xx: runtime calls that put or keep memory on the device."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.cst_helpers import get_arg
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.fixes.map_location import add_map_location


@register
class TorchLoadWithoutMapLocation(Rule):
    """
    ## What it does
    Flags `torch.load(...)` calls that do not pass `map_location`.

    ## Why is this bad?
    Without `map_location`, every tensor in the checkpoint is restored onto the
    device it was saved from. A checkpoint saved during GPU training lands on
    the GPU a second time, next to the model's own parameters and optimizer
    state: loading a 7 GB checkpoint briefly needs 7 GB of free GPU memory on
    top of the model, and on a multi-GPU machine every rank loads onto GPU 0.

    ## Example
    ```python
    state = torch.load("checkpoint.pt")
    model.load_state_dict(state)
    ```

    ## Use instead
    ```python
    state = torch.load("checkpoint.pt", map_location="cpu")
    model.load_state_dict(state)
    ```

    ## Fix safety
    Safe: `load_state_dict` copies the values into the model's tensors on
    their device, so loading onto the CPU first changes no result.
    """

    code = "OOM501"
    name = "torch-load-without-map-location"
    summary = "`torch.load` without `map_location` restores tensors onto the GPU they were saved from."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid('import torch\nstate = torch.load("ckpt.pt", map_location="cpu")\n'),
        Valid('import torch\nstate = torch.load("ckpt.pt", "cpu")\n'),
        Valid('import torch\nkwargs = {"map_location": "cpu"}\nstate = torch.load("ckpt.pt", **kwargs)\n'),
        # A local function called `load` is not torch's.
        Valid('import pickle\ndef load(path):\n    return pickle.load(open(path, "rb"))\nstate = load("ckpt.pt")\n'),
    ]
    INVALID = [
        Invalid(
            'import torch\nstate = torch.load("ckpt.pt")\n',
            line=2,
            expected_fix='import torch\nstate = torch.load("ckpt.pt", map_location="cpu")\n',
        ),
        Invalid(
            'import torch as T\nstate = T.load(path, weights_only=True)\n',
            line=2,
            expected_fix='import torch as T\nstate = T.load(path, weights_only=True, map_location="cpu")\n',
        ),
        Invalid(
            'from torch import load\n\nstate = load(\n    "ckpt.pt",\n)\n',
            line=3,
            expected_fix='from torch import load\n\nstate = load(\n    "ckpt.pt", map_location="cpu",\n)\n',
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.context.call_name(node) != "torch.load":
            return
        if get_arg(node, "map_location", 1) is not None:  # present, or UNKNOWN via a splat
            return
        fix = FixSpec(
            title='Pass `map_location="cpu"`',
            edits=add_map_location(node),
            applicability=Applicability.SAFE,
        )
        self.report(
            node,
            "`torch.load` without `map_location` restores every tensor onto the device it was saved "
            'from, next to the model\'s own copy. Pass `map_location="cpu"` and move what you need.',
            fix=fix,
        )

