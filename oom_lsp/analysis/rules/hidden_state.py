"""OOM305: a recurrent hidden state carried from batch to batch with its graph."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import target_names
from oom_lsp.analysis.dataflow import (
    Callee,
    Role,
    assigned_names,
    binds_inside,
    contains_backward,
    facts_for,
    iter_nodes,
)
from oom_lsp.analysis.facts.contexts import FORWARD_METHODS, CallGraph, call_graph
from oom_lsp.analysis.facts.library import Grad
from oom_lsp.analysis.facts.program import Call, Function
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Valid, short_code
from oom_lsp.analysis.rules._autograd import SEQUENCES, AutogradRule
from oom_lsp.fixes import hidden_state

_RECURRENT_STATES = frozenset(
    {
        "torch.nn.LSTM",
        "torch.nn.LSTMCell",
        "torch.nn.GRU",
        "torch.nn.GRUCell",
        "torch.nn.RNN",
        "torch.nn.RNNCell",
    }
)


class HiddenStateCarriedAcrossBatches(AutogradRule):
    """
    ## What it does
    Flags a recurrent hidden state fed from one training step into the next
    without `.detach()`: `out, hidden = rnn(x, hidden)` (or
    `out, (h, c) = lstm(x, (h, c))`, or `h = cell(x, h)` for a cell that
    returns the state alone and takes it after its input) in a loop that
    calls `backward()`, where nothing else in the loop rebinds or detaches
    `hidden`. Also in a loop that
    trains nothing with autograd on, where nothing can train on the graph:
    its function runs no backward pass and what it returns reaches none (an
    evaluation over the validation data outside `torch.no_grad()`), or the
    call's other outputs are only read as numbers (`q.argmax().item()` in an
    acting loop). There the chained graph only grows, and only a detach or a
    rebind at every iteration stops it (a reset at an episode's end lets it
    grow until then). And a state kept on an object between calls
    (`self.h = self.cell(x, self.h)` in a method that a loop calls for every
    reading, with autograd on and no backward pass in that loop): the same
    chain, carried by the object instead of the loop.

    ## Why is this bad?
    The new `hidden` is computed from the previous one, so its graph reaches
    back through every batch seen so far: the graph, and the activations
    saved for it, span the whole epoch. Memory grows with every step, and the
    next `backward()` fails with "Trying to backward through the graph a
    second time" unless `retain_graph=True` is added, which makes the growth
    permanent. Truncated backpropagation through time cuts the graph at each
    batch boundary.

    ## Example
    ```python
    hidden = model.init_hidden(batch_size)
    for x, y in batches:
        out, hidden = model(x, hidden)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    hidden = model.init_hidden(batch_size)
    for x, y in batches:
        hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
        out, hidden = model(x, hidden)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    Safe: the state is detached at the top of each step, which keeps its
    values and cuts only the gradient path into previous batches (truncated
    BPTT, what the loop's per-step `backward()` implies). The statement fits
    the module: `hidden.detach()` for `nn.GRU` / `nn.RNN`, a tuple for
    `nn.LSTM`, one detach per name for an unpacked `(h, c)`, and a form that
    handles both when the module is not known. A state that may still be
    `None` at the first step is guarded with `if hidden is not None:`.
    Loops without `backward()` (an unrolled forward over time steps) are not
    reported: there the graph must span the steps.
    """

    code = "OOM305"
    name = "hidden-state-carried-across-batches"
    summary = "A recurrent hidden state is carried from batch to batch without `.detach()`: the graph spans the epoch."
    why = (
        "The state links each batch's graph to the previous one, so the graph and activations of every "
        "batch so far stay alive."
    )
    remedy = "Detach the hidden state at the top of each step (hidden = hidden.detach())."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """
            import torch.nn as nn
            rnn = nn.GRU(8, 16)
            hidden = None
            for x, y in loader:
                if hidden is not None:
                    hidden = hidden.detach()
                out, hidden = rnn(x, hidden)
                criterion(out, y).backward()
            """
        ),
        Valid(
            """
            import torch
            hidden = model.init_hidden(32)
            for x, y in batches:
                hidden = repackage_hidden(hidden)
                out, hidden = model(x, hidden)
                loss = criterion(out, y)
                loss.backward()
            """
        ),
        Valid(
            """
            import torch
            for x, y in batches:
                hidden.detach_()
                out, hidden = model(x, hidden)
                criterion(out, y).backward()
            """
        ),
        # An unrolled forward pass over time steps: the graph must span them.
        Valid(
            """
            import torch.nn as nn
            class Seq(nn.Module):
                def forward(self, xs, h):
                    for x in xs:
                        out, h = self.cell(x, h)
                    return out
            """
        ),
        # A fresh state for every batch.
        Valid(
            """
            import torch
            for x, y in loader:
                hidden = model.init_hidden(x.size(0))
                out, hidden = model(x, hidden)
                criterion(out, y).backward()
            """
        ),
        Valid(
            """
            import torch
            with torch.no_grad():
                for x in loader:
                    out, hidden = model(x, hidden)
                    out.sum().backward()
            """
        ),
        # Not a module call.
        Valid("import torch\nfor x in loader:\n    out, state = step_fn(x, state)\n    out.backward()\n"),
        Valid(
            "import torch\nfor x in loader:\n    out, hidden = model(x, hidden.detach())\n    out.backward()\n"
        ),
        # A local function called `rnn` is no module.
        Valid(
            """
            import torch
            def rnn(x, state):
                return x, state
            for x in loader:
                out, state = rnn(x, state)
                out.backward()
            """
        ),
        Valid("import torch\nfor x in loader:\n    out, hidden = model(x, **hidden)\n    out.backward()\n"),
        # An LSTM's `(h, c)` detached in place, one by one.
        Valid(
            """
            import torch
            for x, y in loader:
                hidden[0].detach_()
                hidden[1].detach_()
                out, hidden = model(x, hidden)
                criterion(out, y).backward()
            """
        ),
        # A recurrence unrolled inside a forward whose result the caller trains on.
        Valid(
            """
            import torch
            cell = torch.nn.GRUCell(8, 8)

            def unroll(xs, h):
                outs = []
                for x in xs:
                    out, h = cell(x, h), h
                    outs.append(out)
                return torch.stack(outs)

            def train(batches, h, opt):
                for xs in batches:
                    unroll(xs, h).sum().backward()
                    opt.step()
            """
        ),
        # State kept on the object, but under no_grad at the call site, reset
        # before every step, or detached: no graph crosses calls.
        Valid(
            """
            import torch
            import torch.nn as nn

            class Tracker:
                def __init__(self, n):
                    self.cell = nn.GRUCell(n, n)
                    self.h = torch.zeros(1, n)

                def reset(self):
                    self.h = torch.zeros_like(self.h)

                def update(self, x):
                    self.h = self.cell(x, self.h)
                    return self.h.norm().item()

            def main(stream, tracker):
                tracker = Tracker(64)
                for x in stream:
                    tracker.reset()
                    tracker.update(x)
                with torch.no_grad():
                    for x in stream:
                        tracker.update(x)
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            class Tracker:
                def __init__(self, n):
                    self.cell = nn.GRUCell(n, n)
                    self.h = torch.zeros(1, n)

                def update(self, x):
                    self.h = self.cell(x, self.h.detach())
                    return self.h

            def main(stream):
                tracker = Tracker(64)
                for x in stream:
                    print(tracker.update(x).sum().item())
            """
        ),
        # A layer applied to its own output in a training step is no state:
        # the value taken first is the input.
        Valid(
            """
            import torch.nn as nn
            block = nn.Linear(16, 16)
            for x, y in loader:
                x = block(x)
                x = block(x, scale)
                nn.functional.mse_loss(x, y).backward()
            """
        ),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            lstm = nn.LSTM(8, 16)
            hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
            for x, y in loader:
                optimizer.zero_grad()
                out, hidden = lstm(x, hidden)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
            line=8,
            expected_fix="""
            import torch
            import torch.nn as nn
            lstm = nn.LSTM(8, 16)
            hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
            for x, y in loader:
                hidden = tuple(h.detach() for h in hidden)
                optimizer.zero_grad()
                out, hidden = lstm(x, hidden)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.GRU(8, 16, batch_first=True)

                def fit(self, loader, opt):
                    hidden = None
                    for step, (x, y) in enumerate(loader):
                        # one batch
                        out, hidden = self.rnn(x, hidden)
                        out.mean().backward()
                        opt.step()
            """,
            line=13,
            expected_fix="""
            import torch.nn as nn

            class Model(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.rnn = nn.GRU(8, 16, batch_first=True)

                def fit(self, loader, opt):
                    hidden = None
                    for step, (x, y) in enumerate(loader):
                        # one batch
                        if hidden is not None:
                            hidden = hidden.detach()
                        out, hidden = self.rnn(x, hidden)
                        out.mean().backward()
                        opt.step()
            """,
        ),
        Invalid(
            """
            import torch
            def train(model, batches, h, c):
                for x in batches:
                    out, (h, c) = model(x, (h, c))
                    out.sum().backward()
            """,
            line=5,
            expected_fix="""
            import torch
            def train(model, batches, h, c):
                for x in batches:
                    h, c = h.detach(), c.detach()
                    out, (h, c) = model(x, (h, c))
                    out.sum().backward()
            """,
        ),
        Invalid(
            """
            import torch
            hidden = model.init_hidden(32)
            while True:
                output, hidden = model(data, hidden)
                accelerator.backward(criterion(output, targets))
            """,
            line=5,
            expected_fix="""
            import torch
            hidden = model.init_hidden(32)
            while True:
                hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
                output, hidden = model(data, hidden)
                accelerator.backward(criterion(output, targets))
            """,
        ),
        # An evaluation with autograd on: the graph chained through the state is
        # never backpropagated, and it grows over the whole validation data.
        Invalid(
            """
            import torch
            lstm = torch.nn.LSTM(8, 8)

            def evaluate(chunks, hidden):
                total = 0.0
                for x, y in chunks:
                    out, hidden = lstm(x, hidden)
                    total += (out - y).pow(2).mean().item()
                return total

            def main(data):
                print(evaluate(data, None))

            if __name__ == "__main__":
                main(torch.load("chunks.pt"))
            """,
            line=8,
        ),
        # An acting loop: the Q-values are only read as an action, so nothing
        # trains on this graph; the reset at an episode's end lets it grow until then.
        Invalid(
            """
            import torch

            def run(env, learn, steps):
                policy = torch.nn.LSTM(64, 18).cuda()
                obs, state = env.reset(), None
                for step in range(steps):
                    q, state = policy(torch.as_tensor(obs).cuda(), state)
                    obs, done = env.step(q.argmax().item())
                    if done:
                        obs, state = env.reset(), None
                    if step % 4 == 0:
                        learn()

            if __name__ == "__main__":
                run(make_env(), learner(), 10_000_000)
            """,
            line=8,
        ),
        # The state lives on an object from one call to the next, the method
        # is called for every reading with autograd on, and nothing trains.
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Cell(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.step = nn.Linear(2 * n, n)

                def forward(self, x, h):
                    return torch.tanh(self.step(torch.cat([x, h], -1)))

            class Tracker:
                def __init__(self, cell, n):
                    self.cell = cell.eval()
                    self.h = torch.zeros(1, n)

                def update(self, x):
                    self.h = self.cell(x, self.h)
                    return self.h.norm().item()

            def main(stream):
                tracker = Tracker(Cell(64), 64)
                for x in stream:
                    print(tracker.update(x))

            if __name__ == "__main__":
                main(torch.randn(10_000, 1, 64))
            """,
            line=19,
            expected_fix="""
            import torch
            import torch.nn as nn

            class Cell(nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.step = nn.Linear(2 * n, n)

                def forward(self, x, h):
                    return torch.tanh(self.step(torch.cat([x, h], -1)))

            class Tracker:
                def __init__(self, cell, n):
                    self.cell = cell.eval()
                    self.h = torch.zeros(1, n)

                def update(self, x):
                    self.h = self.cell(x, self.h.detach())
                    return self.h.norm().item()

            def main(stream):
                tracker = Tracker(Cell(64), 64)
                for x in stream:
                    print(tracker.update(x))

            if __name__ == "__main__":
                main(torch.randn(10_000, 1, 64))
            """,
        ),
        # A cell that returns the state alone, trained at every step.
        Invalid(
            """
            import torch
            import torch.nn as nn
            cell = nn.GRUCell(32, 64).cuda()
            h = torch.zeros(8, 64, device="cuda")
            for x, y in stream:
                h = cell(x.cuda(), h)
                loss = (h.sum(1) - y.cuda()).pow(2).mean()
                loss.backward()
                opt.step()
            """,
            line=7,
            expected_fix="""
            import torch
            import torch.nn as nn
            cell = nn.GRUCell(32, 64).cuda()
            h = torch.zeros(8, 64, device="cuda")
            for x, y in stream:
                h = h.detach()
                h = cell(x.cuda(), h)
                loss = (h.sum(1) - y.cuda()).pow(2).mean()
                loss.backward()
                opt.step()
            """,
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        tracker = self.context.tracker
        if tracker.in_no_grad or len(node.targets) != 1:
            return
        if type(node.targets[0].target) is cst.Attribute:
            self._carried_on_self(node)
            return
        if not tracker.in_loop:
            return
        target, call = node.targets[0].target, node.value
        if type(call) is not cst.Call:
            return
        # `out, h = rnn(x, h)`; or `h = cell(x, h)`, a cell that returns the state
        # alone, taking it after its input (`x = block(x)` is a layer, not a state).
        single = type(target) is cst.Name
        if type(target) not in SEQUENCES and not single:
            return
        callee = self._flow().callee(call.func, call)
        if callee.role is not Role.MODULE:
            return
        loop = tracker.loops[-1]
        bound = {name for name, _ in assigned_names(node)}
        arguments = [arg for arg in call.args if not arg.star]
        if single:
            arguments = [arg for position, arg in enumerate(arguments) if position > 0 or arg.keyword is not None]
        carried = [names for arg in arguments for names in [_state_names(arg.value)] if names]
        carried = [names for names in carried if set(names) <= bound]
        if not carried:
            return
        state = {name for names in carried for name in names}
        backward = contains_backward(loop.body, self.context)
        if single and not backward:
            return  # without a backward in the loop, a state returned alone is read as a layer's output
        if backward:
            if any(self._cut_in_loop(name, loop, node) for name in state):
                return
        elif self._graph_never_used(call, loop, bound - state):
            # Nothing trains on this graph: only a cut at every iteration stops
            # the chain (a reset at the end of an episode lets it grow until then).
            if any(self._cut_at_every_iteration(name, loop, node) for name in state):
                return
        else:
            return
        lines = [
            hidden_state.detach_names_line(names)
            if len(names) > 1
            else hidden_state.detach_line(names[0], self._state_constructor(callee))
            for names in carried
        ]
        maybe_none = [name for names in carried for name in names if self._may_be_none(name)]
        edits = hidden_state.insert_at_top(loop, lines, maybe_none=maybe_none)
        state = ", ".join(name for names in carried for name in names)
        self.report(
            node,
            f"Hidden state {short_code(state)} is carried into the next batch with its graph (no .detach())",
            fix=FixSpec("Detach the hidden state at the top of the step", edits, Applicability.SAFE)
            if edits
            else None,
        )

    def _carried_on_self(self, node: cst.Assign) -> None:
        """`self.h = self.cell(x, self.h)` in a method: the state lives on the
        object from one call to the next, so when the method is called at
        every iteration of a loop with autograd on, and that loop's function
        runs no backward pass, each new state holds the graph of all the
        previous ones and nothing frees it."""
        target, call = node.targets[0].target, node.value
        if type(call) is not cst.Call or type(target) is not cst.Attribute:
            return
        state = dotted_name(target)
        if state is None or state.count(".") != 1:
            return
        owner, attribute = state.split(".")
        passed = [arg.value for arg in call.args if not arg.star and dotted_name(arg.value) == state]
        if not passed:
            return
        graph = call_graph(self.context)
        site = graph.program.call(call)
        if site is None or site.scope.owner is None or owner != site.scope.self_name:
            return
        if not self._runs_a_module(graph, site):
            return  # not known to be a module with parameters to build a graph from
        if graph.grad_at(site) is not Grad.ON:
            return
        loop_site = _called_in_a_loop(graph, site.scope)
        if loop_site is None or graph.runs_backward(loop_site.scope):
            return  # a training loop may backpropagate through the state (a second backward then fails loudly)
        if any(
            _detached_in(method.node, state, ("detach", "detach_"))
            for methods in site.scope.owner.methods.values()
            for method in methods
        ):
            return
        if _reset_at_every_iteration(graph, loop_site, site.scope, attribute):
            return
        stored = self.context.code_for(target)
        self.report(
            node,
            f"Hidden state {stored} is carried into the next call with its graph (no .detach()), "
            "and nothing trains on it",
            fix=FixSpec(
                f"Detach the carried state: `{stored}.detach()`",
                hidden_state.detach_arguments(passed, state),
                Applicability.SAFE,
            ),
        )

    def _runs_a_module(self, graph: CallGraph, site: Call) -> bool:
        """The call runs an `nn.Module`: one the data flow knows, the forward of
        a module class of the file, or an attribute that an object of the file
        holds a module in, as the data flow classifies what it is made from
        (`self.model.cell` with `self.cell = nn.GRUCell(...)` in the model's class)."""
        call = site.node
        if self._flow().callee(call.func, call).role is Role.MODULE:
            return True
        if any(
            method.name in FORWARD_METHODS and method.owner is not None and graph.is_module_class(method.owner)
            for method in graph.callees(site)
        ):
            return True
        func = call.func
        if type(func) is not cst.Attribute:
            return False
        holder = graph.instance_class(func.value, site.scope)
        if holder is None:
            return False
        bindings = holder.attributes.get(func.attr.value, ())
        facts = facts_for(self.context)
        return bool(bindings) and all(
            binding.value is not None
            and (callee := facts.classify_value(binding.value, {})) is not None
            and callee.role is Role.MODULE
            for binding in bindings
        )

    def _graph_never_used(self, call: cst.Call, loop: cst.For | cst.While, outputs: set[str]) -> bool:
        """A loop that runs no backward pass calls the recurrent model with
        autograd on, and nothing can train on what it computes: its function
        runs no backward and what it returns reaches none (an evaluation over
        the validation data), or the call's other outputs are only read as
        numbers in the loop (`q[0, -1].argmax().item()` in an acting loop,
        whatever else the function trains). The graph chained through the
        state only grows, step after step, and nothing frees it before the
        loop ends. A recurrence unrolled inside a forward pass is not this: its
        function's result is backpropagated by the caller."""
        graph = call_graph(self.context)
        site = graph.program.call(call)
        if site is None or graph.grad_at(site) is not Grad.ON:
            return False
        if outputs and all(self._only_numbers_read(name, loop) for name in outputs):
            return True
        if graph.runs_backward(site.scope):
            return False  # a loop around it may train on this graph (a time-step loop inside a batch loop)
        return site.scope.is_module or graph.result_feeds_a_backward(site.scope) is False

    def _only_numbers_read(self, name: str, loop: cst.For | cst.While) -> bool:
        """Every mention of `name` in the function (in the loop and after it)
        is a binding or a read that keeps no graph: a chain of indexing and
        methods ending in `.item()`, `.tolist()`, `.argmax()`/`.argmin()`
        (integers carry no gradient)."""
        inside = {id(node) for node in iter_nodes(loop.body)}
        uses = self._summary().uses_of(name)
        if not any(id(use) in inside for use, _ in uses):
            return False
        for use, ancestors in uses:
            if _is_bound_there(ancestors):
                continue
            if not _read_without_graph(use, ancestors):
                return False
        return True

    def _cut_at_every_iteration(self, name: str, loop: cst.For | cst.While, call_statement: cst.Assign) -> bool:
        """A statement of the loop's own body (not under an `if`) rebinds or
        detaches the state, or a detach of it anywhere in the loop."""
        for statement in loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ():
            if type(statement) is not cst.SimpleStatementLine:
                continue
            for small in statement.body:
                if small is call_statement:
                    continue
                if type(small) is cst.Assign and any(
                    name in target_names(target.target) for target in small.targets
                ):
                    return True
        return _detached_in(loop, name, ("detach", "detach_"))

    def _cut_in_loop(self, name: str, loop: cst.For | cst.While, call_statement: cst.Assign) -> bool:
        """The loop rebinds or detaches the state itself."""
        return binds_inside(loop, name, besides=call_statement) or _detached_in(loop, name, ("detach_",))

    def _state_constructor(self, callee: Callee) -> str | None:
        """The recurrent module behind the call: `torch.nn.LSTM` directly, or
        the one kind of recurrent layer a model class of the file holds."""
        if callee.constructor in _RECURRENT_STATES:
            return callee.constructor
        facts = facts_for(self.context)
        for class_def, attributes in facts.class_attributes.items():
            if class_def.name.value == callee.constructor:
                kinds = {
                    attr.constructor for attr in attributes.values() if attr.constructor in _RECURRENT_STATES
                }
                tuple_kinds = {kind for kind in kinds if kind is not None and "LSTM" in kind}
                if len(kinds) >= 1 and (tuple_kinds == kinds or not tuple_kinds):
                    return next(iter(kinds))
        return None

    def _may_be_none(self, name: str) -> bool:
        summary = self._summary()
        if any(
            isinstance(value, cst.Name) and value.value == "None" for value in summary.bindings.get(name, ())
        ):
            return True
        function = self.context.tracker.current_function
        if function is None:
            return False
        params = function.params
        return any(
            param.name.value == name and isinstance(param.default, cst.Name) and param.default.value == "None"
            for param in (*params.posonly_params, *params.params, *params.kwonly_params)
        )


def _detached_in(where: cst.For | cst.While | cst.FunctionDef, name: str, methods: tuple[str, ...]) -> bool:
    """One of `methods` is called on the state (or on one of its elements,
    `hidden[0].detach_()`) somewhere in the loop or the function."""
    return any(
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in methods
        and name in (dotted_name(node.func.value), _subscripted_name(node.func.value))
        for node in iter_nodes(where.body)
    )


def _called_in_a_loop(graph: CallGraph, function: Function, depth: int = 0) -> Call | None:
    """A call site inside a loop that runs `function` at every iteration:
    directly, or through up to three calls of the file."""
    for caller in graph.callers(function):
        if caller.loops:
            return caller
        if depth < 3 and not caller.scope.is_module and caller.scope is not function:
            found = _called_in_a_loop(graph, caller.scope, depth + 1)
            if found is not None:
                return found
    return None


def _reset_at_every_iteration(graph: CallGraph, loop_site: Call, method: Function, attribute: str) -> bool:
    """The loop's own body (not under an `if`) calls another method of the
    class that rebinds the state (`agent.reset()` before each step)."""
    klass = method.owner
    assert klass is not None
    resetters = {
        id(binding.scope)
        for binding in klass.attributes.get(attribute, ())
        if binding.scope is not None and binding.scope is not method
    }
    loop = loop_site.loops[-1]
    direct = {id(statement) for statement in (loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ())}
    return any(
        id(call.statement) in direct and any(id(callee) in resetters for callee in graph.callees(call))
        for call in loop_site.scope.calls
        if call.loops and call.loops[-1] is loop
    )


def _subscripted_name(expr: cst.BaseExpression) -> str | None:
    """`hidden` for `hidden[0]` (an LSTM's `(h, c)` detached one by one)."""
    return dotted_name(expr.value) if isinstance(expr, cst.Subscript) else None


def _state_names(expr: cst.BaseExpression) -> list[str]:
    """`hidden` -> ["hidden"], `(h, c)` -> ["h", "c"], else []."""
    if isinstance(expr, (cst.Tuple, cst.List)):
        names = [dotted_name(element.value) for element in expr.elements]
        return [name for name in names if name is not None] if all(names) else []
    name = dotted_name(expr)
    return [name] if name is not None else []


# What a chain of reads may go through and still be a number in the end.
_NUMBER_ENDS = frozenset({"item", "tolist", "argmax", "argmin"})
_PASSING = frozenset({"detach", "cpu", "squeeze", "view", "reshape", "float", "max", "min", "softmax"})


def _is_bound_there(ancestors: tuple[cst.CSTNode, ...]) -> bool:
    """The mention is (part of) an assignment's target: `q` in `q, h = ...`."""
    index = len(ancestors) - 1
    while index >= 0 and type(ancestors[index]) in (cst.Element, cst.Tuple, cst.List):
        index -= 1
    return index >= 0 and type(ancestors[index]) is cst.AssignTarget


def _read_without_graph(use: cst.CSTNode, ancestors: tuple[cst.CSTNode, ...]) -> bool:
    """`q[0, -1].argmax().item()`, `q.max(1).item()`: indexing and methods up
    to one that turns the value into numbers or integers."""
    node = use
    for parent in reversed(ancestors):
        if type(parent) is cst.Subscript and parent.value is node:
            node = parent
            continue
        if type(parent) is cst.Attribute and parent.value is node:
            if parent.attr.value in _NUMBER_ENDS:
                return True
            if parent.attr.value not in _PASSING:
                return False
            node = parent
            continue
        if type(parent) is cst.Call and parent.func is node:
            node = parent
            continue
        return False
    return False
