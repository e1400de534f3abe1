"""Whether a model's parameters are frozen where a forward call runs.

An operation records an autograd graph only when one of its inputs requires
grad. A module whose parameters were all switched off
(`model.requires_grad_(False)`, `for p in model.parameters(): p.requires_grad
= False`) and called on data records nothing and keeps no activation, whatever
the grad mode: `torch.no_grad()` around it would save no memory.

What decides it, for a model path (`net`, `self.G`) at a call:

- the last `requires_grad_(...)` on that module or on a module that contains
  it (`sampler.eval().requires_grad_(False)` covers `sampler.G`), or a loop
  over its `parameters()` that sets every one, before the call in its scope
  and on every path to it;
- when its scope sets nothing: the value the name was bound to, frozen where it
  was built (`vgg = vgg16().features.eval().requires_grad_(False)`); for an
  attribute of `self`, a freeze of it in any method of the class (its
  `__init__`) and no unfreeze in any.

Freezing a submodule (`model.encoder.requires_grad_(False)`) does not freeze
the model, and a loop that freezes only some parameters (under an `if`) does
not count.
"""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import get_arg
from oom_lsp.analysis.facts.program import Binding, Call, Function, Klass

# Methods that return the module they are called on.
_SAME_MODULE_METHODS = frozenset(
    {"eval", "train", "to", "cuda", "cpu", "half", "float", "bfloat16", "double", "requires_grad_", "to_empty"}
)
_PARAMETER_ITERATORS = frozenset({"parameters", "named_parameters"})


def frozen_at(call: Call, model: str) -> bool:
    """Whether every parameter of `model` (a path in the call's scope) has
    `requires_grad` off when `call` runs."""
    decided = _local_state(call, model)
    if decided is not None:
        return not decided
    if _bound_frozen(call.scope, model, call.index):
        return True
    head, _, rest = model.partition(".")
    scope = call.scope
    owner = scope.owner if scope.self_name is not None and head == scope.self_name else None
    if owner is not None and rest:
        return _frozen_in_class(owner, rest)
    return False


def switches_grad(call: Call) -> tuple[str, bool] | None:
    """(the module's path, requires_grad after it) for `m.requires_grad_(flag)`
    and for a loop over `m.parameters()` setting each one's `requires_grad`;
    None for any other call."""
    func = call.node.func
    if type(func) is not cst.Attribute:
        return None
    if func.attr.value == "requires_grad_":
        path = _module_path(func.value)
        flag = _flag(call.node)
        return (path, flag) if path is not None and flag is not None else None
    if func.attr.value in _PARAMETER_ITERATORS and type(call.statement) is cst.For:
        loop = call.statement
        if loop.iter is not call.node:
            return None
        path = _module_path(func.value)
        parameter = _loop_parameter(loop, func.attr.value)
        if path is None or parameter is None:
            return None
        flag = _body_sets_requires_grad(loop, parameter)
        return (path, flag) if flag is not None else None
    return None


# --- within the scope ----------------------------------------------------------
def _local_state(call: Call, model: str) -> bool | None:
    """requires_grad after the last switch before the call that runs on every
    path to it, or None when the scope switches nothing."""
    around_call = {id(statement) for statement in call.path}
    decided: bool | None = None
    for other in call.scope.calls:
        if other.index >= call.index:
            break
        switched = switches_grad(other)
        if switched is None:
            continue
        path, flag = switched
        if not (model == path or model.startswith(path + ".")):
            continue
        unconditional = all(
            id(statement) in around_call
            for statement in other.path[:-1]
            if type(statement) in (cst.If, cst.Match, cst.Try)
        )
        if unconditional:
            decided = flag
        elif flag:
            decided = True  # unfrozen on some path
    return decided


def _bound_frozen(scope: Function, model: str, before: int) -> bool:
    """The model's name was last bound (before statement `before`) to a
    module frozen where it was built."""
    if "." in model:
        return False
    bindings = [binding for binding in scope.bindings.get(model, ()) if binding.index < before]
    return bool(bindings) and _value_frozen(bindings[-1])


def _frozen_in_class(owner: Klass, attribute: str) -> bool:
    """`self.<attribute>` (or a module containing it) is frozen in some method
    of the class and unfrozen in none."""
    frozen = False
    for methods in owner.methods.values():
        for method in methods:
            self_name = method.self_name
            if self_name is None:
                continue
            target = f"{self_name}.{attribute}"
            for call in method.calls:
                switched = switches_grad(call)
                if switched is None:
                    continue
                path, flag = switched
                if target == path or target.startswith(path + "."):
                    if flag:
                        return False
                    frozen = True
    if frozen:
        return True
    first = attribute.partition(".")[0]
    bindings = owner.attributes.get(first, [])
    return len(bindings) == 1 and first == attribute and _value_frozen(bindings[0])


def _value_frozen(binding: Binding) -> bool:
    """`vgg16().features.eval().requires_grad_(False)`: the value is a chain
    of module methods whose last `requires_grad_` turns gradients off."""
    value = binding.value
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in _SAME_MODULE_METHODS:
        if value.func.attr.value == "requires_grad_":
            return _flag(value) is False
        value = value.func.value
    return False


# --- the syntax of a switch -------------------------------------------------------
def _module_path(expr: cst.BaseExpression) -> str | None:
    while type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value in _SAME_MODULE_METHODS:
        expr = expr.func.value
    return dotted_name(expr)


def _flag(call: cst.Call) -> bool | None:
    """requires_grad_() -> True; requires_grad_(False) -> False; a variable -> None."""
    arg = get_arg(call, "requires_grad", 0)
    if arg is None:
        return True
    if isinstance(arg, cst.Arg) and type(arg.value) is cst.Name and arg.value.value in ("True", "False"):
        return arg.value.value == "True"
    return None


def _loop_parameter(loop: cst.For, iterator: str) -> str | None:
    target = loop.target
    if iterator == "parameters":
        return target.value if type(target) is cst.Name else None
    if type(target) is cst.Tuple and len(target.elements) == 2 and type(target.elements[1].value) is cst.Name:
        return target.elements[1].value.value  # type: ignore[union-attr]
    return None


def _body_sets_requires_grad(loop: cst.For, parameter: str) -> bool | None:
    """The flag every iteration sets: a statement directly in the loop body
    (`p.requires_grad = False`, `p.requires_grad_(False)`); under an `if` only
    some parameters are set, which decides nothing."""
    body = loop.body
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target = small.targets[0].target
                if dotted_name(target) == f"{parameter}.requires_grad" and type(small.value) is cst.Name:
                    if small.value.value in ("True", "False"):
                        return small.value.value == "True"
            if isinstance(small, cst.Expr) and type(small.value) is cst.Call:
                func = small.value.func
                if type(func) is cst.Attribute and func.attr.value == "requires_grad_" and dotted_name(func.value) == parameter:
                    return _flag(small.value)
    return None
