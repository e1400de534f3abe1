"""OOM201: wrap the forward pass and the loss of a training loop in autocast.

In the loop body, the statement that computes the loss used by `.backward()`
(simple statements that bind nothing it reads may sit in between:
`optimizer.zero_grad()`, logging) and every statement above it that computes
what the loss reads, back to the first one that does real work (a call that is
not a data move, or arithmetic), are the *region*:

    for x, y in loader:
        x = x.cuda()                    # data movement: stays outside
        y = y.to(device)
        optimizer.zero_grad()           # outside
        out = model(x)                  # <- wrapped
        loss = criterion(out, y)        # <- wrapped
        loss.backward()                 # outside
        optimizer.step()

Statements inside the region that compute nothing the loss needs (a metric, an
`assert`, `state = state.detach()`) are wrapped with it; an optimizer call
there (`zero_grad()`, `step()`) stays outside, between two autocast blocks. An
`if`, `for`, `while` or `with` in the region is wrapped whole.

bfloat16, not float16: it has float32's exponent range, so gradients do not
underflow and no `GradScaler` is needed, and the fix leaves the backward pass
and the optimizer step as they are (float16 would have to rewrite them:
`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`,
`scaler.unscale_()` before any gradient clipping). GPUs before Ampere have no
bfloat16: there autocast stops at once with "Current CUDA Device does not
support bfloat16", and the rule's docs show the float16 version to write by
hand.

Anything else gets no fix, and the diagnostic alone is the answer: a region
holding a backward pass, a `try`, a nested function or class, or an optimizer
call inside an `if` / `for`; a loss that is not computed in the loop body; a
loop that calls `.numpy()` on what the region computes (NumPy has no
bfloat16).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
from libcst._nodes.internal import CodegenState

from oom_lsp.edits import InsertBefore, InsertLinesBefore, NodeEdit, Replace

# Calls that only move, reinterpret or describe data: nothing for autocast to
# speed up, so leading statements made of these stay outside the region.
_DATA_MOVES = {
    "to", "cuda", "float", "long", "int", "contiguous", "pin_memory", "squeeze", "unsqueeze",
    "items", "keys", "values", "size", "dim", "numel", "view", "reshape", "flatten",
}  # fmt: skip
# Tensor factories (`torch.randint(...)` in a loop that makes its own data):
# not autocast ops, and their arguments are sizes.
_FACTORIES = {
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange", "linspace",
    "rand", "randn", "randint", "randperm", "zeros_like", "ones_like", "empty_like", "full_like",
    "rand_like", "randn_like", "randint_like",
}  # fmt: skip
_DATA_FUNCTIONS = {"next", "iter", "len", "tuple", "list", "dict", "pack_padded_sequence"}
# Calls that stay outside the region: the optimizer's. Between two parts of a
# region they split it in two autocast blocks.
_OPTIMIZER_METHODS = {"zero_grad", "step"}
_WRAPPABLE_COMPOUNDS = (cst.If, cst.For, cst.While, cst.With)


def read_names(node: cst.CSTNode) -> set[str]:
    """Variable names an expression reads (not attribute names, not keywords)."""
    names: set[str] = set()
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Name):
            names.add(current.value)
        elif isinstance(current, (cst.Attribute, cst.Arg)):
            stack.append(current.value)
        else:
            stack.extend(current.children)
    return names


def _target_names(target: cst.BaseExpression) -> set[str] | None:
    """Names bound by an assignment target; None when it binds something else
    (an attribute, a subscript) that we cannot follow."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        names: set[str] = set()
        for element in target.elements:
            inner = _target_names(element.value)
            if inner is None:
                return None
            names |= inner
        return names
    return None


def _assignment(statement: cst.BaseStatement) -> tuple[set[str], cst.BaseExpression] | None:
    """(bound names, value) of a one-assignment line, else None."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign):
        bound: set[str] = set()
        for target in small.targets:
            names = _target_names(target.target)
            if names is None:
                return None
            bound |= names
        return bound, small.value
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        names = _target_names(small.target)
        return (names, small.value) if names is not None else None
    if isinstance(small, cst.AugAssign):
        names = _target_names(small.target)
        if names is None:
            return None
        return names, cst.BinaryOperation(left=small.target, operator=cst.Add(), right=small.value)
    return None


def _binds_any(statement: cst.SimpleStatementLine, names: set[str]) -> bool:
    """Whether a simple line may rebind one of `names` (conservatively)."""
    for small in statement.body:
        targets: list[cst.BaseExpression] = []
        if isinstance(small, cst.Assign):
            targets = [target.target for target in small.targets]
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            targets = [small.target]
        for target in targets:
            if read_names(target) & names:
                return True
    return False


def _is_data_access(func: cst.BaseExpression) -> bool:
    if isinstance(func, cst.Attribute):
        return func.attr.value in _DATA_MOVES or func.attr.value in _FACTORIES
    # `get_batch(split)`, `next_batch()`: the script's own data helpers.
    return isinstance(func, cst.Name) and (func.value in _DATA_FUNCTIONS or "batch" in func.value.lower())


def _bound_anywhere(statement: cst.CSTNode) -> set[str]:
    """Every name a statement may bind, nested blocks included."""
    bound: set[str] = set()
    stack: list[cst.CSTNode] = [statement]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor)):
            bound |= read_names(current.target)
        elif isinstance(current, cst.AsName):
            bound |= read_names(current.name)
        elif isinstance(current, cst.NamedExpr):
            bound |= read_names(current.target)
        stack.extend(current.children)
    return bound


def _computes(node: cst.CSTNode) -> bool:
    """Whether code does work autocast applies to: a call that is not a data
    move (whose arguments, a device or a shape, do not count), or arithmetic
    (index arithmetic in a subscript does not count)."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.BinaryOperation):
            return True
        if isinstance(current, cst.Call):
            if not _is_data_access(current.func):
                return True
            if isinstance(current.func, cst.Attribute):
                stack.append(current.func.value)  # `x.to(device)`: only `x` may compute
            else:
                stack.extend(arg.value for arg in current.args)  # `next(iter(loader))`
        elif isinstance(current, cst.Subscript):
            stack.append(current.value)
        else:
            stack.extend(current.children)
    return False


def _optimizer_call(statement: cst.BaseStatement) -> bool:
    """`optimizer.zero_grad()`, `opt.step()`, `scheduler.step()` alone on a line."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(
        isinstance(small, cst.Expr)
        and isinstance(small.value, cst.Call)
        and isinstance(small.value.func, cst.Attribute)
        and small.value.func.attr.value in _OPTIMIZER_METHODS
        for small in statement.body
    )


def _refused(statement: cst.BaseStatement) -> bool:
    """What a region may not hold: a backward pass or an optimizer call (they
    stay outside autocast), a nested function or class, a `try`, or code that
    cannot be re-indented as a whole (a compound statement of another kind)."""
    if isinstance(statement, cst.BaseCompoundStatement) and not isinstance(statement, _WRAPPABLE_COMPOUNDS):
        return True
    stack: list[cst.CSTNode] = [statement]
    while stack:
        current = stack.pop()
        if isinstance(
            current, (cst.FunctionDef, cst.ClassDef, cst.Try, cst.TryStar, cst.Global, cst.Nonlocal)
        ):
            return True
        if isinstance(current, cst.Call) and _backward_or_step(current.func):
            return True
        stack.extend(current.children)
    return False


def _backward_or_step(func: cst.BaseExpression) -> bool:
    """`loss.backward`, `opt.step`, `opt.zero_grad`, and `torch.autograd.grad` /
    `grad` (a backward pass too)."""
    if isinstance(func, cst.Name):
        return func.value == "grad"
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value in {"backward", *_OPTIMIZER_METHODS}:
        return True
    owner = func.value
    owner_name = owner.attr.value if isinstance(owner, cst.Attribute) else getattr(owner, "value", None)
    return func.attr.value == "grad" and owner_name == "autograd"


def _loss_statement(statements: Sequence[cst.BaseStatement], index: int, needed: set[str]) -> int | None:
    """The position of the statement above `index` that binds the loss; the
    simple statements in between must bind none of what it reads."""
    position = index - 1
    while position >= 0:
        statement = statements[position]
        if isinstance(statement, cst.SimpleStatementLine):
            if _binds_any(statement, needed):
                return position
        elif _bound_anywhere(statement) & needed:
            return position if isinstance(statement, _WRAPPABLE_COMPOUNDS) else None
        else:
            return None  # a compound statement: what it does to the loss is not followed
        position -= 1
    return None


def autocast_regions(
    body: cst.IndentedBlock, backward_statement: cst.BaseStatement, loss: cst.BaseExpression
) -> list[list[cst.BaseStatement]] | None:
    """The blocks of consecutive statements of `body` to put under autocast,
    in order (more than one when an optimizer call sits between the forward
    pass and the loss); None when the loop does not have a shape understood."""
    statements = list(body.body)
    index = next((i for i, statement in enumerate(statements) if statement is backward_statement), None)
    if index is None:
        return None
    loss_position = _loss_statement(statements, index, read_names(loss))
    if loss_position is None:
        return None
    # Walk up from the loss: a statement that binds something the region still
    # reads joins it, and the earliest of those that computes starts the
    # region. Data movement (`x = x.cuda()`, `x, y = batch`) computes nothing:
    # what it reads comes from before the transfer and is not followed.
    needed: set[str] = set()
    start = None
    for position in range(loss_position, -1, -1):
        statement = statements[position]
        if position != loss_position and not (_bound_anywhere(statement) & needed):
            continue
        computes = _computes(statement)
        assignment = _assignment(statement)
        if assignment is not None:
            needed -= assignment[0]
            if computes or position == loss_position:
                needed |= read_names(assignment[1])
        elif computes or position == loss_position:
            needed |= read_names(statement)  # compound, or several statements on a line: everything it reads
        if computes:
            start = position
    if start is None:
        return None
    regions: list[list[cst.BaseStatement]] = [[]]
    for statement in statements[start : loss_position + 1]:
        if _optimizer_call(statement):
            regions.append([])
            continue
        if _refused(statement):
            return None
        regions[-1].append(statement)
    for region in regions[1:]:
        # After an optimizer call, data preparation (`tgt_out = tgt[1:]`) stays outside too.
        while region and isinstance(region[0], cst.SimpleStatementLine) and not _computes(region[0]):
            region.pop(0)
    regions = [region for region in regions if any(_computes(statement) for statement in region)]
    if not regions or not any(_has_call(statement) for region in regions for statement in region):
        return None
    bound = set().union(*(_bound_anywhere(statement) for region in regions for statement in region))
    if _to_numpy(body, bound):
        return None
    return regions


def _to_numpy(body: cst.IndentedBlock, names: set[str]) -> bool:
    """Whether the loop converts one of `names` with `.numpy()`: under autocast
    a forward output is bfloat16, which NumPy has no type for (the call fails)."""
    stack: list[cst.CSTNode] = [body]
    while stack:
        current = stack.pop()
        if (
            isinstance(current, cst.Call)
            and isinstance(current.func, cst.Attribute)
            and current.func.attr.value == "numpy"
            and read_names(current.func.value) & names
        ):
            return True
        stack.extend(current.children)
    return False


def _has_call(node: cst.CSTNode) -> bool:
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call):
            return True
        stack.extend(current.children)
    return False


def _without_last_line_end(statement: cst.BaseStatement) -> cst.BaseStatement:
    """The statement without what follows the code of its last line (the
    trailing comment and newline, the blocks' footers): its range ends there,
    so that text stays where it is."""
    if isinstance(statement, cst.SimpleStatementLine):
        return statement.with_changes(trailing_whitespace=cst.TrailingWhitespace())
    assert isinstance(statement, _WRAPPABLE_COMPOUNDS)
    if isinstance(statement, (cst.If, cst.For, cst.While)) and statement.orelse is not None:
        return statement.with_changes(orelse=_last_block_trimmed(statement.orelse))
    return statement.with_changes(body=_block_trimmed(statement.body))


def _last_block_trimmed(node: cst.If | cst.Else) -> cst.If | cst.Else:
    if isinstance(node, cst.If) and node.orelse is not None:
        return node.with_changes(orelse=_last_block_trimmed(node.orelse))
    return node.with_changes(body=_block_trimmed(node.body))


def _block_trimmed(block: cst.BaseSuite) -> cst.BaseSuite:
    if isinstance(block, cst.SimpleStatementSuite):
        return block.with_changes(trailing_whitespace=cst.TrailingWhitespace())
    assert isinstance(block, cst.IndentedBlock)
    last = _without_last_line_end(block.body[-1])  # type: ignore[arg-type]
    return block.with_changes(body=[*block.body[:-1], last], footer=())


def wrap_in_autocast(
    regions: Sequence[Sequence[cst.BaseStatement]],
    block_indents: Sequence[str],
    torch_name: str,
    default_indent: str,
    default_newline: str,
) -> tuple[NodeEdit, ...]:
    """Edits that put each region (consecutive statements of one block) under
    `with torch.autocast(device_type="cuda", dtype=torch.bfloat16):`.

    `block_indents` are the indentation units of every block from the module
    down to the one holding the regions; each statement is re-rendered one
    level deeper so multi-line calls and nested blocks keep their layout.
    """
    header = f'with {torch_name}.autocast(device_type="cuda", dtype={torch_name}.bfloat16):'
    outer = "".join(block_indents)
    edits: list[NodeEdit] = []
    for region in regions:
        edits.append(InsertLinesBefore(region[0], (header,)))
        for position, statement in enumerate(region):
            if position > 0:
                for line in statement.leading_lines:
                    if line.comment is not None and line.indent:
                        edits.append(InsertBefore(line.comment, default_indent))
            state = CodegenState(
                default_indent=default_indent,
                default_newline=default_newline,
                indent_tokens=[*block_indents, default_indent],
            )
            _without_last_line_end(statement).with_changes(leading_lines=())._codegen(state)
            rendered = "".join(state.tokens)
            # The edit replaces the statement's code, which starts after the
            # existing indentation and ends before its last line's comment.
            code = rendered[len(outer) : len(rendered) - len(default_newline)]
            edits.append(Replace(statement, code))
    return tuple(edits)
