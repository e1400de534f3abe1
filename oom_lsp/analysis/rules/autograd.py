"""OOM3xx: autograd graphs kept alive longer than a step.

Every rule here asks the data flow of `oom_lsp.analysis.dataflow` whether a
value is graph-attached, and stays silent when it cannot tell.
"""

from __future__ import annotations

import re

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg, is_true
from oom_lsp.analysis.dataflow import (
    Kind,
    Role,
    ScopeFlow,
    ScopeSummary,
    assigned_names,
    binds_inside,
    contains_backward,
    facts_for,
    iter_nodes,
    iter_scope_nodes,
)
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.fixes import detach as detach_fix
from oom_lsp.fixes import hidden_state, inference_mode, retain_graph


class _AutogradRule(Rule):
    """Shared access to the file's data flow."""

    def _flow(self) -> ScopeFlow:
        return facts_for(self.context).flow(self.context.tracker.current_function)

    def _summary(self) -> ScopeSummary:
        return facts_for(self.context).summary(self.context.tracker.current_function)

    def _kept_on_purpose(self, holder: str, loop: cst.For | cst.While) -> bool:
        """The graph is wanted: the holder feeds a backward pass, or it is
        returned from a loop that does not train (a loss summed over heads or
        chunks, backpropagated by the caller)."""
        summary = self._summary()
        if holder in summary.feeds_backward:
            return True
        return holder in summary.returned and not contains_backward(loop.body, self.context)


_ACCUMULATING = (cst.AddAssign, cst.SubtractAssign)
# Using any of these on the accumulator needs it to stay a tensor.
_TENSOR_USES = frozenset(
    {"item", "cpu", "cuda", "to", "detach", "numpy", "tolist", "backward", "mean", "sum", "float", "clone", "size"}
)


def _holder(target: cst.BaseExpression) -> str | None:
    """The name that outlives the statement: `total`, `self.total`, the
    `stats` of `stats["loss"]`."""
    if isinstance(target, cst.Subscript):
        return dotted_name(target.value)
    return dotted_name(target)


@register
class LossAccumulatedWithGraph(_AutogradRule):
    """
    ## What it does
    Flags a graph-attached tensor (a loss, a model output) added to an
    accumulator that outlives the loop iteration: `total_loss += loss`,
    `total = total + loss`.

    ## Why is this bad?
    `loss` carries its autograd graph, and `total_loss + loss` makes a new
    tensor whose graph contains it. The accumulator therefore keeps the graph
    of every iteration alive, with the saved activations of each forward pass
    until `backward()` frees them, and the graph nodes themselves forever:
    memory grows with every step until the epoch ends, or the GPU runs out.

    ## Example
    ```python
    total_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total_loss += loss
    ```

    ## Use instead
    ```python
    total_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total_loss += loss.item()
    ```

    ## Fix safety
    Safe. The accumulated operand becomes `loss.item()` when the analysis
    knows it is a scalar loss (a criterion with a reducing `reduction`,
    `outputs.loss`, `.mean()`, arithmetic of those with numbers) and the
    accumulator is never used as a tensor (`total.item()`, `total.cpu()`...);
    otherwise it becomes `loss.detach()`, which keeps a tensor of the same
    shape and device. Accumulators that feed a `backward()` call, or that a
    non-training loop returns, are not reported: their graph is wanted.
    """

    code = "OOM301"
    name = "loss-accumulated-with-graph"
    summary = "A graph-attached loss or output is accumulated across iterations, keeping every step's graph alive."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += loss.item()
            """
        ),
        Valid(
            """
            import torch
            total = 0.0
            for x, y in loader:
                out = model(x)
                total += out.detach().sum()
                total = total + float(out.mean())
            """
        ),
        # Computed under no_grad: no graph.
        Valid(
            """
            import torch
            import torch.nn.functional as F
            total = 0
            with torch.no_grad():
                for x, y in loader:
                    total += F.cross_entropy(model(x), y)
            """
        ),
        Valid(
            """
            import torch
            @torch.inference_mode()
            def evaluate(model, loader, criterion):
                total = 0
                for x, y in loader:
                    total += criterion(model(x), y)
                return total
            """
        ),
        # The accumulator is reset in the iteration: it does not outlive it.
        Valid(
            """
            import torch
            for x, y in loader:
                loss = 0
                for head in range(3):
                    pass
                loss += criterion(model(x), y)
                loss.backward()
            """
        ),
        # Summed on purpose, then backpropagated.
        Valid(
            """
            import torch
            for batch in loader:
                optimizer.zero_grad()
                total = 0
                for chunk in batch.split(8):
                    total += criterion(model(chunk), chunk)
                (total / 4).backward()
                optimizer.step()
            """
        ),
        # Returned by a loop that does not train: the caller backpropagates.
        Valid(
            """
            import torch.nn.functional as F
            def deep_supervision_loss(model, xs, y):
                loss = 0
                for x in xs:
                    loss += F.mse_loss(model(x), y)
                return loss
            """
        ),
        # A local function called `model` is no module.
        Valid(
            """
            import torch
            def model(x):
                return 2 * x
            total = 0
            for x in xs:
                total += model(x)
            """
        ),
        # Not in a loop.
        Valid("import torch\ntotal = 0\nloss = criterion(model(x), y)\ntotal += loss\n"),
        # Unknown callee: silent.
        Valid("import torch\ntotal = 0\nfor x in xs:\n    total += compute(x)\n"),
        # The loss may be detached on one path: cannot tell.
        Valid(
            """
            import torch
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                if log:
                    loss = loss.item()
                total += loss
            """
        ),
        Valid("import torch\ntotal = 0\nfor batch in loader:\n    out = model(**batch)\n    total += out.loss.detach()\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += loss
            """,
            line=8,
            expected_fix="""
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += loss.item()
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            def train(net, loader, opt):
                running = 0.0
                for step, (x, y) in enumerate(loader):
                    out = net(x)
                    loss_a = F.cross_entropy(out, y)
                    loss = loss_a + 0.1 * out.pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    running = running + loss  # logged below
                    print(running / (step + 1))
            """,
            line=14,
            expected_fix="""
            import torch
            import torch.nn.functional as F

            def train(net, loader, opt):
                running = 0.0
                for step, (x, y) in enumerate(loader):
                    out = net(x)
                    loss_a = F.cross_entropy(out, y)
                    loss = loss_a + 0.1 * out.pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    running = running + loss.item()  # logged below
                    print(running / (step + 1))
            """,
        ),
        # The accumulator is used as a tensor afterwards: `.detach()`.
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            lm = AutoModelForCausalLM.from_pretrained("gpt2")
            total = torch.zeros(())
            for batch in loader:
                outputs = lm(**batch)
                outputs.loss.backward()
                total += outputs.loss
            print(total.item())
            """,
            line=9,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM
            lm = AutoModelForCausalLM.from_pretrained("gpt2")
            total = torch.zeros(())
            for batch in loader:
                outputs = lm(**batch)
                outputs.loss.backward()
                total += outputs.loss.detach()
            print(total.item())
            """,
        ),
        # Not known to be a scalar (per-sample losses): `.detach()`.
        Invalid(
            """
            import torch.nn as nn
            class Trainer:
                def fit(self, loader):
                    self.criterion = nn.MSELoss(reduction="none")
                    for x, y in loader:
                        self.epoch_loss += self.criterion(self.model(x), y) * 2
            """,
            line=7,
            expected_fix="""
            import torch.nn as nn
            class Trainer:
                def fit(self, loader):
                    self.criterion = nn.MSELoss(reduction="none")
                    for x, y in loader:
                        self.epoch_loss += (self.criterion(self.model(x), y) * 2).detach()
            """,
        ),
    ]

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.operator, _ACCUMULATING):
            self._check(node, node.target, node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or not isinstance(node.value, cst.BinaryOperation):
            return
        if not isinstance(node.value.operator, (cst.Add, cst.Subtract)):
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        value = node.value
        if dotted_name(value.left) == target:
            self._check(node, node.targets[0].target, value.right)
        elif isinstance(value.operator, cst.Add) and dotted_name(value.right) == target:
            self._check(node, node.targets[0].target, value.left)

    def _check(self, node: cst.CSTNode, target: cst.BaseExpression, operand: cst.BaseExpression) -> None:
        tracker = self.context.tracker
        if not tracker.in_loop or tracker.in_no_grad:
            return
        holder = _holder(target)
        if holder is None:
            return
        kind = self._flow().kind_of(operand)
        if not kind.attached:
            return
        loop = tracker.loops[-1]
        if binds_inside(loop, holder, besides=node) or self._kept_on_purpose(holder, loop):
            return
        method = "item" if kind is Kind.GRAPH_SCALAR and not self._used_as_tensor(holder) else "detach"
        self.report(
            node,
            f"`{holder}` accumulates a graph-attached tensor, so it keeps the autograd graph of every "
            f"iteration alive. Accumulate `.{method}()` instead.",
            fix=FixSpec(
                title=f"Accumulate `.{method}()`",
                edits=detach_fix.call_method(operand, method),
                applicability=Applicability.SAFE,
            ),
        )

    def _used_as_tensor(self, holder: str) -> bool:
        for node in iter_scope_nodes(self._summary().body):
            if (
                isinstance(node, cst.Attribute)
                and node.attr.value in _TENSOR_USES
                and dotted_name(node.value) == holder
            ):
                return True
        return False


