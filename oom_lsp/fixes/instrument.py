"""The "Insert memory monitoring" and "Guard with oom_guard" code actions. Pure functions over text.

A *step loop* is the nearest `for`/`while` loop around a `.backward(...)` call in the same
function (not a nested function), or around a call to a module-level function that runs one step
(a `.backward(...)` outside any of its loops). Its *epoch loop* is the nearest loop around it in
the same function that is not itself a step loop, or, when the step loop's function is called
from a loop elsewhere in the file (`for epoch in ...: train_one_epoch(...)`), that loop.

Insert memory monitoring, for the loop at a line:

* step loop inside an epoch loop (same function): `monitor = memory_monitor()` before the epoch
  loop, `monitor.step()` after the step loop's optimizer step (else at the end of its body),
  `monitor.epoch_end()` at the end of the epoch loop's body;
* epoch loop calling the step loop's function: the monitor and `monitor.epoch_end()` around the
  epoch loop only (the monitor measures windows, it does not need the steps);
* a step loop with no epoch loop: `monitor = memory_monitor(every_n_steps=100)` before it and
  `monitor.step()` after its optimizer step (else at the end of its body).

The monitor counts optimizer steps, not micro-steps: under gradient accumulation
(`if (i + 1) % accum == 0: optimizer.step()`) the loop body runs once per micro-batch, so
`monitor.step()` goes right after the optimizer step, in its block. The optimizer step is the
last `X.step(...)` statement directly in the step loop (not in a loop nested in it) whose `X`
is an optimizer: something the file calls `.zero_grad()` on or builds with a `torch.optim`
constructor (not an `lr_scheduler`), or an engine whose `.backward(loss)` the file calls
(DeepSpeed); `S.step(X)` of such an `X` is one too (a gradient scaler's). A scheduler's
`.step()` or `.step(val_loss)` is none.

Guard with oom_guard, for the training call at a line: the statement that calls a function of
this file that trains (holds a step loop, or calls one that does), or, in a flat script, the
outermost module-level loop around a step loop, is wrapped in `with oom_guard():`.

Both add `from oom_lsp.runtime import ...  # pip install oom-lsp` after the file's leading imports
when the name is not imported yet (the training environment then needs oom-lsp installed; the
actions' titles say so), and offer nothing where the code is already instrumented or cannot be edited by
whole lines (a body on the header's line, a statement sharing its line).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from oom_lsp import python_ast
from oom_lsp.edits import Position, Range, TextEdit, line_starts, split_lines
from oom_lsp.fixes.codegen import code_at_indent

RUNTIME_MODULE = "oom_lsp.runtime"
# What the inserted import needs where the script trains: said on the import line itself.
RUNTIME_REQUIREMENT = "pip install oom-lsp"
DEFAULT_EVERY_N_STEPS = 100
_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_LOOPS = (cst.For, cst.While)


@dataclass(frozen=True)
class TrainingLoop:
    """A loop the monitoring action applies to; `line`..`end_line` is the loop statement."""

    line: int
    end_line: int
    kind: str  # "steps" (calls backward) or "epochs" (runs a step loop, directly or through a call)
    function: str | None  # the enclosing function, None at module level


@dataclass(frozen=True)
class TrainingCall:
    """A statement the guard action wraps."""

    line: int
    end_line: int
    callee: str | None  # the training function called; None for a module-level loop


class _Facts:
    """One parse of the file: its loops, training functions and calls, with positions."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.module = python_ast.parse_module(source)
        wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
        self.positions = wrapper.resolve(PositionProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.lines = split_lines(source)
        self.step_loops: list[cst.For | cst.While] = []
        functions: dict[str, cst.FunctionDef] = {}
        # Module-level functions that run one step: a backward outside any loop of theirs.
        step_functions: set[str] = set()
        calls: list[cst.Call] = []
        for node in self.parents:
            if isinstance(node, cst.Call) and _is_backward(node.func):
                loop = self.enclosing_loop(node)
                if loop is not None:
                    self._add_step_loop(loop)
                else:
                    scope = self.scope_of(node)
                    if scope is not None and self.parents.get(scope) is self.module:
                        step_functions.add(scope.name.value)
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
                calls.append(node)
            elif isinstance(node, cst.FunctionDef) and isinstance(self.parents.get(node), cst.Module):
                functions[node.name.value] = node
        for call in calls:  # `for batch in loader: train_step(batch)`: that loop is a step loop
            if call.func.value in step_functions:  # type: ignore[attr-defined]
                loop = self.enclosing_loop(call)
                if loop is not None:
                    self._add_step_loop(loop)
        self.step_loops.sort(key=self.line_of)
        self.functions = functions
        self.training_functions = self._training_functions()

    def _add_step_loop(self, loop: cst.For | cst.While) -> None:
        if loop not in self.step_loops:
            self.step_loops.append(loop)

    def line_of(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def end_line_of(self, node: cst.CSTNode) -> int:
        end = self.positions[node].end
        return end.line - 1 if end.column == 0 and end.line > self.line_of(node) else end.line

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parents.get(node)
        while current is not None:
            yield current
            current = self.parents.get(current)

    def enclosing_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        """The nearest loop around `node` in its own scope (a loop's `iter`/`test` is outside it)."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, _SCOPES):
                return None
            if isinstance(ancestor, _LOOPS) and child is ancestor.body:
                return ancestor
            child = ancestor
        return None

    def scope_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
            if isinstance(ancestor, cst.ClassDef | cst.Lambda):
                return None
        return None

    def _training_functions(self) -> set[str]:
        """Module-level functions that hold a step loop, or call (by name) one that does."""
        training = {
            name
            for name, function in self.functions.items()
            if any(self.scope_of(loop) is function for loop in self.step_loops)
        }
        # A function decorated with oom_guard trains under its own guard: its callers do not need one.
        unguarded = {name for name in training if not _is_guarded(self.functions[name])}
        changed = True
        while changed:
            changed = False
            for name, function in self.functions.items():
                if name not in training and any(call in unguarded for call in _called_names(function)):
                    training.add(name)
                    if not _is_guarded(function):
                        unguarded.add(name)
                    changed = True
        return training

    def training_call_statements(self) -> Iterator[tuple[cst.SimpleStatementLine, str]]:
        for node in self.parents:
            if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
                continue
            small = node.body[0]
            value = small.value if isinstance(small, (cst.Expr, cst.Assign, cst.AnnAssign)) else None
            if isinstance(value, cst.Await):
                value = value.expression
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
                name = value.func.value
                scope = self.scope_of(node)
                if name in self.training_functions and (scope is None or scope.name.value != name):
                    yield node, name

    def epoch_loop_of(self, step_loop: cst.For | cst.While) -> tuple[cst.For | cst.While | None, bool]:
        """(the epoch loop, whether it is in the step loop's own function)."""
        outer = self.enclosing_loop(step_loop)
        while outer is not None and outer in self.step_loops:  # a GAN's critic loop inside its batch loop
            outer = self.enclosing_loop(outer)
        if outer is not None:
            return outer, True
        function = self.scope_of(step_loop)
        if function is None or self.parents.get(function) is not self.module:
            return None, False
        for statement, name in self.training_call_statements():
            if name == function.name.value:
                loop = self.enclosing_loop(statement)
                if loop is not None:
                    return loop, False
        return None, False

    def indent_of(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[: len(text) - len(text.lstrip())]


def _is_backward(func: cst.BaseExpression) -> bool:
    return isinstance(func, cst.Attribute) and func.attr.value == "backward"


def _receiver(call: cst.Call, method: str) -> str | None:
    """`X` (dotted) of a call `X.method(...)`."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == method:
        return _dotted(func.value)
    return None


def _optimizers(facts: _Facts) -> set[str]:
    """The dotted names the file uses as optimizers (module docstring: what makes one)."""
    optimizers: set[str] = set()
    for node in facts.parents:
        if isinstance(node, cst.Call):
            zeroed = _receiver(node, "zero_grad")
            if zeroed is not None:
                optimizers.add(zeroed)
            engine = _receiver(node, "backward")
            if engine is not None and node.args and node.args[0].keyword is None:
                # `engine.backward(loss)`, not `loss.backward()` nor `loss.backward(retain_graph=True)`
                optimizers.add(engine)
        elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
            constructor = _dotted(node.value.func) or ""
            # torch.optim.AdamW, optim.SGD, bnb.optim.Adam8bit; not torch.optim.lr_scheduler.StepLR
            if "optim." in constructor and "lr_scheduler" not in constructor:
                for target in node.targets:
                    name = _dotted(target.target)
                    if name is not None:
                        optimizers.add(name)
    # A model's `.zero_grad()` does not make it an optimizer, but a model has no `.step()`.
    return optimizers


def _optimizer_step(facts: _Facts, loop: cst.For | cst.While) -> cst.Call | None:
    """The last optimizer step directly in `loop` (in its body's blocks, not in a nested loop
    or function), None when it has none."""
    optimizers = _optimizers(facts)
    steps: list[cst.Call] = []
    for node in facts.parents:
        if not isinstance(node, cst.Call) or facts.enclosing_loop(node) is not loop:
            continue
        statement = facts.parents.get(node)
        if not isinstance(statement, cst.Expr):
            continue  # `ok = optimizer.step(closure)` is rare; `monitor.step()` follows statements
        stepped = _receiver(node, "step")
        if stepped is None:
            continue
        argument = _dotted(node.args[0].value) if node.args else None
        if stepped in optimizers or argument in optimizers:
            steps.append(node)
    return max(steps, key=lambda step: _start(facts, step), default=None)


def _start(facts: _Facts, node: cst.CSTNode) -> tuple[int, int]:
    start = facts.positions[node].start
    return start.line, start.column


def _after_optimizer_step(facts: _Facts, loop: cst.For | cst.While, statement: str) -> TextEdit | None:
    """`statement` right after the loop's optimizer step, in the same block; None without one."""
    call = _optimizer_step(facts, loop)
    if call is None:
        return None
    expression = facts.parents.get(call)
    holder = facts.parents.get(expression) if expression is not None else None
    if isinstance(holder, cst.SimpleStatementLine):
        line = facts.end_line_of(holder)
        return _insert_lines(facts, line + 1, [statement], facts.indent_of(facts.line_of(holder)))
    # A one-line block (`if last: optimizer.step()`): the statement joins it on that line.
    end = facts.positions[call].end
    position = Position(end.line, end.column)
    return TextEdit(Range(position, position), f"; {statement}")


def _called_names(function: cst.FunctionDef) -> set[str]:
    names: set[str] = set()

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Name):
                names.add(node.func.value)

    function.body.visit(Calls())
    return names


def _parse(source: str) -> _Facts | None:
    try:
        return _Facts(source)
    except (cst.ParserSyntaxError, RecursionError):
        return None


def _uses_runtime(facts: _Facts, name: str) -> bool:
    """The file already calls memory_monitor / oom_guard (however it imported it)."""
    for node in facts.parents:
        if isinstance(node, cst.Call):
            func = node.func
            called = (
                func.value
                if isinstance(func, cst.Name)
                else func.attr.value
                if isinstance(func, cst.Attribute)
                else None
            )
            if called == name:
                return True
        if isinstance(node, cst.Decorator):
            decorator = node.decorator
            target = decorator.func if isinstance(decorator, cst.Call) else decorator
            if isinstance(target, cst.Name) and target.value == name:
                return True
    return False


# --- finders -----------------------------------------------------------------------------------


def find_training_loops(source: str) -> list[TrainingLoop]:
    """The loops "Insert memory monitoring" applies to, in source order; [] if already monitored."""
    facts = _parse(source)
    if facts is None or _uses_runtime(facts, "memory_monitor"):
        return []
    found: dict[int, TrainingLoop] = {}
    for loop in facts.step_loops:
        scope = facts.scope_of(loop)
        found[facts.line_of(loop)] = TrainingLoop(
            facts.line_of(loop), facts.end_line_of(loop), "steps", scope.name.value if scope else None
        )
        epoch, _ = facts.epoch_loop_of(loop)
        if epoch is not None and facts.line_of(epoch) not in found:
            epoch_scope = facts.scope_of(epoch)
            found[facts.line_of(epoch)] = TrainingLoop(
                facts.line_of(epoch),
                facts.end_line_of(epoch),
                "epochs",
                epoch_scope.name.value if epoch_scope else None,
            )
    return [found[line] for line in sorted(found)]


def _guard_targets(facts: _Facts) -> list[tuple[cst.BaseStatement, str | None]]:
    targets: list[tuple[cst.BaseStatement, str | None]] = [
        (statement, name) for statement, name in facts.training_call_statements()
    ]
    for loop in facts.step_loops:
        if facts.scope_of(loop) is not None:
            continue
        outermost = loop
        for ancestor in facts.ancestors(loop):
            if isinstance(ancestor, _LOOPS):
                outermost = ancestor
        if all(target is not outermost for target, _ in targets):
            targets.append((outermost, None))
    guarded = [target for target in targets if not _inside_guard(facts, *target)]
    return sorted(guarded, key=lambda target: facts.line_of(target[0]))


def _is_oom_guard(expression: cst.BaseExpression) -> bool:
    """`oom_guard`, `oom_guard(...)`, `runtime.oom_guard(...)`."""
    target = expression.func if isinstance(expression, cst.Call) else expression
    return (isinstance(target, cst.Name) and target.value == "oom_guard") or (
        isinstance(target, cst.Attribute) and target.attr.value == "oom_guard"
    )


def _is_guarded(function: cst.FunctionDef) -> bool:
    return any(_is_oom_guard(decorator.decorator) for decorator in function.decorators)


def _inside_guard(facts: _Facts, node: cst.CSTNode, callee: str | None) -> bool:
    """Already guarded: inside `with oom_guard(...)`, in a function decorated with it, or calling one."""
    called = facts.functions.get(callee) if callee else None
    if called is not None and _is_guarded(called):
        return True
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, cst.With) and any(_is_oom_guard(item.item) for item in ancestor.items):
            return True
        if isinstance(ancestor, cst.FunctionDef) and _is_guarded(ancestor):
            return True
    return False


def find_training_calls(source: str) -> list[TrainingCall]:
    """The statements "Guard with oom_guard" applies to, in source order (not those already guarded)."""
    facts = _parse(source)
    if facts is None:
        return []
    return [
        TrainingCall(facts.line_of(node), facts.end_line_of(node), name)
        for node, name in _guard_targets(facts)
    ]


# --- edits -------------------------------------------------------------------------------------


def _free_name(facts: _Facts, preferred: str) -> str:
    used = {node.value for node in facts.parents if isinstance(node, cst.Name)}
    candidate, number = preferred, 1
    while candidate in used:
        number += 1
        candidate = f"{preferred}_{number}"
    return candidate


def _import_edit(facts: _Facts, name: str) -> TextEdit | None:
    """`from oom_lsp.runtime import name` after the leading imports (and docstring); None if imported."""
    anchor = 0
    leading = True
    for index, statement in enumerate(facts.module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if (
                    isinstance(small, cst.ImportFrom)
                    and isinstance(small.names, Sequence)
                    and _dotted(small.module) == RUNTIME_MODULE
                    and any(alias.name.value == name and alias.asname is None for alias in small.names)
                ):
                    return None
        if not leading:
            continue
        is_import = isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
        )
        is_docstring = (
            index == 0
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and (
                isinstance(statement.body[0], cst.Expr)
                and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
            )
        )
        if is_import or is_docstring:
            anchor = facts.end_line_of(statement)
        else:
            leading = False
    return _insert_lines(
        facts, anchor + 1, [f"from {RUNTIME_MODULE} import {name}  # {RUNTIME_REQUIREMENT}"], ""
    )


def _dotted(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _insert_lines(facts: _Facts, line: int, lines: list[str], indent: str) -> TextEdit:
    """Whole lines inserted before `line` (1-based; one past the end appends)."""
    newline = facts.module.default_newline
    text = "".join(f"{indent}{content}{newline}" for content in lines)
    starts = line_starts(facts.source)
    if line > len(facts.lines) and not facts.source.endswith(("\n", "\r")):
        text = newline + text
        position = Position(len(starts), len(facts.source) - starts[-1])
    else:
        position = Position(line, 0)
    return TextEdit(Range(position, position), text)


def _block_body(loop: cst.For | cst.While) -> Sequence[cst.BaseStatement] | None:
    return loop.body.body if isinstance(loop.body, cst.IndentedBlock) and loop.body.body else None


def _append_to_body(facts: _Facts, loop: cst.For | cst.While, statement: str) -> TextEdit | None:
    body = _block_body(loop)
    if body is None:
        return None
    indent = facts.indent_of(facts.line_of(body[0]))
    return _insert_lines(facts, facts.end_line_of(body[-1]) + 1, [statement], indent)


def _owns_its_lines(facts: _Facts, node: cst.CSTNode) -> bool:
    """The statement starts its line (so lines can be inserted before it or it can be re-indented)."""
    position = facts.positions[node].start
    return facts.indent_of(position.line) == facts.lines[position.line - 1][: position.column]


def _loop_at(facts: _Facts, line: int) -> cst.For | cst.While | None:
    """The innermost step or epoch loop whose lines hold `line`."""
    candidates = []
    for loop in facts.step_loops:
        candidates.append(loop)
        epoch, _ = facts.epoch_loop_of(loop)
        if epoch is not None:
            candidates.append(epoch)
    holding = [loop for loop in candidates if facts.line_of(loop) <= line <= facts.end_line_of(loop)]
    return max(holding, key=facts.line_of, default=None)


def insert_memory_monitoring(source: str, line: int) -> tuple[TextEdit, ...] | None:
    """The edits of "Insert memory monitoring" for the training loop at `line` (its header or any
    line inside it); None when there is none, or it is already monitored."""
    facts = _parse(source)
    if facts is None or _uses_runtime(facts, "memory_monitor"):
        return None
    chosen = _loop_at(facts, line)
    if chosen is None:
        return None
    if chosen in facts.step_loops:
        step_loop: cst.For | cst.While | None = chosen
        epoch_loop, same_function = facts.epoch_loop_of(chosen)
    else:
        inner = [loop for loop in facts.step_loops if facts.epoch_loop_of(loop)[0] is chosen]
        step_loop, epoch_loop = inner[0], chosen
        same_function = facts.epoch_loop_of(step_loop)[1]
    if not same_function and epoch_loop is not None:
        step_loop = None  # in another function: the monitor is not visible there
    name = _free_name(facts, "monitor")
    import_edit = _import_edit(facts, "memory_monitor")
    edits: list[TextEdit] = [import_edit] if import_edit is not None else []  # first: above a loop on line 1
    if epoch_loop is not None:
        if not _owns_its_lines(facts, epoch_loop):
            return None
        edits.append(
            _insert_lines(
                facts,
                facts.line_of(epoch_loop),
                [f"{name} = memory_monitor()"],
                facts.indent_of(facts.line_of(epoch_loop)),
            )
        )
    else:
        assert step_loop is not None
        if not _owns_its_lines(facts, step_loop):
            return None
        edits.append(
            _insert_lines(
                facts,
                facts.line_of(step_loop),
                [f"{name} = memory_monitor(every_n_steps={DEFAULT_EVERY_N_STEPS})"],
                facts.indent_of(facts.line_of(step_loop)),
            )
        )
    if step_loop is not None:
        # Optimizer steps, not micro-steps: after the optimizer step when the loop has one.
        step = _after_optimizer_step(facts, step_loop, f"{name}.step()") or _append_to_body(
            facts, step_loop, f"{name}.step()"
        )
        if step is None:
            return None
        edits.append(step)
    if epoch_loop is not None:
        # After the step's line: both loops may end on the same line, the inner one's call goes first.
        epoch_end = _append_to_body(facts, epoch_loop, f"{name}.epoch_end()")
        if epoch_end is None:
            return None
        edits.append(epoch_end)
    return _merged(edits)


def _merged(edits: list[TextEdit]) -> tuple[TextEdit, ...]:
    """Sorted; insertions at the same point joined in the order they were made."""
    merged: dict[Position, str] = {}
    for edit in edits:
        merged[edit.range.start] = merged.get(edit.range.start, "") + edit.new_text
    return tuple(TextEdit(Range(position, position), text) for position, text in sorted(merged.items()))


def guard_with_oom_guard(source: str, line: int) -> tuple[TextEdit, ...] | None:
    """The edits of "Guard with oom_guard" for the training call at `line` (any of its lines);
    None when there is none there, or it is already guarded."""
    facts = _parse(source)
    if facts is None:
        return None
    targets = [
        node for node, _ in _guard_targets(facts) if facts.line_of(node) <= line <= facts.end_line_of(node)
    ]
    if not targets:
        return None
    statement = targets[-1]
    if not _owns_its_lines(facts, statement):
        return None
    indent = facts.indent_of(facts.line_of(statement))
    wrapped = cst.With(
        items=[cst.WithItem(cst.parse_expression("oom_guard()"))],
        body=cst.IndentedBlock(body=[statement.with_changes(leading_lines=())]),
    )
    code = code_at_indent(wrapped, indent, facts.module)
    start = Position(facts.line_of(statement), 0)
    end_line = facts.end_line_of(statement)
    starts = line_starts(source)
    end = (
        Position(end_line + 1, 0)
        if end_line < len(starts)
        else Position(end_line, len(facts.lines[end_line - 1]))
    )
    if end_line >= len(starts):
        code = code.rstrip("\r\n")
    edits = [TextEdit(Range(start, end), code)]
    import_edit = _import_edit(facts, "oom_guard")
    if import_edit is not None:
        edits.append(import_edit)
    return tuple(sorted(edits, key=lambda edit: edit.range.start))
