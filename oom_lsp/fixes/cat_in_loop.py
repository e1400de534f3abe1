"""OOM401: collect the pieces in a list, concatenate once after the loop."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertLinesAfter, InsertLinesBefore, NodeEdit, Replace


def collect_then_concatenate(
    *,
    loop: cst.For | cst.While,
    grow: cst.Assign,
    accumulator: str,
    parts: str,
    piece: str,
    function: str,
    dim: str | None,
) -> tuple[NodeEdit, ...]:
    """`acc = cat([acc, piece], dim)` in `loop` becomes `parts.append(piece)`.

    The list starts with the accumulator's value before the loop, so zero
    iterations and a non-empty start give the same tensor as before; `dim`
    is the original argument's code (keyword form "dim=..." or positional).
    """
    dim_suffix = f", {dim}" if dim is not None else ""
    return (
        InsertLinesBefore(loop, (f"{parts} = [{accumulator}]",)),
        Replace(grow, f"{parts}.append({piece})"),
        InsertLinesAfter(loop, (f"{accumulator} = {function}({parts}{dim_suffix})",)),
    )


def collect_first_pieces(
    *,
    loop: cst.For | cst.While,
    branch: cst.If,
    accumulator: str,
    parts: str,
    piece: str,
    function: str,
    dim: str | None,
) -> tuple[NodeEdit, ...]:
    """The first-piece idiom, `acc = None` before the loop and
    `if acc is None: acc = piece / else: acc = cat([acc, piece])` in it,
    becomes `parts.append(piece)`; after the loop `acc` is the concatenation,
    or None when the loop did not run, as before."""
    dim_suffix = f", {dim}" if dim is not None else ""
    return (
        InsertLinesBefore(loop, (f"{parts} = []",)),
        Replace(branch, f"{parts}.append({piece})"),
        InsertLinesAfter(loop, (f"{accumulator} = {function}({parts}{dim_suffix}) if {parts} else None",)),
    )
