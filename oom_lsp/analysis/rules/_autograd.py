"""What the OOM3xx rules share: access to the file's data flow, and what runs
once per training step.

Every OOM3xx rule asks the data flow of `oom_lsp.analysis.dataflow` whether a
value is graph-attached, and stays silent when it cannot tell.
"""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.dataflow import (
    ScopeFlow,
    ScopeSummary,
    contains_backward,
    facts_for,
    iter_nodes,
)
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
        return holder in summary.returned and not self._trains(loop)

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
FORWARD_METHODS = frozenset({"forward", "__call__", "_forward", "forward_features"})
# Consumers that take a Python number as well as a tensor: an accumulator
# only used by them can become a float (`.item()`).
NUMBER_CONSUMERS = frozenset(
    {"print", "float", "int", "round", "str", "format", "add_scalar", "log", "info", "debug", "warning", "write",
     "set_postfix", "set_description", "log_metrics"}
)  # fmt: skip
ARITHMETIC = (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.FormattedStringExpression)


def holder_of(target: cst.BaseExpression) -> str | None:
    """The name that outlives the statement: `total`, `self.total`, the
    `stats` of `stats["loss"]`."""
    if isinstance(target, cst.Subscript):
        return dotted_name(target.value)
    return dotted_name(target)
