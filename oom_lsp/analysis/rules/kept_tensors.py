"""OOM302: graph-attached tensors stored in a container that outlives the step
(a list of a loop, a helper's argument, a forward hook's store, a model's attribute)."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg
from oom_lsp.analysis.dataflow import (
    Kind,
    Role,
    ScopeFlow,
    facts_for,
    iter_nodes,
    rebinds_every_iteration,
)
from oom_lsp.analysis.effects import STORING_METHODS, effects_for
from oom_lsp.analysis.facts.datasets import trains_on_small_inputs
from oom_lsp.analysis.facts.program import BindingKind, program_of
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid, short_code
from oom_lsp.analysis.rules._autograd import (
    FORWARD_METHODS,
    AutogradRule,
    is_container_value,
)
from oom_lsp.edits import NodeEdit
from oom_lsp.fixes import detach as detach_fix


class TensorKeptAcrossIterations(AutogradRule):
    """
    ## What it does
    Flags graph-attached tensors (model outputs, losses) stored in a list or
    dict that outlives the loop iteration, without `.detach()` or `.item()`:
    `losses.append(loss)`, `preds.append(out.cpu())`, `history[k] = out`.

    A loop over a collection the code lists (a few models, heads or
    losses: `for net in (small, wide)`, `zip(nets, opts)` of lists of two)
    keeps at most that many entries, not one per step: it is
    shown with `--strict` only.

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
    why = (
        "A stored graph-attached tensor keeps its step's graph and activations alive as long as the "
        "container lives (.cpu() alone keeps the graph)."
    )
    remedy = "Store .detach()ed values (then .cpu())."
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
        # A dict filled from one step's outputs in a loop over their names, made
        # afresh in every step: it holds that step's graph only.
        Valid(
            """
            import torch

            def train(model, loader, optimizer, criterion):
                for images, labels in loader:
                    outputs = model(images)
                    inputs = {}
                    for name, value in outputs.items():
                        inputs[name] = torch.cat([value, value.flip(0)])
                    loss = criterion(**inputs, labels=labels)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """
        ),
    ]
    INVALID = [
        # A loop over the two models the code lists keeps two entries, not one
        # per step: strict only.
        Invalid(
            """
            import torch
            nets = [small_net, wide_net]
            for epoch in range(epochs):
                activations = []
                for net in nets:
                    out = net(test_x)
                    activations.append(out)
                plot(activations)
            """,
            line=8,
            by_default=False,
        ),
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
        # A transition stored through a method of the class: the tuple has no
        # `.detach()`; its graph-attached element is detached (minimalRL's
        # `put_data((s, a, r, prob))`).
        Invalid(
            """
            import torch

            class Agent(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.data = []
                    self.fc = torch.nn.Linear(4, 2)

                def forward(self, x):
                    return self.fc(x)

                def put_data(self, transition):
                    self.data.append(transition)

            agent = Agent()
            for step in range(1000):
                prob = agent(torch.randn(4)).softmax(0)
                agent.put_data((step, prob, 1.0))
            """,
            line=19,
            expected_fix="""
            import torch

            class Agent(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.data = []
                    self.fc = torch.nn.Linear(4, 2)

                def forward(self, x):
                    return self.fc(x)

                def put_data(self, transition):
                    self.data.append(transition)

            agent = Agent()
            for step in range(1000):
                prob = agent(torch.randn(4)).softmax(0)
                agent.put_data((step, prob.detach(), 1.0))
            """,
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
            # A tuple, list or dict display has no `.detach()`: its graph-attached elements do.
            displayed = type(argument) in (cst.Tuple, cst.List, cst.Dict)
            edits = self._detached(_attached_parts(argument, self._flow()) if displayed else [argument])
            fix = FixSpec("Pass a `.detach()`ed value", edits, Applicability.UNSAFE) if edits else None
            self.report(
                node,
                f"{short_code(callee)}() keeps the graph-attached "
                f"{short_code(self.context.code_for(argument), 24)} across iterations in {short_code(holder)}",
                fix=fix,
                proven=not self._few_iterations(loop),
            )
            return

    def _detached(self, parts: list[cst.BaseExpression]) -> tuple[NodeEdit, ...] | None:
        """The edits that `.detach()` each part, or None when there is none or one is a dict or
        model output holding a graph-attached tensor (it has no `.detach()`)."""
        flow = self._flow()
        if not parts or any(flow.kind_of(part) is Kind.GRAPH_CONTAINER for part in parts):
            return None
        if any(self._structure_of(part) == "display" for part in parts):
            return None
        indent = self._indent()
        return tuple(edit for part in parts for edit in detach_fix.detach(part, indent, self.context.module))

    def _structure_of(self, part: cst.BaseExpression, depth: int = 0) -> str | None:
        """What may make `part` no tensor, whose `.detach()` would then fail: "display" when a
        binding gives it a tuple or list display (`h_out = (h0, c0)`, an LSTM's state), "unpacked"
        when it is an element of what a call returned (`prob, h_out = model.pi(x, h_in)`: its own
        structure nothing shows); through plain aliases (`h_in = h_out`). None: neither."""
        if type(part) is not cst.Name or depth > 3:
            return None
        program = program_of(self.context)
        function = self.context.tracker.current_function
        scope = program.function(function) if function is not None else program.functions[0]
        if scope is None:
            return None
        found: str | None = None
        for binding in program.lookup(part.value, scope):
            statement = binding.node
            if binding.kind is BindingKind.ASSIGN and type(binding.value) in (cst.Tuple, cst.List):
                return "display"
            if binding.kind is BindingKind.ASSIGN and type(binding.value) is cst.Name:
                inner = self._structure_of(binding.value, depth + 1)
                if inner == "display":
                    return inner
                found = found or inner
            elif binding.kind is BindingKind.OTHER and type(statement) is cst.SimpleStatementLine:
                for small in statement.body:
                    if type(small) is cst.Assign and type(small.value) is cst.Call and any(
                        type(target.target) in (cst.Tuple, cst.List) for target in small.targets
                    ):
                        found = "unpacked"
        return found

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
        return bool(values) and all(is_container_value(value) for value in values)

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
            f"Forward hook stores graph-attached outputs in {short_code(holder)}, which is never emptied",
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
            if not values or not all(is_container_value(value) for value in values):
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
                f"Forward hook {short_code(function.name.value)} stores graph-attached outputs in "
                f"{short_code(holder)}, which is never emptied",
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
        graph_loop = self._loop_making_graphs(iteration, holder)
        if graph_loop is None:
            return
        iteration = graph_loop
        if rebinds_every_iteration(iteration.body, holder) or not self._holds_a_container(holder):
            return
        if self._kept_on_purpose(holder, iteration) or self._lives_one_call(holder, iteration):
            return
        edits = self._detached(attached)
        # An element of what a call returned may be a tuple (an RNN's state): then unsafe.
        unpacked = any(self._structure_of(part) == "unpacked" for part in attached)
        applicability = Applicability.UNSAFE if unpacked else Applicability.SAFE
        fix = FixSpec("Detach before storing", edits, applicability) if edits else None
        proven = True
        if self._graph_freed_each_step(iteration):
            message = f"{short_code(holder)} keeps each step's tensors and their autograd graphs"
            # What grows is each step's stored tensor: a few MB in all on a known dataset of small samples.
            proven = not trains_on_small_inputs(self.context)
        else:
            message = f"{short_code(holder)} keeps graph-attached tensors and their activations across iterations"
        # A loop over a few models or heads keeps that many entries, not one per step.
        proven = proven and not self._few_iterations(iteration)
        self.report(node, message, fix=fix, proven=proven)

    def _loop_making_graphs(
        self, iteration: cst.For | cst.While | cst.FunctionDef, holder: str
    ) -> cst.For | cst.While | cst.FunctionDef | None:
        """The loop whose iterations each make a graph and all store into `holder`:
        what grows with the steps. A loop that makes no graph itself
        (`for key, val in features.items(): inputs[key] = torch.cat(...)`) stores
        pieces of graphs made around it: the holder keeps more graphs only across
        an enclosing loop that makes them, and none when it is made afresh in each
        iteration of the loop around before one is found."""
        loops = self.context.tracker.loops
        if type(iteration) is cst.FunctionDef or not loops or loops[-1] is not iteration:
            return iteration
        flow = self._flow()
        for loop in reversed(loops):
            if loop is not iteration and rebinds_every_iteration(loop.body, holder):
                return None
            if self._trains(loop) or _makes_a_graph(loop, flow):
                return loop
        return None

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
            f"forward appends graph-attached outputs to {short_code(holder)}, which nothing empties",
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
        return bool(values) and all(is_container_value(value) for value in values)


def _makes_a_graph(loop: cst.For | cst.While, flow: ScopeFlow) -> bool:
    """Some call in the loop's body makes a new graph: a forward pass (a module
    called, a function of the file returning a graph-attached value), or any
    call returning a graph-attached value from no graph-attached input."""
    for node in iter_nodes(loop.body):
        if type(node) is not cst.Call or not flow.kind_of(node).attached:
            continue
        if flow.callee(node.func, node).role is Role.MODULE or flow.local_function(node.func) is not None:
            return True
        inputs = [arg.value for arg in node.args]
        if type(node.func) is cst.Attribute:
            inputs.append(node.func.value)
        if not any(flow.kind_of(value).attached for value in inputs):
            return True
    return False


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
