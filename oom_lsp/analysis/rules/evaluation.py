"""OOM303: evaluation forward passes that run with autograd on."""

from __future__ import annotations

import re

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.contexts import CallGraph
from oom_lsp.analysis.facts.datasets import trains_on_small_inputs
from oom_lsp.analysis.facts.evaluation import EvalForward, evaluation_facts, is_inference_script, never_trains
from oom_lsp.analysis.facts.sizes import model_size
from oom_lsp.analysis.facts.workload import SMALL_MODEL_PARAMETERS, Workload, workload_of
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid, deferred_report
from oom_lsp.fixes import inference_mode

_TEST_FILE_RE = re.compile(r"(^|[/\\])(test_[^/\\]*|[^/\\]*_test)\.py$|(^|[/\\])tests?[/\\]")



class EvalWithoutNoGrad(Rule):
    """
    ## What it does
    Flags a forward pass of a model that records an autograd graph no
    backward pass will use. The facts that decide it cross function calls:

    - the grad mode the call runs under: the `with torch.no_grad()` /
      `inference_mode()` blocks and decorators around it and around every
      call of its function, up the callers the file shows (callers in other
      files are not read yet); a framework's hooks (Lightning's
      `validation_step` runs without grad, a Trainer's `prediction_step` with);
    - the model's train/eval mode: its last `.eval()` / `.train()`, in the
      call's function or in the caller that hands it the model;
    - whether a backward pass uses the output: one in the same loop
      iteration (an adversarial example, a frozen backbone trained through),
      or in a caller that receives the function's result.
    - whether the model records a graph at all: one whose parameters are
      all frozen (`model.requires_grad_(False)`, or every parameter's
      `requires_grad` set off in a loop) and that runs on data records
      nothing, so it is not reported.

    It reports a forward pass in eval mode with autograd on (on some path of
    callers), a function that trains and evaluates by a flag
    (`if is_train: ... else: model.eval()`) on its evaluation path, and a
    loop over batches whose losses are only ever read as numbers
    (`.item()`, printed, logged), whatever the model's mode. A function's
    name (`evaluate`, `predict`) decides nothing.

    By default it reports the evaluations that need more memory than the
    training step they follow: those where a value computed from the
    forward pass (`output`, `loss`, a list the outputs are appended to, a
    comprehension of outputs, or what a caller's loop keeps of the
    function's result) still holds its graph when the next batch's forward
    pass runs. Nothing frees that graph without a backward pass, so two
    batches' activations (or every batch's) are alive at once. One batch's
    graph that dies within its iteration (`correct += (model(x).argmax(1)
    == y).sum().item()`) costs what training already holds, unless the
    evaluation's loader has a larger batch than every training loop's (both
    stated in the code): then its one graph holds more activations than the
    training step does. `--strict` shows the rest. In a file that never
    trains (no backward pass, optimizer step, training loop or Lightning
    `training_step` anywhere) there is no training step to compare with, so
    a forward pass with autograd on keeps the activations inference would
    free, and it is reported by default: in a script (an
    `if __name__ == "__main__":` block), and in code that serves a model it
    makes itself (an embedding or prediction class that builds or loads its
    model and calls `.eval()` on it; not a model it is handed, which a
    training script elsewhere may run, nor a module's own submodules),
    unless the size facts show the model is small (under 10 M parameters).
    A model whose constructor puts it in eval mode is in eval mode in every
    method callers outside the file run, when no method switches it back.
    pytest tests (`test_*` functions) are not reported.

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
    Safe. A function whose forward passes are all evaluation ones, that runs
    no backward pass, switches no model to train mode and hands its model to
    no code the analysis cannot see is decorated with
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
        # Nothing says the model is evaluated here, nor how the callers call it:
        # a method's name (`predict`) is no evidence of either.
        Valid(
            """
            import torch.nn as nn

            class Predictor:
                def __init__(self, model):
                    self.model = model

                def predict(self, x):
                    return self.model(x).softmax(-1)
            """
        ),
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
        # Frozen parameters on data record no graph: no_grad would save nothing.
        Valid(
            """
            import torch
            def compute_metric(sampler, batches):
                sampler.eval().requires_grad_(False)
                scores = []
                for batch in batches:
                    x = sampler(batch)
                    scores.append(x)
                return scores
            """
        ),
        Valid(
            """
            import torch
            class Scorer:
                def __init__(self, net):
                    self.net = net.eval()
                    for p in self.net.parameters():
                        p.requires_grad = False

                def score(self, loader):
                    outs = []
                    for x in loader:
                        outs.append(self.net(x))
                    return outs
            """
        ),
        # The phase decides the grad mode too.
        Valid(
            """
            import torch
            def train_model(model, loaders, criterion, optimizer):
                for phase in ["train", "val"]:
                    for inputs, labels in loaders[phase]:
                        with torch.set_grad_enabled(phase == "train"):
                            outputs = model(inputs)
                            loss = criterion(outputs, labels)
                            if phase == "train":
                                loss.backward()
            """
        ),
        # A grad context chosen by the phase, held in a variable.
        Valid(
            """
            import contextlib
            import torch
            def train_model(model, loaders, criterion):
                for phase in ["train", "val"]:
                    context = torch.no_grad() if phase == "val" else contextlib.nullcontext()
                    for inputs, labels in loaders[phase]:
                        with context:
                            loss = criterion(model(inputs), labels)
                        if phase == "train":
                            loss.backward()
            """
        ),
        # What each batch computes is no phase: the backward is skipped for a
        # bad batch, not for a pass over the data.
        Valid(
            """
            import torch
            def train_model(model, loaders, criterion, optimizer):
                for phase in ["train", "val"]:
                    for inputs, labels in loaders[phase]:
                        loss = criterion(model(inputs), labels)
                        finite = torch.isfinite(loss)
                        if finite:
                            loss.backward()
                            optimizer.step()
            """
        ),
        # The flag is a parameter: a caller may run the evaluation under no_grad.
        Valid(
            """
            import torch
            def run_epoch(model, loader, optimizer, train):
                for x in loader:
                    loss = model(x).mean()
                    if train:
                        loss.backward()
                        optimizer.step()
            """
        ),
        # A pytest test runs the model for its outputs, on the inputs it makes.
        Valid(
            """
            import torch

            def test_attention_shapes():
                model = Attention(8)
                model.eval()
                assert model(torch.zeros(1, 6, 8)).shape == (1, 6, 8)
            """
        ),
    ]
    INVALID = [
        # One batch's graph at a time, freed within the iteration: strict only.
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
            by_default=False,
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
            by_default=False,
            expected_fix="""
            import torch
            model = torch.nn.Linear(4, 2)
            model.eval()
            sample = torch.randn(1, 4)
            with torch.inference_mode():
                print(model(sample))  # inference
            """,
        ),
        # An inference script: nothing in it trains, so the graph of its one
        # forward pass is all the activations inference would have freed
        # (the demo of a model on a full-resolution image).
        Invalid(
            """
            import torch

            def main(args):
                model = Restorer().cuda()
                model.load_state_dict(torch.load(args.weights, map_location="cpu"))
                model.eval()
                image = load_image(args.input).cuda()
                restored = model(image)
                save_image(restored.detach().cpu(), args.output)

            if __name__ == "__main__":
                main(parse_args())
            """,
            line=9,
            by_default=True,
        ),
        # The same function in a module, not a script: a training program may
        # call it, where its graph is no more than the training step holds
        # (only in strict mode).
        Invalid(
            """
            import torch

            def restore(model, path, out):
                model.eval()
                image = load_image(path).cuda()
                restored = model(image)
                save_image(restored.detach().cpu(), out)
            """,
            line=7,
            by_default=False,
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
            line=8,
            by_default=False,
        ),
        # The loss holds this batch's graph while the next batch runs forward.
        Invalid(
            """
            import torch
            def validate(model, loader, criterion):
                model.eval()
                total = 0.0
                for x, y in loader:
                    output = model(x)
                    loss = criterion(output, y)
                    total += loss.item()
                return total
            """,
            line=7,
        ),
        # Every batch's output, graph and all, gathered by a comprehension.
        Invalid(
            """
            import torch
            def predict_all(model, batches):
                model.eval()
                outputs = [model(x) for x in batches]
                return torch.cat(outputs).argmax(-1)
            """,
            line=5,
        ),
        # The function's result is kept by its caller's loop into the next batch.
        Invalid(
            """
            import torch
            class Trainer:
                def validation_step(self, x, y):
                    self.model.eval()
                    y_pred = self.model(x)
                    return {"loss": self.criterion(y_pred, y), "y_pred": y_pred}

                def fit(self, loader):
                    for x, y in loader:
                        step = self.validation_step(x, y)
                        self.history.append(step["loss"].item())
            """,
            line=6,
        ),
        # Only some parameters frozen (under an `if`): the rest still record a graph.
        Invalid(
            """
            import torch
            def evaluate(model, loader):
                model.eval()
                for name, p in model.named_parameters():
                    if "bias" in name:
                        p.requires_grad = False
                outs = []
                for x in loader:
                    out = model(x)
                    outs.append(out)
                return outs
            """,
            line=10,
        ),
        # One loop trains and validates by the phase it binds itself; only the
        # training phase runs a backward pass, so the validation phase records
        # a graph that `outputs` holds into the next batch.
        Invalid(
            """
            import torch
            def train_model(model, loaders, criterion, optimizer):
                for phase in ["train", "val"]:
                    for inputs, labels in loaders[phase]:
                        optimizer.zero_grad()
                        outputs = model(inputs)
                        loss = criterion(outputs, labels)
                        if phase == "train":
                            loss.backward()
                            optimizer.step()
            """,
            line=7,
        ),
        # A function of another module computes the outputs; the script's
        # backward pass runs only when it trains.
        Invalid(
            """
            import sys
            import torch
            from utils import forward_model
            to_do = sys.argv[1]
            for batch in batches:
                outs = forward_model(model, batch.cuda())
                if to_do == "train":
                    outs["loss"].backward()
                    optimizer.step()
            """,
            line=7,
        ),
        # Validation at four times the training batch, with autograd on: its one
        # graph holds more activations than the training step's (shown by default).
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader

            def fit(model, train_set, val_set, optimizer):
                train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
                val_loader = DataLoader(val_set, batch_size=128)
                for epoch in range(10):
                    model.train()
                    for x, y in train_loader:
                        torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
                        optimizer.step()
                    model.eval()
                    for x, y in val_loader:
                        print((model(x.cuda()).argmax(1) == y.cuda()).sum().item())
            """,
            line=15,
            by_default=True,
        ),
        # A class that builds its model, puts it in eval mode and serves it:
        # nothing in the file trains, so the graph of every call is kept for
        # nothing (shown by default), whoever calls `embed`.
        Invalid(
            """
            import torch
            import torchvision

            class Embedder:
                def __init__(self, device="cuda"):
                    self.model = torchvision.models.resnet50(weights="DEFAULT").to(device)
                    self.model.eval()

                def embed(self, images):
                    features = self.model(images)
                    return features.cpu().numpy()
            """,
            line=11,
            by_default=True,
        ),
        # A module's own frozen submodule, run by one of its methods: part of a
        # model that whoever runs the model runs (strict only).
        Invalid(
            """
            import torch
            from torch import nn
            from .modeling_utils import PreTrainedModel

            class VQModel(PreTrainedModel):
                def __init__(self, config):
                    super().__init__(config)
                    self.encoder = nn.Conv2d(3, config.channels, 3)
                    self.eval()  # frozen

                def encode(self, pixel_values):
                    return self.encoder(pixel_values)
            """,
            line=13,
            by_default=False,
        ),
        # The same forward of a model the file is handed (an evaluation helper
        # that a training script may call): strict only.
        Invalid(
            """
            import torch

            class Embedder:
                def __init__(self, model):
                    self.model = model
                    self.model.eval()

                def embed(self, images):
                    return self.model(images).cpu().numpy()
            """,
            line=10,
            by_default=False,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        # The training loops' batches, worked out for the first finding that asks.
        self._trained: list[int] | None = None
        self._trained_known = False

    def leave_Module(self, original_node: cst.Module) -> None:
        if _TEST_FILE_RE.search(self.context.path) is not None:
            return  # tests run models for their outputs, not to serve predictions
        evaluation = evaluation_facts(self.context)
        forwards = evaluation.forwards_without_grad_use()
        script = bool(forwards) and is_inference_script(self.context.module)
        untrained = bool(forwards) and not script and never_trains(self.context.module)
        for forward in forwards:
            if any(part.startswith("test_") for part in forward.call.scope.qualname.split(".")):
                continue  # a pytest test runs the model for its outputs, on the inputs it makes
            # A file that never trains serves the model it makes for inference
            # (a feature extractor, a predictor class, an app) whether or not it
            # has a `__main__` block; a model it is handed may be trained elsewhere.
            inference = script or (untrained and evaluation.model_made_here(forward))
            self._report(forward, inference and not self._small_model(forward))

    def _report(self, forward: EvalForward, inference_only: bool) -> None:
        reference = self.context.imports.reference_to("torch.inference_mode")
        imports: tuple[str, ...] = ()
        if reference is None:
            reference, imports = "torch.inference_mode", ("torch",)
        fix = None
        scope = forward.call.scope
        if forward.whole_function and type(scope.node) is cst.FunctionDef and scope.node.asynchronous is None:
            # On an `async def`, a decorator would only cover creating the coroutine, not running it.
            fix = FixSpec(
                "Decorate the function with `@torch.inference_mode()`",
                inference_mode.decorate(scope.node, reference),
                Applicability.SAFE,
                imports,
            )
        elif forward.wrap is not None:
            target, indent = forward.wrap
            edits = inference_mode.wrap(target, indent, self.context.module, reference)
            fix = FixSpec("Wrap in `with torch.inference_mode():`", edits, Applicability.SAFE, imports)
        message = forward.message
        larger = None
        if forward.kept_into_next_batch is not None:
            message += f"; {forward.kept_into_next_batch} holds its graph into the next batch"
        elif inference_only:
            message += "; the file never trains: activations kept for nothing"
        else:
            larger = self._larger_batch_than_training(forward)
            if larger is not None:
                message += f"; at batch {larger[0]} it keeps more activations than training does at {larger[1]}"
        self.context.add_report(
            deferred_report(
                self,
                forward.call.node,
                message,
                fix,
                forward.call.path,
                # By default only where the evaluation needs more than the training
                # step around it: the graph of one batch still alive while the next
                # runs (two batches' activations). One batch's graph, freed within
                # the iteration or at return, is no more than training holds; and a
                # known dataset of small samples keeps a few MB either way. In a
                # script that never trains there is no training step to compare
                # with: the graph is what makes inference cost training's memory.
                # Or the evaluation's batch is larger than every training loop's: its
                # one graph holds more activations than the training step's.
                proven=(forward.kept_into_next_batch is not None or inference_only or larger is not None)
                and not trains_on_small_inputs(self.context),
            )
        )

    def _small_model(self, forward: EvalForward) -> bool:
        """The size facts know the model, and it is small (a few million
        parameters): its whole graph is a few MB at the inputs such code runs."""
        func = forward.call.node.func
        receiver = func.value if type(func) is cst.Attribute and func.attr.value != forward.model.rpartition(".")[2] else func
        scope = forward.call.scope
        node = scope.node if type(scope.node) is cst.FunctionDef else None
        size = model_size(self.context, receiver, node)
        return size is not None and size.exact and size.parameters < SMALL_MODEL_PARAMETERS

    def _larger_batch_than_training(self, forward: EvalForward) -> tuple[int, int] | None:
        """(the evaluation loop's batch, the largest training loop's batch) when
        the code states both and the evaluation's is larger: a forward with
        autograd on keeps the activations of its whole batch until its output
        is dropped, as the training step does before backward, so at a larger
        batch it needs more than training (validation loaders are often given
        twice the training batch, "no gradients are kept")."""
        evaluation = evaluation_facts(self.context)
        graph = evaluation.graph
        workload = workload_of(self.context)
        loops = [loop for loop in forward.call.loops if type(loop) is cst.For]
        if not loops:
            return None
        evaluated = workload.batch_of(loops[-1], forward.call.scope)
        if evaluated is None:
            return None
        if not self._trained_known:
            self._trained, self._trained_known = _training_batches(graph, workload), True
        trained = self._trained
        if not trained or evaluated.value <= max(trained):
            return None
        return evaluated.value, max(trained)


def _training_batches(graph: CallGraph, workload: Workload) -> list[int] | None:
    """The batch of every training loop of the file (a `for` loop around a
    backward pass), once per file; None when the code does not state one of
    them."""
    trained: list[int] = []
    for scope in graph.program.functions:
        for call in scope.calls:
            if not graph.call_runs_backward(call):
                continue
            around = [loop for loop in call.loops if type(loop) is cst.For]
            if not around:
                continue
            batch = workload.batch_of(around[-1], scope)
            if batch is None:
                return None
            trained.append(batch.value)
    return trained
