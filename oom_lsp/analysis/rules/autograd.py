"""OOM3xx: autograd graphs kept alive longer than a step.

Every rule here asks the data flow of `oom_lsp.analysis.dataflow` whether a
value is graph-attached, and stays silent when it cannot tell.
"""

from __future__ import annotations

import re

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg, is_true
from oom_lsp.analysis.dataflow import (
    Callee,
    Kind,
    Role,
    ScopeFlow,
    ScopeSummary,
    assigned_names,
    binds_inside,
    contains_backward,
    dotted_names_in,
    facts_for,
    is_backward_call,
    iter_nodes,
    maybe_grad_disabling,
    rebinds_every_iteration,
)
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.edits import DeleteStatement, InsertAfter, InsertBefore, NodeEdit
from oom_lsp.fixes import detach as detach_fix
from oom_lsp.fixes import hidden_state, inference_mode, retain_graph


class _AutogradRule(Rule):
    """Shared access to the file's data flow, and the indentation of the
    current statement (for edits that generate multi-line code)."""

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._blocks: list[cst.IndentedBlock] = []

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def _indent(self, depth: int | None = None) -> str:
        """The indentation of the statements of the innermost `depth` blocks
        (all the blocks around the current node by default)."""
        default = self.context.module.default_indent
        blocks = self._blocks if depth is None else self._blocks[:depth]
        return "".join(block.indent if block.indent is not None else default for block in blocks)

    def _flow(self) -> ScopeFlow:
        return facts_for(self.context).flow(self.context.tracker.current_function)

    def _summary(self) -> ScopeSummary:
        return facts_for(self.context).summary(self.context.tracker.current_function)

    def _iteration(self, holder: str) -> cst.For | cst.While | cst.FunctionDef | None:
        """What runs once per step around the current node: the innermost
        loop, or a Lightning `training_step` (called once per batch) when
        `holder` is an attribute of the module, which outlives the call."""
        tracker = self.context.tracker
        function = tracker.current_function
        if function is not None and function.name.value in _FORWARD_METHODS:
            return None  # a forward pass keeps what its backward pass needs
        if tracker.in_loop:
            return tracker.loops[-1]
        if function is None or function.name.value != "training_step" or not holder.startswith("self."):
            return None
        facts = facts_for(self.context)
        owner = facts.class_of.get(function)
        return function if owner is not None and owner.name.value in facts.module_classes else None

    def _kept_on_purpose(self, holder: str, loop: cst.For | cst.While | cst.FunctionDef) -> bool:
        """The graph is wanted: the holder feeds a backward pass, or it is
        returned from a loop that does not train (a loss summed over heads or
        chunks, backpropagated by the caller)."""
        summary = self._summary()
        if holder in summary.feeds_backward:
            return True
        return holder in summary.returned and not contains_backward(loop.body, self.context)


# Node types are tested exactly (`type(x) is cst.Call`) where a hook runs for
# every node of its kind: libcst has no subclasses of its concrete node
# classes, and isinstance() on them goes through ABCMeta, slow on a miss.
_ACCUMULATING = frozenset({cst.AddAssign, cst.SubtractAssign})
_ADDITIVE = frozenset({cst.Add, cst.Subtract})
_SEQUENCES = frozenset({cst.Tuple, cst.List})
_FORWARD_METHODS = frozenset({"forward", "__call__", "_forward", "forward_features"})
# Consumers that take a Python number as well as a tensor: an accumulator
# only used by them can become a float (`.item()`).
_NUMBER_CONSUMERS = frozenset(
    {"print", "float", "int", "round", "str", "format", "add_scalar", "log", "info", "debug", "warning", "write",
     "set_postfix", "set_description", "log_metrics"}
)  # fmt: skip
_ARITHMETIC = (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.FormattedStringExpression)


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
        if type(node.operator) in _ACCUMULATING:
            self._check(node, node.target, node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or type(node.value) is not cst.BinaryOperation:
            return
        if type(node.value.operator) not in _ADDITIVE:
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
        holder = _holder(target)
        if holder is None:
            return
        iteration = self._iteration(holder)
        if iteration is None:
            return
        kind = self._flow().kind_of(operand)
        if not kind.attached:
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
            while index >= 0 and isinstance(ancestors[index], _ARITHMETIC):
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
                if called in _NUMBER_CONSUMERS:
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
class TensorKeptAcrossIterations(_AutogradRule):
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
        indent = self._indent()
        edits = tuple(
            edit for part in attached for edit in detach_fix.detach(part, indent, self.context.module)
        )
        self.report(
            node,
            f"`{holder}` keeps graph-attached tensors across iterations, and with them the autograd graph and "
            "activations of every step. Store `.detach()`ed values (then `.cpu()`) instead.",
            fix=FixSpec(title="Detach before storing", edits=edits, applicability=Applicability.SAFE),
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
_EVAL_WORDS = frozenset(
    {"evaluate", "evaluation", "eval", "validate", "validation", "predict", "prediction", "infer", "inference",
     "test"}
)  # fmt: skip
# Lightning calls these under no_grad itself.
_LIGHTNING_EVAL_HOOKS = frozenset({"validation_step", "test_step", "predict_step"})
_TEST_FILE_RE = re.compile(r"(^|[/\\])(test_[^/\\]*|[^/\\]*_test)\.py$|(^|[/\\])tests?[/\\]")


def _is_eval_name(name: str) -> bool:
    words = [word for word in name.lower().split("_") if word]
    if not words or name in _LIGHTNING_EVAL_HOOKS or words[-1] == "step":
        return False
    return words[0] in _EVAL_WORDS or words[-1] in _EVAL_WORDS


@register
class EvalWithoutNoGrad(_AutogradRule):
    """
    ## What it does
    Flags forward passes of a model in evaluation or inference code that runs
    with autograd on: calls of a model after `model.eval()` in the same
    function, or of any model in a function named like `evaluate`,
    `validate`, `predict`, `infer`, `test_*`, outside `torch.no_grad()` /
    `torch.inference_mode()` (as a `with` block or a decorator). Each forward
    call is reported. Functions that call `backward()` or
    `torch.autograd.grad` (adversarial examples, saliency maps, gradient
    tests) are not reported.

    ## Why is this bad?
    `model.eval()` changes dropout and batch norm; it does not turn autograd
    off. Every forward pass still records its graph and keeps the activations
    a backward pass would need: evaluation then needs as much memory as
    training, and any output or loss kept across batches (a metric, a list of
    predictions) pins all of them.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct
    ```

    ## Use instead
    ```python
    @torch.inference_mode()
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct
    ```

    ## Fix safety
    Safe. A function named as an evaluation function is decorated with
    `@torch.inference_mode()` (spelled with the file's alias for torch;
    `import torch` is added when the file has none). Elsewhere, the innermost
    loop around the forward call (when it contains no `.eval()`/`.train()`
    switch) or else the statement itself is wrapped in
    `with torch.inference_mode():`. Tensors created under inference mode
    cannot later be saved for a backward pass; evaluation code does not do
    that, and code that calls `backward()` is never reported.
    """

    code = "OOM303"
    name = "eval-without-no-grad"
    summary = "An evaluation forward pass runs with autograd on, keeping the activations a backward pass would need."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                with torch.no_grad():
                    for x, y in loader:
                        out = model(x)
            """
        ),
        Valid(
            """
            import torch as T
            @T.inference_mode()
            def predict(net, x):
                return net(x)
            """
        ),
        Valid(
            """
            from torch import no_grad
            @no_grad()
            def validate(model, batch):
                return model(batch)
            """
        ),
        # Gradients are used: an adversarial attack on an eval-mode model.
        Valid(
            """
            import torch
            def fgsm(model, x, y, criterion):
                model.eval()
                x.requires_grad_(True)
                loss = criterion(model(x), y)
                loss.backward()
                return x.grad.sign()
            """
        ),
        # Back to training mode before the forward pass.
        Valid(
            """
            import torch
            def run(model, loader, opt):
                model.eval()
                model.train()
                for x in loader:
                    model(x)
            """
        ),
        # A frozen teacher in eval mode; the student is trained by someone else.
        Valid(
            """
            import torch
            def distill(teacher, student, x):
                teacher.eval()
                with torch.no_grad():
                    target = teacher(x)
                return student(x), target
            """
        ),
        # Lightning runs validation_step under no_grad.
        Valid(
            """
            import torch
            import lightning as L
            class Lit(L.LightningModule):
                def validation_step(self, batch, batch_idx):
                    return self.model(batch)
            """
        ),
        # Not a model call.
        Valid("import torch\ndef evaluate(metric, preds):\n    return metric(preds)\n"),
        # pytest tests of a model are not evaluation code.
        Valid("import torch\ndef test_forward_shape():\n    assert model(x).shape == (2, 3)\n", settings={}),
        Valid("import torch\ndef evaluate(model, x):\n    model = lambda t: t\n    return model(x)\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct
            """,
            line=7,
            expected_fix="""
            import torch
            @torch.inference_mode()
            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct
            """,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Classifier(nn.Module):
                @staticmethod
                def predict_proba(batch):
                    return nn.Softmax(dim=-1)(batch)

                def predict(self, x):
                    return self(x).softmax(-1)
            """,
            line=10,
            expected_fix="""
            import torch.nn as nn
            import torch

            class Classifier(nn.Module):
                @staticmethod
                def predict_proba(batch):
                    return nn.Softmax(dim=-1)(batch)

                @torch.inference_mode()
                def predict(self, x):
                    return self(x).softmax(-1)
            """,
        ),
        Invalid(
            """
            import torch as T

            def main(model, train_loader, val_loader, epochs):
                for epoch in range(epochs):
                    train_one_epoch(model, train_loader)
                    model.eval()
                    total = 0
                    for x, y in val_loader:  # validation
                        # forward only
                        out = model(
                            x,
                        )
                        total += (out.argmax(-1) == y).sum().item()
                    model.train()
            """,
            line=11,
            expected_fix="""
            import torch as T

            def main(model, train_loader, val_loader, epochs):
                for epoch in range(epochs):
                    train_one_epoch(model, train_loader)
                    model.eval()
                    total = 0
                    with T.inference_mode():
                        for x, y in val_loader:  # validation
                            # forward only
                            out = model(
                                x,
                            )
                            total += (out.argmax(-1) == y).sum().item()
                    model.train()
            """,
        ),
        Invalid(
            """
            import torch
            model = torch.nn.Linear(4, 2)
            model.eval()
            sample = torch.randn(1, 4)
            print(model(sample))  # inference
            """,
            line=6,
            expected_fix="""
            import torch
            model = torch.nn.Linear(4, 2)
            model.eval()
            sample = torch.randn(1, 4)
            with torch.inference_mode():
                print(model(sample))  # inference
            """,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        # Per scope: the models switched to eval mode so far, in source order.
        self._eval_mode: dict[cst.FunctionDef | None, dict[str, bool]] = {}
        self._lambda_depth = 0
        # `with` blocks whose grad mode depends on a value: cannot tell.
        self._maybe_no_grad: list[cst.With] = []
        self._eval_functions: dict[cst.FunctionDef, bool] = {}
        # Tests run models for their outputs, not to serve predictions.
        self._in_test_file = _TEST_FILE_RE.search(context.path) is not None

    def visit_With(self, node: cst.With) -> None:
        if any(maybe_grad_disabling(item.item, self.context) for item in node.items):
            self._maybe_no_grad.append(node)

    def leave_With(self, original_node: cst.With) -> None:
        if self._maybe_no_grad and self._maybe_no_grad[-1] is original_node:
            self._maybe_no_grad.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._lambda_depth += 1

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._lambda_depth -= 1

    def leave_Assign(self, original_node: cst.Assign) -> None:
        """Rebinding a model name forgets its mode, unless the new value is
        the same model switched (`model = model.eval()`, `net = net.to(dev)`)."""
        modes = self._eval_mode.get(self.context.tracker.current_function)
        if not modes:
            return
        for target in original_node.targets:
            name = dotted_name(target.target)
            if name is not None and name in modes:
                switched = _mode_after_chain(original_node.value, name, modes[name])
                if switched is None:
                    del modes[name]
                else:
                    modes[name] = switched

    def visit_Call(self, node: cst.Call) -> None:
        if self._lambda_depth or self._in_test_file or self._maybe_no_grad:
            return
        if self._switches_mode(node):
            return
        if self.context.tracker.in_no_grad:
            return
        function = self.context.tracker.current_function
        eval_function = function is not None and self._is_eval_function(function)
        if not eval_function and not any(self._eval_mode.get(function, {}).values()):
            return  # the common case, decided without the data flow
        callee = self._flow().callee(node.func, node)
        by_name = eval_function and callee.role is Role.MODULE
        switched = self._switched_to_eval(node.func, callee.role)
        if by_name:
            if self._summary().backward_calls:
                return  # gradients are computed here: not inference code
        elif switched is None or self._computes_gradients_around():
            return
        reference = self.context.imports.reference_to("torch.inference_mode")
        imports: tuple[str, ...] = ()
        if reference is None:
            reference, imports = "torch.inference_mode", ("torch",)
        fix = None
        if by_name:
            assert function is not None
            # On an `async def`, a decorator would only cover creating the coroutine, not running it.
            if function.asynchronous is None:
                edits = inference_mode.decorate(function, reference)
                fix = FixSpec(
                    "Decorate the function with `@torch.inference_mode()`", edits, Applicability.SAFE, imports
                )
        else:
            target = self._wrap_target()
            indent = self._indent_of(target) if target is not None else None
            if target is not None and indent is not None:
                edits = inference_mode.wrap(target, indent, self.context.module, reference)
                fix = FixSpec("Wrap in `with torch.inference_mode():`", edits, Applicability.SAFE, imports)
        why = "in an evaluation function" if by_name else f"after `{switched}.eval()`"
        self.report(
            node,
            f"This forward pass runs {why} with autograd on, so it records a graph and keeps the activations "
            "a backward pass would need. Run it under `torch.inference_mode()` (or `torch.no_grad()`).",
            fix=fix,
        )

    def _switched_to_eval(self, func: cst.BaseExpression, role: Role) -> str | None:
        """The model switched to eval mode that `func` runs: `model` for
        `model(x)` (unless known to be no module) and, for a known submodule
        call, `model.encoder(x)`."""
        called = dotted_name(func)
        if called is None:
            return None
        modes = self._eval_mode.get(self.context.tracker.current_function, {})
        if modes.get(called) and role in (Role.MODULE, Role.UNKNOWN):
            return called
        if role is Role.MODULE:
            parts = called.split(".")
            for end in range(len(parts) - 1, 0, -1):
                prefix = ".".join(parts[:end])
                if modes.get(prefix):
                    return prefix
        return None

    def _computes_gradients_around(self) -> bool:
        """A backward pass in the loop around the call (or, outside loops,
        anywhere in the scope): a frozen eval-mode backbone being trained
        through, an adversarial attack."""
        tracker = self.context.tracker
        if tracker.loops:
            return contains_backward(tracker.loops[-1].body, self.context)
        return bool(self._summary().backward_calls)

    def _switches_mode(self, node: cst.Call) -> bool:
        """Records `model.eval()` / `model.train(...)`; True for such a call."""
        if type(node.func) is not cst.Attribute or node.func.attr.value not in ("eval", "train"):
            return False
        receiver = dotted_name(node.func.value)
        if receiver is None or node.func.attr.value == "eval" and node.args:
            return False
        modes = self._eval_mode.setdefault(self.context.tracker.current_function, {})
        if node.func.attr.value == "eval":
            modes[receiver] = True
        else:
            mode = get_arg(node, "mode", 0)
            if mode is None or (isinstance(mode, cst.Arg) and is_true(mode.value)):
                modes[receiver] = False
            elif (
                isinstance(mode, cst.Arg) and isinstance(mode.value, cst.Name) and mode.value.value == "False"
            ):
                modes[receiver] = True
            else:
                modes.pop(receiver, None)  # unknown mode
        return True

    def _is_eval_function(self, function: cst.FunctionDef) -> bool:
        known = self._eval_functions.get(function)
        if known is None:
            known = self._eval_functions[function] = self._looks_like_evaluation(function)
        return known

    def _looks_like_evaluation(self, function: cst.FunctionDef) -> bool:
        name = function.name.value
        if not _is_eval_name(name):
            return False
        if any(
            self.context.qualified_name(_callee_of(d.decorator)) in _GRAD_ENABLING
            for d in function.decorators
        ):
            return False  # gradients are asked for explicitly
        if name.startswith("test"):
            owner = facts_for(self.context).class_of.get(function)
            if self._in_test_file or (owner is not None and owner.name.value.startswith("Test")):
                return False
            if not function.params.params:
                return False  # `def test_x():` without parameters is a pytest test, not an evaluation routine
        return True

    def _wrap_target(self) -> cst.CSTNode | None:
        """The innermost loop around the call when it does not switch modes,
        else the statement around the call."""
        tracker = self.context.tracker
        if tracker.loops and not _switches_any_mode(tracker.loops[-1]):
            return tracker.loops[-1]
        statement = tracker.current_statement
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or statement is None:
            return None
        return None if _switches_any_mode(statement) else statement

    def _indent_of(self, statement: cst.CSTNode) -> str | None:
        """The indentation of a statement, from the blocks around it."""
        if any(inner is statement for inner in self.context.module.body):
            return ""
        for depth in range(len(self._blocks) - 1, -1, -1):
            if any(inner is statement for inner in self._blocks[depth].body):
                return self._indent(depth + 1)
        return None


_GRAD_ENABLING = frozenset({"torch.enable_grad", "torch.autograd.enable_grad"})


def _callee_of(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.func if isinstance(expr, cst.Call) else expr


def _mode_after_chain(value: cst.BaseExpression, name: str, mode: bool) -> bool | None:
    """The eval mode of `name` after `name = value`, when `value` is `name`
    through module-returning methods (`name.eval()`, `name.to(device)`);
    None when it is something else."""
    chain: list[str] = []
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        chain.append(value.func.attr.value)
        value = value.func.value
    if dotted_name(value) != name or not all(method in _MODULE_CHAIN_METHODS for method in chain):
        return None
    for method in reversed(chain):
        if method in ("eval", "train"):
            mode = method == "eval"
    return mode


_MODULE_CHAIN_METHODS = frozenset(
    {"eval", "train", "to", "cuda", "cpu", "half", "float", "bfloat16", "double"}
)


def _switches_any_mode(node: cst.CSTNode) -> bool:
    return any(
        isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Attribute)
        and inner.func.attr.value in ("eval", "train")
        for inner in iter_nodes(node)
    )


@register
class RetainGraphInLoop(_AutogradRule):
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
            message = (
                "`retain_graph=True` keeps this step's graph and activations alive after the backward pass; in a "
                "training loop they pile up across iterations. Drop it and detach what is carried between steps."
            )
        else:
            edits = self._sum_losses(node, later, loop)
            fix = FixSpec("Sum the losses, backward once", edits, Applicability.UNSAFE) if edits else None
            message = (
                "`retain_graph=True` keeps every activation of this graph allocated until the next backward pass "
                "of the step. Sum the losses and call `backward()` once, or detach the tensor both graphs share."
            )
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


_RECURRENT_STATES = frozenset(
    {
        "torch.nn.LSTM",
        "torch.nn.LSTMCell",
        "torch.nn.GRU",
        "torch.nn.GRUCell",
        "torch.nn.RNN",
        "torch.nn.RNNCell",
    }
)


@register
class HiddenStateCarriedAcrossBatches(_AutogradRule):
    """
    ## What it does
    Flags a recurrent hidden state fed from one training step into the next
    without `.detach()`: `out, hidden = rnn(x, hidden)` (or
    `out, (h, c) = lstm(x, (h, c))`) in a loop that calls `backward()`, where
    nothing else in the loop rebinds or detaches `hidden`.

    ## Why is this bad?
    The new `hidden` is computed from the previous one, so its graph reaches
    back through every batch seen so far: the graph, and the activations
    saved for it, span the whole epoch. Memory grows with every step, and the
    next `backward()` fails with "Trying to backward through the graph a
    second time" unless `retain_graph=True` is added, which makes the growth
    permanent. Truncated backpropagation through time cuts the graph at each
    batch boundary.

    ## Example
    ```python
    hidden = model.init_hidden(batch_size)
    for x, y in batches:
        out, hidden = model(x, hidden)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    hidden = model.init_hidden(batch_size)
    for x, y in batches:
        hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
        out, hidden = model(x, hidden)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    Safe: the state is detached at the top of each step, which keeps its
    values and cuts only the gradient path into previous batches (truncated
    BPTT, what the loop's per-step `backward()` implies). The statement fits
    the module: `hidden.detach()` for `nn.GRU` / `nn.RNN`, a tuple for
    `nn.LSTM`, one detach per name for an unpacked `(h, c)`, and a form that
    handles both when the module is not known. A state that may still be
    `None` at the first step is guarded with `if hidden is not None:`.
    Loops without `backward()` (an unrolled forward over time steps) are not
    reported: there the graph must span the steps.
    """

    code = "OOM305"
    name = "hidden-state-carried-across-batches"
    summary = "A recurrent hidden state is carried from batch to batch without `.detach()`: the graph spans the epoch."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch.nn as nn
            rnn = nn.GRU(8, 16)
            hidden = None
            for x, y in loader:
                if hidden is not None:
                    hidden = hidden.detach()
                out, hidden = rnn(x, hidden)
                criterion(out, y).backward()
            """
        ),
        Valid(
            """
            import torch
            hidden = model.init_hidden(32)
            for x, y in batches:
                hidden = repackage_hidden(hidden)
                out, hidden = model(x, hidden)
                loss = criterion(out, y)
                loss.backward()
            """
        ),
        Valid(
            """
            import torch
            for x, y in batches:
                hidden.detach_()
                out, hidden = model(x, hidden)
                criterion(out, y).backward()
            """
        ),
        # An unrolled forward pass over time steps: the graph must span them.
        Valid(
            """
            import torch.nn as nn
            class Seq(nn.Module):
                def forward(self, xs, h):
                    for x in xs:
                        out, h = self.cell(x, h)
                    return out
            """
        ),
        # A fresh state for every batch.
        Valid(
            """
            import torch
            for x, y in loader:
                hidden = model.init_hidden(x.size(0))
                out, hidden = model(x, hidden)
                criterion(out, y).backward()
            """
        ),
        Valid(
            """
            import torch
            with torch.no_grad():
                for x in loader:
                    out, hidden = model(x, hidden)
                    out.sum().backward()
            """
        ),
        # Not a module call.
        Valid("import torch\nfor x in loader:\n    out, state = step_fn(x, state)\n    out.backward()\n"),
        Valid(
            "import torch\nfor x in loader:\n    out, hidden = model(x, hidden.detach())\n    out.backward()\n"
        ),
        # A local function called `rnn` is no module.
        Valid(
            """
            import torch
            def rnn(x, state):
                return x, state
            for x in loader:
                out, state = rnn(x, state)
                out.backward()
            """
        ),
        Valid("import torch\nfor x in loader:\n    out, hidden = model(x, **hidden)\n    out.backward()\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            lstm = nn.LSTM(8, 16)
            hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
            for x, y in loader:
                optimizer.zero_grad()
                out, hidden = lstm(x, hidden)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
            line=8,
            expected_fix="""
            import torch
            import torch.nn as nn
            lstm = nn.LSTM(8, 16)
            hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
            for x, y in loader:
                hidden = tuple(h.detach() for h in hidden)
                optimizer.zero_grad()
                out, hidden = lstm(x, hidden)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.GRU(8, 16, batch_first=True)

                def fit(self, loader, opt):
                    hidden = None
                    for step, (x, y) in enumerate(loader):
                        # one batch
                        out, hidden = self.rnn(x, hidden)
                        out.mean().backward()
                        opt.step()
            """,
            line=13,
            expected_fix="""
            import torch.nn as nn

            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.GRU(8, 16, batch_first=True)

                def fit(self, loader, opt):
                    hidden = None
                    for step, (x, y) in enumerate(loader):
                        # one batch
                        if hidden is not None:
                            hidden = hidden.detach()
                        out, hidden = self.rnn(x, hidden)
                        out.mean().backward()
                        opt.step()
            """,
        ),
        Invalid(
            """
            import torch
            def train(model, batches, h, c):
                for x in batches:
                    out, (h, c) = model(x, (h, c))
                    out.sum().backward()
            """,
            line=5,
            expected_fix="""
            import torch
            def train(model, batches, h, c):
                for x in batches:
                    h, c = h.detach(), c.detach()
                    out, (h, c) = model(x, (h, c))
                    out.sum().backward()
            """,
        ),
        Invalid(
            """
            import torch
            hidden = model.init_hidden(32)
            while True:
                output, hidden = model(data, hidden)
                accelerator.backward(criterion(output, targets))
            """,
            line=5,
            expected_fix="""
            import torch
            hidden = model.init_hidden(32)
            while True:
                hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
                output, hidden = model(data, hidden)
                accelerator.backward(criterion(output, targets))
            """,
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        tracker = self.context.tracker
        if not tracker.in_loop or tracker.in_no_grad or len(node.targets) != 1:
            return
        target, call = node.targets[0].target, node.value
        if type(target) not in _SEQUENCES or type(call) is not cst.Call:
            return
        callee = self._flow().callee(call.func, call)
        if callee.role is not Role.MODULE:
            return
        loop = tracker.loops[-1]
        if not contains_backward(loop.body, self.context):
            return
        bound = {name for name, _ in assigned_names(node)}
        carried = [names for arg in call.args if not arg.star for names in [_state_names(arg.value)] if names]
        carried = [names for names in carried if set(names) <= bound]
        if not carried:
            return
        if any(self._cut_in_loop(name, loop, node) for names in carried for name in names):
            return
        lines = [
            hidden_state.detach_names_line(names)
            if len(names) > 1
            else hidden_state.detach_line(names[0], self._state_constructor(callee))
            for names in carried
        ]
        maybe_none = [name for names in carried for name in names if self._may_be_none(name)]
        edits = hidden_state.insert_at_top(loop, lines, maybe_none=maybe_none)
        state = ", ".join(name for names in carried for name in names)
        self.report(
            node,
            f"`{state}` is carried from one training step into the next without `.detach()`, so its graph and "
            "activations span every batch so far. Detach it at the top of each step.",
            fix=FixSpec("Detach the hidden state at the top of the step", edits, Applicability.SAFE)
            if edits
            else None,
        )

    def _cut_in_loop(self, name: str, loop: cst.For | cst.While, call_statement: cst.Assign) -> bool:
        """The loop rebinds or detaches the state itself."""
        if binds_inside(loop, name, besides=call_statement):
            return True
        return any(
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "detach_"
            and dotted_name(node.func.value) == name
            for node in iter_nodes(loop.body)
        )

    def _state_constructor(self, callee: Callee) -> str | None:
        """The recurrent module behind the call: `torch.nn.LSTM` directly, or
        the one kind of recurrent layer a model class of the file holds."""
        if callee.constructor in _RECURRENT_STATES:
            return callee.constructor
        facts = facts_for(self.context)
        for class_def, attributes in facts.class_attributes.items():
            if class_def.name.value == callee.constructor:
                kinds = {
                    attr.constructor for attr in attributes.values() if attr.constructor in _RECURRENT_STATES
                }
                tuple_kinds = {kind for kind in kinds if kind is not None and "LSTM" in kind}
                if len(kinds) >= 1 and (tuple_kinds == kinds or not tuple_kinds):
                    return next(iter(kinds))
        return None

    def _may_be_none(self, name: str) -> bool:
        summary = self._summary()
        if any(
            isinstance(value, cst.Name) and value.value == "None" for value in summary.bindings.get(name, ())
        ):
            return True
        function = self.context.tracker.current_function
        if function is None:
            return False
        params = function.params
        return any(
            param.name.value == name and isinstance(param.default, cst.Name) and param.default.value == "None"
            for param in (*params.posonly_params, *params.params, *params.kwonly_params)
        )


def _state_names(expr: cst.BaseExpression) -> list[str]:
    """`hidden` -> ["hidden"], `(h, c)` -> ["h", "c"], else []."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        names = [dotted_name(element.value) for element in expr.elements]
        return [name for name in names if name is not None] if all(names) else []
    name = dotted_name(expr)
    return [name] if name is not None else []
