"""OOM305: detach a recurrent hidden state at the top of each step."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertLinesBefore, NodeEdit, Replace

_TENSOR_STATES = frozenset({"torch.nn.GRU", "torch.nn.RNN", "torch.nn.GRUCell", "torch.nn.RNNCell"})
_TUPLE_STATES = frozenset({"torch.nn.LSTM", "torch.nn.LSTMCell"})


def detach_line(hidden: str, constructor: str | None) -> str:
    """The statement that cuts `hidden`'s graph, for a state whose module is
    `constructor` (None: unknown, so both a tensor and a tuple are handled)."""
    if constructor in _TENSOR_STATES:
        return f"{hidden} = {hidden}.detach()"
    if constructor in _TUPLE_STATES:
        return f"{hidden} = tuple(h.detach() for h in {hidden})"
    return f"{hidden} = tuple(h.detach() for h in {hidden}) if isinstance({hidden}, tuple) else {hidden}.detach()"


def detach_names_line(names: list[str]) -> str:
    """`h, c = h.detach(), c.detach()` for a state unpacked into names."""
    return f"{', '.join(names)} = {', '.join(f'{name}.detach()' for name in names)}"


def insert_at_top(
    loop: cst.For | cst.While, lines: list[str], *, maybe_none: list[str]
) -> tuple[NodeEdit, ...] | None:
    """Insert `lines` as the first statements of the loop's body, guarded by
    `if x is not None:` for the names that may still be None (the first step).
    None when the body shares the loop's line."""
    if not isinstance(loop.body, cst.IndentedBlock) or not loop.body.body:
        return None
    if maybe_none:
        condition = " and ".join(f"{name} is not None" for name in maybe_none)
        lines = [f"if {condition}:", *("    " + line for line in lines)]
    return (InsertLinesBefore(loop.body.body[0], tuple(lines)),)



def detach_arguments(passed: list[cst.BaseExpression], state: str) -> tuple[NodeEdit, ...]:
    """`self.h = self.cell(x, self.h)` -> `self.cell(x, self.h.detach())`:
    each argument in `passed` (the state, as the call passes it) keeps its
    values and loses only its graph."""
    return tuple(Replace(value, cst.parse_expression(f"{state}.detach()")) for value in passed)
