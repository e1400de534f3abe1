"""Lazy positions and the fast walker agree with libcst's own machinery."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from oom_lsp.analysis.context import FileContext, Tracker
from oom_lsp.analysis.positions import PositionResolver, compute_positions
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.analysis.walker import walk

# Large, varied real code that is always installed: libcst's own sources.
REAL_FILES = [path for path in sorted((Path(cst.__file__).parent / "_nodes").glob("*.py")) if path.name != "__init__.py"][:6]

TRICKY = '''\
import torch

@decorator(
    1,
)
# a comment between decorators
@other
def f(x):  # trailing
    if x:
        y = torch.cat([x, x])
    elif x is None:
        z = torch.stack([x]); w = g(z)
    else:
        for i in range(3): q = h(i)
    try:
        pass
    except ValueError as error:
        r = k(error)
    finally:
        s = torch.load("x")
    return [m(v) for v in x]
\tclass_ = None
'''.replace("\t", "")


class _RecordCallsAndNames(cst.BatchableCSTVisitor):
    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context
        self.seen: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.seen.append((node, tuple(self.context.tracker.statements)))

    def visit_Name(self, node: cst.Name) -> None:
        self.seen.append((node, tuple(self.context.tracker.statements)))


def _sources() -> list[tuple[str, str]]:
    return [("tricky", TRICKY)] + [(path.name, path.read_text()) for path in REAL_FILES]


@pytest.mark.parametrize(("name", "source"), _sources(), ids=[name for name, _ in _sources()])
def test_statement_positions_equal_whole_module_positions(name: str, source: str) -> None:
    module = cst.parse_module(source)
    expected = compute_positions(module)
    context = FileContext(source=source, module=module, settings=LintSettings(enabled=frozenset()), path=name)
    recorder = _RecordCallsAndNames(context)
    walk(
        module,
        [recorder],
        before_visit=context.tracker.before_visit,
        after_leave=context.tracker.after_leave,
        hooked_types=Tracker.HOOKED_TYPES,
    )
    assert recorder.seen
    resolver = PositionResolver(module, source)
    for node, path in recorder.seen:
        innermost = path[-1] if path else None
        resolver.ensure([node, innermost], path)
        assert resolver.range_of(node) == expected[node]
        if innermost is not None:
            assert resolver.range_of(innermost) == expected[innermost]
    # Everything was resolved statement by statement, never the whole module.
    assert not resolver._whole_module_done


class _CountingVisitor(cst.BatchableCSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.order.append(f"call:{cst.Module([]).code_for_node(node.func)}")

    def visit_Name(self, node: cst.Name) -> None:
        self.order.append(f"name:{node.value}")

    def leave_For(self, node: cst.For) -> None:
        self.order.append("leave-for")


@pytest.mark.parametrize(("name", "source"), _sources(), ids=[name for name, _ in _sources()])
def test_walker_visits_what_libcst_visits(name: str, source: str) -> None:
    module = cst.parse_module(source)
    ours, theirs = _CountingVisitor(), _CountingVisitor()
    walk(module, [ours], before_visit=lambda n: None, after_leave=lambda n: None, hooked_types=())
    cst.visit_batched(module, [theirs])
    # Same nodes; the order may differ only where libcst's dataclass order
    # does (decorators), so compare as multisets and the For events in order.
    assert sorted(ours.order) == sorted(theirs.order)


def test_attribute_hooks_are_refused() -> None:
    class UsesAttributeHook(cst.BatchableCSTVisitor):
        def visit_Call_func(self, node: cst.Call) -> None:
            pass

    with pytest.raises(TypeError, match="attribute hooks"):
        walk(cst.parse_module("f()\n"), [UsesAttributeHook()], before_visit=print, after_leave=print, hooked_types=())
