"""OOM201: wrap the forward pass and the loss of a training loop in autocast.

Only the simple shape is fixed: in the loop body, the `.backward()` statement
is preceded (possibly with unrelated simple statements in between, such as
`optimizer.zero_grad()`) by consecutive simple assignments that compute the
loss from the forward pass:

    for x, y in loader:
        x = x.to(device)            # data preparation: stays outside
        out = model(x)              # <- wrapped
        loss = criterion(out, y)    # <- wrapped
        optimizer.zero_grad()
        loss.backward()

Anything else gets no fix, and the diagnostic alone is the answer: the loss
computed inside an `if` or a `with`, a compound statement between the loss
and its backward, or a forward that is not right before the loss (something
earlier in the body computes what the region reads), since wrapping the loss
alone would leave the forward's activations in float32.
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
    "items", "keys", "values", "size", "dim", "numel",
}  # fmt: skip
_DATA_FUNCTIONS = {"next", "iter", "len", "tuple", "list", "dict"}


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


def _binds_any(statement: cst.BaseStatement, names: set[str]) -> bool:
    """Whether a simple line may rebind one of `names` (conservatively)."""
    assert isinstance(statement, cst.SimpleStatementLine)
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
        return func.attr.value in _DATA_MOVES
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


def _computes(expr: cst.CSTNode) -> bool:
    """Whether an expression does work autocast applies to: a call that is not
    a data move, or arithmetic (index arithmetic in a subscript is not)."""
    stack: list[cst.CSTNode] = [expr]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.BinaryOperation):
            return True
        if isinstance(current, cst.Call) and not _is_data_access(current.func):
            return True
        if isinstance(current, cst.Subscript):
            stack.append(current.value)
        else:
            stack.extend(current.children)
    return False


def _has_call(statements: Sequence[tuple[cst.SimpleStatementLine, cst.BaseExpression]]) -> bool:
    for _, value in statements:
        stack: list[cst.CSTNode] = [value]
        while stack:
            current = stack.pop()
            if isinstance(current, cst.Call):
                return True
            stack.extend(current.children)
    return False


def forward_and_loss(
    body: cst.IndentedBlock, backward_statement: cst.BaseStatement, loss: cst.BaseExpression
) -> list[cst.SimpleStatementLine] | None:
    """The consecutive statements of `body` that compute `loss`, ending before
    `backward_statement`; None when the loop does not have the simple shape."""
    statements = list(body.body)
    index = next((i for i, statement in enumerate(statements) if statement is backward_statement), None)
    if index is None:
        return None
    needed = read_names(loss)
    position = index - 1
    # Unrelated simple statements (zero_grad, logging) may sit between the
    # loss and its backward; a compound one may assign anything.
    while position >= 0:
        statement = statements[position]
        if not isinstance(statement, cst.SimpleStatementLine):
            return None
        if _binds_any(statement, needed):
            break
        position -= 1
    if position < 0:
        return None
    chain: list[tuple[cst.SimpleStatementLine, cst.BaseExpression]] = []
    while position >= 0:
        statement = statements[position]
        assignment = _assignment(statement)
        if assignment is None or not (assignment[0] & needed):
            break
        chain.insert(0, (statement, assignment[1]))  # type: ignore[arg-type]
        needed = (needed - assignment[0]) | read_names(assignment[1])
        position -= 1
    # The forward must be in the region: nothing earlier in the body may
    # compute what the region still reads (`logits, h = model(x, h)`, then
    # `h = h.detach()`, then the loss: not consecutive, no fix).
    for statement in statements[: position + 1]:
        if isinstance(statement, cst.SimpleStatementLine):
            assignment = _assignment(statement)
            if assignment is not None and not _computes(assignment[1]):
                continue
        if _bound_anywhere(statement) & needed:
            return None
    # Leading data preparation (`x, y = batch`, `x = x.to(device)`) stays
    # outside: autocast has nothing to do there.
    while chain and not _computes(chain[0][1]):
        chain.pop(0)
    if not chain or not _has_call(chain):
        return None
    return [statement for statement, _ in chain]


def wrap_in_autocast(
    chain: Sequence[cst.SimpleStatementLine],
    block_indents: Sequence[str],
    torch_name: str,
    default_indent: str,
    default_newline: str,
) -> tuple[NodeEdit, ...]:
    """Edits that put `chain` (consecutive statements of one block) under
    `with torch.autocast("cuda", dtype=torch.bfloat16):`.

    `block_indents` are the indentation units of every block from the module
    down to the one holding `chain`; each statement is re-rendered one level
    deeper so multi-line calls keep their layout.
    """
    header = f'with {torch_name}.autocast("cuda", dtype={torch_name}.bfloat16):'
    edits: list[NodeEdit] = [InsertLinesBefore(chain[0], (header,))]
    outer = "".join(block_indents)
    for position, statement in enumerate(chain):
        if position > 0:
            for line in statement.leading_lines:
                if line.comment is not None and line.indent:
                    edits.append(InsertBefore(line.comment, default_indent))
        state = CodegenState(
            default_indent=default_indent,
            default_newline=default_newline,
            indent_tokens=[*block_indents, default_indent],
        )
        statement.with_changes(leading_lines=(), trailing_whitespace=cst.TrailingWhitespace())._codegen(state)
        rendered = "".join(state.tokens)
        # The edit replaces the statement's code, which starts after the
        # existing indentation and ends before its trailing comment.
        code = rendered[len(outer) : len(rendered) - len(default_newline)]
        edits.append(Replace(statement, code))
    return tuple(edits)
