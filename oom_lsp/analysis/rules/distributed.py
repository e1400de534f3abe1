"""OOM603: DistributedDataParallel keeping a second copy of the gradients in its buckets."""

from __future__ import annotations

import re

import libcst as cst

from oom_lsp.analysis.cst_helpers import get_arg
from oom_lsp.analysis.facts.sizes import model_size
from oom_lsp.analysis.facts.workload import MATTERS, format_bytes
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.fixes.ddp import add_gradient_as_bucket_view

_DDP = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
}
# Positional arguments before `gradient_as_bucket_view` (module, device_ids, ..., check_reduction);
# the count moved between releases (init_sync), so a call with that many is not read.
_POSITIONAL_BEFORE = 10
# In-place changes that a gradient which is a view of a bucket refuses (DDP's documentation).
_GRAD_DETACH_RE = re.compile(r"\.grad(?:\.data)?\.(?:detach_|requires_grad_)\(")


class DdpBucketCopy(Rule):
    """
    ## What it does
    Flags `DistributedDataParallel(...)` without `gradient_as_bucket_view`,
    unless the file detaches gradients in place (`p.grad.detach_()`,
    `p.grad.requires_grad_()`), which a gradient that is a view of a bucket
    refuses. An explicit `gradient_as_bucket_view=False` is a choice, and is
    left alone.

    Off by default: select it with `--select OOM603` (or
    `extend-select = ["OOM603"]`). It applies to nearly every DDP script:
    in the real code we check (nanoGPT, DINO, MAE, detectron2, YOLOv5,
    pytorch/examples...) it fires on 21 of 22 DDP constructions (none sets
    the flag; the 22nd passes its options through `**kwargs`), and the
    memory it saves matters when a rank is short of it, which
    `oom-lsp estimate train.py --world-size N` tells: its `ddp-buckets`
    line names the bytes for your model.

    ## Why is this bad?
    DDP reduces gradients in flat buckets (25 MiB each by default). By
    default it copies every gradient into its bucket after backward computes
    it, so each rank holds the gradients twice, from the first backward to
    the end of training: one more copy of the parameters' size. With
    `gradient_as_bucket_view=True` the gradients are views into the buckets
    and the copy is gone.

    Measured with `oom-lsp estimate --world-size 4 --device cpu` and its
    ground truth (the same script on real CPU tensors as rank 0 of 4 under
    PyTorch's fake process group, torch 2.13) on a DDP residual MLP of
    8.5 M parameters (32.3 MiB) trained with AdamW: peak 170.7 MiB per step
    without the flag, 140.0 MiB with it from the third step on (-30.7 MiB,
    -18 %, one copy of the gradients less what overlapped). Step 2 peaks
    once at 162.7 MiB with the flag: DDP rebuilds its buckets at the start
    of step 2, and gradients still held from step 1 (`zero_grad` after the
    forward) move from the old buckets to the new ones, which coexist for a
    moment.

    ## Example
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank])
    ```

    ## Use instead
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank], gradient_as_bucket_view=True)
    ```

    ## Fix safety
    Unsafe: the gradients become views into DDP's buckets, so code that
    detaches one in place or changes its `requires_grad` fails, and
    `zero_grad(set_to_none=False)` zeroes the buckets rather than separate
    tensors. The numbers DDP computes do not change.
    """

    code = "OOM603"
    advisory = True
    name = "ddp-bucket-copy"
    summary = "`DistributedDataParallel` keeps a second copy of every gradient in its buckets."
    why = (
        "DDP copies each gradient into a flat bucket to reduce it, so every rank holds the gradients "
        "twice for the whole run: one more copy of the parameters' size."
    )
    remedy = "DistributedDataParallel(..., gradient_as_bucket_view=True): the gradients become views of the buckets."
    fix_applicability = Applicability.UNSAFE
    # A saving, not a mistake, and it applies to nearly every DDP script.
    default_enabled = False

    VALID = [
        Valid(
            """\
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank], gradient_as_bucket_view=True)
            """
        ),
        # A deliberate False, and a value from the configuration.
        Valid(
            """\
            import torch
            model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=False)
            other = torch.nn.parallel.DistributedDataParallel(other, gradient_as_bucket_view=args.bucket_view)
            """
        ),
        # The options come through a splat.
        Valid(
            """\
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, **ddp_kwargs)
            """
        ),
        # The file detaches gradients in place, which views of a bucket refuse.
        Valid(
            """\
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[rank])
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.detach_()
            """
        ),
        # Unwrapping, and a local class with the same name.
        Valid(
            """\
            import torch
            if isinstance(model, torch.nn.parallel.DistributedDataParallel):
                model = model.module
            class DistributedDataParallel:
                pass
            wrapped = DistributedDataParallel(model)
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel
            from transformers import AutoModelForCausalLM
            model = DistributedDataParallel(AutoModelForCausalLM.from_pretrained("gpt2-xl").cuda())
            for batch in loader:
                model(batch).loss.backward()
            """,
            line=5,
            by_default=True,
        ),
        Invalid(
            """\
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[local_rank])
            """,
            line=2,
            expected_fix="""\
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)
            """,
        ),
        # nanoGPT's form, and a call over several lines with a trailing comma.
        Invalid(
            """\
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            if ddp:
                model = DDP(model, device_ids=[ddp_local_rank])
            net = torch.nn.parallel.DistributedDataParallel(
                net,
                find_unused_parameters=True,
            )
            """,
            line=4,
        ),
        Invalid(
            """\
            import torch.nn as nn
            self.model = nn.parallel.DistributedDataParallel(self.model)
            """,
            line=2,
            expected_fix="""\
            import torch.nn as nn
            self.model = nn.parallel.DistributedDataParallel(self.model, gradient_as_bucket_view=True)
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.context.call_name(node) not in _DDP:
            return
        positional = [arg for arg in node.args if arg.keyword is None and not arg.star]
        if len(positional) > _POSITIONAL_BEFORE:
            return
        # Given (a splat may give it too), or refused by the file's own use of the gradients.
        if get_arg(node, "gradient_as_bucket_view") is not None or _GRAD_DETACH_RE.search(
            self.context.source
        ):
            return
        module = node.args[0].value if node.args and not node.args[0].star else None
        size = model_size(self.context, module, self.context.tracker.current_function) if module else None
        stake = size.parameters * 4 if size is not None and size.exact else None
        message = "DistributedDataParallel keeps every gradient twice: in the parameter and in its bucket."
        if stake is not None:
            message = f"DistributedDataParallel keeps every gradient twice: {format_bytes(stake)} more per GPU"
        self.report(
            node,
            message,
            proven=stake is not None and stake >= MATTERS,
            fix=FixSpec(
                title="Pass `gradient_as_bucket_view=True`",
                edits=add_gradient_as_bucket_view(node),
                applicability=Applicability.UNSAFE,
            ),
        )
