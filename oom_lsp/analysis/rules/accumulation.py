"""OOM301 and OOM302: graph-attached tensors kept past the step that made them,
added to an accumulator or stored in a container."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg
from oom_lsp.analysis.dataflow import (
    Kind,
    ScopeFlow,
    facts_for,
    rebinds_every_iteration,
)
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid
from oom_lsp.analysis.rules._autograd import (
    ACCUMULATING,
    ADDITIVE,
    ARITHMETIC,
    NUMBER_CONSUMERS,
    AutogradRule,
    holder_of,
)
from oom_lsp.fixes import detach as detach_fix


@register
class LossAccumulatedWithGraph(AutogradRule):
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
    `outputs.loss`, `.mean()`, arithmetic of those with numbers) and every
    use of the accumulator also works with a float (its own updates,
    arithmetic, f-strings, `print`, logging calls). Otherwise (a tensor of
    several values, or an accumulator that is returned, stored or used as a
    tensor, as in `total.item()`) it becomes `loss.detach()`, which keeps a
    tensor of the same shape and device. `.item()` waits for the GPU once
    per step; `.detach()` does not. Accumulators that feed a `backward()` call, or that a
    non-training loop returns, are not reported: their graph is wanted.
    """

    code = "OOM301"
    name = "loss-accumulated-with-graph"
    summary = (
        "A graph-attached loss or output is accumulated across iterations, keeping every step's graph alive."
    )
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
        Valid(
            "import torch\ntotal = 0\nfor batch in loader:\n    out = model(**batch)\n    total += out.loss.detach()\n"
        ),
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
        if type(node.operator) in ACCUMULATING:
            self._check(node, node.target, node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or type(node.value) is not cst.BinaryOperation:
            return
        if type(node.value.operator) not in ADDITIVE:
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        value = node.value
        if dotted_name(value.left) == target:
            self._check(node, node.targets[0].target, value.right)
        elif type(value.operator) is cst.Add and dotted_name(value.right) == target:
            self._check(node, node.targets[0].target, value.left)

    def _check(self, node: cst.CSTNode, target: cst.BaseExpression, operand: cst.BaseExpression) -> None:
        if self.context.tracker.in_no_grad:
            return
        holder = holder_of(target)
        if holder is None:
            return
        iteration = self._iteration(holder)
        if iteration is None:
            return
        kind = self._flow().kind_of(operand)
        if not kind.attached or kind is Kind.GRAPH_CONTAINER:
            return
        if rebinds_every_iteration(iteration.body, holder, besides=node) or self._kept_on_purpose(
            holder, iteration
        ):
            return
        method = "item" if kind is Kind.GRAPH_SCALAR and self._stays_a_number(holder) else "detach"
        self.report(
            node,
            f"`{holder}` accumulates a graph-attached tensor, so it keeps the autograd graph of every "
            f"iteration alive. Accumulate `.{method}()` instead.",
            fix=FixSpec(
                title=f"Accumulate `.{method}()`",
                edits=detach_fix.call_method(operand, method, self._indent(), self.context.module),
                applicability=Applicability.SAFE,
            ),
        )

    def _stays_a_number(self, holder: str) -> bool:
        """Every use of the accumulator works with a float as well: its own
        updates and resets, arithmetic, f-strings, printing and logging.
        Anything else (returned, stored, `total.item()`) may need a tensor."""
        for use, ancestors in self._summary().uses_of(holder):
            index = len(ancestors) - 1
            child: cst.CSTNode = use
            while index >= 0 and isinstance(ancestors[index], ARITHMETIC):
                child, index = ancestors[index], index - 1
            consumer = ancestors[index] if index >= 0 else None
            if isinstance(consumer, (cst.AugAssign, cst.AssignTarget)) and child is use:
                continue  # `total += ...`, `total = 0.0`
            if isinstance(consumer, cst.Assign) and _assigns_to(consumer, holder):
                continue  # `total = total + loss`
            if isinstance(consumer, cst.AugAssign) and dotted_name(consumer.target) == holder:
                continue
            if isinstance(consumer, cst.FormattedString):
                continue
            if isinstance(consumer, cst.Arg) and index >= 1 and isinstance(ancestors[index - 1], cst.Call):
                call = ancestors[index - 1]
                called = (
                    call.func.attr.value if isinstance(call.func, cst.Attribute) else dotted_name(call.func)
                )
                if called in NUMBER_CONSUMERS:
                    continue
            return False
        return True


def _assigns_to(statement: cst.Assign, holder: str) -> bool:
    return any(dotted_name(target.target) == holder for target in statement.targets)


_CONTAINER_FACTORIES = frozenset(
    {"list", "dict", "deque", "defaultdict", "OrderedDict", "collections.deque", "collections.defaultdict",
     "collections.OrderedDict"}
)  # fmt: skip
_STORING_METHODS = {"append": 0, "extend": 0, "insert": 1}


def _is_container_value(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, (cst.List, cst.Dict, cst.ListComp, cst.DictComp)):
        return True
    return isinstance(value, cst.Call) and dotted_name(value.func) in _CONTAINER_FACTORIES


@register
class TensorKeptAcrossIterations(AutogradRule):
    """
    ## What it does
    Flags graph-attached tensors (model outputs, losses) stored in a list or
    dict that outlives the loop iteration, without `.detach()` or `.item()`:
    `losses.append(loss)`, `preds.append(out.cpu())`, `history[k] = out`.

    ## Why is this bad?
    A stored tensor keeps its autograd graph, and the graph keeps the
    activations its backward pass would need: every stored element pins a
    whole forward pass. The list grows by one graph per iteration until the
    GPU runs out. `.cpu()` alone does not help: the CPU copy is still part of
    the graph, so the GPU activations behind it stay allocated.

    ## Example
    ```python
    predictions = []
    for x in loader:
        out = model(x)
        predictions.append(out.cpu())
    ```

    ## Use instead
    ```python
    predictions = []
    for x in loader:
        out = model(x)
        predictions.append(out.detach().cpu())
    ```

    ## Fix safety
    Safe: `.detach()` is inserted before the value is stored (before
    `.cpu()` / `.to(...)` when present, so the copy carries no graph). Values
    that later feed a `backward()` call, or that a non-training loop
    returns, are not reported: their graph is wanted.
    """

    code = "OOM302"
    name = "tensor-kept-across-iterations"
    summary = (
        "Graph-attached tensors stored in a list or dict that outlives the iteration keep every step's graph."
    )
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch
            losses, preds = [], []
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                losses.append(loss.item())
                preds.append(out.detach().cpu())
            """
        ),
        Valid(
            """
            import torch
            preds = []
            with torch.no_grad():
                for x in loader:
                    preds.append(model(x).cpu())
            """
        ),
        # Collected to be summed and backpropagated: the graph is wanted.
        Valid(
            """
            import torch
            for batch in loader:
                losses = []
                for head in heads:
                    losses.append(criterion(model(batch), head))
                torch.stack(losses).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            outputs = []
            for x in loader:
                out = model(x)
                loss = out.mean()
                loss.backward()
                outputs.append(out.argmax(-1))
                outputs.extend(out.tolist())
            """
        ),
        # Not a list: an object whose `append` we know nothing about.
        Valid("import torch\nfor x in loader:\n    out = model(x)\n    logger.append(out)\n"),
        # The list is created in the iteration.
        Valid("import torch\nfor x in loader:\n    batch_preds = []\n    batch_preds.append(model(x))\n"),
        # Not in a loop.
        Valid("import torch\nkept = []\nkept.append(model(x))\n"),
        # Unknown value.
        Valid("import torch\nkept = []\nfor x in loader:\n    kept.append(transform(x))\n"),
        # A local function called `model` is no module.
        Valid(
            """
            import torch
            def model(batch):
                return [len(batch)]
            kept = []
            for batch in loader:
                kept.append(model(batch))
            """
        ),
        Valid("import torch\nkept = []\nfor x in loader:\n    kept.append(**model(x))\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            predictions = []
            for x in loader:
                out = model(x)
                predictions.append(out.cpu())
            """,
            line=6,
            expected_fix="""
            import torch
            predictions = []
            for x in loader:
                out = model(x)
                predictions.append(out.detach().cpu())
            """,
        ),
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class Net(nn.Module):
                def forward(self, x):
                    return x

            def train(loader, opt):
                net = Net()
                history = {}
                losses = []
                for step, (x, y) in enumerate(loader):
                    logits = net(x)[0]
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    opt.step()
                    losses.append(loss)
                    history[step] = {"logits": logits, "step": step}
                return losses
            """,
            line=18,
            expected_fix="""
            import torch.nn as nn
            import torch.nn.functional as F

            class Net(nn.Module):
                def forward(self, x):
                    return x

            def train(loader, opt):
                net = Net()
                history = {}
                losses = []
                for step, (x, y) in enumerate(loader):
                    logits = net(x)[0]
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    opt.step()
                    losses.append(loss.detach())
                    history[step] = {"logits": logits.detach(), "step": step}
                return losses
            """,
        ),
        Invalid(
            """
            import torch
            class Evaluator:
                def __init__(self, model):
                    self.model = model
                    self.outputs = []

                def run(self, loader):
                    for batch in loader:
                        self.outputs.extend(self.model(batch) * 2 for _ in range(1))
                        self.outputs.insert(0, self.model(batch) + 1)
            """,
            line=11,
            expected_fix="""
            import torch
            class Evaluator:
                def __init__(self, model):
                    self.model = model
                    self.outputs = []

                def run(self, loader):
                    for batch in loader:
                        self.outputs.extend(self.model(batch) * 2 for _ in range(1))
                        self.outputs.insert(0, (self.model(batch) + 1).detach())
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is not cst.Attribute or func.attr.value not in _STORING_METHODS:
            return
        position = _STORING_METHODS[func.attr.value]
        stored = get_arg(node, "object", position)
        if stored is None or stored is UNKNOWN or stored.star:
            return
        self._check(node, func.value, stored.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if type(target.target) is cst.Subscript:
                self._check(node, target.target.value, node.value)

    def _check(self, node: cst.CSTNode, container: cst.BaseExpression, stored: cst.BaseExpression) -> None:
        if self.context.tracker.in_no_grad:
            return
        holder = dotted_name(container)
        if holder is None:
            return
        iteration = self._iteration(holder)
        if iteration is None:
            return
        attached = _attached_parts(stored, self._flow())
        if not attached:
            return
        if rebinds_every_iteration(iteration.body, holder) or not self._holds_a_container(holder):
            return
        if self._kept_on_purpose(holder, iteration):
            return
        flow = self._flow()
        fix = None
        # A dict or model output holding a graph-attached tensor has no `.detach()`.
        if all(flow.kind_of(part) is not Kind.GRAPH_CONTAINER for part in attached):
            indent = self._indent()
            edits = tuple(
                edit for part in attached for edit in detach_fix.detach(part, indent, self.context.module)
            )
            fix = FixSpec(title="Detach before storing", edits=edits, applicability=Applicability.SAFE)
        self.report(
            node,
            f"`{holder}` keeps graph-attached tensors across iterations, and with them the autograd graph and "
            "activations of every step. Store `.detach()`ed values (then `.cpu()`) instead.",
            fix=fix,
        )

    def _holds_a_container(self, holder: str) -> bool:
        """`holder` is only ever bound to a list or dict: in this scope, at
        module level, or (`self.x`) in a method of the class."""
        facts = facts_for(self.context)
        function = self.context.tracker.current_function
        summaries = [facts.summary(function)]
        if holder.startswith("self.") and function is not None and function in facts.class_of:
            owner = facts.class_of[function]
            summaries += [
                facts.summary(method)
                for method, method_owner in facts.class_of.items()
                if method_owner is owner and method is not function
            ]
        elif function is not None:
            summaries.append(facts.summary(None))
        values = [value for summary in summaries for value in summary.bindings.get(holder, ())]
        return bool(values) and all(_is_container_value(value) for value in values)


def _attached_parts(stored: cst.BaseExpression, flow: ScopeFlow) -> list[cst.BaseExpression]:
    """The graph-attached parts of a stored value: the value itself, or the
    elements of a list / tuple / dict literal."""
    if isinstance(stored, (cst.List, cst.Tuple)):
        return [part for element in stored.elements for part in _attached_parts(element.value, flow)]
    if isinstance(stored, cst.Dict):
        return [
            part
            for element in stored.elements
            if isinstance(element, cst.DictElement)
            for part in _attached_parts(element.value, flow)
        ]
    return [stored] if flow.kind_of(stored).attached else []


# Words that make a function an evaluation function, as the first or last
# word of its snake_case name: `evaluate`, `run_validation`, `predict_batch`.
