"""OOM701-OOM703: memory that only a notebook keeps. A kernel outlives its
cells: what a cell leaves referenced (a failed run's traceback, a displayed
value in `Out`, an optimizer holding a model that a re-run replaces) stays on
the GPU until the kernel restarts.

These rules run only on a notebook's code cells joined by oom_lsp.notebooks
(`FileContext.cell_statements` says which top-level statements each cell
holds); in a `.py` file they are silent. Their examples are notebooks in the
percent format (`# %%` starts a cell).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.dataflow import Kind, contains_backward, facts_for, is_backward_call, iter_nodes
from oom_lsp.analysis.facts.sizes import model_size
from oom_lsp.analysis.facts.workload import MATTERS, workload_of
from oom_lsp.analysis.findings import Applicability, Severity
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid, deferred_report, short_code
from oom_lsp.analysis.rules._devices import file_uses_cuda, is_device_expression
from oom_lsp.fixes import detach as detach_fix
from oom_lsp.fixes import notebook as notebook_fixes

# A notebook that already frees a failed cell's frames, one way or another.
_CLEANUP_RE = re.compile(r"post_run_cell|set_custom_exc|f_locals\.clear\(\)|free_failed_cell")
_LOOP_TYPES = (cst.For, cst.While)


class NotebookRule(Rule):
    """A rule that reads the notebook's cells: it runs once the walk is done."""

    notebook_only = True

    def cells(self) -> Iterator[tuple[int, list[cst.BaseStatement]]]:
        """(1-based position among the analysed cells, the cell's top-level statements)."""
        counts = self.context.cell_statements or ()
        body = list(self.context.module.body)
        start = 0
        for position, count in enumerate(counts, start=1):
            yield position, body[start : start + count]
            start += count


def _trains(statement: cst.CSTNode, module_functions: dict[str, cst.FunctionDef], context) -> bool:
    """A cell-level loop that calls backward, or a call of a notebook function whose
    loop does."""
    if isinstance(statement, _LOOP_TYPES):
        return contains_backward(statement, context)
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for node in iter_nodes(statement):
        if type(node) is cst.Call and type(node.func) is cst.Name:
            function = module_functions.get(node.func.value)
            if function is not None and any(
                isinstance(inner, _LOOP_TYPES) and contains_backward(inner, context)
                for inner in iter_nodes(function.body)
            ):
                return True
    return False


def _uses_gpu(statement: cst.CSTNode, context) -> bool:
    """A `.cuda()`, or a `.to(...)` / `device=` given a device expression, in the statement."""
    for node in iter_nodes(statement):
        if type(node) is cst.Call and type(node.func) is cst.Attribute:
            method = node.func.attr.value
            if method == "cuda":
                return True
            if method == "to" and node.args and is_device_expression(node.args[0].value, context):
                return True
        elif type(node) is cst.Arg and node.keyword is not None and node.keyword.value == "device":
            if is_device_expression(node.value, context):
                return True
    return False


class FailedCellKeepsTensors(NotebookRule):
    """
    ## What it does
    Flags the first cell-level statement of a notebook that trains on the GPU
    (a loop calling `backward()`, or a call of a notebook function whose loop
    does, in or after the first cell that puts something on the GPU: a
    course's first loop often trains on the CPU) when nothing in the notebook
    frees what a failed cell leaves behind.

    ## Why is this bad?
    When a training step runs out of memory, IPython keeps the error's
    traceback (`sys.last_traceback`, the cell's result) to show it and to
    debug it, and the traceback keeps the frames of the step that failed:
    their locals hold the batch, the activations and every tensor the step
    had made. Running the cell again allocates a new step next to them, so it
    fails again, until the kernel restarts. Measured in real kernels
    (`bench/ipython_oom_references.py`): `%xmode Minimal`, `gc.collect()`,
    `torch.cuda.empty_cache()`, `sys.last_traceback = None` and
    `traceback.clear_frames(...)` each leave the failed step's tensors alive
    (on CPython before 3.13, a frame's locals shown in a traceback survive
    `frame.clear()`).

    ## Example
    ```python
    # %%
    for epoch in range(epochs):
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            loss.backward()
    ```

    ## Use instead
    Clear the failed run's frames, their locals first, before training
    again (the fix inserts this at the top of the cell, so that running it
    again starts with the memory the failure held), or register the same
    function as an IPython `post_run_cell` hook.

    ## Fix safety
    Unsafe: it adds code to the cell, and `%debug` after a failure no longer
    sees the failed frames' variables once the cell has run again.
    """

    code = "OOM701"
    advisory = True
    name = "failed-cell-keeps-tensors"
    summary = "After an out-of-memory error in a notebook, IPython keeps the failed step's tensors alive."
    why = (
        "IPython keeps the last error's traceback, whose frames hold the failed step's tensors: they "
        "stay on the GPU, so running the cell again runs out again."
    )
    remedy = "Free a failed run's frames at the top of the cell (free_failed_cell())."
    default_severity = Severity.INFO
    fix_applicability = Applicability.UNSAFE

    VALID = [
        Valid(
            """
            # %%
            import torch
            import gc, sys, traceback
            def free_failed_cell():
                error = getattr(sys, "last_value", None)
                while error is not None:
                    for frame, _ in traceback.walk_tb(error.__traceback__):
                        if frame.f_locals is not frame.f_globals:
                            frame.f_locals.clear()
                    traceback.clear_frames(error.__traceback__)
                    error = error.__cause__ or error.__context__
                gc.collect()
            # %%
            model = Net().cuda()
            # %%
            free_failed_cell()
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
            """
        ),
        # Training on the CPU: nothing is held on a GPU.
        Valid(
            """
            # %%
            import torch
            model = Net()
            # %%
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """
        ),
        # The first loop trains on the CPU; the GPU comes later, for inference only.
        Valid(
            """
            # %%
            import torch
            model = Net()
            # %%
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            # %%
            device = "cuda" if torch.cuda.is_available() else "cpu"
            predictions = model.to(device)(x.to(device))
            """
        ),
        # The same code in a .py file: no kernel keeps anything.
        Valid(
            """
            import torch
            model = Net().cuda()
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            # %%
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("gpt2-large").cuda()
            # %%
            for batch in loader:
                loss = model(batch.cuda(), labels=batch.cuda()).loss
                loss.backward()
            """,
            line=7,
            by_default=True,
        ),
        Invalid(
            """
            # %%
            import torch
            model = Net().cuda()
            # %%
            for epoch in range(3):
                for x, y in loader:
                    loss = criterion(model(x.cuda()), y.cuda())
                    loss.backward()
            """,
            line=6,
            expected_fix="""
            # %%
            import torch
            model = Net().cuda()
            # %%
            import gc, sys, traceback


            def free_failed_cell():
                \"\"\"Free the tensors a failed run of a cell left: IPython keeps its traceback,
                and the frames in it keep the locals of the step that failed.\"\"\"
                error = getattr(sys, "last_value", None)
                while error is not None:
                    for frame, _ in traceback.walk_tb(error.__traceback__):
                        if frame.f_locals is not frame.f_globals:  # never the notebook's own names
                            frame.f_locals.clear()
                    traceback.clear_frames(error.__traceback__)
                    error = error.__cause__ or error.__context__
                gc.collect()


            free_failed_cell()
            for epoch in range(3):
                for x, y in loader:
                    loss = criterion(model(x.cuda()), y.cuda())
                    loss.backward()
            """,
        ),
        # The loop in a function the cell calls.
        Invalid(
            """
            # %%
            import torch
            device = torch.device("cuda")
            def train(model, loader):
                for x, y in loader:
                    loss = criterion(model(x.to(device)), y.to(device))
                    loss.backward()
            # %%
            history = train(model, loader)
            """,
            line=10,
        ),
    ]

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.context.cell_statements is None or _CLEANUP_RE.search(self.context.source):
            return
        if not file_uses_cuda(self.context):
            return
        functions = facts_for(self.context).module_functions
        on_gpu = False  # whether a cell run before (or this statement) put something on the GPU
        for _, statements in self.cells():
            for statement in statements:
                on_gpu = on_gpu or _uses_gpu(statement, self.context)
                if on_gpu and _trains(statement, functions, self.context):
                    stake = workload_of(self.context).program_stake()
                    self.context.add_report(
                        deferred_report(
                            self,
                            statement,
                            "After an OOM here, IPython keeps the failed step's tensors, so a rerun fails too",
                            FixSpec(
                                "Free a failed run's tensors at the top of the cell",
                                notebook_fixes.free_failed_cell(statement),
                                Applicability.UNSAFE,
                            ),
                            (statement,),
                            # An OOM is plausible, and what it pins matters, when the step is large.
                            proven=stake is not None,
                        )
                    )
                    return


class CellOutputKeepsGraph(NotebookRule):
    """
    ## What it does
    Flags a cell whose last line is a graph-attached loss that `backward()`
    never consumed, which IPython displays and stores in its output history.
    (A model's output shown the same way keeps its graph too, but it may be a
    tuple or a library's output object: not reported.)

    ## Why is this bad?
    IPython keeps every displayed value in `Out[n]`, `_`, `__` and `_n` for
    the rest of the session, and a graph-attached tensor keeps its whole
    autograd graph: every activation of the forward pass that made it. `del`
    of the variable frees nothing (measured in a real kernel, neither does
    `%reset -f out`); the memory comes back when the kernel restarts.

    ## Example
    ```python
    # %%
    loss = criterion(model(batch.cuda()), labels.cuda())
    loss
    ```

    ## Use instead
    ```python
    # %%
    loss = criterion(model(batch.cuda()), labels.cuda())
    loss.detach()
    ```
    (or end the line with `;` to show nothing, or compute it under
    `torch.no_grad()`).

    ## Fix safety
    Safe: the cell shows the same values; only `grad_fn=...` goes from the
    display, and the variable itself is unchanged.
    """

    code = "OOM702"
    advisory = True
    name = "cell-output-keeps-graph"
    summary = "A cell displays a graph-attached loss, which IPython's output history keeps with its graph."
    why = (
        "IPython's output history (Out, _) keeps every displayed value for the whole session, and a "
        "graph-attached loss keeps its graph and every activation behind it."
    )
    remedy = "Display .detach() of it (or .item()), or end the line with a semicolon."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            # %%
            import torch
            with torch.no_grad():
                logits = model(batch)
            logits
            """
        ),
        Valid(
            """
            # %%
            import torch
            logits = model(batch)
            logits;
            """
        ),
        # backward() consumed the graph: the displayed loss holds no activations.
        Valid(
            """
            # %%
            import torch
            loss = criterion(model(x), y)
            loss.backward()
            # %%
            loss
            """
        ),
        Valid(
            """
            import torch
            logits = model(batch)
            logits
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            # %%
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("gpt2-large").cuda()
            # %%
            loss = model(batch.cuda(), labels=batch.cuda()).loss
            loss
            """,
            line=8,
            by_default=True,
        ),
        Invalid(
            """
            # %%
            import torch
            # %%
            loss = criterion(model(batch), labels)
            loss
            """,
            line=6,
            expected_fix="""
            # %%
            import torch
            # %%
            loss = criterion(model(batch), labels)
            loss.detach()
            """,
        ),
        Invalid(
            """
            # %%
            import torch
            import torch.nn.functional as F
            # %%
            F.cross_entropy(model(x), y)
            """,
            line=6,
        ),
    ]

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.context.cell_statements is None:
            return
        flow = facts_for(self.context).flow(None)
        consumed = _backward_receivers(self.context)
        for _, statements in self.cells():
            if not statements or not isinstance(statements[-1], cst.SimpleStatementLine):
                continue
            last = statements[-1].body[-1]
            if type(last) is not cst.Expr or isinstance(last.semicolon, cst.Semicolon):
                continue
            value = last.value
            # A loss: certainly a tensor. A model's output may be a tensor, a tuple or a
            # library's output object (no `.detach()`): left alone, precision first.
            if flow.kind_of(value) is not Kind.GRAPH_SCALAR:
                continue
            if dotted_name(value) in consumed:
                continue
            shown = _describe(value)
            self.context.add_report(
                deferred_report(
                    self,
                    value,
                    f"IPython keeps {shown} in Out with its autograd graph",
                    FixSpec(
                        "Show `.detach()` of it",
                        detach_fix.detach(value, "", self.context.module),
                        Applicability.SAFE,
                    ),
                    (statements[-1],),
                    proven=workload_of(self.context).program_stake() is not None,
                )
            )


def _built_model(statement: cst.BaseStatement) -> cst.BaseExpression | None:
    """The value of `model = <expression>` (the model a cell builds)."""
    if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1:
        small = statement.body[0]
        if type(small) is cst.Assign:
            return small.value
    return None


def _describe(value: cst.BaseExpression) -> str:
    name = dotted_name(value)
    return short_code(name) if name is not None else "this graph-attached tensor"


def _backward_receivers(context) -> set[str]:
    """Names `backward()` is called on (or passed to) anywhere: their graph is freed."""
    names: set[str] = set()
    for node in iter_nodes(context.module):
        if type(node) is cst.Call and is_backward_call(node, context):
            if type(node.func) is cst.Attribute:
                receiver = dotted_name(node.func.value)
                if receiver is not None:
                    names.add(receiver)
            for arg in node.args:
                name = dotted_name(arg.value)
                if name is not None:
                    names.add(name)
    return names


_HOLDER_KEYWORDS = frozenset({"model", "module"})
_PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
# Model zoos whose models are known to be sizeable (pretrained architectures). A model
# class the notebook defines itself (a course's small network) is of unknown size:
# running its cell again costs little, so OOM703 stays silent there.
_MODEL_ZOO_RE = re.compile(
    r"^(torchvision\.models\.|timm\.(models\.)?create_model$|torch\.hub\.load$|transformers\.|diffusers\."
    r"|open_clip\.|segmentation_models_pytorch\.|ultralytics\.)"
)


class ModelRebuiltWhileHeld(NotebookRule):
    """
    ## What it does
    Flags a cell that puts a pretrained or model-zoo model on the GPU
    (`from_pretrained(...)`, `torchvision.models.*`, `timm.create_model`,
    `torch.hub.load`, then `.cuda()` / `.to(device)`) when a later cell hands
    that model to an object that keeps it: an optimizer over
    `model.parameters()`, a `Trainer(model=model)`. A model class the
    notebook defines itself is of a size the analysis cannot tell (most are
    a course's small networks, whose second copy costs nothing): not flagged.

    ## Why is this bad?
    Notebook cells are run again. Running the model's cell again builds a
    second model on the GPU while the optimizer (or trainer) of the later
    cell still holds the first one's parameters, and with Adam their two
    moment buffers: the old copy is never freed until that later cell runs
    again, and the new model is built next to it. Measured in a real kernel:
    after the model cell ran twice, both models' parameters were alive.

    ## Example
    ```python
    # %%
    model = AutoModelForCausalLM.from_pretrained("gpt2-large").to(device)
    # %%
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```

    ## Use instead
    ```python
    # %%
    model = optimizer = None  # free the previous run's before building new ones
    model = AutoModelForCausalLM.from_pretrained("gpt2-large").to(device)
    # %%
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ```

    ## Fix safety
    Unsafe: it rebinds the holder's name to `None` when the model cell runs,
    so a cell run afterwards that still uses the old optimizer fails until
    its own cell runs again, which is the intended order.
    """

    code = "OOM703"
    advisory = True
    name = "model-rebuilt-while-held"
    summary = "Running a notebook's model cell again builds a second model on the GPU while a later cell holds the first."
    why = (
        "A later cell's object (an optimizer, a Trainer) still references the first model, so its "
        "weights stay on the GPU next to the new ones."
    )
    remedy = "Set the model and what holds it to None before building a new one."
    fix_applicability = Applicability.UNSAFE

    VALID = [
        # Model and optimizer in one cell: running it again replaces both.
        Valid(
            """
            # %%
            import torch, torchvision
            model = torchvision.models.resnet50(weights="DEFAULT").cuda()
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        Valid(
            """
            # %%
            import torch, torchvision
            model = optimizer = None
            model = torchvision.models.resnet50(weights="DEFAULT").cuda()
            # %%
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        # On the CPU.
        Valid(
            """
            # %%
            import torch, torchvision
            model = torchvision.models.resnet50()
            # %%
            optimizer = torch.optim.AdamW(model.parameters())
            """
        ),
        # A network the notebook defines (a course's CircleModelV0, TinyVGG): its size
        # is unknown, most often a few thousand parameters.
        Valid(
            """
            # %%
            import torch
            from torch import nn
            device = "cuda"
            class CircleModel(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.layer = nn.Linear(2, 1)
            model_0 = CircleModel().to(device)
            # %%
            optimizer = torch.optim.SGD(params=model_0.parameters(), lr=0.1)
            """
        ),
        # A function given the model returns its results; it keeps no reference.
        Valid(
            """
            # %%
            import torch, torchvision
            model = torchvision.models.efficientnet_b0(weights="DEFAULT").to("cuda")
            # %%
            results = eval_model(model=model, data_loader=test_loader)
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            # %%
            import torch
            from transformers import AutoModelForCausalLM
            device = "cuda"
            # %%
            model = AutoModelForCausalLM.from_pretrained("gpt2-large").to(device)
            # %%
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            """,
            line=7,
            by_default=True,
        ),
        Invalid(
            """
            # %%
            import torch
            import torchvision
            device = "cuda"
            # %%
            model = torchvision.models.efficientnet_b0(weights="DEFAULT").to(device)
            # %%
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            """,
            line=7,
            expected_fix="""
            # %%
            import torch
            import torchvision
            device = "cuda"
            # %%
            model = optimizer = None  # free the previous run's before building new ones
            model = torchvision.models.efficientnet_b0(weights="DEFAULT").to(device)
            # %%
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            """,
        ),
        Invalid(
            """
            # %%
            import torch
            from transformers import AutoModelForCausalLM, Trainer
            model = AutoModelForCausalLM.from_pretrained("gpt2")
            model.cuda()
            # %%
            trainer = Trainer(model=model, args=args)
            """,
            line=5,
        ),
    ]

    def leave_Module(self, original_node: cst.Module) -> None:
        if self.context.cell_statements is None or not file_uses_cuda(self.context):
            return
        cells = list(self.cells())
        for index, (position, statements) in enumerate(cells):
            for number, statement in enumerate(statements):
                name = self._model_on_gpu(statement, statements[number:])
                if name is None or _released_before(name, statements[:number]):
                    continue
                later = [s for _, cell in cells[index + 1 :] for s in cell]
                same_cell = statements[number + 1 :]
                holder = _holder_of(name, later)
                if holder is None or _holder_of(name, same_cell) is not None:
                    continue
                built = _built_model(statement)
                largest = model_size(self.context, built, None) if built is not None else None
                self.context.add_report(
                    deferred_report(
                        self,
                        statement,
                        f"Rerunning this cell builds a second {short_code(name, 24)} while "
                        f"{short_code(holder, 24)} still holds the first",
                        FixSpec(
                            f"Free the previous `{name}` and `{holder}` first",
                            notebook_fixes.release_before_rebuild(statement, [name, holder]),
                            Applicability.UNSAFE,
                        ),
                        (statement,),
                        # A second copy of a model of a GiB or more of weights.
                        proven=largest is not None and largest.parameters * 4 >= MATTERS,
                    )
                )

    def _model_on_gpu(self, statement: cst.BaseStatement, rest: list[cst.BaseStatement]) -> str | None:
        """`name` when the statement binds a model that this cell puts on the GPU."""
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        assign = statement.body[0]
        if (
            type(assign) is not cst.Assign
            or len(assign.targets) != 1
            or type(assign.targets[0].target) is not cst.Name
        ):
            return None
        name = assign.targets[0].target.value
        value = assign.value
        if not self._builds_model(value):
            return None
        if self._moved_to_gpu(value):
            return name
        for later in rest[1:]:
            for node in iter_nodes(later):
                if type(node) is cst.Call and dotted_name(node.func) in (f"{name}.cuda", f"{name}.to"):
                    if self._moved_to_gpu(node):
                        return name
        return None

    def _builds_model(self, value: cst.BaseExpression) -> bool:
        """A pretrained model, or one from a model zoo (`_MODEL_ZOO_RE`)."""
        call = value
        while (
            type(call) is cst.Call
            and type(call.func) is cst.Attribute
            and call.func.attr.value in ("to", "cuda")
        ):
            call = call.func.value
        if type(call) is not cst.Call:
            return False
        if type(call.func) is cst.Attribute and call.func.attr.value == "from_pretrained":
            return True
        qualified = self.context.call_name(call)
        return qualified is not None and _MODEL_ZOO_RE.match(qualified) is not None

    def _moved_to_gpu(self, value: cst.BaseExpression) -> bool:
        while type(value) is cst.Call and type(value.func) is cst.Attribute:
            method = value.func.attr.value
            if method == "cuda":
                return True
            if method == "to" and value.args and is_device_expression(value.args[0].value, self.context):
                return True
            value = value.func.value
        return False


def _released_before(name: str, statements: list[cst.BaseStatement]) -> bool:
    """`del model`, `model = None` (or `model = optimizer = None`) earlier in the cell."""
    for statement in statements:
        for node in iter_nodes(statement):
            if type(node) is cst.Del and name in {dotted_name(t) for t in _targets(node.target)}:
                return True
            if type(node) is cst.Assign and type(node.value) is cst.Name and node.value.value == "None":
                if any(dotted_name(target.target) == name for target in node.targets):
                    return True
    return False


def _targets(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    if type(target) in (cst.Tuple, cst.List):
        return [element.value for element in target.elements]
    return [target]


def _constructs(call: cst.Call) -> bool:
    """`Trainer(model=model)`: a class, whose object keeps what it is given (by Python's
    naming convention), not a function such as `eval_model(model=model)`, which
    returns its results."""
    name = dotted_name(call.func)
    return name is not None and name.rsplit(".", 1)[-1][:1].isupper()


def _holder_of(name: str, statements: list[cst.BaseStatement]) -> str | None:
    """The top-level name bound to an object built over `name`'s parameters
    (`torch.optim.X(name.parameters())`) or given `name` (`Trainer(model=name)`)."""
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            continue
        assign = statement.body[0]
        if (
            type(assign) is not cst.Assign
            or len(assign.targets) != 1
            or type(assign.targets[0].target) is not cst.Name
        ):
            continue
        if type(assign.value) is not cst.Call:
            continue
        for arg in assign.value.args:
            argument = arg.value
            if (
                type(argument) is cst.Call
                and type(argument.func) is cst.Attribute
                and argument.func.attr.value in _PARAMETER_METHODS
                and dotted_name(argument.func.value) == name
            ):
                return assign.targets[0].target.value
            if (
                arg.keyword is not None
                and arg.keyword.value in _HOLDER_KEYWORDS
                and dotted_name(argument) == name
                and _constructs(assign.value)
            ):
                return assign.targets[0].target.value
    return None
