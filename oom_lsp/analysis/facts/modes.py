"""Train/eval mode of the model a forward call runs, merged over callers.

`model.eval()` changes dropout and batch norm; code that calls it is
evaluating the model. Whether a forward call runs a model in eval mode is
decided by the last `.eval()` / `.train(...)` on that model (or on a module
that contains it: `model.eval()` covers `model.encoder(x)`) before the call
in its own scope, in statement order; when its scope switches nothing, by the
mode the model had at each call of the scope (a parameter bound to the
caller's model, `self.x` shared by the methods of one instance), and by the
frameworks' hooks (`prediction_step` of a transformers Trainer runs in eval
mode). Unknown callers leave the mode unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import bound_arguments, get_arg
from oom_lsp.analysis.facts.contexts import _LOCAL_TO_GRAD, CallGraph, _method_scope
from oom_lsp.analysis.facts.library import Grad, Mode
from oom_lsp.analysis.facts.program import Call, Function

# How many callers up a mode is looked for.
_MAX_DEPTH = 4


class ModeFacts:
    def __init__(self, graph: CallGraph) -> None:
        self.graph = graph
        # Per scope: (the switching call, model path, mode) of each switch, in order.
        self._switches: dict[int, list[tuple[Call, str, Mode]]] = {}
        self._memo: dict[tuple[int, str], Mode] = {}
        self._entry_contexts: dict[tuple[int, str | None], frozenset[tuple[Grad, Mode]]] = {}

    def switches(self, scope: Function) -> list[tuple[Call, str, Mode]]:
        known = self._switches.get(id(scope))
        if known is None:
            known = self._switches[id(scope)] = [
                switch for call in scope.calls if (switch := _switch(call)) is not None
            ]
        return known

    def switch_of(self, call: Call) -> tuple[Call, str, Mode] | None:
        return _switch(call)

    def mode_at(self, call: Call, model: str, depth: int = 0) -> Mode:
        """The modes `model` (a dotted path in the call's scope) may be in when `call` runs."""
        local = self.local_mode(call, model)
        if local is None:
            return self.entry_mode(call.scope, model, depth)
        if local.conditional:
            return local.mode | self.entry_mode(call.scope, model, depth)
        return local.mode

    # --- grad and mode together, per path of callers ------------------------------
    def contexts_at(self, call: Call, model: str | None, depth: int = 0) -> frozenset[tuple[Grad, Mode]]:
        """The (grad mode, model mode) pairs `call` may run with, one per path
        of callers: a helper called by a training loop with autograd on and by
        an evaluation loop under `no_grad` runs in (ON, TRAIN) and (OFF, EVAL),
        never in (ON, EVAL). `model`: the model's path in the call's scope
        (None: the grad mode alone matters)."""
        local_grad = _LOCAL_TO_GRAD.get(call.local_grad) if call.local_grad is not None else None
        local = self.local_mode(call, model) if model is not None else None
        if local_grad is not None and local is not None and not local.conditional:
            return frozenset({(local_grad, local.mode)})
        pairs = set()
        for grad, mode in self.entry_contexts(call.scope, model, depth):
            if local is None:
                decided = mode
            elif local.conditional:
                decided = local.mode | mode
            else:
                decided = local.mode
            pairs.add((local_grad if local_grad is not None else grad, decided))
        return frozenset(pairs)

    def entry_contexts(self, scope: Function, model: str | None, depth: int = 0) -> frozenset[tuple[Grad, Mode]]:
        key = (id(scope), model)
        known = self._entry_contexts.get(key)
        if known is not None:
            return known
        # While it is worked out (recursion): unknown.
        self._entry_contexts[key] = frozenset({(Grad.UNKNOWN, Mode.UNKNOWN)})
        result = frozenset(self._compute_entry_contexts(scope, model, depth))
        self._entry_contexts[key] = result
        return result

    def _compute_entry_contexts(self, scope: Function, model: str | None, depth: int) -> set[tuple[Grad, Mode]]:
        graph = self.graph
        if scope.is_module:
            return {(Grad.ON, Mode.UNKNOWN)}
        declared = graph.declared_grad(scope)
        hook = graph.framework_hook(scope)
        method = _method_scope(scope)
        self_name = method.self_name if method is not None else None
        if hook is not None:
            own_model = model is not None and model.partition(".")[0] == self_name
            return {(hook.grad, hook.mode if own_model else Mode.UNKNOWN)}
        if depth >= _MAX_DEPTH:
            return {(declared or Grad.UNKNOWN, Mode.UNKNOWN)}
        pairs: set[tuple[Grad, Mode]] = set()
        for caller in graph.callers(scope):
            translated = self._translate(caller, scope, model, self_name) if model is not None else None
            if translated is None:
                sub = {(grad, Mode.UNKNOWN) for grad, _ in self.contexts_at(caller, None, depth + 1)}
            else:
                sub = set(self.contexts_at(caller, translated, depth + 1))
            for grad, mode in sub:
                pairs.add((declared or grad, mode))
        # Callers the file cannot see run a method on a constructed instance:
        # its own model is in the mode its constructor left it in, when no method
        # of the class switches it otherwise.
        unseen = self._constructed_mode(method, model) if method is not None and model is not None else Mode.UNKNOWN
        for reference in graph.escapes(scope):
            pairs.add((declared or graph.escape_grad(reference), unseen))
        external = graph.external_grad(scope)
        if external != Grad.NONE:
            pairs.add((declared or external, unseen))
        if not pairs:
            pairs.add((declared or Grad.UNKNOWN, unseen))
        return pairs

    def _constructed_mode(self, method: Function, model: str) -> Mode:
        """The mode `__init__` puts the instance's own model in (`self.model.eval()`
        at the constructor's top level), when every switch of it in the class's
        methods is that same mode; else unknown."""
        owner = method.owner
        self_name = method.self_name
        if owner is None or self_name is None or not model.startswith(self_name + "."):
            return Mode.UNKNOWN
        attribute = model[len(self_name) + 1 :]
        found = Mode.NONE
        constructed = Mode.NONE
        for overloads in owner.methods.values():
            for function in overloads:
                if function.self_name is None:
                    continue
                for switch, switched, mode in self.switches(function):
                    if not _covers(switched, f"{function.self_name}.{attribute}"):
                        continue
                    found |= mode
                    if function.name == "__init__" and _at_top_level(switch):
                        constructed |= mode
        return constructed if constructed != Mode.NONE and found == constructed else Mode.UNKNOWN

    def local_mode(self, call: Call, model: str) -> LocalMode | None:
        """What the switches of the call's own scope before it say, or None.

        A switch under an `if` (or in an exception handler) that does not also
        hold the call is an alternative, not a decision: its mode joins the one
        before it (`model.train() if training else model.eval()`)."""
        decided: LocalMode | None = None
        for switch, switched, mode in self.switches(call.scope):
            if switch.index >= call.index:
                break
            if not _covers(switched, model):
                continue
            if _holds(switch, call):
                decided = LocalMode(mode, conditional=False)
            elif decided is None:
                decided = LocalMode(mode, conditional=True)
            else:
                decided = LocalMode(decided.mode | mode, decided.conditional)
            if _rebound_between(call.scope, model, switch.index, call.index):
                decided = None  # `f = torch.jit.freeze(f.eval())`: another object now
        return decided

    def entry_mode(self, scope: Function, model: str, depth: int = 0) -> Mode:
        """The modes `model` may be in when `scope` is entered."""
        key = (id(scope), model)
        known = self._memo.get(key)
        if known is not None:
            return known
        self._memo[key] = Mode.UNKNOWN  # while it is worked out: recursion
        result = self._entry_mode(scope, model, depth)
        self._memo[key] = result
        return result

    def _entry_mode(self, scope: Function, model: str, depth: int) -> Mode:
        hook = self.graph.framework_hook(scope)
        method = _method_scope(scope)
        self_name = method.self_name if method is not None else None
        head, _, rest = model.partition(".")
        if hook is not None and self_name is not None and head == self_name:
            return hook.mode
        if depth >= _MAX_DEPTH or scope.is_module:
            return Mode.UNKNOWN if not scope.is_module else Mode.TRAIN
        callers = self.graph.callers(scope)
        if not callers:
            return self._constructed_mode(method, model) if method is not None else Mode.UNKNOWN
        result = Mode.NONE
        for caller in callers:
            translated = self._translate(caller, scope, model, self_name)
            if translated is None:
                result |= Mode.UNKNOWN
            else:
                result |= self.mode_at(caller, translated, depth + 1)
        return result

    def _translate(self, caller: Call, scope: Function, model: str, self_name: str | None) -> str | None:
        """The caller's name for the callee's `model`: an argument bound to a
        parameter, or `self.x` when the caller calls a method of its own instance."""
        head, dot, rest = model.partition(".")
        if scope.parent is not None and not scope.parent.is_module and scope.owner is None and head not in scope.params:
            return model  # a closure reads its enclosing function's names
        if self_name is not None and head == self_name:
            func = caller.node.func
            caller_method = _method_scope(caller.scope)
            if (
                type(func) is cst.Attribute
                and type(func.value) is cst.Name
                and caller_method is not None
                and func.value.value == caller_method.self_name
            ):
                return caller_method.self_name + dot + rest
            return None
        if head in scope.params:
            argument = _argument_for(caller.node, scope, head)
            if argument is None:
                return None
            path = dotted_name(argument)
            return path + dot + rest if path is not None else None
        if scope.parent is not None and scope.parent.is_module and scope.owner is None:
            return model  # a module-level function reads the module's names
        return None


@dataclass(frozen=True)
class LocalMode:
    mode: Mode
    # Only some paths to the call switch it: the mode before them also applies.
    conditional: bool


_CONDITIONAL = frozenset({cst.If, cst.Match})


def _holds(switch: Call, call: Call) -> bool:
    """Every conditional statement around the switch also holds the call: the
    switch runs on every path that reaches the call."""
    around_call = {id(statement) for statement in call.path}
    return all(
        id(statement) in around_call
        for statement in switch.path[:-1]
        if type(statement) in _CONDITIONAL
    )


_SAME_MODULE_METHODS = frozenset({"eval", "train", "to", "cuda", "cpu", "half", "float", "bfloat16", "double"})


def _rebound_between(scope: Function, model: str, start: int, end: int) -> bool:
    """A binding of the model's name from statement `start` up to (not
    including) `end`, other than the same module switched or moved
    (`model = model.eval()`, `net = net.to(device)`)."""
    head = model.partition(".")[0]
    for binding in scope.bindings.get(head, ()):
        if not start <= binding.index < end:
            continue
        if binding.value is not None and _same_module(binding.value, head):
            continue
        return True
    return False


def _same_module(value: cst.BaseExpression, name: str) -> bool:
    while type(value) is cst.Call and type(value.func) is cst.Attribute and value.func.attr.value in _SAME_MODULE_METHODS:
        value = value.func.value
    return type(value) is cst.Name and value.value == name


def _argument_for(call: cst.Call, function: Function, param: str) -> cst.BaseExpression | None:
    """The expression bound to `param` by `call` (None when it cannot be told)."""
    params = list(function.params)
    bound_self = function.self_name is not None and type(call.func) is cst.Attribute
    if bound_self and params:
        params = params[1:]
    return bound_arguments(call, params).get(param)


def _switch(call: Call) -> tuple[Call, str, Mode] | None:
    """`m.eval()` -> (index, "m", EVAL); `m.train()` / `m.train(True)` -> TRAIN;
    `m.train(False)` -> EVAL; `m.train(flag)` -> both."""
    func = call.node.func
    if type(func) is not cst.Attribute or func.attr.value not in ("eval", "train"):
        return None
    model = dotted_name(func.value)
    if model is None:
        return None
    if func.attr.value == "eval":
        if call.node.args:
            return None  # not nn.Module.eval()
        return call, model, Mode.EVAL
    mode = get_arg(call.node, "mode", 0)
    if mode is None:
        return call, model, Mode.TRAIN
    if isinstance(mode, cst.Arg) and type(mode.value) is cst.Name and mode.value.value in ("True", "False"):
        return call, model, Mode.TRAIN if mode.value.value == "True" else Mode.EVAL
    return call, model, Mode.TRAIN | Mode.EVAL


def _covers(switched: str, model: str) -> bool:
    """A switch of `switched` sets the mode of `model`: the same path, or a
    module that contains it (`model.eval()` covers `model.encoder`)."""
    return model == switched or model.startswith(switched + ".")


def _at_top_level(call: Call) -> bool:
    """The statement of the call is one of its function's own statements (not
    under an `if`, a `try` or a `with`)."""
    node = call.scope.node
    body = getattr(node, "body", None)
    statements = getattr(body, "body", ())
    return any(statement is call.statement for statement in statements)
