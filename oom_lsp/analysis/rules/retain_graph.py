"""OOM304: `backward(retain_graph=True)` in a training loop."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.cst_helpers import get_arg, is_true
from oom_lsp.analysis.dataflow import (
    assigned_names,
    dotted_names_in,
    is_backward_call,
    iter_nodes,
)
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid
from oom_lsp.analysis.rules._autograd import AutogradRule
from oom_lsp.edits import DeleteStatement, InsertAfter, InsertBefore, NodeEdit
from oom_lsp.fixes import retain_graph


class RetainGraphInLoop(AutogradRule):
    """
    ## What it does
    Flags `backward(retain_graph=True)` (a tensor's, `accelerator.backward`,
    `torch.autograd.backward`) in a training loop: a loop that computes a
    new loss every iteration, or steps an optimizer. Loops over several
    losses of one graph (`for loss in losses: loss.backward(retain_graph=True)`)
    and higher-order gradients (`create_graph=True`) are not reported.

    ## Why is this bad?
    `retain_graph=True` keeps the graph's saved activations after the
    backward pass instead of freeing them as it goes. In a training loop it
    is usually a workaround for "Trying to backward through the graph a
    second time", whose real cause is a tensor carried from one iteration to
    the next (a hidden state, an accumulated loss): the retained graphs then
    chain across iterations and memory grows every step. When a second
    backward pass in the same step goes through the same graph (two losses
    of one forward pass), every activation stays allocated until it ends:
    summing the losses and calling `backward()` once frees them
    progressively, with the same gradients.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward(retain_graph=True)
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    Unsafe. When no other backward pass follows in the iteration, the
    argument is dropped; if a backward pass elsewhere (another function)
    goes through the same graph, it will then fail with "Trying to backward
    through the graph a second time", and the remedy is to detach what is
    carried across iterations. When `a.backward(retain_graph=True)` is
    followed by `b.backward()`, the two become `(a + b).backward()` (the same
    gradients, summed once). Other cases are reported without a fix.
    """

    code = "OOM304"
    name = "retain-graph-in-loop"
    summary = "`backward(retain_graph=True)` in a training loop keeps the step's graph and activations alive."
    why = (
        "retain_graph=True keeps the graph and its activations after the backward pass; in a training "
        "loop they pile up across iterations."
    )
    remedy = "Drop it: sum the losses and call backward() once, or detach what is carried between steps."
    fix_applicability = Applicability.UNSAFE

    VALID = [
        Valid(
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
        Valid("import torch\nloss.backward(retain_graph=True)\n"),
        Valid("import torch\nfor x in loader:\n    loss.backward(retain_graph=keep)\n    opt.step()\n"),
        Valid("import torch\nfor x in loader:\n    loss.backward(**backward_options)\n    opt.step()\n"),
        # Backward over the losses of one graph, not a training loop.
        Valid("import torch\nfor loss in losses:\n    loss.backward(retain_graph=True)\n"),
        Valid("import torch\nfor x in loader:\n    loss.backward(None, False)\n    opt.step()\n"),
        # Higher-order gradients need the graph.
        Valid(
            """
            import torch
            for x in loader:
                loss = model(x).sum()
                loss.backward(create_graph=True, retain_graph=True)
                opt.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward(retain_graph=True)
                optimizer.step()
            """,
            line=5,
            expected_fix="""
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            from torch import autograd
            while True:
                loss = model(batch).mean()
                autograd.backward(
                    [loss],
                    retain_graph=True,
                )
                if step % 4 == 0:
                    scaler.step(optimizer)
            """,
            line=6,
            expected_fix="""
            import torch
            from torch import autograd
            while True:
                loss = model(batch).mean()
                autograd.backward(
                    [loss],
                )
                if step % 4 == 0:
                    scaler.step(optimizer)
            """,
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                accelerator.backward(loss, retain_graph=True, inputs=params)
                optimizer.step()
            """,
            line=4,
            expected_fix="""
            import torch
            for batch in loader:
                accelerator.backward(loss, inputs=params)
                optimizer.step()
            """,
        ),
        # Two losses of one forward pass: summed, one backward.
        Invalid(
            """
            import torch
            for x, y in loader:
                logits = model(x)
                bce, dice = bce_loss(logits, y), dice_loss(logits, y)
                optimizer.zero_grad()
                bce.backward(retain_graph=True)  # both losses
                dice.backward()
                optimizer.step()
            """,
            line=7,
            expected_fix="""
            import torch
            for x, y in loader:
                logits = model(x)
                bce, dice = bce_loss(logits, y), dice_loss(logits, y)
                optimizer.zero_grad()
                (bce + dice).backward()
                optimizer.step()
            """,
        ),
        # A later backward pass through the same graph: reported, no fix.
        Invalid(
            """
            import torch
            for real in loader:
                fake = netG(noise)
                err_fake = criterion(netD(fake), zeros)
                err_fake.backward(retain_graph=True)
                optimizerD.step()
                criterion(netD(fake), ones).backward()
                optimizerG.step()
            """,
            line=6,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        tracker = self.context.tracker
        if not tracker.in_loop:
            return
        # A method call other than `.backward()` is no `torch.autograd.backward`
        # either (a qualified name ends like the call): no lookup needed.
        if type(node.func) is cst.Attribute and node.func.attr.value != "backward":
            return
        if self.context.call_name(node) == "torch.autograd.backward":
            retain = get_arg(node, "retain_graph", 2)
            graph_args = node.args[:1]
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            # Tensor.backward(gradient, retain_graph, ...); other objects' backward: by keyword only.
            tensor_like = self.context.qualified_name(node.func.value) is None and _positional_only_args(node)
            retain = get_arg(node, "retain_graph", 1 if tensor_like else None)
            graph_args = node.args[:1] if not tensor_like else []
        else:
            return
        if not isinstance(retain, cst.Arg) or not is_true(retain.value):
            return
        if get_arg(node, "create_graph", 2 if self.context.call_name(node) is None else 3) is not None:
            return  # present (higher-order gradients) or maybe present
        loop = tracker.loops[-1]
        graph_names = set().union(
            *(dotted_names_in(arg.value) for arg in graph_args),
            dotted_names_in(node.func.value) if isinstance(node.func, cst.Attribute) else set(),
        )
        if not (_steps_optimizer(loop) or _assigned_in(loop, graph_names)):
            return
        later = self._next_backward(node, loop)
        if later is None:
            fix = FixSpec(
                "Drop `retain_graph=True`",
                retain_graph.drop_argument(node, retain, self._indent(), self.context.module),
                Applicability.UNSAFE,
            )
            message = "retain_graph=True in a training loop keeps each step's graph alive after backward"
        else:
            edits = self._sum_losses(node, later, loop)
            fix = FixSpec("Sum the losses, backward once", edits, Applicability.UNSAFE) if edits else None
            message = "retain_graph=True keeps this graph's activations until the step's next backward"
        self.report(node, message, fix=fix)

    def _next_backward(self, node: cst.Call, loop: cst.For | cst.While) -> cst.Call | None:
        calls = [inner for inner in iter_nodes(loop.body) if is_backward_call(inner, self.context)]
        for index, call in enumerate(calls):
            if call is node:
                return calls[index + 1] if index + 1 < len(calls) else None
        return None

    def _sum_losses(
        self, first: cst.Call, second: cst.Call, loop: cst.For | cst.While
    ) -> tuple[NodeEdit, ...] | None:
        """`a.backward(retain_graph=True); b.backward()` -> `(a + b).backward()`,
        when both are plain statements of their own and one follows the other."""
        first_statement = self.context.tracker.current_statement
        statements = list(loop.body.body) if isinstance(loop.body, cst.IndentedBlock) else []
        for index, statement in enumerate(statements[:-1]):
            if statement is not first_statement:
                continue
            following = statements[index + 1]
            if not (_sole_call(statement) is first and _sole_call(following) is second):
                return None
            if len(first.args) != 1 or second.args:
                return None
            if not isinstance(first.func, cst.Attribute) or not isinstance(second.func, cst.Attribute):
                return None
            first_loss, second_loss = first.func.value, second.func.value
            if not isinstance(first_loss, cst.Name) or not isinstance(second_loss, cst.Name):
                return None
            return (
                DeleteStatement(statement),
                InsertBefore(second_loss, f"({first_loss.value} + "),
                InsertAfter(second_loss, ")"),
            )
        return None


def _sole_call(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """The call a statement consists of (`loss.backward()`), if so."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr):
            return small.value
    return None


def _assigned_in(loop: cst.For | cst.While, names: set[str]) -> bool:
    """A value of `names` is computed in the loop body (not only iterated over)."""
    return any(
        name in names and value is not None
        for node in iter_nodes(loop.body)
        for name, value in assigned_names(node)
    )


def _positional_only_args(call: cst.Call) -> bool:
    """`x.backward(g, True)`: a positional retain_graph is only trusted
    when the call passes no keyword and no splat."""
    return all(arg.keyword is None and not arg.star for arg in call.args)


def _steps_optimizer(loop: cst.For | cst.While) -> bool:
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step"
        for node in iter_nodes(loop.body)
    )
