"""One level of summaries of the file's functions: what each keeps of its arguments."""

from __future__ import annotations

import textwrap

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.dataflow import facts_for
from oom_lsp.analysis.effects import bind_arguments, effects_for
from oom_lsp.analysis.settings import default_settings


def _context(source: str) -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="train.py")


def _functions(context: FileContext) -> dict[str, cst.FunctionDef]:
    return {function.name.value: function for function in facts_for(context).functions()}


def test_what_a_function_keeps() -> None:
    context = _context(
        """
        import torch
        history = []

        def record(log, out, loss):
            log["outputs"].append(out.cpu())
            log["losses"].insert(0, loss)
            history.append(out)

        class Meter:
            def update(self, value, n=1):
                self.sum += value * n
                self.last = value
                self.values.append(value.detach())

        def local_only(out):
            kept = []
            kept.append(out)
            return kept

        def backpropagates(loss, losses):
            losses.append(loss)
            loss.backward()
        """
    )
    effects = effects_for(context)
    functions = _functions(context)
    described = {
        name: [(keep.param, keep.container, keep.owner, keep.accumulates) for keep in effects.keeps(function)]
        for name, function in functions.items()
    }
    assert described == {
        "record": [
            ("out", "log['outputs']", "log", False),
            ("loss", "log['losses']", "log", False),
            ("out", "history", None, False),
        ],
        "update": [("value", "self.sum", "self", True)],
        "local_only": [],
        "backpropagates": [],
    }


def test_forward_hooks_and_their_output_parameter() -> None:
    context = _context(
        """
        import torch
        def save(module, args, output):
            pass

        def save_kwargs(module, args, kwargs, output):
            pass

        def pre(module, args):
            pass

        class Probe:
            def keep(self, module, args, output):
                pass

            def attach(self, model):
                model.register_forward_hook(self.keep)

        model.layer.register_forward_hook(save)
        model.layer.register_forward_hook(save_kwargs, with_kwargs=True)
        model.layer.register_forward_pre_hook(pre)
        """
    )
    hooks = {function.name.value: output for function, output in effects_for(context).forward_hooks().items()}
    assert hooks == {"save": "output", "save_kwargs": "output", "keep": "output"}


def test_cleared_containers() -> None:
    context = _context(
        """
        import torch
        kept, emptied, reset, sliced, never = [], [], [], [], []

        def step():
            emptied.clear()
            del sliced[:]

        def epoch():
            global reset
            reset = []
        """
    )
    effects = effects_for(context)
    assert {name: effects.cleared(name) for name in ("kept", "emptied", "reset", "sliced", "never")} == {
        "kept": False,
        "emptied": True,
        "reset": True,
        "sliced": True,
        "never": False,
    }


def test_bind_arguments() -> None:
    context = _context(
        """
        def update(self, value, n=1):
            pass

        meter.update(loss, n=4)
        update(meter, loss)
        meter.update(*values)
        """
    )
    function = _functions(context)["update"]
    calls = [
        statement.body[0].value
        for statement in context.module.body
        if isinstance(statement, cst.SimpleStatementLine)
    ]

    def spelled(bound: dict[str, cst.BaseExpression] | None) -> dict[str, str] | None:
        return None if bound is None else {name: context.code_for(expr) for name, expr in bound.items()}

    assert spelled(bind_arguments(calls[0], function, bound_self=True)) == {"value": "loss", "n": "4"}
    assert spelled(bind_arguments(calls[1], function, bound_self=False)) == {"self": "meter", "value": "loss"}
    assert bind_arguments(calls[2], function, bound_self=True) is None
