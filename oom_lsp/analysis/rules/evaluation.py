"""OOM303: evaluation forward passes that run with autograd on."""

from __future__ import annotations

import re

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, is_true
from oom_lsp.analysis.dataflow import (
    Role,
    contains_backward,
    facts_for,
    inside_no_grad_block,
    iter_nodes,
    maybe_grad_disabling,
)
from oom_lsp.analysis.effects import bind_arguments
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid, short_code
from oom_lsp.analysis.rule_store import register
from oom_lsp.analysis.rules._autograd import AutogradRule
from oom_lsp.fixes import inference_mode

_EVAL_WORDS = frozenset(
    {"evaluate", "evaluation", "eval", "validate", "validation", "predict", "prediction", "infer", "inference",
     "test"}
)  # fmt: skip
# Lightning calls these under no_grad itself.
_LIGHTNING_EVAL_HOOKS = frozenset({"validation_step", "test_step", "predict_step"})
_TEST_FILE_RE = re.compile(r"(^|[/\\])(test_[^/\\]*|[^/\\]*_test)\.py$|(^|[/\\])tests?[/\\]")


def _is_eval_name(name: str) -> bool:
    words = [word for word in name.lower().split("_") if word]
    if not words or name in _LIGHTNING_EVAL_HOOKS or words[-1] == "step":
        return False
    return words[0] in _EVAL_WORDS or words[-1] in _EVAL_WORDS


@register
class EvalWithoutNoGrad(AutogradRule):
    """
    ## What it does
    Flags forward passes of a model in evaluation or inference code that runs
    with autograd on: calls of a model after `model.eval()` in the same
    function, or of any model in a function named like `evaluate`,
    `validate`, `predict`, `infer`, `test_*`, outside `torch.no_grad()` /
    `torch.inference_mode()` (as a `with` block or a decorator). Each forward
    call is reported. Functions that call `backward()` or
    `torch.autograd.grad` (adversarial examples, saliency maps, gradient
    tests) are not reported.

    ## Why is this bad?
    `model.eval()` changes dropout and batch norm; it does not turn autograd
    off. Every forward pass still records its graph and keeps the activations
    a backward pass would need: evaluation then needs as much memory as
    training, and any output or loss kept across batches (a metric, a list of
    predictions) pins all of them.

    ## Example
    ```python
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct
    ```

    ## Use instead
    ```python
    @torch.inference_mode()
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct
    ```

    ## Fix safety
    Safe. A function named as an evaluation function is decorated with
    `@torch.inference_mode()` (spelled with the file's alias for torch;
    `import torch` is added when the file has none). Elsewhere, the innermost
    loop around the forward call (when it contains no `.eval()`/`.train()`
    switch) or else the statement itself is wrapped in
    `with torch.inference_mode():`. Tensors created under inference mode
    cannot later be saved for a backward pass; evaluation code does not do
    that, and code that calls `backward()` is never reported.
    """

    code = "OOM303"
    name = "eval-without-no-grad"
    summary = "An evaluation forward pass runs with autograd on, keeping the activations a backward pass would need."
    why = (
        "With autograd on, a forward pass records a graph and keeps the activations a backward pass "
        "would need, although none comes."
    )
    remedy = "Run it under torch.inference_mode() (or torch.no_grad())."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                with torch.no_grad():
                    for x, y in loader:
                        out = model(x)
            """
        ),
        Valid(
            """
            import torch as T
            @T.inference_mode()
            def predict(net, x):
                return net(x)
            """
        ),
        Valid(
            """
            from torch import no_grad
            @no_grad()
            def validate(model, batch):
                return model(batch)
            """
        ),
        # Gradients are used: an adversarial attack on an eval-mode model.
        Valid(
            """
            import torch
            def fgsm(model, x, y, criterion):
                model.eval()
                x.requires_grad_(True)
                loss = criterion(model(x), y)
                loss.backward()
                return x.grad.sign()
            """
        ),
        # Back to training mode before the forward pass.
        Valid(
            """
            import torch
            def run(model, loader, opt):
                model.eval()
                model.train()
                for x in loader:
                    model(x)
            """
        ),
        # A frozen teacher in eval mode; the student is trained by someone else.
        Valid(
            """
            import torch
            def distill(teacher, student, x):
                teacher.eval()
                with torch.no_grad():
                    target = teacher(x)
                return student(x), target
            """
        ),
        # Lightning runs validation_step under no_grad.
        Valid(
            """
            import torch
            import lightning as L
            class Lit(L.LightningModule):
                def validation_step(self, batch, batch_idx):
                    return self.model(batch)
            """
        ),
        # A model's own method: whoever calls it decides the grad mode (a head
        # used by `forward` in training, a contact map of a protein model).
        Valid(
            """
            import torch.nn as nn
            class Segmenter(nn.Module):
                def forward(self, x):
                    return self.predict(self.backbone(x))

                def predict(self, features):
                    return self.mask_head(features), self.class_head(features)
            """
        ),
        # Called only under no_grad, or handed over as a callback: not ours to judge.
        Valid(
            """
            import torch
            def predict(model, batch):
                return model(batch)

            def run(model, loader):
                with torch.no_grad():
                    return [predict(model, batch) for batch in loader]

            def export(model, evaluate_dataset):
                def eval_wrapper(inputs):
                    return model(inputs)
                return evaluate_dataset(eval_wrapper)
            """
        ),
        # A project's own decorator named for what it does (`@smart_inference_mode()`).
        Valid(
            """
            import torch
            from utils.torch_utils import smart_inference_mode
            @smart_inference_mode()
            def run(model, loader):
                model.eval()
                return [model(x) for x in loader]
            """
        ),
        # Grad turned off through an ExitStack, or a context manager of the file.
        Valid(
            """
            import contextlib
            import torch
            @contextlib.contextmanager
            def frozen():
                with torch.no_grad():
                    yield

            def evaluate(model, loader):
                with contextlib.ExitStack() as stack:
                    stack.enter_context(torch.no_grad())
                    for x in loader:
                        model(x)

            def validate(model, loader):
                with frozen():
                    return [model(x) for x in loader]
            """
        ),
        # A diffusers pipeline runs under no_grad itself.
        Valid(
            """
            import torch
            from diffusers import StableDiffusionControlNetPipeline
            def log_validation(args, prompts):
                pipeline = StableDiffusionControlNetPipeline.from_pretrained(args.model)
                pipeline.unet.eval()
                return [pipeline(prompt).images[0] for prompt in prompts]
            """
        ),
        # Not a model call.
        Valid("import torch\ndef evaluate(metric, preds):\n    return metric(preds)\n"),
        # pytest tests of a model are not evaluation code.
        Valid("import torch\ndef test_forward_shape():\n    assert model(x).shape == (2, 3)\n", settings={}),
        Valid("import torch\ndef evaluate(model, x):\n    model = lambda t: t\n    return model(x)\n"),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct
            """,
            line=7,
            expected_fix="""
            import torch
            @torch.inference_mode()
            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct
            """,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Predictor:
                def __init__(self, model):
                    self.model = model

                def predict(self, x):
                    return self.model(x).softmax(-1)
            """,
            line=9,
            expected_fix="""
            import torch.nn as nn
            import torch

            class Predictor:
                def __init__(self, model):
                    self.model = model

                @torch.inference_mode()
                def predict(self, x):
                    return self.model(x).softmax(-1)
            """,
        ),
        Invalid(
            """
            import torch as T

            def main(model, train_loader, val_loader, epochs):
                for epoch in range(epochs):
                    train_one_epoch(model, train_loader)
                    model.eval()
                    total = 0
                    for x, y in val_loader:  # validation
                        # forward only
                        out = model(
                            x,
                        )
                        total += (out.argmax(-1) == y).sum().item()
                    model.train()
            """,
            line=11,
            expected_fix="""
            import torch as T

            def main(model, train_loader, val_loader, epochs):
                for epoch in range(epochs):
                    train_one_epoch(model, train_loader)
                    model.eval()
                    total = 0
                    with T.inference_mode():
                        for x, y in val_loader:  # validation
                            # forward only
                            out = model(
                                x,
                            )
                            total += (out.argmax(-1) == y).sum().item()
                    model.train()
            """,
        ),
        Invalid(
            """
            import torch
            model = torch.nn.Linear(4, 2)
            model.eval()
            sample = torch.randn(1, 4)
            print(model(sample))  # inference
            """,
            line=6,
            expected_fix="""
            import torch
            model = torch.nn.Linear(4, 2)
            model.eval()
            sample = torch.randn(1, 4)
            with torch.inference_mode():
                print(model(sample))  # inference
            """,
        ),
        # A forward pass routed through a method of the class after `.eval()`.
        Invalid(
            """
            import torch
            class Scorer:
                def __init__(self, module):
                    self.module_ = module

                def infer(self, batch):
                    return self.module_(batch)

                def score(self, loader):
                    self.module_.eval()
                    total = 0.0
                    for batch in loader:
                        total += float(self.infer(batch).mean())
                    return total
            """,
            line=14,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        # Per scope: the models switched to eval mode so far, in source order.
        self._eval_mode: dict[cst.FunctionDef | None, dict[str, bool]] = {}
        self._lambda_depth = 0
        # `with` blocks whose grad mode depends on a value: cannot tell.
        self._maybe_no_grad: list[cst.With] = []
        self._eval_functions: dict[cst.FunctionDef, bool] = {}
        self._called_with_grad_cache: dict[cst.FunctionDef, bool] = {}
        # Tests run models for their outputs, not to serve predictions.
        self._in_test_file = _TEST_FILE_RE.search(context.path) is not None

    def visit_With(self, node: cst.With) -> None:
        if any(maybe_grad_disabling(item.item, self.context) for item in node.items):
            self._maybe_no_grad.append(node)

    def leave_With(self, original_node: cst.With) -> None:
        if self._maybe_no_grad and self._maybe_no_grad[-1] is original_node:
            self._maybe_no_grad.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._lambda_depth += 1

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._lambda_depth -= 1

    def leave_Assign(self, original_node: cst.Assign) -> None:
        """Rebinding a model name forgets its mode, unless the new value is
        the same model switched (`model = model.eval()`, `net = net.to(dev)`)."""
        modes = self._eval_mode.get(self.context.tracker.current_function)
        if not modes:
            return
        for target in original_node.targets:
            name = dotted_name(target.target)
            if name is not None and name in modes:
                switched = _mode_after_chain(original_node.value, name, modes[name])
                if switched is None:
                    del modes[name]
                else:
                    modes[name] = switched

    def visit_Call(self, node: cst.Call) -> None:
        if self._lambda_depth or self._in_test_file or self._maybe_no_grad:
            return
        if self._switches_mode(node):
            return
        if self.context.tracker.in_no_grad:
            return
        function = self.context.tracker.current_function
        eval_function = function is not None and self._is_eval_function(function)
        if not eval_function and not any(self._eval_mode.get(function, {}).values()):
            return  # the common case, decided without the data flow
        callee = self._flow().callee(node.func, node)
        by_name = eval_function and callee.role is Role.MODULE
        switched = self._switched_to_eval(node.func, callee.role)
        if switched is None and not by_name:
            switched = self._routed_forward(node, self._eval_mode.get(function, {}))
        if by_name:
            if self._summary().backward_calls or not self._called_with_grad(function):
                return  # gradients are computed here, or the callers turn them off
        elif switched is None or self._computes_gradients_around():
            return
        reference = self.context.imports.reference_to("torch.inference_mode")
        imports: tuple[str, ...] = ()
        if reference is None:
            reference, imports = "torch.inference_mode", ("torch",)
        fix = None
        if by_name:
            assert function is not None
            # On an `async def`, a decorator would only cover creating the coroutine, not running it.
            if function.asynchronous is None:
                edits = inference_mode.decorate(function, reference)
                fix = FixSpec(
                    "Decorate the function with `@torch.inference_mode()`", edits, Applicability.SAFE, imports
                )
        else:
            target = self._wrap_target()
            indent = self._indent_of(target) if target is not None else None
            if target is not None and indent is not None:
                edits = inference_mode.wrap(target, indent, self.context.module, reference)
                fix = FixSpec("Wrap in `with torch.inference_mode():`", edits, Applicability.SAFE, imports)
        where = "in an evaluation function" if by_name else f"after {short_code(switched)}.eval()"
        self.report(
            node,
            f"Forward pass {where} runs with autograd on",
            fix=fix,
        )

    def _switched_to_eval(self, func: cst.BaseExpression, role: Role) -> str | None:
        """The model switched to eval mode that `func` runs: `model` for
        `model(x)` (unless known to be no module) and, for a known submodule
        call, `model.encoder(x)`."""
        called = dotted_name(func)
        if called is None:
            return None
        modes = self._eval_mode.get(self.context.tracker.current_function, {})
        if modes.get(called) and role in (Role.MODULE, Role.UNKNOWN):
            return called
        if role is Role.MODULE:
            parts = called.split(".")
            for end in range(len(parts) - 1, 0, -1):
                prefix = ".".join(parts[:end])
                if modes.get(prefix):
                    return prefix
        return None

    def _routed_forward(self, call: cst.Call, modes: dict[str, bool]) -> str | None:
        """A function of the file that runs a model switched to eval mode
        here, with autograd on (`self.infer(x)` whose body calls
        `self.module_(x)`, `score(model, batch)` whose body calls its
        parameter): the model, else None. A callee reported by its own name
        (`def predict(...)` calling a known model) is left to that report."""
        if not any(modes.values()):
            return None
        function = self._flow().local_function(call.func)
        if function is None:
            return None
        if any(self.context.tracker.is_grad_disabling(decorator.decorator) for decorator in function.decorators):
            return None
        # The callee's name for each model switched here.
        names = {model: model for model, switched in modes.items() if switched and model.startswith("self.")}
        arguments = bind_arguments(call, function, bound_self=type(call.func) is cst.Attribute) or {}
        for param, argument in arguments.items():
            model = dotted_name(argument)
            if model is not None and modes.get(model):
                names[param] = model
        facts = facts_for(self.context)
        summary = facts.summary(function)
        reported_there = self._is_eval_function(function) and self._called_with_grad(function)
        for name, model in names.items():
            for mention, ancestors in summary.uses_of(name):
                parent = ancestors[-1] if ancestors else None
                if type(parent) is not cst.Call or parent.func is not mention:
                    continue
                if inside_no_grad_block(ancestors, self.context):
                    continue
                if reported_there and facts.flow(function).callee(parent.func, parent).role is Role.MODULE:
                    continue  # the callee's own report covers this forward pass
                return model
        return None

    def _computes_gradients_around(self) -> bool:
        """A backward pass in the loop around the call (or, outside loops,
        anywhere in the scope): a frozen eval-mode backbone being trained
        through, an adversarial attack."""
        tracker = self.context.tracker
        if tracker.loops:
            return contains_backward(tracker.loops[-1].body, self.context)
        return bool(self._summary().backward_calls)

    def _switches_mode(self, node: cst.Call) -> bool:
        """Records `model.eval()` / `model.train(...)`; True for such a call."""
        if type(node.func) is not cst.Attribute or node.func.attr.value not in ("eval", "train"):
            return False
        receiver = dotted_name(node.func.value)
        if receiver is None or node.func.attr.value == "eval" and node.args:
            return False
        modes = self._eval_mode.setdefault(self.context.tracker.current_function, {})
        if node.func.attr.value == "eval":
            modes[receiver] = True
        else:
            mode = get_arg(node, "mode", 0)
            if mode is None or (isinstance(mode, cst.Arg) and is_true(mode.value)):
                modes[receiver] = False
            elif (
                isinstance(mode, cst.Arg) and isinstance(mode.value, cst.Name) and mode.value.value == "False"
            ):
                modes[receiver] = True
            else:
                modes.pop(receiver, None)  # unknown mode
        return True

    def _is_eval_function(self, function: cst.FunctionDef) -> bool:
        known = self._eval_functions.get(function)
        if known is None:
            known = self._eval_functions[function] = self._looks_like_evaluation(function)
        return known

    def _looks_like_evaluation(self, function: cst.FunctionDef) -> bool:
        name = function.name.value
        if not _is_eval_name(name):
            return False
        if any(
            self.context.qualified_name(_callee_of(d.decorator)) in _GRAD_ENABLING
            for d in function.decorators
        ):
            return False  # gradients are asked for explicitly
        facts = facts_for(self.context)
        owner = facts.class_of.get(function)
        if owner is not None and owner.name.value in facts.module_classes and _takes_self(function):
            return False  # a model's own method (`predict_contacts`, a head's `predict`): its caller decides
        if name.startswith("test"):
            if self._in_test_file or (owner is not None and owner.name.value.startswith("Test")):
                return False
            if not function.params.params:
                return False  # `def test_x():` without parameters is a pytest test, not an evaluation routine
        return True

    def _called_with_grad(self, function: cst.FunctionDef) -> bool:
        """Not only called under no_grad, nor handed to code we cannot see (a
        callback): its forward passes are ours to judge. Asked only once a
        forward pass is about to be reported (it reads the whole file)."""
        known = self._called_with_grad_cache.get(function)
        if known is None:
            known = facts_for(self.context).runs_without_grad_for_its_callers(function) is False
            self._called_with_grad_cache[function] = known
        return known

    def _wrap_target(self) -> cst.CSTNode | None:
        """The innermost loop around the call when it does not switch modes,
        else the statement around the call."""
        tracker = self.context.tracker
        if tracker.loops and not _switches_any_mode(tracker.loops[-1]):
            return tracker.loops[-1]
        statement = tracker.current_statement
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or statement is None:
            return None
        return None if _switches_any_mode(statement) else statement

    def _indent_of(self, statement: cst.CSTNode) -> str | None:
        """The indentation of a statement, from the blocks around it."""
        if any(inner is statement for inner in self.context.module.body):
            return ""
        for depth in range(len(self._blocks) - 1, -1, -1):
            if any(inner is statement for inner in self._blocks[depth].body):
                return self._indent(depth + 1)
        return None


_GRAD_ENABLING = frozenset({"torch.enable_grad", "torch.autograd.enable_grad"})


def _takes_self(function: cst.FunctionDef) -> bool:
    """An instance method (not a `@staticmethod` taking the model as an argument)."""
    params = function.params.posonly_params or function.params.params
    return bool(params) and params[0].name.value == "self"


def _callee_of(expr: cst.BaseExpression) -> cst.BaseExpression:
    return expr.func if isinstance(expr, cst.Call) else expr


def _mode_after_chain(value: cst.BaseExpression, name: str, mode: bool) -> bool | None:
    """The eval mode of `name` after `name = value`, when `value` is `name`
    through module-returning methods (`name.eval()`, `name.to(device)`);
    None when it is something else."""
    chain: list[str] = []
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        chain.append(value.func.attr.value)
        value = value.func.value
    if dotted_name(value) != name or not all(method in _MODULE_CHAIN_METHODS for method in chain):
        return None
    for method in reversed(chain):
        if method in ("eval", "train"):
            mode = method == "eval"
    return mode


_MODULE_CHAIN_METHODS = frozenset(
    {"eval", "train", "to", "cuda", "cpu", "half", "float", "bfloat16", "double"}
)


def _switches_any_mode(node: cst.CSTNode) -> bool:
    return any(
        isinstance(inner, cst.Call)
        and isinstance(inner.func, cst.Attribute)
        and inner.func.attr.value in ("eval", "train")
        for inner in iter_nodes(node)
    )
