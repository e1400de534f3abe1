"""OOM306: whole outputs collected on the GPU across a data loader."""

from __future__ import annotations

import re

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.dataflow import assigned_names, binds_inside, facts_for, iter_nodes
from oom_lsp.analysis.facts.datasets import trains_on_small_inputs
from oom_lsp.analysis.facts.devices import Device, device_facts, reduced
from oom_lsp.analysis.facts.evaluation import indent_in_path
from oom_lsp.analysis.facts.program import BindingKind, Function, program_of
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid, deferred_report, short_code
from oom_lsp.analysis.rules._devices import file_uses_cuda
from oom_lsp.fixes import detach as detach_fix

_STORING = frozenset({"append", "extend"})
# How people name what yields batches: `loader`, `val_loader`, `dataloader`,
# `test_dl`, `batches`. The loop over one runs once per batch of a dataset.
_LOADER_RE = re.compile(r"(^|_)(loader|dataloader|dl|batches|data_iter|dataiter)$", re.IGNORECASE)
_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "zip", "iter"})
_DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# What makes a container that a loop may grow: displays or comprehensions, and factories.
_CONTAINERS = (
    frozenset({cst.List, cst.Dict, cst.ListComp}),
    frozenset({"list", "dict", "collections.defaultdict", "defaultdict", "deque"}),
)
# The ones a keyed store (`holder[key] = ...`) adds entries to.
_DICTS = (frozenset({cst.Dict, cst.DictComp}), frozenset({"dict", "collections.defaultdict", "defaultdict"}))


class DeviceTensorsKeptAcrossIterations(Rule):
    """
    ## What it does
    Flags a loop over a data loader that stores, every batch, a whole tensor
    that still lives on the GPU in a list or dict that outlives the loop:
    `preds.append(out.detach())`, `features.extend(model(x))` under
    `torch.no_grad()`, `by_id[image_id] = output` in a loop over one batch's
    items, `embeddings[split].append(...)`. Where the value lives is followed
    through the file's own helpers (`pool(out, mask)` returns where its
    arguments live). The stored value holds no autograd graph (that is
    OOM302's case); it is a model's output (or a tensor moved to the GPU),
    not reduced to a few numbers (`argmax`, `sum`, `.item()`), and nothing
    moves it off the GPU (`.cpu()`, `.numpy()`, `.tolist()`).

    ## Why is this bad?
    Every batch's output stays allocated on the GPU until the loop ends and
    the list is dropped: the loop holds the outputs of the whole dataset at
    once. A validation set of 50,000 images with 1,000 logits each is 200 MB;
    a segmentation model's masks or a language model's logits are gigabytes
    per few hundred batches. Collecting predictions on the GPU for a final
    `torch.cat` is a common cause of out-of-memory errors at the end of an
    epoch (7 % of the memory reports classified for issue 27).

    ## Example
    ```python
    preds = []
    with torch.no_grad():
        for x, _ in val_loader:
            preds.append(model(x.cuda()))
    ```

    ## Use instead
    ```python
    preds = []
    with torch.no_grad():
        for x, _ in val_loader:
            preds.append(model(x.cuda()).cpu())
    ```

    ## Fix safety
    Unsafe: `.cpu()` is appended to the stored value, which changes where the
    collected tensors live; code that later combines them with GPU tensors
    (`torch.cat(preds) == labels.cuda()`) must move those too. When only a
    reduction of the outputs is needed, keep a running reduction instead.
    """

    code = "OOM306"
    name = "device-tensors-kept-across-iterations"
    summary = "Whole GPU tensors are collected in a list across a data loader: the GPU holds every batch's output."
    why = (
        "Each stored tensor keeps its GPU storage until the loop ends: the loop holds the outputs of the "
        "whole dataset on the GPU at once."
    )
    remedy = "Store .cpu() copies (or keep a running reduction)."
    fix_applicability = Applicability.UNSAFE

    VALID = [
        Valid(
            """
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            preds = []
            with torch.no_grad():
                for x, _ in val_loader:
                    preds.append(model(x.cuda()).cpu())
            """
        ),
        # A reduction per batch: a few numbers.
        Valid(
            """
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            correct = []
            with torch.no_grad():
                for x, y in val_loader:
                    correct.append((model(x.cuda()).argmax(1) == y.cuda()).sum())
            """
        ),
        # A CPU-only file: host memory is the host's business.
        Valid(
            """
            import torch
            model = torch.nn.Linear(4, 4)
            preds = []
            with torch.no_grad():
                for x, _ in loader:
                    preds.append(model(x))
            """
        ),
        # The list is emptied every iteration.
        Valid(
            """
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            with torch.no_grad():
                for x, _ in loader:
                    preds = []
                    preds.append(model(x.cuda()))
            """
        ),
        # A loop over a fixed range inside one step (heads, hops), not over data.
        Valid(
            """
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            outs = []
            with torch.no_grad():
                for i in range(4):
                    outs.append(model(x.cuda()))
            """
        ),
        # A tensor made once and written batch by batch: it does not grow.
        Valid(
            """
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            preds = torch.empty(len(dataset), 4, device="cuda")
            with torch.no_grad():
                for i, (x, _) in enumerate(loader):
                    preds[i * 32:(i + 1) * 32] = model(x.cuda())
            """
        ),
        # One entry overwritten every batch, and entries made afresh in the loop.
        Valid(
            """
            import torch

            @torch.no_grad()
            def predict(model, loader):
                latest, cache = {}, {}
                for images, ids in loader:
                    outputs = model(images.cuda())
                    latest["val"] = outputs
                    for k in ids:
                        cache[k] = []
                        cache[k].append(outputs)
                return latest
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            preds = []
            with torch.no_grad():
                for x, _ in val_loader:
                    preds.append(model(x.cuda()))
            """,
            line=7,
            expected_fix="""
            import torch
            model = torch.nn.Linear(4, 4).cuda()
            preds = []
            with torch.no_grad():
                for x, _ in val_loader:
                    preds.append(model(x.cuda()).cpu())
            """,
        ),
        Invalid(
            """
            import torch
            device = "cuda"

            @torch.inference_mode()
            def collect(model, test_loader):
                outputs = []
                for step, batch in enumerate(test_loader):
                    logits = model(batch.to(device))
                    outputs.append(logits.detach())
                return torch.cat(outputs)
            """,
            line=10,
        ),
        # A dict keyed per item of each batch, filled in a loop over the batch.
        Invalid(
            """
            import torch

            @torch.no_grad()
            def predict(model, loader):
                by_id = {}
                for images, ids in loader:
                    outputs = model(images.cuda())
                    for image_id, output in zip(ids, outputs):
                        by_id[image_id] = output
                return by_id
            """,
            line=10,
        ),
        # Lists kept per split in a dict, the batch pooled by a helper of the file.
        Invalid(
            """
            import torch

            def pool(hidden, mask):
                return (hidden * mask).sum(1) / mask.sum(1)

            @torch.no_grad()
            def encode(model, loaders):
                found = {}
                for split, loader in loaders.items():
                    found[split] = []
                    for batch in loader:
                        out = model(batch.cuda())
                        found[split].append(pool(out, batch.cuda()))
                return found
            """,
            line=14,
        ),
        # The stored name is bound again after the loop (`logits = torch.cat(...)`):
        # inside the loop it is what the loop's body bound, the model's output.
        Invalid(
            """
            import torch

            @torch.no_grad()
            def evaluate(model, loader):
                all_logits = []
                for images, labels in loader:
                    logits = model(images.cuda())
                    all_logits.append(logits)
                logits = torch.cat(all_logits).cpu()
                return logits
            """,
            line=9,
        ),
        # The pieces of a batch (`unbind`, `split`) are views on the same GPU.
        Invalid(
            """
            import torch

            class Indexer:
                def __init__(self, encoder):
                    self.encoder = encoder.cuda().eval()
                    self.vectors = []

                @torch.inference_mode()
                def index(self, dataloader):
                    for batch in dataloader:
                        emb = self.encoder(batch.cuda())
                        self.vectors.extend(emb.unbind(0))
                    return torch.stack(self.vectors)
            """,
            line=13,
        ),
    ]

    def __init__(self, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context)
        # `holder[key] = value` statements met in loops, with where they are:
        # (the statement, its loops, its function, the statements around it).
        self._keyed_stores: list[tuple[cst.Assign, tuple[cst.CSTNode, ...], cst.FunctionDef | None, tuple[cst.CSTNode, ...]]] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        tracker = self.context.tracker
        if len(node.targets) == 1 and type(node.targets[0].target) is cst.Subscript and tracker.in_loop:
            self._keyed_stores.append(
                (node, tuple(tracker.loops), tracker.current_function, tuple(tracker.statements))
            )

    def leave_Module(self, original_node: cst.Module) -> None:
        if not file_uses_cuda(self.context):
            return
        program = program_of(self.context)
        devices = device_facts(self.context, uses_cuda=True)
        for scope in program.functions:
            if scope.is_lambda:
                continue
            for call in scope.calls:
                func = call.node.func
                if type(func) is not cst.Attribute or func.attr.value not in _STORING or len(call.node.args) != 1:
                    continue
                if call.node.args[0].star:
                    continue
                self._check(call.node, func.value, call.node.args[0].value, call.loops, scope, call.path, devices)
        for node, loops, function, path in self._keyed_stores:
            scope = program.function(function) if function is not None else program.module
            target = node.targets[0].target
            if scope is None or not self._is_keyed(target, scope):  # type: ignore[arg-type]
                continue
            self._check(node, target.value, node.value, loops, scope, path, devices)  # type: ignore[attr-defined]

    def _check(
        self,
        store: cst.CSTNode,
        holder_expr: cst.BaseExpression,
        value: cst.BaseExpression,
        loops: tuple[cst.CSTNode, ...],
        scope: Function,
        path: tuple[cst.CSTNode, ...],
        devices: object,
    ) -> None:
        """`holder.append(value)` or `holder[key] = value` (the holder may be an
        entry of a container: `embeddings[split].append(...)`) in a loop over a
        data loader that does not make the container afresh: every batch's
        value is kept until the loop ends. The store may sit in an inner loop
        over one batch's items (`for image_id, output in zip(ids, outputs)`)."""
        holder = dotted_name(holder_expr)
        root = _container_root(holder_expr)
        if root is None:
            return
        loop = next(
            (loop for loop in reversed(loops) if type(loop) is cst.For and self._is_data_loop(loop, scope)), None
        )
        if loop is None or binds_inside(loop, root) or _entry_made_in(loop, holder_expr, self.context.code_for):
            return
        if not self._is_a_list(root, scope):
            return
        if type(store) is cst.Assign and not _varies_in(store.targets[0].target, loop):  # type: ignore[attr-defined]
            return  # `latest["val"] = out`: one entry, overwritten every batch
        flow = facts_for(self.context).flow(None if scope.is_module else scope.node)  # type: ignore[arg-type]
        if flow.kind_of(value).attached or reduced(value, self.context):
            return
        if devices.device_of(value, scope, at=path) is not Device.GPU:  # type: ignore[attr-defined]
            return
        indent = indent_in_path(path[-1], path, self.context.module) if path else None
        fix = None
        if indent is not None:
            fix = FixSpec(
                "Store a `.cpu()` copy",
                detach_fix.call_method(value, "cpu", indent, self.context.module),
                Applicability.UNSAFE,
            )
        shown = holder if holder is not None else self.context.code_for(holder_expr)
        self.context.add_report(
            deferred_report(
                self,
                store,
                f"{short_code(shown)} keeps every batch's {short_code(self.context.code_for(value), 24)} "
                "on the GPU until the loop ends",
                fix,
                path,
                # The outputs of a known dataset of small samples: a few MB in all.
                proven=not trains_on_small_inputs(self.context),
            )
        )

    def _is_keyed(self, target: cst.Subscript, scope: Function) -> bool:
        """`holder[key] = ...` into a dict the scope makes (a key per item adds
        an entry; a list or a tensor written at an index does not grow)."""
        name = dotted_name(target.value)
        return name is not None and "." not in name and self._made_as(name, scope, _DICTS)

    def _is_data_loop(self, loop: cst.For, scope: Function) -> bool:
        """The loop runs once per batch of a data loader."""
        iterable = loop.iter
        while type(iterable) is cst.Call and dotted_name(iterable.func) in _WRAPPERS and iterable.args:
            iterable = iterable.args[0].value
        name = dotted_name(iterable)
        if name is None:
            return False
        if _LOADER_RE.search(name.rpartition(".")[2]):
            return True
        if "." in name:
            return False
        for binding in program_of(self.context).lookup(name, scope):
            value = binding.value
            if binding.kind is BindingKind.ASSIGN and type(value) is cst.Call:
                if self.context.qualified_name(value.func) in _DATALOADERS:
                    return True
        return False

    def _is_a_list(self, holder: str, scope: Function) -> bool:
        """`holder` is bound to a list (or dict) in its scope, or is an attribute of `self`."""
        if "." in holder:
            return holder.startswith("self.")
        return self._made_as(holder, scope, _CONTAINERS)

    def _made_as(self, name: str, scope: Function, kinds: tuple[frozenset[type], frozenset[str]]) -> bool:
        """Every binding of `name` in reach makes a container of `kinds`: one
        of its displays or comprehensions, or a call of one of its factories."""
        displays, factories = kinds
        bindings = program_of(self.context).lookup(name, scope)
        return bool(bindings) and all(
            binding.kind is BindingKind.ASSIGN
            and (
                type(binding.value) in displays
                or type(binding.value) is cst.Call
                and dotted_name(binding.value.func) in factories
            )
            for binding in bindings
        )


def _container_root(expr: cst.BaseExpression) -> str | None:
    """The dotted name of the container a store goes into: `preds` for
    `preds`, `embeddings` for `embeddings[split]`, `self.outputs` for
    `self.outputs["val"]`."""
    while type(expr) is cst.Subscript:
        expr = expr.value
    return dotted_name(expr)


def _entry_made_in(loop: cst.For, holder: cst.BaseExpression, code_for) -> bool:  # type: ignore[no-untyped-def]
    """`cache[k] = []` inside the loop, for a store into `cache[k]`: the entry
    is made afresh there, like a list bound inside the loop."""
    if type(holder) is not cst.Subscript:
        return False
    text = code_for(holder)
    return any(
        type(node) is cst.Assign and any(code_for(target.target) == text for target in node.targets)
        for node in iter_nodes(loop.body)
    )


def _varies_in(target: cst.BaseExpression, loop: cst.For) -> bool:
    """The key of `holder[key] = value` names something the loop binds anew at
    every iteration (its target, or a name assigned in it): a new entry per
    item. A constant key overwrites one entry."""
    if type(target) is not cst.Subscript:
        return False
    bound = {name for node in iter_nodes(loop) for name, _ in assigned_names(node)}
    bound |= {node.value for node in iter_nodes(loop.target) if type(node) is cst.Name}
    return any(
        type(node) is cst.Name and node.value in bound
        for element in target.slice
        for node in iter_nodes(element)
    )
