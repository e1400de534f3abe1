"""OOM301 and OOM302: graph-attached tensors kept past the step that made them,
added to an accumulator or stored in a container."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg
from oom_lsp.analysis.dataflow import (
    Kind,
    ScopeFlow,
    facts_for,
    rebinds_every_iteration,
)
from oom_lsp.analysis.effects import STORING_METHODS, effects_for
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid
from oom_lsp.analysis.rules._autograd import (
    ACCUMULATING,
    ADDITIVE,
    ARITHMETIC,
    FORWARD_METHODS,
    NUMBER_CONSUMERS,
    AutogradRule,
    holder_of,
)
from oom_lsp.fixes import detach as detach_fix


@register
class LossAccumulatedWithGraph(AutogradRule):
    """
    ## What it does
    Flags a graph-attached tensor (a loss, a model output) added to an
    accumulator that outlives the loop iteration: `total_loss += loss`,
    `total = total + loss`.

    ## Why is this bad?
    `loss` carries its autograd graph, and `total_loss + loss` makes a new
    tensor whose graph contains it. The accumulator therefore keeps the graph
    of every iteration alive, with the saved activations of each forward pass
    until `backward()` frees them, and the graph nodes themselves forever:
    memory grows with every step until the epoch ends, or the GPU runs out.

    ## Example
    ```python
    total_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total_loss += loss
    ```

    ## Use instead
    ```python
    total_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total_loss += loss.item()
    ```

    ## Fix safety
    Safe. The accumulated operand becomes `loss.item()` when the analysis
    knows it is a scalar loss (a criterion with a reducing `reduction`,
    `outputs.loss`, `.mean()`, arithmetic of those with numbers) and every
    use of the accumulator also works with a float (its own updates,
    arithmetic, f-strings, `print`, logging calls). Otherwise (a tensor of
    several values, or an accumulator that is returned, stored or used as a
    tensor, as in `total.item()`) it becomes `loss.detach()`, which keeps a
    tensor of the same shape and device. `.item()` waits for the GPU once
    per step; `.detach()` does not. Accumulators that feed a `backward()` call, or that a
    non-training loop returns, are not reported: their graph is wanted.
    """

    code = "OOM301"
    name = "loss-accumulated-with-graph"
    summary = (
        "A graph-attached loss or output is accumulated across iterations, keeping every step's graph alive."
    )
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += loss.item()
            """
        ),
        Valid(
            """
            import torch
            total = 0.0
            for x, y in loader:
                out = model(x)
                total += out.detach().sum()
                total = total + float(out.mean())
            """
        ),
        # Computed under no_grad: no graph.
        Valid(
            """
            import torch
            import torch.nn.functional as F
            total = 0
            with torch.no_grad():
                for x, y in loader:
                    total += F.cross_entropy(model(x), y)
            """
        ),
        Valid(
            """
            import torch
            @torch.inference_mode()
            def evaluate(model, loader, criterion):
                total = 0
                for x, y in loader:
                    total += criterion(model(x), y)
                return total
            """
        ),
        # The accumulator is reset in the iteration: it does not outlive it.
        Valid(
            """
            import torch
            for x, y in loader:
                loss = 0
                for head in range(3):
                    pass
                loss += criterion(model(x), y)
                loss.backward()
            """
        ),
        # Summed on purpose, then backpropagated.
        Valid(
            """
            import torch
            for batch in loader:
                optimizer.zero_grad()
                total = 0
                for chunk in batch.split(8):
                    total += criterion(model(chunk), chunk)
                (total / 4).backward()
                optimizer.step()
            """
        ),
        # Returned by a loop that does not train: the caller backpropagates.
        Valid(
            """
            import torch.nn.functional as F
            def deep_supervision_loss(model, xs, y):
                loss = 0
                for x in xs:
                    loss += F.mse_loss(model(x), y)
                return loss
            """
        ),
        # A local function called `model` is no module.
        Valid(
            """
            import torch
            def model(x):
                return 2 * x
            total = 0
            for x in xs:
                total += model(x)
            """
        ),
        # Not in a loop.
        Valid("import torch\ntotal = 0\nloss = criterion(model(x), y)\ntotal += loss\n"),
        # Unknown callee: silent.
        Valid("import torch\ntotal = 0\nfor x in xs:\n    total += compute(x)\n"),
        # The loss may be detached on one path: cannot tell.
        Valid(
            """
            import torch
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                if log:
                    loss = loss.item()
                total += loss
            """
        ),
        Valid(
            "import torch\ntotal = 0\nfor batch in loader:\n    out = model(**batch)\n    total += out.loss.detach()\n"
        ),
        # The metric class is given a number.
        Valid(
            """
            import torch
            class Meter:
                def update(self, value):
                    self.sum += value

            def train(model, loader, criterion, meter):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    meter.update(loss.item())
            """
        ),
        # A method that returns a detached loss (as the Trainer's `training_step` does).
        Valid(
            """
            import torch
            class Runner:
                def step(self, batch):
                    loss = self.compute(batch)
                    loss.backward()
                    return loss.detach()

                def epoch(self, loader):
                    total = 0.0
                    for batch in loader:
                        total += self.step(batch)
                    return total
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += loss
            """,
            line=8,
            expected_fix="""
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += loss.item()
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F

            def train(net, loader, opt):
                running = 0.0
                for step, (x, y) in enumerate(loader):
                    out = net(x)
                    loss_a = F.cross_entropy(out, y)
                    loss = loss_a + 0.1 * out.pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    running = running + loss  # logged below
                    print(running / (step + 1))
            """,
            line=14,
            expected_fix="""
            import torch
            import torch.nn.functional as F

            def train(net, loader, opt):
                running = 0.0
                for step, (x, y) in enumerate(loader):
                    out = net(x)
                    loss_a = F.cross_entropy(out, y)
                    loss = loss_a + 0.1 * out.pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    running = running + loss.item()  # logged below
                    print(running / (step + 1))
            """,
        ),
        # The accumulator is used as a tensor afterwards: `.detach()`.
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            lm = AutoModelForCausalLM.from_pretrained("gpt2")
            total = torch.zeros(())
            for batch in loader:
                outputs = lm(**batch)
                outputs.loss.backward()
                total += outputs.loss
            print(total.item())
            """,
            line=9,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM
            lm = AutoModelForCausalLM.from_pretrained("gpt2")
            total = torch.zeros(())
            for batch in loader:
                outputs = lm(**batch)
                outputs.loss.backward()
                total += outputs.loss.detach()
            print(total.item())
            """,
        ),
        # Not known to be a scalar (per-sample losses): `.detach()`.
        Invalid(
            """
            import torch.nn as nn
            class Trainer:
                def fit(self, loader):
                    self.criterion = nn.MSELoss(reduction="none")
                    for x, y in loader:
                        self.epoch_loss += self.criterion(self.model(x), y) * 2
            """,
            line=7,
            expected_fix="""
            import torch.nn as nn
            class Trainer:
                def fit(self, loader):
                    self.criterion = nn.MSELoss(reduction="none")
                    for x, y in loader:
                        self.epoch_loss += (self.criterion(self.model(x), y) * 2).detach()
            """,
        ),
        # A loss from a callable passed in: `.backward()` proves it holds a graph.
        Invalid(
            """
            import torch
            def train_epoch(model, crit, loader, opt):
                total = 0
                for x, y in loader:
                    loss = crit(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    total += loss
                return total
            """,
            line=10,
            expected_fix="""
            import torch
            def train_epoch(model, crit, loader, opt):
                total = 0
                for x, y in loader:
                    loss = crit(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    total += loss.detach()
                return total
            """,
        ),
        # Accumulated before the backward pass that proves it, and a criterion built inline.
        Invalid(
            """
            import torch.nn as nn
            def fit(net, batches):
                seen = 0.0
                for x, y in batches:
                    step_loss = nn.CrossEntropyLoss()(net(x), y)
                    seen += step_loss
                    step_loss.backward()
                print(f"{seen:.3f}")
            """,
            line=7,
            expected_fix="""
            import torch.nn as nn
            def fit(net, batches):
                seen = 0.0
                for x, y in batches:
                    step_loss = nn.CrossEntropyLoss()(net(x), y)
                    seen += step_loss.item()
                    step_loss.backward()
                print(f"{seen:.3f}")
            """,
        ),
        # A loss returned by a method of the class, which runs the backward pass.
        Invalid(
            """
            import torch
            class Runner:
                def step(self, batch):
                    loss = self.compute(batch)
                    self.accelerator.backward(loss)
                    return loss

                def epoch(self, loader):
                    epoch_loss = 0.0
                    for batch in loader:
                        epoch_loss += self.step(batch)
                    return epoch_loss
            """,
            line=12,
        ),
        # A metric class of the file that adds what it is given into `self.sum`.
        Invalid(
            """
            import torch
            class Meter:
                def __init__(self):
                    self.sum, self.count = 0.0, 0

                def update(self, value, n=1):
                    self.sum += value * n
                    self.count += n

            def train(model, loader, criterion):
                meter = Meter()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    meter.update(loss, len(x))
            """,
            line=16,
            expected_fix="""
            import torch
            class Meter:
                def __init__(self):
                    self.sum, self.count = 0.0, 0

                def update(self, value, n=1):
                    self.sum += value * n
                    self.count += n

            def train(model, loader, criterion):
                meter = Meter()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    meter.update(loss.detach(), len(x))
            """,
        ),
    ]

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if type(node.operator) in ACCUMULATING:
            self._check(node, node.target, node.value)

    def visit_Call(self, node: cst.Call) -> None:
        """`meter.update(loss)` where the file's `update` does `self.sum += val * n`."""
        for keep, argument, holder in self._kept_by_callee(node, accumulates=True):
            loop = self.context.tracker.loops[-1]
            if rebinds_every_iteration(loop.body, holder) or self._kept_on_purpose(holder, loop):
                continue
            callee = dotted_name(node.func) or "the function"
            self.report(
                node,
                f"`{callee}()` adds the graph-attached `{self.context.code_for(argument)}` into "
                f"`{keep.container}`, which keeps the autograd graph of every iteration alive. Pass "
                "`.detach()` (or `.item()`) instead.",
                fix=FixSpec(
                    title="Pass `.detach()`",
                    edits=detach_fix.call_method(argument, "detach", self._indent(), self.context.module),
                    applicability=Applicability.UNSAFE,
                ),
            )
            return

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or type(node.value) is not cst.BinaryOperation:
            return
        if type(node.value.operator) not in ADDITIVE:
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        value = node.value
        if dotted_name(value.left) == target:
            self._check(node, node.targets[0].target, value.right)
        elif type(value.operator) is cst.Add and dotted_name(value.right) == target:
            self._check(node, node.targets[0].target, value.left)

    def _check(self, node: cst.CSTNode, target: cst.BaseExpression, operand: cst.BaseExpression) -> None:
        if self.context.tracker.in_no_grad:
            return
        holder = holder_of(target)
        if holder is None:
            return
        iteration = self._iteration(holder)
        if iteration is None:
            return
        kind = self._flow().kind_of(operand)
        if not kind.attached or kind is Kind.GRAPH_CONTAINER:
            return
        if rebinds_every_iteration(iteration.body, holder, besides=node) or self._kept_on_purpose(
            holder, iteration
        ):
            return
        method = "item" if kind is Kind.GRAPH_SCALAR and self._stays_a_number(holder) else "detach"
        self.report(
            node,
            f"`{holder}` accumulates a graph-attached tensor, so it keeps the autograd graph of every "
            f"iteration alive. Accumulate `.{method}()` instead.",
            fix=FixSpec(
                title=f"Accumulate `.{method}()`",
                edits=detach_fix.call_method(operand, method, self._indent(), self.context.module),
                applicability=Applicability.SAFE,
            ),
        )

    def _stays_a_number(self, holder: str) -> bool:
        """Every use of the accumulator works with a float as well: its own
        updates and resets, arithmetic, f-strings, printing and logging.
        Anything else (returned, stored, `total.item()`) may need a tensor."""
        for use, ancestors in self._summary().uses_of(holder):
            index = len(ancestors) - 1
            child: cst.CSTNode = use
            while index >= 0 and isinstance(ancestors[index], ARITHMETIC):
                child, index = ancestors[index], index - 1
            consumer = ancestors[index] if index >= 0 else None
            if isinstance(consumer, (cst.AugAssign, cst.AssignTarget)) and child is use:
                continue  # `total += ...`, `total = 0.0`
            if isinstance(consumer, cst.Assign) and _assigns_to(consumer, holder):
                continue  # `total = total + loss`
            if isinstance(consumer, cst.AugAssign) and dotted_name(consumer.target) == holder:
                continue
            if isinstance(consumer, cst.FormattedString):
                continue
            if isinstance(consumer, cst.Arg) and index >= 1 and isinstance(ancestors[index - 1], cst.Call):
                call = ancestors[index - 1]
                called = (
                    call.func.attr.value if isinstance(call.func, cst.Attribute) else dotted_name(call.func)
                )
                if called in NUMBER_CONSUMERS:
                    continue
            return False
        return True


def _assigns_to(statement: cst.Assign, holder: str) -> bool:
    return any(dotted_name(target.target) == holder for target in statement.targets)


_CONTAINER_FACTORIES = frozenset(
    {"list", "dict", "deque", "defaultdict", "OrderedDict", "collections.deque", "collections.defaultdict",
     "collections.OrderedDict"}
)  # fmt: skip


def _is_container_value(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, (cst.List, cst.Dict, cst.ListComp, cst.DictComp)):
        return True
    return isinstance(value, cst.Call) and dotted_name(value.func) in _CONTAINER_FACTORIES


@register
class TensorKeptAcrossIterations(AutogradRule):
    """
    ## What it does
    Flags graph-attached tensors (model outputs, losses) stored in a list or
    dict that outlives the loop iteration, without `.detach()` or `.item()`:
    `losses.append(loss)`, `preds.append(out.cpu())`, `history[k] = out`.

    ## Why is this bad?
    A stored tensor keeps its autograd graph, and the graph keeps the
    activations its backward pass would need: every stored element pins a
    whole forward pass. The list grows by one graph per iteration until the
    GPU runs out. `.cpu()` alone does not help: the CPU copy is still part of
    the graph, so the GPU activations behind it stay allocated.

    ## Example
    ```python
    predictions = []
    for x in loader:
        out = model(x)
        predictions.append(out.cpu())
    ```

    ## Use instead
    ```python
    predictions = []
    for x in loader:
        out = model(x)
        predictions.append(out.detach().cpu())
    ```

    ## Fix safety
    Safe: `.detach()` is inserted before the value is stored (before
    `.cpu()` / `.to(...)` when present, so the copy carries no graph). Values
    that later feed a `backward()` call, or that a non-training loop
    returns, are not reported: their graph is wanted.
    """

    code = "OOM302"
    name = "tensor-kept-across-iterations"
    summary = (
        "Graph-attached tensors stored in a list or dict that outlives the iteration keep every step's graph."
    )
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch
            losses, preds = [], []
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                losses.append(loss.item())
                preds.append(out.detach().cpu())
            """
        ),
        Valid(
            """
            import torch
            preds = []
            with torch.no_grad():
                for x in loader:
                    preds.append(model(x).cpu())
            """
        ),
        # Collected to be summed and backpropagated: the graph is wanted.
        Valid(
            """
            import torch
            for batch in loader:
                losses = []
                for head in heads:
                    losses.append(criterion(model(batch), head))
                torch.stack(losses).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            outputs = []
            for x in loader:
                out = model(x)
                loss = out.mean()
                loss.backward()
                outputs.append(out.argmax(-1))
                outputs.extend(out.tolist())
            """
        ),
        # Not a list: an object whose `append` we know nothing about.
        Valid("import torch\nfor x in loader:\n    out = model(x)\n    logger.append(out)\n"),
        # The list is created in the iteration.
        Valid("import torch\nfor x in loader:\n    batch_preds = []\n    batch_preds.append(model(x))\n"),
        # Not in a loop.
        Valid("import torch\nkept = []\nkept.append(model(x))\n"),
        # Unknown value.
        Valid("import torch\nkept = []\nfor x in loader:\n    kept.append(transform(x))\n"),
        # A local function called `model` is no module.
        Valid(
            """
            import torch
            def model(batch):
                return [len(batch)]
            kept = []
            for batch in loader:
                kept.append(model(batch))
            """
        ),
        Valid("import torch\nkept = []\nfor x in loader:\n    kept.append(**model(x))\n"),
        # The loss in the dict is detached before it is kept.
        Valid(
            """
            import torch
            def train(module, loader, optimizer):
                outputs = []
                for index, batch in enumerate(loader):
                    output = module.training_step(batch, index)
                    output["loss"].backward()
                    optimizer.step()
                    output["loss"] = output["loss"].detach()
                    outputs.append(output)
                return outputs
            """
        ),
        # A diffusers pipeline's images are PIL images made under no_grad.
        Valid(
            """
            import torch
            from diffusers import StableDiffusionPipeline
            pipeline = StableDiffusionPipeline.from_pretrained(path)
            images = []
            for prompt in prompts:
                images.append(pipeline(prompt).images[0])
            """
        ),
        # A hook whose store is emptied every step, one that overwrites a fixed
        # key, and a hook in a script that never trains.
        Valid(
            """
            import torch
            activations = []
            named = {}

            def keep(module, args, output):
                activations.append(output)

            def keep_last(module, args, output):
                named["head"] = output

            model.backbone.register_forward_hook(keep)
            model.head.register_forward_hook(keep_last)
            for x, y in loader:
                loss_fn(model(x), y).backward()
                activations.clear()
            """
        ),
        Valid(
            """
            import torch
            features = []
            def keep(module, args, output):
                features.append(output)
            model.register_forward_hook(keep)
            with torch.no_grad():
                for x in loader:
                    model(x)
            """
        ),
        # A model that keeps only the last attention map (assigned, not appended).
        Valid(
            """
            import torch.nn as nn
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.attn = nn.MultiheadAttention(8, 2)
                    self.last = []

                def forward(self, x):
                    y, weights = self.attn(x, x, x)
                    self.last = [weights]
                    return y
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            predictions = []
            for x in loader:
                out = model(x)
                predictions.append(out.cpu())
            """,
            line=6,
            expected_fix="""
            import torch
            predictions = []
            for x in loader:
                out = model(x)
                predictions.append(out.detach().cpu())
            """,
        ),
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F

            class Net(nn.Module):
                def forward(self, x):
                    return x

            def train(loader, opt):
                net = Net()
                history = {}
                losses = []
                for step, (x, y) in enumerate(loader):
                    logits = net(x)[0]
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    opt.step()
                    losses.append(loss)
                    history[step] = {"logits": logits, "step": step}
                return losses
            """,
            line=18,
            expected_fix="""
            import torch.nn as nn
            import torch.nn.functional as F

            class Net(nn.Module):
                def forward(self, x):
                    return x

            def train(loader, opt):
                net = Net()
                history = {}
                losses = []
                for step, (x, y) in enumerate(loader):
                    logits = net(x)[0]
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    opt.step()
                    losses.append(loss.detach())
                    history[step] = {"logits": logits.detach(), "step": step}
                return losses
            """,
        ),
        Invalid(
            """
            import torch
            class Evaluator:
                def __init__(self, model):
                    self.model = model
                    self.outputs = []

                def run(self, loader):
                    for batch in loader:
                        self.outputs.extend(self.model(batch) * 2 for _ in range(1))
                        self.outputs.insert(0, self.model(batch) + 1)
            """,
            line=11,
            expected_fix="""
            import torch
            class Evaluator:
                def __init__(self, model):
                    self.model = model
                    self.outputs = []

                def run(self, loader):
                    for batch in loader:
                        self.outputs.extend(self.model(batch) * 2 for _ in range(1))
                        self.outputs.insert(0, (self.model(batch) + 1).detach())
            """,
        ),
        # A dict whose loss was backpropagated, kept for the epoch (no `.detach()` for a dict).
        Invalid(
            """
            import torch
            def train(module, loader, optimizer):
                outputs = []
                for index, batch in enumerate(loader):
                    output = module.training_step(batch, index)
                    output["loss"].backward()
                    optimizer.step()
                    outputs.append(output)
                return module.training_epoch_end(outputs)
            """,
            line=9,
        ),
        # A helper of the file that appends what it is given to a container of the caller.
        Invalid(
            """
            import torch
            def log_step(log, prediction):
                log["predictions"].append(prediction)

            def train(model, loader, criterion):
                log = {"predictions": []}
                for x, y in loader:
                    prediction = model(x)
                    criterion(prediction, y).backward()
                    log_step(log, prediction)
            """,
            line=11,
            expected_fix="""
            import torch
            def log_step(log, prediction):
                log["predictions"].append(prediction)

            def train(model, loader, criterion):
                log = {"predictions": []}
                for x, y in loader:
                    prediction = model(x)
                    criterion(prediction, y).backward()
                    log_step(log, prediction.detach())
            """,
        ),
        # A forward hook that keeps every output, in a script that trains.
        Invalid(
            """
            import torch
            features = []

            def keep_features(module, args, output):
                features.append(output)

            model.backbone.register_forward_hook(keep_features)
            cache = {}
            model.head.register_forward_hook(lambda m, i, o: cache.__setitem__(len(cache), o))
            for x, y in loader:
                loss_fn(model(x), y).backward()
            """,
            line=6,
            expected_fix="""
            import torch
            features = []

            def keep_features(module, args, output):
                features.append(output.detach())

            model.backbone.register_forward_hook(keep_features)
            cache = {}
            model.head.register_forward_hook(lambda m, i, o: cache.__setitem__(len(cache), o.detach()))
            for x, y in loader:
                loss_fn(model(x), y).backward()
            """,
        ),
        # A model that appends to a list attribute in `forward`, which nothing empties.
        Invalid(
            """
            import torch.nn as nn
            class Probe(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.block = nn.Linear(8, 8)
                    self.history = []

                def forward(self, x):
                    y = self.block(x)
                    self.history.append(y)
                    return y
            """,
            line=11,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value in STORING_METHODS:
            position = STORING_METHODS[func.attr.value]
            stored = get_arg(node, "object", position)
            if stored is None or stored is UNKNOWN or stored.star:
                return
            self._check(node, func.value, stored.value)
        elif type(func) is cst.Attribute and func.attr.value == "register_forward_hook":
            self._check_lambda_hook(node)
        else:
            self._check_callee(node)

    def _check_callee(self, node: cst.Call) -> None:
        """`record(history, out)` where the file's `record` appends `out` to `history[...]`."""
        for keep, argument, holder in self._kept_by_callee(node, accumulates=False):
            loop = self.context.tracker.loops[-1]
            if rebinds_every_iteration(loop.body, holder) or self._kept_on_purpose(holder, loop):
                continue
            function = self._flow().local_function(node.func)
            assert function is not None
            if keep.owner == "self" and holder != keep.container:
                holds = self._class_container(function, keep.container)  # `obj.update(x)`
            else:
                holds = self._holds_a_container(holder)
            if not holds:
                continue
            callee = dotted_name(node.func) or "the function"
            self.report(
                node,
                f"`{callee}()` stores the graph-attached `{self.context.code_for(argument)}` in `{holder}`, which "
                "outlives the iteration, and with it every step's graph and activations. Pass a `.detach()`ed "
                "value instead.",
                fix=FixSpec(
                    title="Pass a `.detach()`ed value",
                    edits=detach_fix.detach(argument, self._indent(), self.context.module),
                    applicability=Applicability.UNSAFE,
                ),
            )
            return

    def _class_container(self, method: cst.FunctionDef, attribute: str) -> bool:
        """`self.x` is only ever bound to a list or dict in the methods of `method`'s class."""
        facts = facts_for(self.context)
        owner = facts.class_of.get(method)
        values = [
            value
            for other, other_owner in facts.class_of.items()
            if other_owner is owner
            for value in facts.summary(other).bindings.get(attribute, ())
        ]
        return bool(values) and all(_is_container_value(value) for value in values)

    def _check_lambda_hook(self, node: cst.Call) -> None:
        """`layer.register_forward_hook(lambda m, i, o: feats.append(o))`."""
        hook = node.args[0].value if node.args else None
        if type(hook) is not cst.Lambda or len(hook.params.params) < 3:
            return
        output = hook.params.params[2].name.value
        body = hook.body
        if type(body) is not cst.Call or type(body.func) is not cst.Attribute:
            return
        method = body.func.attr.value
        position = {"__setitem__": 1, **STORING_METHODS}.get(method)
        stored = get_arg(body, "object", position) if position is not None else None
        if not isinstance(stored, cst.Arg) or dotted_name(stored.value) != output:
            return
        holder = dotted_name(body.func.value)
        if method == "__setitem__" and not _grows(body.args[0].value, holder):
            return  # a fixed key: each output replaces the last one
        if holder is None or "." in holder or not self._outlives_every_forward(holder, in_a_function=False):
            return
        self.report(
            body,
            f"This forward hook stores every output in `{holder}`, which is never emptied, so the graph and "
            "activations of every forward pass stay alive. Store `.detach()`ed outputs.",
            fix=FixSpec(
                title="Store `.detach()`ed outputs",
                edits=detach_fix.detach(stored.value, "", self.context.module),
                applicability=Applicability.UNSAFE,
            ),
        )

    def _outlives_every_forward(self, holder: str, *, in_a_function: bool = True) -> bool:
        """A container of the module (or of `self`) that nothing in the file
        empties, in a file that trains: what a forward hook stores in it
        piles up, graph and all, one entry per forward pass. (`in_a_function`:
        the hook is a `def`, whose own names die with each call.)"""
        facts = facts_for(self.context)
        if effects_for(self.context).cleared(holder):
            return False
        if in_a_function and holder in self._summary().bindings:
            return False
        if holder.startswith("self."):
            function = self.context.tracker.current_function
            if function is None or not self._class_container(function, holder):
                return False
        else:
            values = facts.summary(None).bindings.get(holder, ())
            if not values or not all(_is_container_value(value) for value in values):
                return False
        return facts.trains()

    def _check_hook_store(self, node: cst.CSTNode, holder: str, stored: cst.BaseExpression) -> bool:
        """A forward hook of the file (`def save(module, inputs, output)`)
        storing its output; True when this decides the store."""
        function = self.context.tracker.current_function
        output = effects_for(self.context).forward_hooks().get(function) if function is not None else None
        if output is None:
            return False
        base = stored
        while type(base) in (cst.Subscript, cst.Attribute):
            base = base.value
        if type(base) is not cst.Name or base.value != output:
            return False
        if type(node) is cst.Assign and not _grows(_subscript_key(node), holder):
            return True  # `feats[name] = output`: each output replaces the last one
        if self._outlives_every_forward(holder):
            assert function is not None
            self.report(
                node,
                f"`{function.name.value}` is a forward hook that stores every output in `{holder}`, which is "
                "never emptied, so the graph and activations of every forward pass stay alive. Store "
                "`.detach()`ed outputs.",
                fix=FixSpec(
                    title="Store `.detach()`ed outputs",
                    edits=detach_fix.detach(stored, self._indent(), self.context.module),
                    applicability=Applicability.UNSAFE,
                ),
            )
        return True

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if type(target.target) is cst.Subscript:
                self._check(node, target.target.value, node.value)

    def _check(self, node: cst.CSTNode, container: cst.BaseExpression, stored: cst.BaseExpression) -> None:
        if self.context.tracker.in_no_grad:
            return
        holder = dotted_name(container)
        if holder is None or self._check_hook_store(node, holder, stored):
            return
        iteration = self._iteration(holder)
        if iteration is None:
            if type(node) is cst.Call:
                self._check_forward_store(node, holder, stored)
            return
        attached = _attached_parts(stored, self._flow())
        if not attached:
            return
        if rebinds_every_iteration(iteration.body, holder) or not self._holds_a_container(holder):
            return
        if self._kept_on_purpose(holder, iteration):
            return
        flow = self._flow()
        fix = None
        # A dict or model output holding a graph-attached tensor has no `.detach()`.
        if all(flow.kind_of(part) is not Kind.GRAPH_CONTAINER for part in attached):
            indent = self._indent()
            edits = tuple(
                edit for part in attached for edit in detach_fix.detach(part, indent, self.context.module)
            )
            fix = FixSpec(title="Detach before storing", edits=edits, applicability=Applicability.SAFE)
        self.report(
            node,
            f"`{holder}` keeps graph-attached tensors across iterations, and with them the autograd graph and "
            "activations of every step. Store `.detach()`ed values (then `.cpu()`) instead.",
            fix=fix,
        )

    def _check_forward_store(self, node: cst.Call, holder: str, stored: cst.BaseExpression) -> None:
        """A model's `forward` appending to a list attribute that nothing
        empties: one entry, graph and all, per forward pass."""
        function = self.context.tracker.current_function
        facts = facts_for(self.context)
        owner = facts.class_of.get(function) if function is not None else None
        if (
            function is None
            or function.name.value not in FORWARD_METHODS
            or owner is None
            or owner.name.value not in facts.module_classes
            or not holder.startswith("self.")
            or holder.count(".") != 1
        ):
            return
        if effects_for(self.context).cleared(holder) or not self._class_container(function, holder):
            return
        attached = _attached_parts(stored, self._flow())
        if not attached:
            return
        self.report(
            node,
            f"`forward` appends to `{holder}`, which nothing empties, so the graph and activations of every "
            "forward pass stay alive. Store `.detach()`ed values, or empty it each step.",
            fix=None,
        )

    def _holds_a_container(self, holder: str) -> bool:
        """`holder` is only ever bound to a list or dict: in this scope, at
        module level, or (`self.x`) in a method of the class."""
        facts = facts_for(self.context)
        function = self.context.tracker.current_function
        summaries = [facts.summary(function)]
        if holder.startswith("self.") and function is not None and function in facts.class_of:
            owner = facts.class_of[function]
            summaries += [
                facts.summary(method)
                for method, method_owner in facts.class_of.items()
                if method_owner is owner and method is not function
            ]
        elif function is not None:
            summaries.append(facts.summary(None))
        values = [value for summary in summaries for value in summary.bindings.get(holder, ())]
        return bool(values) and all(_is_container_value(value) for value in values)


def _subscript_key(node: cst.Assign) -> cst.BaseExpression | None:
    """The key of `c[key] = value` (None for a slice or several keys)."""
    target = node.targets[0].target
    if type(target) is not cst.Subscript or len(target.slice) != 1 or type(target.slice[0].slice) is not cst.Index:
        return None
    return target.slice[0].slice.value


def _grows(key: cst.BaseExpression | None, holder: str | None) -> bool:
    """A key that is new at every store: `len(holder)`."""
    return (
        type(key) is cst.Call
        and dotted_name(key.func) == "len"
        and len(key.args) == 1
        and holder is not None
        and dotted_name(key.args[0].value) == holder
    )


def _attached_parts(stored: cst.BaseExpression, flow: ScopeFlow) -> list[cst.BaseExpression]:
    """The graph-attached parts of a stored value: the value itself, or the
    elements of a list / tuple / dict literal."""
    if isinstance(stored, (cst.List, cst.Tuple)):
        return [part for element in stored.elements for part in _attached_parts(element.value, flow)]
    if isinstance(stored, cst.Dict):
        return [
            part
            for element in stored.elements
            if isinstance(element, cst.DictElement)
            for part in _attached_parts(element.value, flow)
        ]
    return [stored] if flow.kind_of(stored).attached else []


# Words that make a function an evaluation function, as the first or last
# word of its snake_case name: `evaluate`, `run_validation`, `predict_batch`.
