"""Data-dependent truth tests: which way a check goes when only a real run knows its value.

A fake tensor has shapes, not values, so `if t:`, `assert (boxes[:, 2:] >= boxes[:, :2]).all()` and
`bool(t)` cannot be answered from the data. The policy, in order (docs/estimate.md, "Values only a
real run knows"):

1. a value the run knows (a real twin of an integer tensor computed outside the step, a
   constant) answers for real (tracker.py);
2. a truth test one of whose outcomes raises at once takes the other: a sanity check (`assert
   cond`, `if bad: raise ValueError(...)`) holds in any run that reaches its second optimizer step,
   which is the only run an estimate describes. This module finds that from the bytecode of the
   frame doing the test: the conditional jump the value feeds, and for each outcome whether the
   code it leads to raises before any other branch, call result is used, or return;
3. anything else answers 0/False, counted and stated with the estimate;
4. a run that then fails is measured by real CPU steps instead (estimator.py's fallback).
"""

from __future__ import annotations

import dis
import os
import sys

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Conditional jumps: the outcome that jumps. `JUMP_IF_*_OR_POP` are `and`/`or` (before 3.12).
_JUMPS_WHEN = {
    "POP_JUMP_IF_TRUE": True,
    "POP_JUMP_FORWARD_IF_TRUE": True,
    "POP_JUMP_BACKWARD_IF_TRUE": True,
    "JUMP_IF_TRUE_OR_POP": True,
    "POP_JUMP_IF_FALSE": False,
    "POP_JUMP_FORWARD_IF_FALSE": False,
    "POP_JUMP_BACKWARD_IF_FALSE": False,
    "JUMP_IF_FALSE_OR_POP": False,
}
_UNCONDITIONAL = {"JUMP_FORWARD", "JUMP_ABSOLUTE", "JUMP_NO_INTERRUPT"}
_RAISES = {"RAISE_VARARGS", "LOAD_ASSERTION_ERROR"}
# Where an outcome's code goes on without raising at once (or we cannot tell).
_ENDS = {"RETURN_VALUE", "RETURN_CONST", "FOR_ITER", "YIELD_VALUE", "RERAISE", "POP_EXCEPT"}
_SCAN_LIMIT = 64  # instructions followed from an outcome

_instructions: dict = {}  # code object -> (offsets in order, {offset: instruction})
_answers: dict = {}  # (code object, offset) -> True, False or None


def passing_outcome() -> bool | None:
    """The outcome of the truth test being evaluated now that does not raise at once, or None
    when the read is not a truth test (`.item()`, `bool(t)` as a value), or neither or both of
    its outcomes raise. Called from inside the dispatch of the read."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        offsets, by_offset = _code_instructions(code)
        instruction = by_offset.get(frame.f_lasti)
        if instruction is not None and instruction.opname == "TO_BOOL":  # 3.13: the jump follows
            following = offsets.index(instruction.offset) + 1
            instruction = by_offset[offsets[following]] if following < len(offsets) else None
        if instruction is not None and instruction.opname in _JUMPS_WHEN:
            key = (code, instruction.offset)
            if key not in _answers:
                _answers[key] = _decide(code, instruction)
            return _answers[key]
        filename = code.co_filename
        if not (filename.startswith(_TORCH_DIR) or filename.startswith(_HARNESS_DIR)):
            return None  # the read was asked for as a value, in the script or a library
        frame = frame.f_back
    return None


def _code_instructions(code) -> tuple[list[int], dict]:
    known = _instructions.get(code)
    if known is None:
        listed = list(dis.get_instructions(code))
        known = _instructions[code] = ([i.offset for i in listed], {i.offset: i for i in listed})
    return known


def _decide(code, jump) -> bool | None:
    offsets, by_offset = _code_instructions(code)
    following = offsets[offsets.index(jump.offset) + 1] if jump.offset != offsets[-1] else None
    jumps_when = _JUMPS_WHEN[jump.opname]
    target = jump.argval
    raises = {
        jumps_when: _raises_at_once(code, target),
        not jumps_when: following is not None and _raises_at_once(code, following),
    }
    if raises[True] == raises[False]:
        return None
    return not raises[True]


def _raises_at_once(code, offset) -> bool:
    offsets, by_offset = _code_instructions(code)
    for _ in range(_SCAN_LIMIT):
        instruction = by_offset.get(offset)
        if instruction is None:
            return False
        name = instruction.opname
        if name in _RAISES:
            return True
        if name in _ENDS or name in _JUMPS_WHEN or "BACKWARD" in name:
            return False
        if name in _UNCONDITIONAL:
            if not isinstance(instruction.argval, int) or instruction.argval <= offset:
                return False
            offset = instruction.argval
            continue
        position = offsets.index(offset) + 1
        if position >= len(offsets):
            return False
        offset = offsets[position]
    return False
