"""What a function of the file does with the values it is given: one level of
summaries for the OOM3xx rules, built from the function's own code.

- `keeps(function)`: the parameters it stores or adds into a container that
  outlives the call: a container of another parameter (`record(history, out)`
  appends `out` to `history["outputs"]`), an attribute of `self`
  (`self.sum += val * n` in a metric's `update`), or a module-level or
  enclosing function's name (a forward hook's `activations.append(output)`).
- `forward_hooks()`: the functions registered with `register_forward_hook`,
  with the parameter that receives the module's output.
- `cleared(name)`: whether anything in the file empties or rebinds a
  container after its first binding (`.clear()`, `del x[:]`, `x = []` in a
  function), so that what it keeps may not outlive a step.

Everything is worked out on demand, for the candidates a rule already has,
and cached per file.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import UNKNOWN, get_arg
from oom_lsp.analysis.dataflow import (
    FileFacts,
    assigned_names,
    facts_for,
    iter_nodes,
    value_path,
)

STORING_METHODS = {"append": 0, "extend": 0, "insert": 1}
# `p.cpu()`, `p.float()`: still the parameter's tensor, graph and all.
_KEEPING_METHODS = frozenset({"cpu", "to", "float", "half", "bfloat16", "clone", "contiguous", "squeeze", "view"})
_EMPTYING_METHODS = frozenset({"clear", "pop", "popleft", "popitem", "remove"})
_ACCUMULATING = frozenset({cst.AddAssign, cst.SubtractAssign})
_HOOK_RE = re.compile(r"\.register_forward_hook\(\s*(self\.)?([A-Za-z_]\w*)\s*([,)])")


@dataclass(frozen=True)
class Keep:
    """A parameter a function keeps beyond the call."""

    param: str
    # The container as the function spells it: "history['outputs']", "self.sum", "activations".
    container: str
    # Whose container it is: a parameter's name, "self", or None for a name
    # of the module or of an enclosing function.
    owner: str | None
    accumulates: bool
    node: cst.CSTNode


class FileEffects:
    def __init__(self, context: FileContext) -> None:
        self.context: FileContext = weakref.proxy(context)
        self.facts: FileFacts = facts_for(context)
        self._keeps: dict[cst.FunctionDef, tuple[Keep, ...]] = {}
        self._hooks: dict[cst.FunctionDef, str] | None = None
        self._cleared: dict[str, bool] = {}

    # --- what a function keeps ---------------------------------------------
    def keeps(self, function: cst.FunctionDef) -> tuple[Keep, ...]:
        known = self._keeps.get(function)
        if known is None:
            known = self._keeps[function] = self._find_keeps(function)
        return known

    def _find_keeps(self, function: cst.FunctionDef) -> tuple[Keep, ...]:
        if self.facts.summary(function).backward_calls:
            return ()  # it backpropagates what it is given: the graph is wanted
        # A parameter the function rebinds to a graph-free value (`if
        # torch.is_tensor(val): val = val.detach().item()`, the usual meter's
        # guard) is that value from there on: what it keeps is no graph.
        params = _param_names(function) - _freed_parameters(function)
        local = {
            name.partition(".")[0]
            for statement in _body(function)
            for node in iter_nodes(statement)
            for name, _ in assigned_names(node)
        } - params
        found: list[Keep] = []
        for statement in _body(function):
            for node in iter_nodes(statement):
                kept = _kept_value(node)
                if kept is None:
                    continue
                container, value, accumulates = kept
                param = _parameter_in(value, params, accumulates)
                path = value_path(container)
                if param is None or path is None:
                    continue
                base = re.split(r"[.\[]", path, maxsplit=1)[0]
                if base in local:
                    continue  # a local container dies with the call
                owner = base if base in params else None
                if base == "self" and "self" in params:
                    owner = "self"
                found.append(Keep(param, path, owner, accumulates, node))
        return tuple(found)

    # --- forward hooks -------------------------------------------------------
    def forward_hooks(self) -> dict[cst.FunctionDef, str]:
        """Functions registered as forward hooks, each with the name of the
        parameter that receives the module's output."""
        if self._hooks is None:
            self._hooks = {}
            source = self.context.source
            if "register_forward_hook" in source:
                by_name: dict[str, list[cst.FunctionDef]] = {}
                for function in self.facts.functions():
                    by_name.setdefault(function.name.value, []).append(function)
                for match in _HOOK_RE.finditer(source):
                    with_kwargs = match.group(3) == "," and "with_kwargs=True" in source[match.end() : match.end() + 80]
                    candidates = by_name.get(match.group(2), [])
                    if len(candidates) != 1:
                        continue
                    function = candidates[0]
                    positional = [param.name.value for param in function.params.params]
                    if match.group(1) and positional[:1] == ["self"]:
                        positional = positional[1:]
                    index = 3 if with_kwargs else 2
                    if len(positional) > index:
                        self._hooks[function] = positional[index]
        return self._hooks

    # --- whether a container is emptied ------------------------------------------
    def cleared(self, name: str) -> bool:
        """Anything in the file empties `name` or binds it again after its
        first binding: what it keeps may then not outlive a step."""
        known = self._cleared.get(name)
        if known is None:
            known = self._cleared[name] = self._find_clearing(name)
        return known

    def _find_clearing(self, name: str) -> bool:
        bindings = 0
        for scope in (None, *self.facts.functions()):
            summary = self.facts.summary(scope)
            bindings += len(summary.bindings.get(name, ()))
            for mention, ancestors in summary.uses_of(name):
                parent = ancestors[-1] if ancestors else None
                if (
                    type(parent) is cst.Attribute
                    and parent.attr.value in _EMPTYING_METHODS
                    and len(ancestors) >= 2
                    and type(ancestors[-2]) is cst.Call
                ):
                    return True
                if type(parent) is cst.Subscript and any(type(a) is cst.Del for a in ancestors):
                    return True
                if type(parent) is cst.Subscript and any(
                    type(a) is cst.AssignTarget and type(a.target) is cst.Subscript and a.target.value is mention
                    and type(a.target.slice[0].slice) is cst.Slice
                    for a in ancestors
                ):
                    return True  # `x[:] = []`
        return bindings > 1


def _body(function: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    return function.body.body if type(function.body) is cst.IndentedBlock else ()


def _param_names(function: cst.FunctionDef) -> set[str]:
    params = function.params
    return {param.name.value for param in (*params.posonly_params, *params.params, *params.kwonly_params)}


def _kept_value(node: cst.CSTNode) -> tuple[cst.BaseExpression, cst.BaseExpression, bool] | None:
    """(container, value, accumulates) for `c.append(v)`, `c.insert(i, v)`,
    `c[k] = v`, `c += v`, `c = c + v`."""
    node_type = type(node)
    if node_type is cst.Call:
        func = node.func
        if type(func) is not cst.Attribute or func.attr.value not in STORING_METHODS:
            return None
        stored = get_arg(node, "object", STORING_METHODS[func.attr.value])
        if stored is None or stored is UNKNOWN or stored.star:
            return None
        return func.value, stored.value, False
    if node_type is cst.Assign and len(node.targets) == 1:
        target = node.targets[0].target
        if type(target) is cst.Subscript:
            return target.value, node.value, False
        value = node.value
        if (
            type(value) is cst.BinaryOperation
            and type(value.operator) is cst.Add
            and dotted_name(value.left) is not None
            and dotted_name(value.left) == dotted_name(target)
        ):
            return target, value.right, True
        return None
    if node_type is cst.AugAssign and type(node.operator) in _ACCUMULATING:
        return node.target, node.value, True
    return None


# Calls whose result holds no graph: a Python number or list, an array, a detached tensor.
_GRAPH_FREEING_METHODS = frozenset({"item", "detach", "detach_", "tolist", "numpy"})


def _freed_parameters(function: cst.FunctionDef) -> set[str]:
    """Parameters the function rebinds to a value without a graph."""
    params = _param_names(function)
    return {
        name
        for statement in _body(function)
        for node in iter_nodes(statement)
        for name, value in assigned_names(node)
        if name in params and value is not None and _frees_the_graph(value)
    }


def _frees_the_graph(value: cst.BaseExpression) -> bool:
    """`x.detach()`, `x.detach().cpu()`, `x.item()`, `float(x)`, or a
    conditional whose one branch is one of these (the other is the guard's
    non-tensor case: `x.item() if torch.is_tensor(x) else x`)."""
    if type(value) is cst.IfExp:
        return _frees_the_graph(value.body) or _frees_the_graph(value.orelse)
    while type(value) is cst.Call:
        func = value.func
        if type(func) is cst.Name:
            return func.value in ("float", "int")
        if type(func) is not cst.Attribute:
            return False
        if func.attr.value in _GRAPH_FREEING_METHODS:
            return True
        value = func.value
    return False


def _parameter_in(value: cst.BaseExpression, params: set[str], accumulates: bool) -> str | None:
    """The parameter `value` is, still with its graph: `p`, `p[0]`, `p.cpu()`;
    for an accumulation also a product or quotient of it (`val * n`)."""
    while True:
        value_type = type(value)
        if value_type is cst.Name:
            return value.value if value.value in params and value.value != "self" else None
        if value_type is cst.Subscript:
            value = value.value
        elif (
            value_type is cst.Call
            and type(value.func) is cst.Attribute
            and value.func.attr.value in _KEEPING_METHODS
        ):
            value = value.func.value
        elif accumulates and value_type is cst.BinaryOperation and type(value.operator) in (cst.Multiply, cst.Divide):
            left = _parameter_in(value.left, params, accumulates)
            return left if left is not None else _parameter_in(value.right, params, accumulates)
        else:
            return None


def bind_arguments(call: cst.Call, function: cst.FunctionDef, *, bound_self: bool) -> dict[str, cst.BaseExpression] | None:
    """Each parameter of `function` with the argument `call` passes it
    (`bound_self`: a method called on an object, whose `self` is implicit);
    None when a splat hides which is which."""
    if any(arg.star for arg in call.args):
        return None
    names = [param.name.value for param in (*function.params.posonly_params, *function.params.params)]
    if bound_self and names[:1] == ["self"]:
        names = names[1:]
    bound: dict[str, cst.BaseExpression] = {}
    positional = [arg for arg in call.args if arg.keyword is None]
    for name, arg in zip(names, positional):
        bound[name] = arg.value
    for arg in call.args:
        if arg.keyword is not None:
            bound[arg.keyword.value] = arg.value
    return bound


_EFFECTS: weakref.WeakKeyDictionary[FileContext, FileEffects] = weakref.WeakKeyDictionary()


def effects_for(context: FileContext) -> FileEffects:
    """The file's function summaries, built once per analysis and shared by every rule."""
    effects = _EFFECTS.get(context)
    if effects is None:
        effects = _EFFECTS[context] = FileEffects(context)
    return effects
