"""Forward passes that record a graph no backward pass will use.

The fact that decides OOM303: a forward call of a model runs with autograd
on (the grad mode of its statement, merged over the callers of its
function), the model is in eval mode there (its last `.eval()` / `.train()`,
here or in the callers), and no backward pass consumes what it computes (none
in the loop iteration around it, none in the function when it is not in a
loop, and its result does not flow to a caller's backward). Its activations
are then kept alive for nothing until the outputs are dropped.

Names of functions (`evaluate`, `predict`) decide nothing: a function named
`predict` that trains, or a `train_one_epoch` that evaluates, are told apart
by what they do.
"""

from __future__ import annotations

import enum
import weakref
from dataclasses import dataclass, replace

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.dataflow import Kind, Role, assigned_names, facts_for, iter_nodes, value_path
from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.facts import flags, library
from oom_lsp.analysis.facts.contexts import (
    _MODULE_RETURNING,
    FORWARD_METHODS,
    CallGraph,
    _assigned_from,
    _method_scope,
    call_graph,
)
from oom_lsp.analysis.facts.frozen import frozen_at
from oom_lsp.analysis.facts.library import Grad, Mode
from oom_lsp.analysis.facts.loops import runs_a_few_times, unrolls_a_recurrence
from oom_lsp.analysis.facts.modes import ModeFacts
from oom_lsp.analysis.facts.program import Binding, BindingKind, Call, Function, Klass, LocalGrad
from oom_lsp.analysis.walker import child_fields, is_node


_UNASKED = object()


@dataclass(frozen=True, repr=False)
class EvalForward:
    call: Call
    model: str
    message: str
    # The whole function evaluates: decorating it is the fix.
    whole_function: bool
    # Else the statement (a loop, or the call's statement) to wrap, with its indentation.
    wrap: tuple[cst.CSTNode, str] | None
    # The path that still holds a graph of one batch when the next batch's
    # forward pass runs (`loss`, `output`): the evaluation then holds two
    # batches' activations, more than the training step it follows.
    kept_into_next_batch: str | None = None


# `model.forward(x)`, `model.forward_features(x)`: the methods a module call runs, called by name.
_FORWARD_SUFFIXES = tuple(sorted(f".{method}" for method in FORWARD_METHODS))
_LOOP_STATEMENTS = (cst.For, cst.While)
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


class EvaluationFacts:
    def __init__(self, context: FileContext) -> None:
        self.context: FileContext = weakref.proxy(context)
        self._context_ref = weakref.ref(context)  # for the fact caches, keyed by the context itself
        self.graph: CallGraph = call_graph(context)
        self.modes = ModeFacts(self.graph)
        self.flow_facts = facts_for(context)
        self._found: list[EvalForward] | None = None
        # forward_model's answers by Call (compared by identity, and kept alive here).
        self._forward_models: dict[Call, str | None] = {}
        self._switched: frozenset[str] | None = None
        # _loop_backward's answers by id(loop), each holding its loop alive.
        self._loops: dict[int, tuple[cst.CSTNode, list[Call], set[str | None], list[tuple[str | None, set[str]]]]] = {}

    def forwards_without_grad_use(self) -> list[EvalForward]:
        if self._found is None:
            self._found = []
            for scope in self.graph.program.functions:
                if scope.is_lambda or self._is_forward_method(scope):
                    continue
                found = [forward for call in scope.calls if (forward := self._check(call)) is not None]
                found += self._routed(scope, found)
                if found and self._evaluates_only(scope, found):
                    found = [replace(f, whole_function=True) for f in found]
                found = [replace(f, kept_into_next_batch=self.graph_kept_into_next_batch(f.call)) for f in found]
                self._found.extend(found)
        return self._found

    # --- the decision ---------------------------------------------------------
    def _check(self, call: Call) -> EvalForward | None:
        model = self.forward_model(call)
        if model is None:
            producer = self._graph_producer(call)
            if producer is not None and self._an_evaluation_path_by_flag(call, producer):
                return EvalForward(
                    call=call,
                    model=producer,
                    message=f"{producer}() runs with autograd on when it evaluates",
                    whole_function=False,
                    wrap=None,
                )
            return None
        if frozen_at(call, model):
            # A frozen model called on data records no graph: nothing to save.
            return None
        verdict = _judge(self.modes.contexts_at(call, model))
        if verdict is not _Verdict.REPORT or self._gradients_used(call):
            # One flag may choose between a training and an evaluation path here.
            if self._an_evaluation_path_by_flag(call, model):
                return EvalForward(
                    call=call,
                    model=model,
                    message=f"Forward pass of {model} runs with autograd on when it evaluates",
                    whole_function=False,
                    wrap=None,
                )
            if verdict is _Verdict.SILENT and self._losses_only_read_as_numbers(call):
                return EvalForward(
                    call=call,
                    model=model,
                    message=f"Forward pass of {model} runs with autograd on in a loop whose losses are only read",
                    whole_function=False,
                    wrap=self._wrap_target(call),
                )
            return None
        local = self.modes.local_mode(call, model)
        switched_here = local is not None and not local.conditional and local.mode is Mode.EVAL
        where = f"after {model}.eval()" if switched_here else "of a model in eval mode"
        return EvalForward(
            call=call,
            model=model,
            message=f"Forward pass {where} runs with autograd on",
            whole_function=False,
            wrap=self._wrap_target(call),
        )

    def _graph_producer(self, call: Call) -> str | None:
        """The name of a function the file does not define (`forward_model`
        imported from the project's utils) whose result a backward pass in the
        same loop uses (`outs = forward_model(...)`, `outs["loss"].backward()`):
        it records the graph, whatever it calls inside. None when the loop runs
        a model the facts know (its forward is the one to judge) or the call is
        something else."""
        loops = [loop for loop in call.loops if isinstance(loop, _LOOP_STATEMENTS)]
        if not loops or self.graph.callees(call) or self.graph.call_runs_backward(call):
            return None
        name = dotted_name(call.node.func)
        if name is None or self.context.qualified_name(call.node.func) is not None and name.startswith("torch"):
            return None
        loop = loops[-1]
        in_loop, backpropagated, aliases = self._loop_backward(call.scope, loop)
        if not backpropagated:
            return None
        produced = _assigned_from(call)
        # What is backpropagated is the result itself or a part of it
        # (`outs["loss"]`, `loss = outs.loss`), not a value computed from it
        # by another call: `inp = inp.cuda()` feeds the forward, not the loss.
        for root, names in aliases:
            if root in produced:
                produced = produced | names
        if not produced & backpropagated:
            return None
        if any(other is not call and self.forward_model(other) is not None for other in in_loop):
            return None
        return name

    def _loop_backward(
        self, scope: Function, loop: cst.CSTNode
    ) -> tuple[list[Call], set[str | None], list[tuple[str | None, set[str]]]]:
        """For a loop of `scope`: its calls, the values its backward calls
        are made on (`_part_of` each receiver), and its assignments as (the
        value's root, the names bound) in source order. Asked for each call
        in the loop, so computed once per loop, and the body is read only when
        the loop runs a backward pass."""
        key = id(loop)
        known = self._loops.get(key)
        if known is None:
            in_loop = [other for other in scope.calls if any(enclosing is loop for enclosing in other.loops)]
            backpropagated = {
                _part_of(receiver)
                for other in in_loop
                if self.graph.call_runs_backward(other) and (receiver := _backward_receiver(other.node)) is not None
            }
            aliases = (
                [
                    (_part_of(node.value), {name for name, _ in assigned_names(node)})
                    for node in iter_nodes(loop.body)
                    if type(node) in (cst.Assign, cst.AnnAssign) and node.value is not None
                ]
                if backpropagated
                else []
            )
            known = self._loops[key] = (loop, in_loop, backpropagated, aliases)
        return known[1], known[2], known[3]

    def graph_kept_into_next_batch(self, call: Call, depth: int = 0) -> str | None:
        """The path that still holds a graph recorded in one iteration of the
        loop around `call` when the next iteration runs it again: a value
        derived from the call's result (`output = model(x)`, `loss =
        criterion(output, y)`, `ypred = unpack(ypred)`), or a container it is
        stored in (`preds.append(out)`), kept to the end of the loop's body.
        Without a backward pass nothing frees that graph before the next
        forward pass records its own, so two batches' activations are alive at
        once, more than the training step needs (its `backward()` frees the
        graph). A call in no loop, in a function that returns its result, is
        looked at where its callers call that function in a loop
        (`step = self.validation_step(batch)`). None when each iteration's
        graph dies within it (`correct += (model(x).argmax(1) == y).sum().item()`,
        `del loss`, `loss = loss.item()`)."""
        if call.loops and type(call.loops[-1]) in _COMPREHENSIONS:
            return self._kept_by_comprehension(call, call.loops[-1])
        loops = [loop for loop in call.loops if isinstance(loop, _LOOP_STATEMENTS)]
        if loops:
            return self._kept_in_loop(call, loops[-1])
        if depth >= 2 or call.scope.is_module or type(call.scope.node) is not cst.FunctionDef:
            return None
        body = call.scope.node.body
        derived = _derived_from(call, iter_nodes(body))
        returned = [node for node in iter_nodes(body) if type(node) is cst.Return and node.value is not None]
        if not any(node.value is call.node or _mentions(node.value, derived) for node in returned):
            return None
        for caller in self.graph.callers(call.scope):
            kept = self.graph_kept_into_next_batch(caller, depth + 1)
            if kept is not None:
                return kept
        return None

    def _kept_by_comprehension(self, call: Call, comprehension: cst.CSTNode) -> str | None:
        """`[model(x) for x in batches]`: the comprehension gathers every
        iteration's result, graphs and all."""
        elements = [comprehension.key, comprehension.value] if type(comprehension) is cst.DictComp else [comprehension.elt]  # type: ignore[attr-defined]
        scope = call.scope
        flow = self.flow_facts.flow(None if scope.is_module else scope.node)  # type: ignore[arg-type]
        if not any(
            element is call.node or (_mentions(element, {call.node}) and flow.kind_of(element).attached)
            for element in elements
        ):
            return None
        statement = call.path[-1] if call.path else None
        if type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                if type(small) is cst.Assign and small.value is comprehension and len(small.targets) == 1:
                    name = dotted_name(small.targets[0].target)
                    if name is not None:
                        return name
        return "the comprehension"

    def _kept_in_loop(self, call: Call, loop: cst.For | cst.While) -> str | None:
        if type(loop.body) is not cst.IndentedBlock:
            return None
        function = call.scope.node if type(call.scope.node) is cst.FunctionDef else None
        context = self._context_ref()
        if (context is not None and runs_a_few_times(context, loop, function)) or unrolls_a_recurrence(loop):  # type: ignore[arg-type]
            return None  # a loop over a few models or heads, or over one sequence's positions: not over batches
        body = loop.body.body
        position = next((i for i, statement in enumerate(body) if any(statement is node for node in call.path)), None)
        if position is None:
            return None
        scope = call.scope
        flow = self.flow_facts.flow(None if scope.is_module else scope.node)  # type: ignore[arg-type]
        at_end = flow.kinds_at_loop_end(loop)
        rebound_before = {
            name for statement in body[:position] for node in iter_nodes(statement) for name, _ in assigned_names(node)
        }
        after = [node for statement in body[position:] for node in iter_nodes(statement)]
        derived = _derived_from(call, after)
        # The last thing done to each path in the rest of the body: bound from
        # the call's result or from what derives from it, bound to something
        # else, deleted, or given a derived value to hold.
        last: dict[str, bool] = {}
        stored_last: set[str] = set()
        order: list[str] = []
        for node in after:
            whole = node.value if type(node) in (cst.Assign, cst.AugAssign, cst.AnnAssign) else None
            for name, value in _bound_or_deleted(node):
                value = whole if value is None else value  # `outputs, attns = model(src)`
                keeps = value is not None and (value is call.node or _mentions(value, derived))
                if type(node) is cst.AugAssign:
                    keeps = keeps or last.get(name, False)
                last[name] = keeps
                stored_last.discard(name)
                order.append(name)
            stored = _stored_into(node)
            if stored is not None and _mentions(stored[1], derived | {call.node}) and not flow.kind_of(stored[1]).free:
                last[stored[0]] = True
                stored_last.add(stored[0])
                order.append(stored[0])
        for name in dict.fromkeys(order):
            if name in rebound_before:
                continue
            kind = at_end.get(name)
            if kind is not None and kind.free and name not in stored_last:
                continue  # `loss = loss.item()`: a number by the body's end
            if last.get(name) or (kind is not None and kind.attached):
                return name
        return None

    def _losses_only_read_as_numbers(self, call: Call) -> bool:
        """A loop over batches whose losses are only ever read as numbers
        (`.item()`, `float()`, printed, logged), never backpropagated nor
        handed to code that could: an evaluation loop, whatever the model's
        mode and the function's name. The call runs in it with autograd on, on
        a path the file shows."""
        scope = call.scope
        loops = [loop for loop in call.loops if isinstance(loop, _LOOP_STATEMENTS)]
        if not loops:
            return False
        loop = loops[-1]
        if Grad.ON not in self.graph.grad_at(call) or self.graph.trains_in(loop, scope):
            return False
        if self.graph.result_feeds_a_backward(scope) is not False and not scope.is_module:
            return False
        flow = self.flow_facts.flow(None if scope.is_module else scope.node)  # type: ignore[arg-type]
        summary = self.flow_facts.summary(None if scope.is_module else scope.node)  # type: ignore[arg-type]
        # The losses: what the loop computes and reads with `.item()`, or a
        # scalar the data flow knows to be a loss.
        losses: set[str] = set()
        for other in scope.calls:
            if not any(enclosing is loop for enclosing in other.loops):
                continue
            func = other.node.func
            if type(func) is cst.Attribute and func.attr.value == "item" and not other.node.args:
                name = dotted_name(func.value)
                if name is not None:
                    losses.add(name)
            elif flow.kind_of(other.node) is Kind.GRAPH_SCALAR:
                losses.update(_assigned_from(other))
        if not losses:
            return False  # no loss computed: nothing says what the loop is for
        return all(
            _read_as_number(use, ancestors, losses) for name in losses for use, ancestors in summary.uses_of(name)
        )

    def _an_evaluation_path_by_flag(self, call: Call, model: str) -> bool:
        """A flag chooses between training and evaluation in the call's own
        function (`if is_train: model.train() else: model.eval()`, `if is_train:
        loss.backward()`): for some value of it the model is in eval mode, the
        forward runs with autograd on, and no backward pass runs."""
        scope = call.scope
        stop = None if scope.is_module else scope.node
        forward_guards = flags.guards_of(call.path, stop)
        if forward_guards is None:
            return False
        switches = [
            (switch, mode) for switch, switched, mode in self.modes.switches(scope)
            if switch.index < call.index and (model == switched or model.startswith(switched + "."))
        ]
        loops = [loop for loop in call.loops if isinstance(loop, _LOOP_STATEMENTS)]
        backwards = [
            other for other in scope.calls
            if (not loops or any(enclosing is loops[-1] for enclosing in other.loops))
            and self.graph.call_runs_backward(other)
        ]
        guarded: list[tuple[object, list[flags.Guard]]] = []
        for item in [*(switch for switch, _ in switches), *backwards]:
            guards = flags.guards_of(item.path, stop)
            if guards is None:
                return False
            guarded.append((item, guards))
        names = {guard.flag for _, guards in guarded for guard in guards} | {g.flag for g in forward_guards}
        grad_flag = _grad_flag(call)
        switch_flags = {switch_flag for switch, _ in switches if (switch_flag := _train_flag(switch)) is not None}
        names |= switch_flags | ({grad_flag} if grad_flag is not None else set())
        if len(names) != 1:
            return False
        [flag] = names
        root = flag.partition(".")[0]
        if loops and any(name.partition(".")[0] == root for node in iter_nodes(loops[-1].body) for name, _ in assigned_names(node)):
            # A value each batch computes (`if loss.requires_grad:`, `if not
            # torch.isfinite(loss)`) is no choice between a training and an
            # evaluation pass over the data.
            return False
        all_guards = [guard for _, guards in guarded for guard in guards] + list(forward_guards)
        values = flags.values_of(flag, all_guards) if all_guards else [True, False]
        if grad_flag is not None or switch_flags:
            values = [value for value in values if type(value) is bool] or [True, False]
        entry = self.graph.entry_grad(scope)
        trains_for = [
            value for value in values
            if any(
                flags.runs(next(guards for item, guards in guarded if item is backward), flag, value)
                for backward in backwards
            )
        ]
        if entry is Grad.UNKNOWN and trains_for and _bound_inside(scope, flag):
            # No caller in the file, but the flag is the function's own (`for
            # phase in ("train", "val")`): a caller cannot give its values
            # different grad modes, and its training path's backward needs
            # autograd on, so the function runs with autograd on.
            entry = Grad.ON
        for value in values:
            if flags.runs(forward_guards, flag, value) is not True:
                continue
            mode = Mode.UNKNOWN
            for switch, switch_mode in switches:
                switch_guards = next(guards for item, guards in guarded if item is switch)
                if flags.runs(switch_guards, flag, value):
                    if _train_flag(switch) == flag:
                        mode = Mode.TRAIN if flags.truthy(value) else Mode.EVAL
                    else:
                        mode = switch_mode
            # The model's mode decides nothing about the graph; without a
            # `.eval()` the path is still an evaluation when the same flag
            # chooses the training path's backward and this value runs none.
            if mode is Mode.TRAIN or (mode is not Mode.EVAL and (not trains_for or Grad.OFF in entry)):
                # (A caller that runs it under no_grad is then the evaluation's.)
                continue
            if grad_flag is not None:
                grad_on = flags.truthy(value)
            elif call.local_grad is not None:
                grad_on = call.local_grad is LocalGrad.ON
            else:
                grad_on = Grad.ON in entry  # a caller the file shows runs it with autograd on
            if not grad_on:
                continue
            if any(
                flags.runs(next(guards for item, guards in guarded if item is backward), flag, value)
                for backward in backwards
            ):
                continue
            return True
        return False

    def _routed(self, scope: Function, found: list[EvalForward]) -> list[EvalForward]:
        """Calls of `scope` whose callee runs a forward pass shared by training
        and evaluation, on the evaluation path (`self.infer(batch)` in a loop
        after `self.model.eval()`): the call is where the graph is recorded
        for nothing, and where the fix goes."""
        routed = []
        reported = {id(forward.call.node) for forward in found}
        for call in scope.calls:
            if id(call.node) in reported:
                continue
            for callee in self.graph.callees(call):
                for inner in callee.calls:
                    model = self.forward_model(inner)
                    if model is None or _judge(self.modes.contexts_at(inner, model)) is not _Verdict.SHARED:
                        continue
                    outer = self.modes._translate(call, callee, model, _self_name(callee))
                    if outer is None:
                        continue
                    if _judge(self.modes.contexts_at(call, outer)) is not _Verdict.REPORT:
                        continue
                    if self._gradients_used(call):
                        continue
                    name = callee.name if not callee.is_lambda else "the lambda"
                    routed.append(
                        EvalForward(
                            call=call,
                            model=outer,
                            message=f"{name}() runs a forward pass of {outer} in eval mode with autograd on",
                            whole_function=False,
                            wrap=self._wrap_target(call),
                        )
                    )
                    break
                else:
                    continue
                break
        return routed

    def model_made_here(self, forward: EvalForward) -> bool:
        """The model a forward pass runs is one this file makes (builds,
        loads or asks a builder for: `self.model = models.resnet18(...)`,
        `model = load_model(path)`, `self.model, self.layer = self._get_model()`),
        not one it is handed: no binding that reaches it is a parameter, or
        a name or attribute bound from one; and the code that runs it is not
        itself a module (whose submodules are part of a bigger model)."""
        path = forward.model
        scope = forward.call.scope
        head, _, attribute = path.partition(".")
        method = _method_scope(scope)
        if method is not None and method.owner is not None and self._is_a_module(method.owner):
            # A module's own submodules, run by its methods: part of a model that
            # whoever runs the model runs (a frozen VQ encoder in its `__init__`'s
            # `self.eval()`), not one this file serves.
            return False
        if attribute and method is not None and head == method.self_name and "." not in attribute:
            assert method.owner is not None
            bindings = self.graph.attribute_bindings(method.owner, attribute)
        elif not attribute:
            bindings = self.graph.program.lookup(path, scope)
        else:
            return False
        return bool(bindings) and not any(self._received(binding, 0) for binding in bindings)

    def _is_a_module(self, klass: Klass) -> bool:
        """A module class (its bases say so), or one that acts as one where the
        bases are imported relatively: it has a `forward`, or switches its own
        mode (`self.eval()` in `__init__`)."""
        if self.graph.is_module_class(klass) or self.graph.dispatch(klass, "forward"):
            return True
        for overloads in klass.methods.values():
            for function in overloads:
                if any(switched == function.self_name for _, switched, _ in self.modes.switches(function)):
                    return True
        return False

    def _received(self, binding: Binding, depth: int) -> bool:
        """Whether a binding may hold a value handed to the file's code from
        outside: a parameter, or a name bound from one (through `.to(device)`,
        `.eval()` and the other methods that return the module itself)."""
        if depth > 4 or binding.kind is BindingKind.PARAM:
            return True
        if binding.kind is BindingKind.ASSIGN:
            value = binding.value
        elif binding.kind is BindingKind.OTHER and _assignment(binding.node) is not None:
            value = _assignment(binding.node).value  # type: ignore[union-attr]  # `self.model, self.layer = self._get_model(name)`
        else:
            return True  # a loop variable, a `with` target, an import: not made here
        while (
            type(value) is cst.Call
            and type(value.func) is cst.Attribute
            and value.func.attr.value in _MODULE_RETURNING
        ):
            value = value.func.value
        if type(value) is cst.Call or value is None:
            return False
        if (
            type(value) is cst.Attribute
            and type(value.value) is cst.Name
            and binding.scope is not None
            and value.value.value == binding.scope.self_name
            and value.attr.value == binding.name
        ):
            return False  # `self.model = self.model.to(device)`: the same model, moved
        if type(value) is cst.Name and binding.scope is not None:
            return any(self._received(inner, depth + 1) for inner in self.graph.program.lookup(value.value, binding.scope))
        return True

    def forward_model(self, call: Call) -> str | None:
        """The model a call runs forward, as a path in its scope (`model`,
        `self.encoder`); None when the call is no forward pass. Answered once per
        call: the facts it reads are the file's, and `_routed` asks it of every call
        of every callee, once per call site."""
        known = self._forward_models.get(call, _UNASKED)
        if known is _UNASKED:
            known = self._forward_models[call] = self._forward_model(call)
        return known  # type: ignore[return-value]

    def _forward_model(self, call: Call) -> str | None:
        func = call.node.func
        if type(func) is cst.Attribute and func.attr.value in library.GRAPHLESS_METHODS:
            return None
        path = value_path(func)
        if path is None:
            return None
        for suffix in _FORWARD_SUFFIXES:
            if path.endswith(suffix):
                path = path[: -len(suffix)]
        callees = self.graph.callees(call)
        if any(callee.name in ("forward", "__call__") and callee.owner is not None and self.graph.is_module_class(callee.owner) for callee in callees):
            return path
        if callees:
            return None  # a function or method of the file, not a model
        scope_node = None if call.scope.is_module else call.scope.node
        if type(scope_node) is cst.Lambda:
            return None
        flow = self.flow_facts.flow(scope_node)  # type: ignore[arg-type]
        role = flow.callee(func, call.node).role
        if role is Role.MODULE:
            return path
        if role is Role.UNKNOWN and call.node.args and path.rpartition(".")[2] in self._switched_names():
            # `.eval()` with no argument is nn.Module's: a value switched to eval
            # mode and then called is a model.
            if Mode.EVAL in self.modes.mode_at(call, path):
                return path
        return None

    def _switched_names(self) -> frozenset[str]:
        """The last names of every path the file switches with `.eval()` / `.train()`."""
        if self._switched is None:
            self._switched = frozenset(
                switched.rpartition(".")[2]
                for scope in self.graph.program.functions
                for _, switched, _ in self.modes.switches(scope)
            )
        return self._switched

    def _gradients_used(self, call: Call) -> bool:
        """A backward pass uses what the forward computed: one in the loop
        iteration around it (a frozen eval-mode backbone trained through, an
        adversarial example), in its function when it is in no loop, or in a
        caller that receives the function's result."""
        graph = self.graph
        scope = call.scope
        loops = [loop for loop in call.loops if isinstance(loop, _LOOP_STATEMENTS)]
        if loops:
            if graph.trains_in(loops[-1], scope):
                return True
        elif graph.runs_backward(scope):
            return True
        return self.graph.result_feeds_a_backward(scope) is True

    def _evaluates_only(self, scope: Function, found: list[EvalForward]) -> bool:
        """Every forward pass of the function is an evaluation one, it runs no
        backward, and it is a plain function: decorating it is the whole fix."""
        if scope.is_module or type(scope.node) is not cst.FunctionDef:
            return False
        if self.graph.runs_backward(scope):
            return False
        if any(Mode.TRAIN in mode for _, _, mode in self.modes.switches(scope)):
            return False  # it also trains, or hands the model back in train mode
        models = {forward.model.split(".")[0] for forward in found}
        for call in scope.calls:
            if self.graph.callees(call):
                continue
            if any((value_path(arg.value) or "").split(".")[0] in models for arg in call.node.args):
                return False  # the model goes to code we cannot see, which may train it
        reported = {id(forward.call.node) for forward in found}
        return all(
            id(call.node) in reported for call in scope.calls if self.forward_model(call) is not None
        )

    def _is_forward_method(self, scope: Function) -> bool:
        """A model's own forward: its submodules' calls are part of the pass
        its callers run (and are reported there)."""
        return (
            scope.owner is not None
            and scope.name in ("forward", "__call__", "_forward", "forward_features")
            and self.graph.is_module_class(scope.owner)
        )

    # --- the fix -----------------------------------------------------------------
    def _wrap_target(self, call: Call) -> tuple[cst.CSTNode, str] | None:
        """The innermost loop statement around the call that switches no mode,
        else the call's own statement, with its indentation."""
        path = call.path
        candidates = [statement for statement in path if any(statement is loop for loop in call.loops)]
        for loop in reversed(candidates):
            if not _switches_mode(loop):
                return self._with_indent(loop, path)
            break
        statement = path[-1] if path else None
        if statement is None or isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or _switches_mode(statement):
            return None
        return self._with_indent(statement, path)

    def _with_indent(self, statement: cst.CSTNode, path: tuple[cst.CSTNode, ...]) -> tuple[cst.CSTNode, str] | None:
        if any(type(inner) is cst.Await for inner in iter_nodes(statement)):
            return None  # grad mode is per thread: another coroutine would run under it at the await
        indent = indent_in_path(statement, path, self.context.module)
        return (statement, indent) if indent is not None else None


class _Verdict(enum.Enum):
    REPORT = "report"  # evaluation with autograd on, on some path
    SHARED = "shared"  # also runs as a training forward on another path
    SILENT = "silent"


def _judge(pairs: frozenset[tuple[Grad, Mode]]) -> _Verdict:
    """Whether the (grad, mode) pairs of a forward call make it an
    evaluation pass with autograd on.

    A path with autograd on in eval mode is one. So is a path whose grad mode
    is unknown (its callers are elsewhere) in eval mode: the code that put
    the model in eval mode is in view, and evaluation code owns its grad
    mode. A grad mode chosen by a value at run time
    (`set_grad_enabled(phase == "train")`) is the author's decision."""
    evaluating = False
    training = False
    for grad, mode in pairs:
        if Grad.MAYBE in grad:
            continue
        if mode == Mode.EVAL and (Grad.ON in grad or grad == Grad.UNKNOWN):
            evaluating = True
        elif (Grad.ON in grad or grad == Grad.UNKNOWN) and Mode.TRAIN in mode:
            training = True
    if not evaluating:
        return _Verdict.SILENT
    return _Verdict.SHARED if training else _Verdict.REPORT


_NUMBER_READERS = frozenset({"item", "tolist"})
_NUMBER_FUNCTIONS = frozenset(
    {"float", "int", "round", "str", "print", "format", "add_scalar", "log", "info", "debug", "warning", "write",
     "set_postfix", "set_description", "log_metrics", "append"}
)  # fmt: skip


def _read_as_number(use: cst.CSTNode, ancestors: tuple[cst.CSTNode, ...], losses: set[str]) -> bool:
    """A mention of a loss that only reads its value: `loss.item()`, `float(loss)`,
    `f"{loss:.3f}"`, `print(loss)`, its own binding, or arithmetic that makes
    another of the losses (`total = content + 0.1 * adv`)."""
    index = len(ancestors) - 1
    while index >= 0 and type(ancestors[index]) in (cst.BinaryOperation, cst.UnaryOperation):
        index -= 1
    if index < len(ancestors) - 1:
        holder = ancestors[index] if index >= 0 else None
        if type(holder) is cst.Assign:
            return all(dotted_name(target.target) in losses for target in holder.targets)
        if type(holder) is cst.AugAssign:
            return dotted_name(holder.target) in losses
        return False
    parent = ancestors[-1] if ancestors else None
    if type(parent) is cst.AssignTarget or (type(parent) is cst.AugAssign and parent.target is use):
        return True
    if type(parent) is cst.Attribute and parent.value is use and parent.attr.value in _NUMBER_READERS:
        return True
    if type(parent) is cst.FormattedStringExpression:
        return True
    if type(parent) is cst.Arg and len(ancestors) >= 2 and type(ancestors[-2]) is cst.Call:
        func = ancestors[-2].func
        called = func.attr.value if type(func) is cst.Attribute else dotted_name(func)
        return called in _NUMBER_FUNCTIONS and called != "append"
    return False


def _grad_flag(call: Call) -> str | None:
    """The flag of a `with torch.set_grad_enabled(flag):` around the call."""
    for statement in reversed(call.path):
        if type(statement) is not cst.With:
            continue
        for item in statement.items:
            expr = item.item
            if (
                type(expr) is cst.Call
                and dotted_name(expr.func) in ("torch.set_grad_enabled", "set_grad_enabled")
                and expr.args
            ):
                return dotted_name(expr.args[0].value)
    return None


def _part_of(expr: cst.BaseExpression) -> str | None:
    """The name `expr` is a part of: `outs` for `outs["loss"]`, `outs.loss`,
    `outs.loss.mean()`; None for anything computed by a call of another value."""
    while True:
        if type(expr) is cst.Name:
            return expr.value
        if type(expr) in (cst.Subscript, cst.Attribute):
            expr = expr.value  # type: ignore[attr-defined]
        elif type(expr) is cst.Call and type(expr.func) is cst.Attribute:
            expr = expr.func.value
        else:
            return None


def _backward_receiver(node: cst.Call) -> cst.BaseExpression | None:
    """`loss` of `loss.backward()`, of `accelerator.backward(loss)` and of
    `torch.autograd.grad(loss, ...)`."""
    func = node.func
    if type(func) is cst.Attribute and func.attr.value == "backward" and not node.args:
        return func.value
    return node.args[0].value if node.args else None


def _bound_inside(scope: Function, flag: str) -> bool:
    """`flag` is a local name the function binds itself (a loop variable,
    an assignment), not a parameter: its callers do not choose its value."""
    node = scope.node
    if scope.is_module or type(node) is not cst.FunctionDef or not flag.isidentifier():
        return False
    params = node.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [star for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param)]
    if any(param.name.value == flag for param in every):
        return False
    return any(name == flag for body_node in iter_nodes(node.body) for name, _ in assigned_names(body_node))


def _train_flag(switch: Call) -> str | None:
    """`model.train(flag)`: the flag that chooses the mode."""
    node = switch.node
    if type(node.func) is cst.Attribute and node.func.attr.value == "train" and node.args:
        flag = dotted_name(node.args[0].value)
        return flag if flag not in ("True", "False") else None
    return None


def _assignment(node: cst.CSTNode) -> cst.Assign | None:
    if type(node) is cst.Assign:
        return node
    if type(node) is cst.SimpleStatementLine and len(node.body) == 1 and type(node.body[0]) is cst.Assign:
        return node.body[0]
    return None


def _self_name(function: Function) -> str | None:
    method = _method_scope(function)
    return method.self_name if method is not None else None


def _derived_from(call: Call, nodes: list[cst.CSTNode]) -> set[str]:
    """The names bound, in `nodes` (in source order), to the call's result or
    to a value computed from one of them."""
    derived: set[str] = set()
    for node in nodes:
        if type(node) not in (cst.Assign, cst.AugAssign, cst.AnnAssign):
            continue
        value = node.value
        if value is None or not (value is call.node or _mentions(value, derived)):
            continue
        targets = [target.target for target in node.targets] if type(node) is cst.Assign else [node.target]
        for target in targets:
            for inner in iter_nodes(target):
                if type(inner) is cst.Name:
                    derived.add(inner.value)
    return derived


def _mentions(expr: cst.CSTNode, names: set[str] | set[object]) -> bool:
    """`expr` reads one of the names, or is (or holds) one of the nodes."""
    return any((type(node) is cst.Name and node.value in names) or node in names for node in iter_nodes(expr))


_STORING_METHODS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "put"})


def _stored_into(node: cst.CSTNode) -> tuple[str, cst.CSTNode] | None:
    """(container, value) for `container.append(value)` and `container[key] = value`."""
    if type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value in _STORING_METHODS:
        container = dotted_name(node.func.value)
        if container is not None and node.args:
            return container, node.args[0].value
    if type(node) is cst.Assign and len(node.targets) == 1 and type(node.targets[0].target) is cst.Subscript:
        container = dotted_name(node.targets[0].target.value)
        if container is not None:
            return container, node.value
    return None


def _bound_or_deleted(node: cst.CSTNode) -> list[tuple[str, cst.BaseExpression | None]]:
    """The paths a node binds (with the value, when one expression), updates
    (`total += loss`) or deletes (`del loss`, with no value)."""
    node_type = type(node)
    if node_type is cst.AugAssign:
        name = dotted_name(node.target)
        return [(name, node.value)] if name is not None else []
    if node_type is cst.Del:
        targets = (
            [element.value for element in node.target.elements]
            if type(node.target) in (cst.Tuple, cst.List)
            else [node.target]
        )
        names = [dotted_name(target) for target in targets]
        return [(name, None) for name in names if name is not None]
    return list(reversed(assigned_names(node)))  # in source order: `outputs, attns = ...` names outputs first


def _switches_mode(node: cst.CSTNode) -> bool:
    return any(
        type(inner) is cst.Call
        and type(inner.func) is cst.Attribute
        and inner.func.attr.value in ("eval", "train")
        for inner in iter_nodes(node)
    )


def indent_in_path(statement: cst.CSTNode, path: tuple[cst.CSTNode, ...], module: cst.Module) -> str | None:
    """The indentation of `statement`, from the blocks of the statements around it."""
    default = module.default_indent
    indent = ""
    for outer, inner in zip(path, path[1:]):
        if outer is statement:
            return indent
        if getattr(outer, "orelse", None) is inner:
            continue  # an `elif`: at the `if`'s own indentation
        block = _block_holding(outer, inner)
        if block is None:
            return None
        indent += block.indent if block.indent is not None else default
    if path and path[-1] is statement:
        return indent
    return None


def _block_holding(outer: cst.CSTNode, inner: cst.CSTNode) -> cst.IndentedBlock | None:
    blocks: list[cst.CSTNode] = []
    body = getattr(outer, "body", None)
    if isinstance(body, cst.CSTNode):
        blocks.append(body)
    orelse = getattr(outer, "orelse", None)
    if type(orelse) is cst.Else:
        blocks.append(orelse.body)
    for handler in getattr(outer, "handlers", ()):
        blocks.append(handler.body)
    finalbody = getattr(outer, "finalbody", None)
    if finalbody is not None:
        blocks.append(finalbody.body)
    for case in getattr(outer, "cases", ()):
        blocks.append(case.body)
    for block in blocks:
        if type(block) is cst.IndentedBlock and any(statement is inner for statement in block.body):
            return block
    return None


_FACTS: weakref.WeakKeyDictionary[FileContext, EvaluationFacts] = weakref.WeakKeyDictionary()


def evaluation_facts(context: FileContext) -> EvaluationFacts:
    facts = _FACTS.get(context)
    if facts is None:
        facts = _FACTS[context] = EvaluationFacts(context)
    return facts


# Calls that make a program train: a backward pass, a gradient, an optimizer or
# scheduler step, a framework's fit/train loop (`model.train()` too: a script
# that switches a model to training mode trains it).
_TRAINING_METHODS = frozenset({"backward", "manual_backward", "step", "fit", "train", "train_model", "grad"})


def is_inference_script(module: cst.Module) -> bool:
    """A script (it has an `if __name__ == "__main__":` block) in which
    nothing trains: no backward pass, gradient, optimizer step or training
    loop is called anywhere in the file. There an evaluation forward's graph
    is not something training holds anyway: it is the activations inference
    would free, kept for nothing (the peak of a demo on a full-resolution
    input is a training step's, not an inference's)."""
    has_main, trains = _main_and_training(module)
    return has_main and not trains


def never_trains(module: cst.Module) -> bool:
    """Nothing in the file trains: no backward pass, gradient, optimizer
    step or training loop is called, and no Lightning `training_step` is
    defined."""
    return not _main_and_training(module)[1]


def _main_and_training(module: cst.Module) -> tuple[bool, bool]:
    has_main = False
    pending: list[cst.CSTNode] = [module]
    while pending:
        node = pending.pop()
        node_type = type(node)
        if node_type is cst.If and _is_main_guard(node.test):
            has_main = True
        elif node_type is cst.Call:
            func = node.func
            func_type = type(func)
            name = func.attr.value if func_type is cst.Attribute else func.value if func_type is cst.Name else None
            if name in _TRAINING_METHODS:
                return has_main, True
        elif node_type is cst.FunctionDef and node.name.value == "training_step":
            return has_main, True
        # The fields that can hold an `if` or a call (libcst's `children` builds every
        # whitespace node too, and cost most of this scan), in the same order.
        for field_name in child_fields(node_type):
            value = getattr(node, field_name)
            if type(value) is tuple or type(value) is list:
                pending.extend(child for child in value if is_node(child))
            elif is_node(value):
                pending.append(value)
    return has_main, False


def _is_main_guard(test: cst.BaseExpression) -> bool:
    return (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and test.left.value == "__name__"
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.comparisons[0].comparator, cst.SimpleString)
        and test.comparisons[0].comparator.evaluated_value == "__main__"
    )

