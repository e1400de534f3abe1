"""OOM301: a graph-attached tensor added to an accumulator that outlives the step."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.facts.loops import unrolls_a_recurrence
from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.dataflow import (
    Kind,
    binds_inside,
    rebinds_every_iteration,
)
from oom_lsp.analysis.findings import Applicability, Severity
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid, short_code
from oom_lsp.analysis.rules._autograd import (
    ACCUMULATING,
    ADDITIVE,
    ARITHMETIC,
    NUMBER_CONSUMERS,
    AutogradRule,
    holder_of,
)
from oom_lsp.fixes import detach as detach_fix


class LossAccumulatedWithGraph(AutogradRule):
    """
    ## What it does
    Flags a graph-attached tensor (a loss, a model output) added to an
    accumulator that outlives the loop iteration: `total_loss += loss`,
    `total = total + loss`.

    A loop over a collection the code lists (a few models, heads or
    losses: `for net in (small, wide)`, `zip(nets, opts)` of lists of two)
    keeps at most that many entries, not one per step: it is
    shown with `--strict` only. So is a sum over a sequence's positions
    in a loop that feeds a call the state it returned the iteration before
    (`out, hidden = decoder(inp, hidden)` over `range(target_length)`, with
    no backward inside): that is one unrolled forward pass, whose graph is
    the sequence's.

    ## Why is this bad?
    `loss` carries its autograd graph, and `total_loss + loss` makes a new
    tensor whose graph contains it. The accumulator therefore keeps the graph
    of every iteration alive. What that costs depends on whether a backward
    pass ran through it:

    - in a loop that calls `backward()` every step (without
      `retain_graph=True`), backward has freed the activations each graph
      saved; what grows is the chain of autograd nodes, in host memory, a
      little every step for as long as the accumulator lives (reported as
      information);
    - in a loop that runs no backward (an evaluation loop with autograd on),
      every iteration's saved activations stay on the GPU: memory grows by a
      forward pass per iteration until the GPU runs out (a warning).

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
    why = (
        "A graph-attached tensor holds its autograd graph: adding it up keeps the graph and activations "
        "of every iteration alive."
    )
    remedy = "Accumulate loss.item() or loss.detach()."
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
        # Built from several terms within one step: each branch binds the loss afresh first.
        Valid(
            """
            import torch
            for x, y in loader:
                outputs = model(x)
                if single:
                    loss = criterion(outputs, y)
                else:
                    loss = 0.5 * criterion(outputs, y)
                    loss = loss + 0.5 * criterion(outputs, y.flip(0))
                loss.backward()
            """
        ),
        # A helper that only the forward pass calls: its loop over layers builds the model's graph.
        Valid(
            """
            import torch.nn as nn
            class Net(nn.Module):
                def layers(self, h):
                    for i in range(self.depth):
                        h = self.cell(h)
                        h += self.skip(h)
                    return h

                def forward(self, x):
                    return self.head(self.layers(x))
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
        # The same entries made afresh each step: the sum spans a few heads.
        Valid(
            """
            import torch

            def train(model, optimizer, loader):
                for images, targets in loader:
                    loss_dict = model(images, targets)
                    total = 0
                    for name, value in loss_dict.items():
                        total += value
                    optimizer.zero_grad()
                    total.backward()
                    optimizer.step()
            """
        ),
        # The meter turns a tensor into a number before it keeps it.
        Valid(
            """
            import torch
            class Meter:
                def __init__(self):
                    self.sum, self.count = 0.0, 0

                def update(self, value, n=1):
                    if isinstance(value, torch.Tensor):
                        value = value.detach().item()
                    self.sum += value * n
                    self.count += n

            def train(model, loader, criterion):
                meter = Meter()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    meter.update(loss, len(x))
            """
        ),
    ]
    INVALID = [
        # A sentence's loss summed over its decoder steps: the graph of one
        # unrolled forward pass, not one per step of training (strict only).
        Invalid(
            """
            import torch.nn as nn

            class DecoderRNN(nn.Module):
                def __init__(self, size):
                    super().__init__()
                    self.gru = nn.GRU(size, size)

                def forward(self, inputs, hidden):
                    return self.gru(inputs, hidden)

            def eval_pair(inputs, target, decoder, criterion):
                decoder.eval()
                hidden = None
                loss = 0
                for di in range(target.size(0)):
                    output, hidden = decoder(inputs, hidden)
                    loss += criterion(output, target[di])
                return loss.item() / target.size(0)

            eval_pair(inputs, target, DecoderRNN(8), nn.NLLLoss())
            """,
            line=18,
            by_default=False,
        ),
        # Three heads' losses summed in a loop over the heads the code lists:
        # three losses, not one per step (strict only).
        Invalid(
            """
            import torch.nn as nn
            criterion = nn.CrossEntropyLoss()
            def train_step(model, x, y):
                total = 0.0
                for head in (model.coarse, model.middle, model.fine):
                    loss = criterion(head(x), y)
                    loss.backward()
                    total += loss
                return float(total)
            """,
            line=9,
            by_default=False,
        ),
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
        # Two updates in one iteration do not reset each other: both read the old value.
        Invalid(
            """
            import torch.nn.functional as F
            running = 0.0
            for x, y in loader:
                out = model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
                running = running + loss
                running = running + 0
            """,
            line=8,
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
        # The losses of a detection model's dict, added into meters that live for
        # the epoch from a loop over the dict's entries inside each step.
        Invalid(
            """
            import torch
            from collections import defaultdict

            def train_one_epoch(model, optimizer, loader):
                meters = defaultdict(float)
                for images, targets in loader:
                    loss_dict = model(images, targets)
                    losses = sum(loss for loss in loss_dict.values())
                    optimizer.zero_grad()
                    losses.backward()
                    optimizer.step()
                    for name, value in loss_dict.items():
                        meters[name] += value
                return meters
            """,
            line=14,
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
                f"{short_code(callee)}() accumulates the graph-attached "
                f"{short_code(self.context.code_for(argument), 24)} across iterations in "
                f"{short_code(keep.container)}",
                fix=FixSpec(
                    title="Pass `.detach()`",
                    edits=detach_fix.call_method(argument, "detach", self._indent(), self.context.module),
                    applicability=Applicability.UNSAFE,
                ),
                proven=not self._few_iterations(loop),
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
        iteration = self._step_loop(iteration, holder, node)
        if rebinds_every_iteration(iteration.body, holder, besides=node) or self._kept_on_purpose(
            holder, iteration
        ):
            return
        method = "item" if kind is Kind.GRAPH_SCALAR and self._stays_a_number(holder) else "detach"
        proven = True
        if self._graph_freed_each_step(iteration):
            # backward() freed each step's activations: the chain of graph nodes is what grows.
            message = f"{short_code(holder)} keeps every step's autograd graph: host memory grows each step"
            severity = Severity.INFO
            # Reset inside the loop (every N steps, at each optimizer step): the
            # chain never holds more than a few steps' nodes, some kilobytes.
            proven = type(iteration) is cst.FunctionDef or not binds_inside(iteration, holder, besides=node, afresh=True)
        else:
            message = f"{short_code(holder)} keeps every iteration's graph and activations alive"
            severity = None
        # A loop over a few models or heads sums that many graphs, not one per step;
        # one over a sequence's positions sums the graph of a single forward pass.
        proven = proven and not self._few_iterations(iteration) and not unrolls_a_recurrence(iteration)
        self.report(
            node,
            message,
            fix=FixSpec(
                title=f"Accumulate `.{method}()`",
                edits=detach_fix.call_method(operand, method, self._indent(), self.context.module),
                applicability=Applicability.SAFE,
            ),
            severity=severity,
            proven=proven,
        )

    def _step_loop(
        self, iteration: cst.For | cst.While | cst.FunctionDef, holder: str, node: cst.CSTNode
    ) -> cst.For | cst.While | cst.FunctionDef:
        """The outermost loop of the function whose iterations the accumulation
        spans: the innermost loop, then each loop around it whose iterations do
        not make the holder afresh. `meters` built before the epoch and added to
        in `for name, value in loss_dict.items()` grows with the epoch's steps,
        not with the few entries of the inner loop; a sum over heads made afresh
        each step (`loss = 0` in the step) spans the inner loop only."""
        loops = self.context.tracker.loops
        if type(iteration) is cst.FunctionDef or not loops or loops[-1] is not iteration:
            return iteration
        for outer in reversed(loops[:-1]):
            if rebinds_every_iteration(outer.body, holder, besides=node):
                break
            iteration = outer
        return iteration

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
