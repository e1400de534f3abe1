"""The batch-size literal the editor decorates after an estimate (its inlay hint and quick fixes):
on a line the estimate reported as a batch knob, including a module global that OOM101 does not
flag (nanoGPT's `batch_size = 12`, issue 16 cause 5)."""

from __future__ import annotations

from oom_lsp.server.estimate import BatchLiteral, find_batch_literal

NANOGPT_LIKE = """import torch

out_dir = "out"
batch_size = 12  # the micro-batch when accumulating
block_size = 64
exec(open("configurator.py").read())


def get_batch():
    return torch.randint(256, (batch_size, block_size))
"""


def test_a_module_global_on_a_knob_line_is_the_literal():
    literal = find_batch_literal(NANOGPT_LIKE, "train.py", {4}, 8)
    column = NANOGPT_LIKE.splitlines()[3].index("12")
    assert literal == BatchLiteral(line=4, start=column, end=column + 2, statement_line=4)


def test_a_global_that_is_not_a_knob_line_is_left_alone():
    assert find_batch_literal(NANOGPT_LIKE, "train.py", {5}, 8) is None
    assert find_batch_literal(NANOGPT_LIKE, "train.py", set(), 8) is None
