"""FakeDispatchMemo (oom_lsp/estimate/harness/memo.py), called directly: what it
answers must be what FakeTensorMode answers, down to each output's storage and
offset, whether it replays a memo entry or computes a view."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

aten = torch.ops.aten


@pytest.fixture(scope="module")
def memo_module():
    # The harness package imports itself relatively: its modules load under this package name too.
    from oom_lsp.estimate.harness import memo

    return memo


@pytest.fixture
def fake_mode():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        yield mode


def _layout(tensor):
    return tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype, tensor.fake_device


def _check(memo, func, args):
    """The memo's answer next to FakeTensorMode's for the same call (uncached:
    the memo switched its cache off): same metadata, and over the same storage
    when FakeTensorMode's shares one."""
    answer = memo.call(func, args, {})
    expected = func(*args)
    answers = answer if isinstance(answer, (tuple, list)) else (answer,)
    expectations = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(answers) == len(expectations)
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    for got, want in zip(answers, expectations):
        assert _layout(got) == _layout(want)
        for tensor in inputs:
            shares = want.untyped_storage() is tensor.untyped_storage()
            assert (got.untyped_storage() is tensor.untyped_storage()) == shares
    return answer


def test_an_op_on_each_time_step_is_one_entry(memo_module, fake_mode):
    memo = memo_module.FakeDispatchMemo(fake_mode, entries={})
    sequence = torch.empty(12, 4, 16)
    weight = torch.empty(16, 16)
    for t in range(12):
        _check(memo, aten.mm.default, (aten.select.int(sequence, 0, t), weight))
    # The first call is learned, the other eleven replayed: the step's storage offset is not in the key.
    assert memo.hits == 11
    assert sum(1 for key in memo.entries if key[0] is aten.mm.default) == 1


def test_an_unsafe_view_of_a_step_lies_over_that_step(memo_module, fake_mode):
    memo = memo_module.FakeDispatchMemo(fake_mode, entries={})
    sequence = torch.empty(6, 4, 16)
    for t in range(6):
        step = aten.select.int(sequence, 0, t)
        view = _check(memo, aten._unsafe_view.default, (step, [64]))
        # Replayed for t > 0 from the entry learned at t = 0: the offset follows the step.
        assert view.storage_offset() == 64 * t
    assert memo.hits >= 5


@pytest.mark.parametrize("func, arguments", [(aten.slice.Tensor, (0, 37, 53)), (aten.select.int, (0, 411))])
def test_views_at_data_indices_are_computed_as_fake_tensor_mode_computes_them(
    memo_module, fake_mode, func, arguments
):
    memo = memo_module.FakeDispatchMemo(fake_mode, entries={})
    tokens = torch.empty(1000, dtype=torch.long)
    view = _check(memo, func, (tokens, *arguments))
    assert view.untyped_storage() is tokens.untyped_storage()
    assert memo.hits == 1 and not memo.entries  # computed, not learned


def test_views_of_an_argument_are_learned_and_replayed_over_it(memo_module, fake_mode):
    memo = memo_module.FakeDispatchMemo(fake_mode, entries={})
    for rows in (10, 10):
        tensor = torch.empty(rows, 4)
        parts = _check(memo, aten.split.Tensor, (tensor, 3))
        assert [part.storage_offset() for part in parts] == [0, 12, 24, 36]
        assert all(part.untyped_storage() is tensor.untyped_storage() for part in parts)
    assert memo.hits == 1
