"""Stateful metrics whose states grow with every update and are never reset.

A torchmetrics metric of the curve, ranking, retrieval or clustering family
(`AUROC`, `AveragePrecision`, `SpearmanCorrCoef`, `RetrievalMAP`, ...) keeps
the inputs of every `update()` in list states until `reset()`: what it needs
at `compute()` time. Which classes do is measured from torchmetrics itself
(`metric_states_table.py`, with the constructor arguments that bound them:
`thresholds=` bins the curve family). The fact this module derives: such a
metric is updated once per batch, outlives the pass over the data (an
attribute of a LightningModule, which lives for the whole fit; a local made
before an epoch loop that encloses the batch loop), and nothing resets it:
no `.reset()` on it, no new metric bound to it, and it is never handed to
other code (Lightning's `self.log(name, metric)` resets a logged metric at
the epoch's end; a collection, a callback or a helper may reset it too, so
any such use leaves the fact unproven). Its memory then grows by one batch
of inputs per step for the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg
from oom_lsp.analysis.dataflow import iter_nodes
from oom_lsp.analysis.facts.contexts import CallGraph, call_graph
from oom_lsp.analysis.facts.library import LIGHTNING_BASES
from oom_lsp.analysis.facts.metric_states_table import GROWING
from oom_lsp.analysis.facts.program import Call, Function, program_of

_PER_BATCH_HOOK_SUFFIXES = ("_step", "_batch_end")
_ONE_PASS_HOOK_PREFIXES = ("test", "predict", "on_test", "on_predict")
_LOOPS = (cst.For, cst.While)
_UPDATING = frozenset({"update", "forward"})
_RESETTING = frozenset({"reset", "_reset_states", "__init__"})
# A module's `.to(device)`, `.cuda()`, `.train()`, `.eval()` return the module
# itself: `auroc = BinaryAUROC().to(device)` binds the metric it made.
_RETURNING_SELF = frozenset({"to", "cuda", "train", "eval", "requires_grad_", "float", "double", "half"})


@dataclass(frozen=True, eq=False)
class GrowingMetric:
    # The path the metric is bound to (`self.val_auroc`, `auroc`) and its class.
    path: str
    metric_class: str
    construction: cst.Call
    # The first update once per batch (where the growth happens).
    update: Call


def _is_per_batch_hook(function: Function) -> bool:
    """A hook `fit` runs on every batch of every epoch (`training_step`, `validation_step`,
    `on_train_batch_end`). `test_step` and `predict_step` run over one pass per `trainer.test()` /
    `predict()` call: a metric they fill holds that pass, what it needs to compute."""
    name = function.name
    return (
        function.is_method
        and name.endswith(_PER_BATCH_HOOK_SUFFIXES)
        and not name.startswith(_ONE_PASS_HOOK_PREFIXES)
    )


def _runs_per_batch(graph: CallGraph, function: Function, depth: int = 0) -> bool:
    """A per-batch hook of the framework, or a method one of them calls
    (`self._update_metrics(preds, y)` from `validation_step`)."""
    if _is_per_batch_hook(function):
        return True
    return depth < 2 and any(_runs_per_batch(graph, caller.scope, depth + 1) for caller in graph.callers(function))


def _bounded(construction: cst.Call, metric_class: str) -> bool:
    """Built with an argument that bounds its states (`thresholds=100`), or
    `compute_on_cpu=True` (the states move off the GPU after each update)."""
    for argument in (*GROWING[metric_class], "compute_on_cpu"):
        arg = get_arg(construction, argument)
        if arg is None:
            continue
        value = arg.value
        if not (type(value) is cst.Name and value.value in ("None", "False")):
            return True
    return any(arg.star for arg in construction.args)  # `**kwargs`: whatever it holds


def _uses(
    bodies: list[cst.CSTNode], path: str, updating: frozenset[str] = _UPDATING, resetting: frozenset[str] = _RESETTING
) -> tuple[list[cst.Call], bool, bool]:
    """The update calls of `path` in `bodies` (calls of it, or of one of the
    `updating` methods), whether it is reset (a `resetting` method called, or
    bound again), and whether it escapes (used as a value: passed, returned,
    stored)."""
    updates: list[cst.Call] = []
    reset = escapes = False
    occurrences = 0
    accounted: set[int] = set()
    for body in bodies:
        for node in iter_nodes(body):
            node_type = type(node)
            if node_type in (cst.Name, cst.Attribute) and dotted_name(node) == path:  # type: ignore[arg-type]
                occurrences += 1
            if node_type is cst.Attribute and dotted_name(node.value) == path:  # type: ignore[attr-defined]
                accounted.add(id(node.value))  # type: ignore[attr-defined]
            elif node_type is cst.Call:
                func = node.func  # type: ignore[attr-defined]
                if dotted_name(func) == path:
                    accounted.add(id(func))
                    updates.append(node)  # type: ignore[arg-type]
                elif type(func) is cst.Attribute and dotted_name(func.value) == path:
                    if func.attr.value in updating:
                        updates.append(node)  # type: ignore[arg-type]
                    elif func.attr.value in resetting:
                        reset = True
            elif node_type in (cst.Assign, cst.AnnAssign, cst.AugAssign):
                targets = node.targets if node_type is cst.Assign else [node]  # type: ignore[attr-defined]
                for target in targets:
                    if dotted_name(target.target) == path:
                        accounted.add(id(target.target))
                        reset = True  # counted below: a second binding is a new metric
            elif node_type is cst.Del and any(
                type(node) in (cst.Name, cst.Attribute) and dotted_name(node) == path  # type: ignore[arg-type]
                for node in iter_nodes(node.target)  # type: ignore[attr-defined]
            ):
                reset = True
    escapes = occurrences > len(accounted)
    return updates, reset, escapes


def growing_metrics(context: FileContext) -> list[GrowingMetric]:
    program = program_of(context)
    growing_classes = _growing_classes(context)
    if "torchmetrics" not in context.source and not growing_classes:
        return []
    found: list[GrowingMetric] = []
    for scope in program.functions:
        for call in scope.calls:
            updating, resetting = _UPDATING, _RESETTING
            qualified = context.qualified_name(call.node.func)
            if qualified is not None and qualified.startswith("torchmetrics."):
                metric_class = qualified.rpartition(".")[2]
                if metric_class == "MetricCollection":
                    member = _growing_member(context, call.node)
                    if member is None:
                        continue
                    metric_class = f"{member} in a MetricCollection"
                elif metric_class not in GROWING or _bounded(call.node, metric_class):
                    continue
            elif type(call.node.func) is cst.Name and call.node.func.value in growing_classes:
                metric_class = call.node.func.value
                updating, resetting = growing_classes[metric_class]
            else:
                continue
            path = _bound_to(call)
            if path is None:
                continue
            metric = _attribute_metric(
                context, scope, path, metric_class, call.node, updating, resetting
            ) or _local_metric(call_graph(context), scope, path, metric_class, call, updating, resetting)
            if metric is not None:
                found.append(metric)
    return found


def _growing_member(context: FileContext, collection: cst.Call) -> str | None:
    """The first growing, unbounded metric a `MetricCollection([...])` or
    `MetricCollection({...})` is made of: the collection updates and keeps
    each member's states."""
    members = get_arg(collection, "metrics", 0)
    if members is None or members.star:
        return None
    value = members.value
    if type(value) is cst.Dict:
        made = [element.value for element in value.elements if type(element) is cst.DictElement]
    elif type(value) in (cst.List, cst.Tuple):
        made = [element.value for element in value.elements if type(element) is cst.Element]
    else:
        made = [value]
    for member in made:
        if type(member) is not cst.Call:
            continue
        qualified = context.qualified_name(member.func) or ""
        name = qualified.rpartition(".")[2]
        if qualified.startswith("torchmetrics.") and name in GROWING and not _bounded(member, name):
            return name
    return None


def _bound_to(call: Call) -> str | None:
    """The path a statement binds the object `call` makes to: `auroc =
    AUROC()`, `self.auroc = AUROC().to(device)`; None when it goes elsewhere
    or is moved to the CPU (`.cpu()`, `.to("cpu")`: the states grow in host
    memory, not on the GPU)."""
    statement = call.statement
    if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if type(assign) is not cst.Assign or len(assign.targets) != 1:
        return None
    value: cst.BaseExpression = assign.value
    while value is not call.node:
        if type(value) is not cst.Call or type(value.func) is not cst.Attribute:
            return None
        if value.func.attr.value not in _RETURNING_SELF or any(
            type(arg.value) is cst.SimpleString and "cpu" in arg.value.value for arg in value.args
        ):
            return None
        value = value.func.value
    return dotted_name(assign.targets[0].target)


def _growing_classes(context: FileContext) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Classes of the file that keep what they are given, by name, with the
    methods that do and those that empty it again: a method other than
    `__init__` appends (or extends) one of its parameters, or a value computed
    from them, to a list attribute that `__init__` makes
    (`self.preds.append(logits.argmax(-1))`), so every call adds to the
    instance's state, like a torchmetrics curve metric; a method that binds
    such a list again or clears it (`reset`, a `make_batch` that hands the
    data over and starts afresh), or calls one that does, resets it."""
    found: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for klass in program_of(context).classes:
        initialisers = klass.methods.get("__init__", [])
        lists = {
            attribute
            for attribute, bindings in klass.attributes.items()
            if any(
                binding.scope in initialisers and type(binding.value) is cst.List and not binding.value.elements
                for binding in bindings
            )
        }
        if not lists:
            continue
        growing = set()
        for name, methods in klass.methods.items():
            if name.startswith("__") or name == "reset":
                continue
            for method in methods:
                if method.self_name is not None and _appends_parameters(method, lists):
                    growing.add(name)
        if growing:
            clearing = {
                name
                for name, methods in klass.methods.items()
                if name != "__init__" and any(_clears(method, lists) for method in methods)
            }
            for name, methods in klass.methods.items():  # one call away: `train()` calls `self.make_batch()`
                for method in methods:
                    if any(
                        type(call.node.func) is cst.Attribute
                        and dotted_name(call.node.func.value) == method.self_name
                        and call.node.func.attr.value in clearing
                        for call in method.calls
                    ):
                        clearing.add(name)
            found[klass.name] = (frozenset(growing - clearing), _RESETTING | clearing)
    return {name: methods for name, methods in found.items() if methods[0]}


def _clears(method: Function, lists: set[str]) -> bool:
    """The method binds one of the list attributes again (`self.preds = []`,
    `self.preds[:] = []`), empties it (`.clear()`, `del self.preds[:]`) or
    deletes it. Adding to it (`self.preds += [x]`) or storing one entry
    (`self.preds[i] = x`, `del self.preds[0]`) does not."""
    self_name = method.self_name
    if self_name is None:
        return False
    paths = {f"{self_name}.{attribute}" for attribute in lists}
    for node in iter_nodes(method.node.body):
        node_type = type(node)
        if node_type in (cst.Assign, cst.AnnAssign):
            targets = [t.target for t in node.targets] if node_type is cst.Assign else [node.target]
            if any(_whole(target, paths) for target in targets):
                return True
        elif node_type is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "clear":
            if dotted_name(node.func.value) in paths:
                return True
        elif node_type is cst.Del:
            if _whole(node.target, paths):
                return True
    return False


def _whole(target: cst.BaseExpression, paths: set[str]) -> bool:
    """`self.preds` itself, or all of it: `self.preds[:]` (also as one name of
    a tuple target: `batch, self.preds = self.preds, []`)."""
    if type(target) in (cst.Tuple, cst.List):
        return any(_whole(element.value, paths) for element in target.elements)
    if type(target) is cst.StarredElement:
        return _whole(target.value, paths)
    if type(target) is cst.Subscript:
        if len(target.slice) != 1 or type(target.slice[0].slice) is not cst.Slice:
            return False
        whole = target.slice[0].slice
        if whole.lower is not None or whole.upper is not None or whole.step is not None:
            return False
        target = target.value
    return type(target) is cst.Attribute and dotted_name(target) in paths


def _appends_parameters(method: Function, lists: set[str]) -> bool:
    self_name = method.self_name
    params = set(method.params[1:])
    for call in method.calls:
        func = call.node.func
        if (
            type(func) is cst.Attribute
            and func.attr.value in ("append", "extend")
            and type(func.value) is cst.Attribute
            and dotted_name(func.value.value) == self_name
            and func.value.attr.value in lists
            and len(call.node.args) == 1
        ):
            mentioned = {
                node.value for node in iter_nodes(call.node.args[0].value) if type(node) is cst.Name
            }
            if mentioned & params or _derived_from_parameters(method, mentioned, params):
                return True
    return False


def _derived_from_parameters(method: Function, names: set[str], params: set[str]) -> bool:
    """One of `names` is bound in the method from a value that mentions a parameter."""
    for name in names:
        for binding in method.bindings.get(name, []):
            if binding.value is not None and any(
                type(node) is cst.Name and node.value in params for node in iter_nodes(binding.value)
            ):
                return True
    return False


def _attribute_metric(
    context: FileContext,
    scope: Function,
    path: str,
    metric_class: str,
    construction: cst.Call,
    updating: frozenset[str] = _UPDATING,
    resetting: frozenset[str] = _RESETTING,
) -> GrowingMetric | None:
    """`self.auroc = AUROC(...)` in a LightningModule: it lives for the whole
    fit, and its per-batch hooks update it."""
    self_name = scope.self_name
    klass = scope.owner
    if self_name is None or klass is None or not path.startswith(self_name + ".") or path.count(".") != 1:
        return None
    lightning = any(context.qualified_name(base) in LIGHTNING_BASES for base in klass.bases)
    graph = call_graph(context)
    attribute = path.partition(".")[2]
    methods = [method for overloads in klass.methods.values() for method in overloads]
    updates: list[Call] = []
    for method in methods:
        name = method.self_name
        if name is None:
            continue
        updated, reset, escapes = _uses([method.node], f"{name}.{attribute}", updating, resetting)
        if escapes or (reset and method is not scope):
            return None
        if not updated:
            continue
        program_calls = {id(call.node): call for call in method.calls}
        found = [program_calls[id(node)] for node in updated if id(node) in program_calls]
        if lightning and _runs_per_batch(graph, method):
            updates += found
        elif not lightning:
            # A plain object lives as long as whoever holds it: a pass over the
            # data in the method, the method run again after each epoch of training.
            per_batch = [call for call in found if any(isinstance(loop, _LOOPS) for loop in call.loops)]
            if per_batch and _repeated_between_training(graph, method):
                updates += per_batch
    # The constructing method binds it once (a second `.reset()` there also counts).
    _, reset_in_scope, _ = _uses([scope.node], path, updating, resetting)
    if not updates or (reset_in_scope and _binds_more_than_once(scope.node, path, resetting)):
        return None
    return GrowingMetric(path, metric_class, construction, updates[0])


def _repeated_between_training(graph: CallGraph, function: Function, depth: int = 0) -> bool:
    """`function` runs at every iteration of a loop that also trains (a call
    in that loop runs a backward pass: `self.train_one_epoch(...)` then
    `self.evaluate(...)` per epoch), directly or through up to two callers."""
    for caller in graph.callers(function):
        loops = [loop for loop in caller.loops if isinstance(loop, _LOOPS)]
        if loops and _trains_in(graph, caller.scope, loops, besides=caller):
            return True
        if depth < 2 and not caller.scope.is_module and _repeated_between_training(graph, caller.scope, depth + 1):
            return True
    return False


def _trains_in(graph: CallGraph, scope: Function, loops: list[cst.CSTNode], besides: Call | None = None) -> bool:
    """A call of `scope` inside one of `loops` (other than `besides`) runs a
    backward pass: that loop trains between the passes it repeats."""
    return any(
        call is not besides
        and any(around is loop for around in call.loops for loop in loops)
        and graph.call_runs_backward(call)
        for call in scope.calls
    )


def _binds_more_than_once(body: cst.CSTNode, path: str, resetting: frozenset[str] = _RESETTING) -> bool:
    """Reset (a `resetting` method called on it) or bound more than once."""
    count = 0
    for node in iter_nodes(body):
        if type(node) is cst.Call and type(node.func) is cst.Attribute and dotted_name(node.func.value) == path:
            if node.func.attr.value in resetting - {"__init__"}:
                return True
        if type(node) is cst.Assign and any(dotted_name(target.target) == path for target in node.targets):
            count += 1
    return count > 1


def _local_metric(
    graph: CallGraph,
    scope: Function,
    path: str,
    metric_class: str,
    construction: Call,
    updating: frozenset[str] = _UPDATING,
    resetting: frozenset[str] = _RESETTING,
) -> GrowingMetric | None:
    """`auroc = AUROC()` before `for epoch ...: train...; for batch in val_loader:
    auroc.update(...)`: one metric for every epoch of training, never reset. The
    loop that repeats the passes trains (a backward pass or an optimizer step in
    it, outside the loop that updates): nested loops alone are no epochs (an
    evaluation that scores every query against every batch is one pass)."""
    if "." in path or path in scope.outer_names:
        return None
    updated, reset, escapes = _uses([scope.node], path, updating, resetting)
    if escapes or _binds_more_than_once(scope.node, path, resetting) or not updated:
        return None
    calls = {id(call.node): call for call in scope.calls}
    outside = {id(loop) for loop in construction.loops}
    for node in updated:
        call = calls.get(id(node))
        if call is None:
            continue
        # The loops around the update that the construction is not in, outermost first.
        passes = [loop for loop in call.loops if isinstance(loop, _LOOPS) and id(loop) not in outside]
        if len(passes) < 2:
            continue
        # An outer one of them trains: it repeats the passes over the data between updates.
        if _trains_in(graph, scope, passes[:-1]):
            return GrowingMetric(path, metric_class, construction.node, call)
    return None


__all__ = ["GrowingMetric", "growing_metrics"]
