"""Grad and train/eval contexts merged over callers (oom_lsp.analysis.facts)."""

from __future__ import annotations

import textwrap

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.contexts import call_graph
from oom_lsp.analysis.facts.library import Grad, Mode
from oom_lsp.analysis.facts.modes import ModeFacts
from oom_lsp.analysis.facts.program import LocalGrad
from oom_lsp.analysis.settings import default_settings


def _context(source: str) -> FileContext:
    source = textwrap.dedent(source)
    return FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="t.py")


def _entry(source: str, qualname: str) -> Grad:
    context = _context(source)
    graph = call_graph(context)
    [function] = [f for f in graph.program.functions if f.qualname == qualname]
    return graph.entry_grad(function)


def _contexts(source: str, qualname: str, callee_text: str, model: str) -> set[tuple[Grad, Mode]]:
    context = _context(source)
    graph = call_graph(context)
    modes = ModeFacts(graph)
    [function] = [f for f in graph.program.functions if f.qualname == qualname]
    [call] = [c for c in function.calls if context.module.code_for_node(c.node.func) == callee_text]
    return set(modes.contexts_at(call, model))


def test_a_with_block_at_the_call_site_turns_grad_off_for_the_callee() -> None:
    source = """
        import torch
        def evaluate(model, loader):
            return [model(x) for x in loader]
        def main(model, loader):
            with torch.no_grad():
                evaluate(model, loader)
        main(None, [])
    """
    assert _entry(source, "evaluate") == Grad.OFF


def test_grad_mode_crosses_two_levels_of_callers() -> None:
    source = """
        import torch
        def step(model, x):
            return model(x)
        def evaluate(model, loader):
            return [step(model, x) for x in loader]
        def main(model, loader):
            with torch.no_grad():
                evaluate(model, loader)
        if __name__ == "__main__":
            main(None, [])
    """
    assert _entry(source, "step") == Grad.OFF
    assert _entry(source, "main") == Grad.ON


def test_a_function_called_both_ways_runs_in_both_modes() -> None:
    source = """
        import torch
        def forward_batch(model, x):
            return model(x)
        def train(model, x):
            forward_batch(model, x).sum().backward()
        @torch.no_grad()
        def validate(model, x):
            return forward_batch(model, x)
        train(None, None); validate(None, None)
    """
    assert _entry(source, "forward_batch") == Grad.ON | Grad.OFF


def test_a_function_nobody_calls_has_unknown_callers_not_the_default_mode() -> None:
    assert _entry("import torch\ndef evaluate(model, x):\n    return model(x)\n", "evaluate") == Grad.UNKNOWN


def test_an_optimizer_closure_runs_with_grad() -> None:
    source = """
        import torch
        def train(model, opt, x):
            def closure():
                opt.zero_grad()
                loss = model(x).sum()
                loss.backward()
                return loss
            with torch.no_grad():
                pass
            opt.step(closure)
        train(None, None, None)
    """
    assert _entry(source, "train.<locals>.closure") == Grad.ON


def test_a_callback_handed_to_unknown_code_has_an_unknown_mode() -> None:
    source = """
        import torch
        def export(model, evaluate_dataset):
            def wrapper(inputs):
                return model(inputs)
            return evaluate_dataset(wrapper)
        export(None, None)
    """
    assert _entry(source, "export.<locals>.wrapper") == Grad.UNKNOWN


def test_lightning_validation_step_runs_without_grad_in_eval_mode() -> None:
    source = """
        import lightning as L
        class Lit(L.LightningModule):
            def validation_step(self, batch, batch_idx):
                return self.model(batch)
    """
    assert _entry(source, "Lit.validation_step") == Grad.OFF
    assert _contexts(source, "Lit.validation_step", "self.model", "self.model") == {(Grad.OFF, Mode.EVAL)}


def test_a_trainer_prediction_step_override_runs_with_grad_in_eval_mode() -> None:
    source = """
        from transformers import Trainer
        class MyTrainer(Trainer):
            def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
                return model(**inputs)
    """
    assert _entry(source, "MyTrainer.prediction_step") == Grad.ON


def test_eval_mode_set_in_one_method_reaches_the_forward_in_another() -> None:
    source = """
        import torch
        class Trainer:
            def infer(self, batch):
                return self.model(batch)
            def validate(self, loader):
                self.model.eval()
                return [self.infer(b) for b in loader]
            def fit(self, loader):
                self.model.train()
                for b in loader:
                    self.infer(b).sum().backward()
                self.validate(loader)
        Trainer().fit([])
    """
    contexts = _contexts(source, "Trainer.infer", "self.model", "self.model")
    assert (Grad.ON, Mode.EVAL) in contexts and (Grad.ON, Mode.TRAIN) in contexts


def test_a_switch_under_an_if_is_an_alternative() -> None:
    source = """
        import torch
        def run(model, loader, training):
            if training:
                model.train()
            else:
                model.eval()
            for x in loader:
                model(x)
        run(None, [], True)
    """
    [(grad, mode)] = _contexts(source, "run", "model", "model")
    assert grad == Grad.ON and Mode.EVAL in mode and Mode.TRAIN in mode


def test_a_grad_mode_chosen_by_a_value_is_maybe() -> None:
    source = """
        import torch
        def run(model, loader, phase):
            model.eval()
            with torch.set_grad_enabled(phase == "train"):
                for x in loader:
                    model(x)
        run(None, [], "val")
    """
    assert _contexts(source, "run", "model", "model") == {(Grad.MAYBE, Mode.EVAL)}


def test_the_model_passed_as_an_argument_keeps_the_callers_mode() -> None:
    source = """
        import torch
        def score(net, x):
            return net(x)
        def main(model, x):
            model.eval()
            score(model, x)
        main(None, None)
    """
    assert _contexts(source, "score", "net", "net") == {(Grad.ON, Mode.EVAL)}


def test_rebinding_the_model_forgets_its_mode() -> None:
    source = """
        import torch
        def compile_it(f, inps):
            f = torch.jit.freeze(f.eval())
            f(*inps)
        compile_it(None, ())
    """
    assert Mode.EVAL not in {mode for _, mode in _contexts(source, "compile_it", "f", "f")}


def test_a_model_method_resolves_to_the_class_forward() -> None:
    source = """
        import torch.nn as nn
        class Encoder(nn.Module):
            def forward(self, x):
                return x
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = Encoder()
            def forward(self, x):
                return self.encoder(x)
        def main():
            net = Net()
            net(1)
        main()
    """
    context = _context(source)
    graph = call_graph(context)
    calls = {
        context.module.code_for_node(call.node.func): [callee.qualname for callee in graph.callees(call)]
        for function in graph.program.functions
        for call in function.calls
    }
    assert calls["self.encoder"] == ["Encoder.forward"]
    assert calls["net"] == ["Net.forward"]
    assert calls["Net"] == ["Net.__init__"]


def _local_grad_of(source: str, callee_text: str) -> list[LocalGrad | None]:
    context = _context(source)
    graph = call_graph(context)
    return [
        call.local_grad
        for function in graph.program.functions
        for call in function.calls
        if context.module.code_for_node(call.node.func) == callee_text
    ]


def test_a_grad_context_held_in_a_variable_is_the_context_it_holds() -> None:
    source = """
        import contextlib
        import torch
        def run(model, x, phase):
            maybe = torch.no_grad() if phase == "val" else contextlib.nullcontext()
            off = torch.no_grad()
            other = open("log.txt")
            with maybe:
                model(x)
            with off:
                model.encoder(x)
            with other:
                model.decoder(x)
    """
    assert _local_grad_of(source, "model") == [LocalGrad.MAYBE]
    assert _local_grad_of(source, "model.encoder") == [LocalGrad.OFF]
    assert _local_grad_of(source, "model.decoder") == [None]


def test_a_module_handed_to_a_constructor_resolves_through_the_attribute_it_is_kept_in() -> None:
    """`Detector(model.to(device))` with `model = Forecaster(...)`: the parameter is a
    Forecaster in every call, so `self.model.cell(...)` runs `Cell.forward`."""
    source = """
        import torch.nn as nn
        class Cell(nn.Module):
            def forward(self, x, h):
                return x
        class Forecaster(nn.Module):
            def __init__(self):
                super().__init__()
                self.cell = Cell()
        class Detector:
            def __init__(self, model):
                self.model = model.eval()
            def step(self, x, h):
                return self.model.cell(x, h)
        def main(device):
            model = Forecaster()
            detector = Detector(model.to(device))
            detector.step(1, 2)
        main("cuda")
    """
    context = _context(source)
    graph = call_graph(context)
    [call] = [c for f in graph.program.functions for c in f.calls if context.module.code_for_node(c.node.func) == "self.model.cell"]
    assert [callee.qualname for callee in graph.callees(call)] == ["Cell.forward"]


def test_a_parameter_passed_instances_of_two_classes_is_neither() -> None:
    source = """
        import torch.nn as nn
        class A(nn.Module):
            def forward(self, x):
                return x
        class B(nn.Module):
            def forward(self, x):
                return x
        def run(model, x):
            return model(x)
        run(A(), 1)
        run(B(), 1)
    """
    context = _context(source)
    graph = call_graph(context)
    [call] = [c for f in graph.program.functions for c in f.calls if context.module.code_for_node(c.node.func) == "model"]
    assert graph.callees(call) == ()


def test_calling_a_parameter_runs_the_forward_of_the_module_every_caller_passes() -> None:
    source = """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x
        def generate(model, x):
            with torch.no_grad():
                return model(x)
        generate(Net(), None)
    """
    assert _entry(source, "Net.forward") == Grad.OFF


def test_the_blocks_of_a_module_list_run_under_the_grad_mode_of_the_loop_that_calls_them() -> None:
    source = """
        import torch
        import torch.nn as nn
        class Block(nn.Module):
            def forward(self, x):
                return x
        class Model(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.blocks = nn.ModuleList([Block() for _ in range(n)])
                self.head = nn.Sequential(nn.Linear(4, 4), Head())
            def forward(self, x):
                for block in self.blocks:
                    x = block(x)
                return self.head(self.blocks[0](x))
        class Head(nn.Module):
            def forward(self, x):
                return x
        model = Model(2)
        with torch.no_grad():
            model(None)
    """
    assert _entry(source, "Block.forward") == Grad.OFF
    assert _entry(source, "Head.forward") == Grad.OFF


def test_a_sequential_of_unknown_elements_resolves_nothing() -> None:
    source = """
        import torch
        import torch.nn as nn
        class Block(nn.Module):
            def forward(self, x):
                return x
        class Model(nn.Module):
            def __init__(self, layers):
                super().__init__()
                self.body = nn.Sequential(*layers)
            def forward(self, x):
                for layer in self.body:
                    x = layer(x)
                return x
        with torch.no_grad():
            Model(load_layers())(None)
    """
    assert _entry(source, "Block.forward") == Grad.UNKNOWN


def test_a_module_called_through_a_value_the_file_cannot_type_may_run_with_grad() -> None:
    # `generate` types its model, `loss_of` cannot (its caller's caller is
    # elsewhere): that call may run Net.forward too, with autograd on.
    source = """
        import torch
        import torch.nn as nn
        class Net(nn.Module):
            def forward(self, x):
                return x
        def generate(model, x):
            with torch.no_grad():
                return model(x)
        def loss_of(model, x):
            return model(x).sum()
        def train(m, x):
            loss_of(m, x).backward()
        generate(Net(), None)
    """
    assert _entry(source, "Net.forward") != Grad.OFF
    assert Grad.UNKNOWN in _entry(source, "Net.forward")


def test_a_model_its_constructor_puts_in_eval_mode_is_in_eval_mode_for_callers_the_file_cannot_see() -> None:
    source = """
        import torch
        import torchvision
        class Embedder:
            def __init__(self):
                self.model = torchvision.models.resnet18(weights="DEFAULT")
                self.model.eval()
            def embed(self, images):
                return self.model(images)
    """
    assert _contexts(source, "Embedder.embed", "self.model", "self.model") == {(Grad.UNKNOWN, Mode.EVAL)}
    # A method that switches it to train mode: the mode at an unseen call is unknown.
    switched = source + """
            def finetune(self):
                self.model.train()
    """
    assert _contexts(switched, "Embedder.embed", "self.model", "self.model") == {(Grad.UNKNOWN, Mode.UNKNOWN)}
