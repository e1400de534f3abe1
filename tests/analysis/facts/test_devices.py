"""Where a value lives (oom_lsp.analysis.facts.devices): across the file's own
functions, loop targets and tuple displays."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.devices import Device, device_facts
from oom_lsp.analysis.facts.program import program_of
from oom_lsp.analysis.settings import default_settings


def _device_of_argument(source: str, function: str, called: str) -> Device:
    """The device of the first argument of the first call to `called` in `function`."""
    source = textwrap.dedent(source)
    context = FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="t.py")
    program = program_of(context)
    [scope] = [f for f in program.functions if f.name == function]
    call = next(c for c in scope.calls if context.module.code_for_node(c.node.func) == called)
    return device_facts(context, uses_cuda=True).device_of(call.node.args[0].value, scope)


def test_a_helper_returns_a_value_where_its_callers_arguments_live() -> None:
    source = """
        import torch
        def pool(hidden, mask):
            weights = mask.unsqueeze(-1)
            return (hidden * weights).sum(1) / weights.sum(1)
        def encode(model, loader, out):
            for batch in loader:
                pooled = pool(batch.cuda(), batch)
                out.append(pooled)
    """
    assert _device_of_argument(source, "encode", "out.append") is Device.GPU


def test_a_parameter_passed_from_the_cpu_by_one_caller_is_not_known_to_be_on_the_gpu() -> None:
    source = """
        import torch
        def pool(hidden):
            return hidden.mean(1)
        def encode(loader, out):
            for batch in loader:
                out.append(pool(batch.cuda()))
            out.append(pool(batch.cpu()))
    """
    assert _device_of_argument(source, "encode", "out.append") is Device.UNKNOWN


@pytest.mark.parametrize(
    "loop",
    [
        "for image_id, output in zip(ids, outputs):",
        "for i, output in enumerate(outputs):",
        "for output in outputs:",
    ],
)
def test_a_loop_target_lives_where_the_iterated_values_do(loop: str) -> None:
    source = f"""
        import torch
        def run(ids, images, store):
            outputs = images.cuda() * 2
            {loop}
                store.append(output)
    """
    assert _device_of_argument(source, "run", "store.append") is Device.GPU


def test_the_index_of_enumerate_is_not_an_element() -> None:
    source = """
        import torch
        def run(images, store):
            outputs = images.cuda() * 2
            for i, output in enumerate(outputs):
                store.append(i)
    """
    assert _device_of_argument(source, "run", "store.append") is Device.UNKNOWN


def test_names_unpacked_from_a_tuple_display_are_bound_to_its_elements() -> None:
    source = """
        import torch
        def run(x, store):
            gpu, host = x.cuda(), x.cpu()
            store.append(gpu)
            store.add(host)
    """
    assert _device_of_argument(source, "run", "store.append") is Device.GPU
    assert _device_of_argument(source, "run", "store.add") is Device.HOST


def _device_where_read(source: str, function: str, called: str) -> Device:
    """The device of the first argument of the first call to `called` in `function`, read where
    the call is (the bindings that reach it)."""
    source = textwrap.dedent(source)
    context = FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="t.py")
    program = program_of(context)
    [scope] = [f for f in program.functions if f.name == function]
    call = next(c for c in scope.calls if context.module.code_for_node(c.node.func) == called)
    return device_facts(context, uses_cuda=True).device_of(call.node.args[0].value, scope, at=call.path)


def test_a_name_rebound_after_the_loop_is_read_in_the_loop_as_the_loop_binds_it() -> None:
    source = """
        import torch
        def evaluate(model, loader, out):
            for x in loader:
                logits = model(x.cuda())
                out.append(logits)
            logits = torch.cat(out).cpu()
            return logits
    """
    assert _device_of_argument(source, "evaluate", "out.append") is Device.UNKNOWN  # every binding
    assert _device_where_read(source, "evaluate", "out.append") is Device.GPU


def test_a_binding_later_in_the_loop_body_reaches_the_next_iteration() -> None:
    source = """
        import torch
        def collect(loader, out):
            state = torch.zeros(4).cuda()
            for x in loader:
                out.append(state)
                state = x.cpu()
    """
    assert _device_where_read(source, "collect", "out.append") is Device.UNKNOWN


def test_a_conditional_binding_between_reaches_too() -> None:
    source = """
        def collect(model, loader, out, flag):
            for x in loader:
                y = model(x.cuda())
                if flag:
                    y = y.cpu()
                out.append(y)
    """
    assert _device_where_read(source, "collect", "out.append") is Device.UNKNOWN


def test_an_unconditional_move_kills_the_earlier_binding() -> None:
    source = """
        def collect(model, loader, out):
            for x in loader:
                y = model(x.cuda())
                y = y.cpu()
                out.append(y)
    """
    assert _device_where_read(source, "collect", "out.append") is Device.HOST


def test_a_name_bound_from_itself_reads_the_binding_before_it() -> None:
    source = """
        import torch
        def extract(model, loader, feats):
            model.eval()
            for img, _ in loader:
                f = model.forward_features(img.cuda())
                f = torch.nn.functional.normalize(f, dim=1)
                feats.append(f)
    """
    assert _device_where_read(source, "extract", "feats.append") is Device.GPU
