"""What the OOM3xx rules share: access to the file's data flow, and what runs
once per training step.

Every OOM3xx rule asks the data flow of `oom_lsp.analysis.dataflow` whether a
value is graph-attached, and stays silent when it cannot tell.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.dataflow import (
    ScopeFlow,
    ScopeSummary,
    contains_backward,
    facts_for,
    iter_nodes,
)
from oom_lsp.analysis.effects import Keep, bind_arguments, effects_for
from oom_lsp.analysis.facts.contexts import FORWARD_METHODS, call_graph
from oom_lsp.analysis.facts.loops import runs_a_few_times
from oom_lsp.analysis.rule import Rule


class AutogradRule(Rule):
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
        if function is not None and function.name.value in FORWARD_METHODS:
            return None  # a forward pass keeps what its backward pass needs
        if function is not None:
            graph = call_graph(self.context)
            scope = graph.program.function(function)
            if scope is not None and graph.runs_within_forward(scope):
                return None  # a helper of the forward pass, which keeps the same
        if tracker.in_loop:
            return tracker.loops[-1]
        if function is None or function.name.value != "training_step" or not holder.startswith("self."):
            return None
        facts = facts_for(self.context)
        owner = facts.class_of.get(function)
        return function if owner is not None and owner.name.value in facts.module_classes else None

    def _few_iterations(self, loop: cst.CSTNode) -> bool:
        """The loop runs a few times over a collection the code lists (a few
        models, heads, losses): what it keeps grows to that many entries, not
        with the steps of training."""
        return runs_a_few_times(self.context, loop, self.context.tracker.current_function)

    def _kept_on_purpose(self, holder: str, loop: cst.For | cst.While | cst.FunctionDef) -> bool:
        """The graph is wanted: the holder feeds a backward pass, or it is
        returned from a loop that does not train (a loss summed over heads or
        chunks, backpropagated by the caller)."""
        summary = self._summary()
        if holder in summary.feeds_backward:
            return True
        if holder not in summary.returned or self._trains(loop):
            return False
        # Returned: wanted when a caller may backpropagate it (or no caller is known).
        graph = call_graph(self.context)
        function = self.context.tracker.current_function
        scope = graph.program.function(function) if function is not None else None
        return scope is None or graph.result_feeds_a_backward(scope) is not False

    def _kept_by_callee(self, call: cst.Call, *, accumulates: bool) -> list[tuple[Keep, cst.BaseExpression, str]]:
        """For a call, in a loop, of a function of the file that keeps a
        parameter (`record(history, out)`, `meter.update(loss)`): each
        graph-attached argument it keeps, with the caller's name for the
        container that keeps it (`history`, `meter`, `self.outputs`)."""
        tracker = self.context.tracker
        if not tracker.in_loop or tracker.in_no_grad:
            return []
        facts = facts_for(self.context)
        func = call.func
        if not (
            (type(func) is cst.Name and func.value in facts.module_functions)
            or (type(func) is cst.Attribute and func.attr.value in facts.method_names)
        ):
            return []  # the common case: no function of this file is called
        flow = self._flow()
        function = flow.local_function(call.func)
        if function is None:
            return []
        keeps = [keep for keep in effects_for(self.context).keeps(function) if keep.accumulates is accumulates]
        if not keeps:
            return []
        bound_self = type(call.func) is cst.Attribute
        arguments = bind_arguments(call, function, bound_self=bound_self)
        if arguments is None:
            return []
        found = []
        for keep in keeps:
            argument = arguments.get(keep.param)
            if argument is None or not flow.kind_of(argument).attached:
                continue
            holder: str | None
            if keep.owner == "self":
                receiver = dotted_name(call.func.value) if bound_self else None  # type: ignore[attr-defined]
                holder = keep.container if receiver == "self" else receiver
            elif keep.owner is not None:
                owner_argument = arguments.get(keep.owner)
                holder = dotted_name(owner_argument) if owner_argument is not None else None
            else:
                holder = keep.container.partition("[")[0].partition(".")[0]
            if holder is not None:
                found.append((keep, argument, holder))
        return found

    def _graph_freed_each_step(self, iteration: cst.For | cst.While | cst.FunctionDef) -> bool:
        """A backward pass (without `retain_graph=True`) runs in every
        iteration, itself or in a function it calls: it frees the activations
        the iteration's graph saved, so what outlives the iteration keeps the
        graph's nodes (host memory), not its activations. A Lightning
        `training_step` is one iteration whose loss Lightning backpropagates."""
        if type(iteration) is cst.FunctionDef:
            return True
        graph = call_graph(self.context)
        function = self.context.tracker.current_function
        scope = graph.program.function(function) if function is not None else graph.program.module
        if scope is None or not graph.trains_in(iteration, scope):
            return False
        return not any(
            type(node) is cst.Arg and node.keyword is not None and node.keyword.value == "retain_graph"
            and not (type(node.value) is cst.Name and node.value.value == "False")
            for node in iter_nodes(iteration.body)
        )

    def _lives_one_call(self, holder: str, iteration: cst.For | cst.While | cst.FunctionDef) -> bool:
        """The container is created anew before the loop, in a block that holds
        it (`self.h_emb_list = []` at the top of a method, `arr = []` in the
        arm of an `if`, or once per iteration of an outer loop), and the loop
        runs over a fixed range within one step (hops, heads, facets), not
        over steps or batches: what it holds never outlives one call."""
        function = self.context.tracker.current_function
        if type(iteration) is cst.FunctionDef or self._is_step_loop(iteration):
            return False
        statements = self.context.tracker.statements
        try:
            position = statements.index(iteration)
        except ValueError:
            return False
        start = statements.index(function) if function is not None and function in statements else -1
        # The blocks from the function (or the module) down to the loop: look in
        # each for a binding of the container before the statement leading to the loop.
        path = statements[start + 1 : position + 1]
        blocks: list[tuple[Sequence[cst.CSTNode], cst.CSTNode]] = []
        outer: cst.CSTNode | None = function
        for inner in path:
            block = _block_holding(outer, inner) if outer is not None else self.context.module.body
            if block is None:
                return False
            blocks.append((block, inner))
            outer = inner
        for block, inner in blocks:
            for statement in block:
                if statement is inner:
                    break
                if type(statement) is cst.SimpleStatementLine and any(
                    type(small) in (cst.Assign, cst.AnnAssign)
                    and any(dotted_name(target) == holder for target in _targets(small))
                    for small in statement.body
                ):
                    return True
        return False

    def _is_step_loop(self, loop: cst.For | cst.While) -> bool:
        """A loop over training steps or data batches: it runs a backward pass,
        or iterates anything but a `range(...)` (a loader, a dataset, batches)."""
        if self._graph_freed_each_step(loop) or self._trains(loop):
            return True
        if type(loop) is not cst.For:
            return True  # a `while` runs as long as it likes
        iterable = loop.iter
        while type(iterable) is cst.Call and dotted_name(iterable.func) in ("enumerate", "tqdm", "tqdm.tqdm", "zip"):
            if not iterable.args:
                return True
            iterable = iterable.args[0].value
        return not (type(iterable) is cst.Call and dotted_name(iterable.func) == "range")

    def _trains(self, loop: cst.For | cst.While | cst.FunctionDef) -> bool:
        """The loop runs a backward pass, itself or in a function of the file
        it calls (`tr_loss += self.training_step(batch)`)."""
        if contains_backward(loop.body, self.context):
            return True
        facts, flow = facts_for(self.context), self._flow()
        for node in iter_nodes(loop.body):
            if type(node) is cst.Call:
                function = flow.local_function(node.func)
                if function is not None and facts.summary(function).backward_calls:
                    return True
        return False


# Node types are tested exactly (`type(x) is cst.Call`) where a hook runs for
# every node of its kind: libcst has no subclasses of its concrete node
# classes, and isinstance() on them goes through ABCMeta, slow on a miss.
ACCUMULATING = frozenset({cst.AddAssign, cst.SubtractAssign})
ADDITIVE = frozenset({cst.Add, cst.Subtract})
SEQUENCES = frozenset({cst.Tuple, cst.List})
# Consumers that take a Python number as well as a tensor: an accumulator
# only used by them can become a float (`.item()`).
NUMBER_CONSUMERS = frozenset(
    {"print", "float", "int", "round", "str", "format", "add_scalar", "log", "info", "debug", "warning", "write",
     "set_postfix", "set_description", "log_metrics"}
)  # fmt: skip
ARITHMETIC = (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.FormattedStringExpression)


def _block_holding(outer: cst.CSTNode, inner: cst.CSTNode) -> Sequence[cst.CSTNode] | None:
    """The statements of the block of `outer` that holds `inner`."""
    suites = []
    body = getattr(outer, "body", None)
    if isinstance(body, cst.IndentedBlock):
        suites.append(body)
    orelse = getattr(outer, "orelse", None)
    if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock):
        suites.append(orelse.body)
    elif isinstance(orelse, cst.If) and orelse is inner:
        return [orelse]
    for handler in getattr(outer, "handlers", ()):
        if isinstance(handler.body, cst.IndentedBlock):
            suites.append(handler.body)
    finalbody = getattr(outer, "finalbody", None)
    if isinstance(finalbody, cst.Finally) and isinstance(finalbody.body, cst.IndentedBlock):
        suites.append(finalbody.body)
    for suite in suites:
        if any(statement is inner for statement in suite.body):
            return suite.body
    return None


def _targets(small: cst.BaseSmallStatement) -> list[cst.BaseExpression]:
    if type(small) is cst.Assign:
        return [target.target for target in small.targets]
    if type(small) is cst.AnnAssign:
        return [small.target]
    return []


def holder_of(target: cst.BaseExpression) -> str | None:
    """The name that outlives the statement: `total`, `self.total`, the
    `stats` of `stats["loss"]`."""
    if isinstance(target, cst.Subscript):
        return dotted_name(target.value)
    return dotted_name(target)


_CONTAINER_FACTORIES = frozenset(
    {"list", "dict", "deque", "defaultdict", "OrderedDict", "collections.deque", "collections.defaultdict",
     "collections.OrderedDict"}
)  # fmt: skip


def is_container_value(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, (cst.List, cst.Dict, cst.ListComp, cst.DictComp)):
        return True
    return isinstance(value, cst.Call) and dotted_name(value.func) in _CONTAINER_FACTORIES
