"""OOM307: `backward(create_graph=True)`, whose gradients keep their graph in a reference cycle."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, is_true
from oom_lsp.analysis.dataflow import iter_nodes
from oom_lsp.analysis.facts.program import BindingKind, program_of
from oom_lsp.analysis.rule import Invalid, Rule, Valid, deferred_report

_BACKWARD_FUNCTIONS = frozenset({"torch.autograd.backward"})


class BackwardCreatesGraphCycle(Rule):
    """
    ## What it does
    Flags `tensor.backward(create_graph=True)` (and
    `torch.autograd.backward(..., create_graph=True)`). It is shown by
    default where the code reads the gradient of a tensor it made itself
    (`x.requires_grad = True`, then `x.grad`) and never resets that `.grad` to
    `None`: the case PyTorch's own warning describes as a leak.

    ## Why is this bad?
    With `create_graph=True`, every gradient `backward()` accumulates into a
    `.grad` is itself part of a graph that leads back to the tensor holding
    it: a reference cycle between the tensor and its gradient. The double
    backward graph and the activations it saves stay alive as long as the
    `.grad` is set; for a tensor the optimizer never resets (an interpolated
    sample of a gradient penalty), every step's graph is leaked. PyTorch
    warns: "Using backward() with create_graph=True will create a reference
    cycle between the parameter and its gradient which can cause a memory
    leak. We recommend using autograd.grad when creating the graph".

    ## Example
    ```python
    merged.requires_grad = True
    out = discriminator(merged)
    out.backward(torch.ones_like(out), create_graph=True)
    gradient = merged.grad
    ```

    ## Use instead
    ```python
    merged.requires_grad = True
    out = discriminator(merged)
    (gradient,) = torch.autograd.grad(out, merged, torch.ones_like(out), create_graph=True)
    ```
    """

    code = "OOM307"
    name = "backward-create-graph"
    summary = "backward(create_graph=True) keeps each gradient's graph in a reference cycle with its tensor."
    why = (
        "With create_graph=True a gradient is part of a graph that leads back to the tensor holding it: "
        "the graph stays alive until .grad is reset."
    )
    remedy = "Use torch.autograd.grad(..., create_graph=True), or reset .grad to None after use."

    VALID = [
        Valid(
            """
            import torch
            def penalty(discriminator, merged):
                merged.requires_grad_(True)
                out = discriminator(merged)
                (gradient,) = torch.autograd.grad(out, merged, torch.ones_like(out), create_graph=True)
                return gradient.norm()
            """
        ),
        Valid(
            """
            import torch
            def step(model, x):
                loss = model(x).sum()
                loss.backward()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def penalty(discriminator, real, fake):
                merged = 0.5 * real + 0.5 * fake
                merged.requires_grad = True
                out = discriminator(merged)
                out.backward(gradient=torch.ones_like(out), create_graph=True)
                gradient = merged.grad
                return ((gradient.norm() - 1) ** 2).mean()
            """,
            line=7,
        ),
        # Only parameters' gradients, which the optimizer resets each step: strict mode only.
        Invalid(
            """
            import torch
            def hessian_step(model, x, optimizer):
                optimizer.zero_grad()
                loss = model(x).sum()
                loss.backward(create_graph=True)
                optimizer.step()
            """,
            line=6,
            by_default=False,
        ),
    ]

    def leave_Module(self, original_node: cst.Module) -> None:
        if "create_graph" not in self.context.source:
            return
        program = program_of(self.context)
        for scope in program.functions:
            for call in scope.calls:
                if not self._creates_graph(call.node):
                    continue
                body = scope.node if not scope.is_module else self.context.module
                leaked = self._gradient_read_and_kept(body, scope)
                self.context.add_report(
                    deferred_report(
                        self,
                        call.node,
                        (
                            f"backward(create_graph=True) leaves {leaked}.grad holding this step's graph "
                            "in a reference cycle"
                            if leaked
                            else "backward(create_graph=True) ties each gradient to its graph in a reference cycle"
                        ),
                        None,
                        call.path,
                        proven=leaked is not None,
                    )
                )

    def _creates_graph(self, call: cst.Call) -> bool:
        func = call.func
        is_backward = (type(func) is cst.Attribute and func.attr.value == "backward") or (
            self.context.qualified_name(func) in _BACKWARD_FUNCTIONS
        )
        if not is_backward:
            return False
        flag = get_arg(call, "create_graph")
        return isinstance(flag, cst.Arg) and is_true(flag.value)

    def _gradient_read_and_kept(self, body: cst.CSTNode, scope: object) -> str | None:
        """A tensor made in this function whose `.grad` the function reads and
        never resets to None (the optimizer resets its parameters', not it)."""
        program = program_of(self.context)
        read: list[str] = []
        reset: set[str] = set()
        for node in iter_nodes(body):
            if type(node) is cst.Attribute and node.attr.value == "grad":
                owner = dotted_name(node.value)
                if owner is not None and "." not in owner:
                    read.append(owner)
            elif type(node) is cst.Assign:
                for target in node.targets:
                    target_node = target.target
                    if (
                        type(target_node) is cst.Attribute
                        and target_node.attr.value == "grad"
                        and type(node.value) is cst.Name
                        and node.value.value == "None"
                    ):
                        owner = dotted_name(target_node.value)
                        if owner is not None:
                            reset.add(owner)
            elif type(node) is cst.Del:
                owner = dotted_name(node.target.value) if type(node.target) is cst.Attribute else None
                if owner is not None:
                    reset.add(owner)
        for owner in read:
            if owner in reset:
                continue
            bindings = program.lookup(owner, scope)  # type: ignore[arg-type]
            if bindings and all(binding.kind is BindingKind.ASSIGN for binding in bindings):
                return owner
        return None
