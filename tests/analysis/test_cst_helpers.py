"""analysis/cst_helpers.bound_arguments: which argument a call passes for each parameter."""

from __future__ import annotations

import libcst as cst
import pytest

from oom_lsp.analysis.cst_helpers import bound_arguments


def _bound(call: str, params: list[str]) -> dict[str, str]:
    node = cst.parse_expression(call)
    assert isinstance(node, cst.Call)
    return {name: cst.Module([]).code_for_node(value) for name, value in bound_arguments(node, params).items()}


@pytest.mark.parametrize(
    ("call", "params", "expected"),
    [
        ("f(a, b)", ["x", "y"], {"x": "a", "y": "b"}),
        ("f(a, y=b)", ["x", "y"], {"x": "a", "y": "b"}),
        ("f(y=b, x=a)", ["x", "y"], {"x": "a", "y": "b"}),
        ("f(a, b, c)", ["x", "y"], {"x": "a", "y": "b"}),  # one more than the parameters named
        ("f(*args)", ["x"], {}),
        ("f(a, **kw)", ["x", "y"], {}),
    ],
)
def test_arguments_are_bound_by_position_and_by_name_and_not_through_a_splat(
    call: str, params: list[str], expected: dict[str, str]
) -> None:
    assert _bound(call, params) == expected
