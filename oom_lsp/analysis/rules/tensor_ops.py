"""OOM4xx: tensor operations that allocate more than they need."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, method_call, string_value
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.analysis.rules._scan import (
    SCOPES,
    descendants,
    enclosing_block,
    free_name,
    is_int_literal,
    references,
    scope_of,
)
from oom_lsp.fixes.attention import fused_attention
from oom_lsp.fixes.cat_in_loop import collect_first_pieces, collect_then_concatenate

# Concatenations, and whether concatenating the collected pieces once gives
# the same tensor as concatenating them one by one (stack adds a dimension
# per call, so it does not).
_CONCATENATIONS = {
    "torch.cat": True,
    "torch.concat": True,
    "torch.concatenate": True,
    "torch.vstack": True,
    "torch.row_stack": True,
    "torch.hstack": True,
    "torch.dstack": True,
    "torch.stack": False,
}
# The ones that take a `dim`.
_WITH_DIM = {"torch.cat", "torch.concat", "torch.concatenate"}


@register
class CatInLoop(Rule):
    """
    ## What it does
    Flags a tensor grown by concatenation inside a loop,
    `x = torch.cat([x, y])`, where `x` carries over from one iteration to the
    next (a loop that sets `x` afresh at every iteration grows nothing).

    ## Why is this bad?
    Each `torch.cat` allocates a new tensor holding everything accumulated so
    far and copies it: n iterations copy O(n^2) elements, and at every step
    the old and the new accumulator are alive together, so the peak is twice
    the final size plus the fragmentation left by n ever-larger blocks. On the
    GPU, collecting predictions this way over an evaluation set is a classic
    late OOM. When the loop needs the whole tensor at every iteration (the
    tokens of a generation loop), preallocate it at its final size and fill
    slices instead.

    ## Example
    ```python
    preds = torch.empty(0, device="cuda")
    for batch in loader:
        preds = torch.cat([preds, model(batch)], dim=0)
    ```

    ## Use instead
    ```python
    preds = torch.empty(0, device="cuda")
    preds_parts = [preds]
    for batch in loader:
        preds_parts.append(model(batch))
    preds = torch.cat(preds_parts, dim=0)
    ```

    ## Fix safety
    Safe, and offered only when the result is provably the same: `cat`,
    `concat`, `concatenate`, `vstack`, `hstack` or `dstack` (not `stack`),
    the accumulator assigned just before the loop in the same block and used
    nowhere else in the loop, one append per iteration directly in the loop
    body, a literal `dim`, no `else:` on the loop, no enclosing `try`, and no
    in-place write in the loop to the appended tensor (the list keeps a
    reference where `cat` took a copy). The list starts with the accumulator's
    initial value, so a loop that runs zero times still gives the same value.
    The first-piece idiom (`x = None` before the loop, `if x is None: x = y`
    `else: x = cat([x, y])` in it) becomes an append, and `x` is None after
    a loop that did not run, as before; comments inside that `if` go with it.
    """

    code = "OOM401"
    name = "cat-in-loop"
    summary = "A tensor grown with `torch.cat` inside a loop is copied whole at every iteration."
    fix_applicability = Applicability.SAFE

    VALID = [
        # Collected in a list, concatenated once.
        Valid(
            """\
            import torch
            parts = []
            for batch in loader:
                parts.append(model(batch))
            preds = torch.cat(parts)
            """
        ),
        # A sliding window keeps a fixed size.
        Valid(
            """\
            import torch
            for frame in frames:
                window = torch.cat([window[1:], frame[None]])
            """
        ),
        # Not in a loop.
        Valid("import torch\nx = torch.cat([x, y], dim=1)\n"),
        # A local function called `cat` is not torch's.
        Valid(
            """\
            def cat(items):
                return items[0]
            for y in ys:
                x = cat([x, y])
            """
        ),
        # A U-Net decoder: `x` is transformed at every level, it does not grow.
        Valid(
            """\
            import torch
            for up, decode, skip in zip(ups, decoders, reversed(skips)):
                x = up(x)
                x = torch.cat([x, skip], dim=1)
                x = decode(x)
            """
        ),
        # Restarted from a fresh tensor at every iteration: nothing accumulates.
        Valid(
            """\
            import torch
            for batch in loader:
                feats = backbone(batch)
                feats = torch.cat([feats, extra(batch)], dim=1)
            last = feats
            """
        ),
        # The sequence comes through a splat: unknown.
        Valid(
            """\
            import torch
            for pair in pairs:
                acc = torch.cat(*pair)
            """
        ),
        # Concatenating other tensors in a loop does not grow anything.
        Valid(
            """\
            from torch import cat
            for a, b in pairs:
                x = cat([a, b], dim=-1)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """\
            import torch
            preds = torch.empty(0)
            for batch in loader:
                preds = torch.cat([preds, model(batch)], dim=0)
            print(preds.shape)
            """,
            line=4,
            expected_fix="""\
            import torch
            preds = torch.empty(0)
            preds_parts = [preds]
            for batch in loader:
                preds_parts.append(model(batch))
            preds = torch.cat(preds_parts, dim=0)
            print(preds.shape)
            """,
        ),
        Invalid(
            """\
            import torch as T

            def collect(loader, model):
                feats = T.zeros(0, 128)
                for x, _ in loader:
                    # keep every batch
                    feats = T.cat(
                        (feats, model(x).detach()),  # rows
                        0,
                    )
                return feats
            """,
            line=7,
            expected_fix="""\
            import torch as T

            def collect(loader, model):
                feats = T.zeros(0, 128)
                feats_parts = [feats]
                for x, _ in loader:
                    # keep every batch
                    feats_parts.append(model(x).detach())
                feats = T.cat(feats_parts, 0)
                return feats
            """,
        ),
        # `from torch import cat`, keyword `dim`, a name already taken.
        Invalid(
            """\
            from torch import cat
            out_parts = None
            out = start
            while step():
                out = cat([out, piece()], dim=-1)
            """,
            line=5,
            expected_fix="""\
            from torch import cat
            out_parts = None
            out = start
            out_parts_2 = [out]
            while step():
                out_parts_2.append(piece())
            out = cat(out_parts_2, dim=-1)
            """,
        ),
        # Prepending: reported, no fix.
        Invalid(
            """\
            import torch
            h = torch.empty(0)
            for y in ys:
                h = torch.vstack([y, h])
            """,
            line=4,
        ),
        # A generation loop reads the whole sequence each step: reported
        # (preallocate and fill), no fix.
        Invalid(
            """\
            import torch
            for _ in range(max_new_tokens):
                logits = model(idx)[:, -1, :]
                idx_next = torch.multinomial(logits.softmax(-1), 1)
                idx = torch.cat((idx, idx_next), dim=1)
            """,
            line=5,
        ),
        # The first-piece idiom.
        Invalid(
            """\
            import torch
            all_logits = None
            for batch in loader:
                logits = model(**batch).logits
                if all_logits is None:
                    all_logits = logits
                else:
                    all_logits = torch.cat((all_logits, logits), dim=0)
            """,
            line=8,
            expected_fix="""\
            import torch
            all_logits = None
            all_logits_parts = []
            for batch in loader:
                logits = model(**batch).logits
                all_logits_parts.append(logits)
            all_logits = torch.cat(all_logits_parts, dim=0) if all_logits_parts else None
            """,
        ),
        # Options through a splat: reported, no fix (they may hold anything).
        Invalid(
            """\
            import torch
            acc = torch.empty(0)
            for y in ys:
                acc = torch.cat([acc, y], **options)
            """,
            line=4,
        ),
        # torch.stack grows too; stacking once would give another shape: no fix.
        Invalid(
            """\
            import torch
            for y in ys:
                history = torch.stack([history, y])
            """,
            line=3,
        ),
        # An attribute accumulator in a nested loop; its init is elsewhere: no fix.
        Invalid(
            """\
            import torch
            class Buffer:
                def add_all(self, batches):
                    for batch in batches:
                        if batch is not None:
                            self.seen = torch.concat([self.seen, batch])
            """,
            line=6,
        ),
        # The appended tensor is written in place later in the loop: no fix.
        Invalid(
            """\
            import torch
            acc = torch.empty(0)
            for batch in loader:
                buf.copy_(batch)
                acc = torch.cat([acc, buf])
                buf.zero_()
            """,
            line=5,
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        tracker = self.context.tracker
        if not tracker.in_loop or len(node.targets) != 1 or not isinstance(node.value, cst.Call):
            return
        call = node.value
        function = self.context.call_name(call)
        if function not in _CONCATENATIONS:
            return
        accumulator = dotted_name(node.targets[0].target)
        sequence = get_arg(call, "tensors", 0)
        if accumulator is None or not isinstance(sequence, cst.Arg):
            return
        if not isinstance(sequence.value, (cst.List, cst.Tuple)):
            return
        elements = sequence.value.elements
        position = next(
            (
                i
                for i, element in enumerate(elements)
                if isinstance(element, cst.Element) and dotted_name(element.value) == accumulator
            ),
            None,
        )
        if position is None:
            return
        loop = tracker.loops[-1]
        # The loop reads the accumulator nowhere else (but the first-piece
        # idiom `if x is None: x = y else: x = cat([x, y])` is accumulation too).
        others = [
            reference
            for part in _repeated_parts(loop)
            for reference in references(part, accumulator)
            if reference is not node.targets[0].target and reference is not elements[position].value
        ]
        short = function.rsplit(".", 1)[-1]
        growth = (
            f"`{accumulator}` is grown with `{short}` inside a loop: every iteration copies everything "
            "accumulated so far into a new tensor, so the copies are quadratic and the old and new "
            "tensors are alive together."
        )
        if not _only_first_piece_idiom(loop.body, accumulator, others):
            if _rebinds(loop, accumulator, others):
                # Set or transformed elsewhere in the loop (`x = up(x)`, `x = f(batch)`):
                # nothing says it grows from one iteration to the next.
                return
            # The loop reads the whole tensor: a list would not do.
            self.report(
                node,
                f"{growth} The loop reads it, so preallocate it at its final size once and fill slices.",
            )
            return
        fix = None
        if position == 0 and len(elements) == 2 and isinstance(elements[1], cst.Element):
            fix = self._fix(node, call, loop, accumulator, function, elements[1].value, others)
        self.report(
            node,
            f"{growth} Append the pieces to a list and `{short}` once after the loop.",
            fix=fix,
        )

    def _fix(
        self,
        node: cst.Assign,
        call: cst.Call,
        loop: cst.For | cst.While,
        accumulator: str,
        function: str,
        piece: cst.BaseExpression,
        others: list[cst.BaseExpression],
    ) -> FixSpec | None:
        if not _CONCATENATIONS[function] or not isinstance(node.targets[0].target, cst.Name):
            return None
        literal, dim = self._literal_dim(call, function)
        if not literal or loop.orelse is not None:
            return None
        tracker = self.context.tracker
        module = self.context.module
        enclosing = self._enclosing_in_function(loop)
        if any(isinstance(statement, (cst.Try, cst.TryStar)) for statement in enclosing):
            return None
        block = enclosing_block(tracker.statements, module, loop)
        start = _assignment_just_before(block, loop, accumulator) if block is not None else None
        if start is None or _written_in_place(loop, piece):
            return None
        function_node = tracker.current_function
        if function_node is None and _read_by_a_definition(module, accumulator):
            return None
        parts = free_name(scope_of(function_node, module), f"{accumulator}_parts")
        piece_code = self.context.code_for(piece)
        if not others and self._is_whole_statement_of(loop, node):
            edits = collect_then_concatenate(
                loop=loop,
                grow=node,
                accumulator=accumulator,
                parts=parts,
                piece=piece_code,
                function=self.context.code_for(call.func),
                dim=dim,
            )
        else:
            branch = self._first_piece_branch(loop, accumulator, piece_code, others)
            if branch is None or not (isinstance(start.value, cst.Name) and start.value.value == "None"):
                return None
            edits = collect_first_pieces(
                loop=loop,
                branch=branch,
                accumulator=accumulator,
                parts=parts,
                piece=piece_code,
                function=self.context.code_for(call.func),
                dim=dim,
            )
        return FixSpec(
            title=f"Collect the pieces in `{parts}` and concatenate once after the loop",
            edits=edits,
            applicability=Applicability.SAFE,
        )

    def _first_piece_branch(
        self, loop: cst.For | cst.While, accumulator: str, piece: str, others: list[cst.BaseExpression]
    ) -> cst.If | None:
        """The `if x is None: x = piece / else: x = cat([x, piece])` statement
        that holds the current assignment, directly in the loop body, with no
        other use of `x` in the loop."""
        statements = self.context.tracker.statements
        if len(statements) < 3 or statements[-3] is not loop or not isinstance(loop.body, cst.IndentedBlock):
            return None
        branch, line = statements[-2], statements[-1]
        if not isinstance(branch, cst.If) or not any(child is branch for child in loop.body.body):
            return None
        test = branch.test
        if not (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot))
            and dotted_name(test.left) == accumulator
            and dotted_name(test.comparisons[0].comparator) == "None"
            and isinstance(branch.orelse, cst.Else)
        ):
            return None
        first_block, grow_block = branch.body, branch.orelse.body
        if isinstance(test.comparisons[0].operator, cst.IsNot):
            first_block, grow_block = grow_block, first_block
        if not isinstance(grow_block, cst.IndentedBlock) or list(grow_block.body) != [line]:
            return None
        first = _single_assignment(first_block.body[0]) if isinstance(first_block, cst.IndentedBlock) else None
        if first is None or len(first_block.body) != 1 or dotted_name(first.targets[0].target) != accumulator:
            return None
        if self.context.code_for(first.value) != piece:
            return None
        expected = {id(test.left), id(first.targets[0].target)}
        return branch if len(others) == 2 and {id(other) for other in others} == expected else None

    def _literal_dim(self, call: cst.Call, function: str) -> tuple[bool, str | None]:
        """(True, code of the `dim` argument: "dim=1" or "1", or None when
        absent), or (False, None) when the call has any other argument or a
        `dim` that is not a literal."""
        if has_splat(call) or not call.args:
            return False, None
        first = call.args[0]
        if first.keyword is not None and first.keyword.value != "tensors":
            return False, None
        extra = call.args[1:]
        if not extra:
            return True, None
        if function not in _WITH_DIM or len(extra) != 1:
            return False, None
        arg = extra[0]
        if arg.keyword is not None and arg.keyword.value != "dim" or not is_int_literal(arg.value):
            return False, None
        value = self.context.code_for(arg.value)
        return True, (f"dim={value}" if arg.keyword is not None else value)

    def _is_whole_statement_of(self, loop: cst.For | cst.While, node: cst.Assign) -> bool:
        body = loop.body
        if isinstance(body, cst.SimpleStatementSuite):
            return len(body.body) == 1 and body.body[0] is node
        statement = self.context.tracker.current_statement
        return (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and statement.body[0] is node
            and any(child is statement for child in body.body)
        )

    def _enclosing_in_function(self, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """The statements around `loop`, innermost first, up to its function."""
        statements = self.context.tracker.statements
        index = next(i for i in range(len(statements) - 1, -1, -1) if statements[i] is loop)
        outer: list[cst.CSTNode] = []
        for statement in reversed(statements[:index]):
            if isinstance(statement, cst.FunctionDef):
                break
            outer.append(statement)
        return outer


def _rebinds(loop: cst.For | cst.While, accumulator: str, others: list[cst.BaseExpression]) -> bool:
    """Whether one of `others` is a binding of `accumulator` (an assignment,
    a loop target, a `with ... as`, a walrus) rather than a read."""
    targets: list[cst.CSTNode] = [loop.target] if isinstance(loop, cst.For) else []
    for node in descendants(loop.body):
        if isinstance(node, cst.Assign):
            targets.extend(target.target for target in node.targets)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For, cst.CompFor)):
            targets.append(node.target)
        elif isinstance(node, cst.AsName):
            targets.append(node.name)
    bindings = {id(reference) for target in targets for reference in references(target, accumulator)}
    return any(id(reference) in bindings for reference in others)


def _repeated_parts(loop: cst.For | cst.While) -> list[cst.CSTNode]:
    """What runs at every iteration: the body, and the target or the test."""
    header = loop.target if isinstance(loop, cst.For) else loop.test
    return [header, loop.body]


def _only_first_piece_idiom(body: cst.CSTNode, accumulator: str, others: list[cst.BaseExpression]) -> bool:
    """Whether the references in `others` are those of the first-piece idiom:
    `x is None` / `x is not None` tests, and assignments that do not read `x`
    made under an `if` (an unconditional `x = f(batch)` restarts `x` at every
    iteration: then nothing accumulates)."""
    if not others:
        return True
    tests: set[int] = set()
    conditional_targets: set[int] = set()
    for node in descendants(body):
        if (
            isinstance(node, cst.Comparison)
            and len(node.comparisons) == 1
            and isinstance(node.comparisons[0].operator, (cst.Is, cst.IsNot))
            and isinstance(node.comparisons[0].comparator, cst.Name)
            and node.comparisons[0].comparator.value == "None"
        ):
            tests.add(id(node.left))
        elif isinstance(node, cst.If):
            for inner in descendants(node, skip=SCOPES):
                if isinstance(inner, cst.Assign) and not references(inner.value, accumulator):
                    conditional_targets.update(id(target.target) for target in inner.targets)
    return any(id(reference) in tests for reference in others) and all(
        id(reference) in tests or id(reference) in conditional_targets for reference in others
    )


def _assignment_just_before(
    block: Sequence[cst.BaseStatement], loop: cst.CSTNode, accumulator: str
) -> cst.Assign | None:
    """The plain `accumulator = ...` that is the last statement before `loop`
    in `block` to mention `accumulator`, if it is one."""
    statements = list(block)
    index = next(i for i, statement in enumerate(statements) if statement is loop)
    for statement in reversed(statements[:index]):
        if not references(statement, accumulator):
            continue
        assign = _single_assignment(statement)
        if assign is not None and dotted_name(assign.targets[0].target) == accumulator:
            return assign
        return None
    return None


def _base_name(expr: cst.BaseExpression) -> str | None:
    """`buf` for `buf`, `buf.data`, `buf[0]`, `buf[0].data`."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def _written_in_place(loop: cst.CSTNode, piece: cst.BaseExpression) -> bool:
    """Whether the loop may modify, in place, a tensor that `piece` reads.

    `cat` copies its inputs; a list keeps references. Any in-place method
    (`x.add_()`), augmented assignment, item or attribute assignment on a name
    of `piece`, or any `out=` argument in the loop, makes the list version
    differ.
    """
    names = {node.value for node in descendants(piece) if isinstance(node, cst.Name)}
    for node in descendants(loop):
        if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == "out":
            return True
        if isinstance(node, cst.AugAssign) and _base_name(node.target) in names:
            return True
        if isinstance(node, cst.Assign) and any(
            isinstance(target.target, (cst.Subscript, cst.Attribute)) and _base_name(target.target) in names
            for target in node.targets
        ):
            return True
        called = method_call(node) if isinstance(node, cst.Call) else None
        if called is not None:
            receiver, method = called
            if method.endswith("_") and not method.startswith("_") and _base_name(receiver) in names:
                return True
    return False


def _read_by_a_definition(module: cst.Module, accumulator: str) -> bool:
    """Whether a module-level function or class mentions the global `accumulator`
    (it could read it while the loop runs)."""
    return any(
        isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and references(statement, accumulator)
        for statement in module.body
    )


_SOFTMAX = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_MATMUL = {"torch.matmul", "torch.bmm"}
# Operations that keep a score matrix a score matrix (masking, casting).
_SCORE_PRESERVING_METHODS = {"masked_fill", "masked_fill_", "float", "to", "type_as", "contiguous"}


def _is_minus(expr: cst.BaseExpression, value: int) -> bool:
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
        and expr.expression.value == str(value)
    )


def _swaps_last_two(first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
    return (_is_minus(first, 2) and _is_minus(second, 1)) or (_is_minus(first, 1) and _is_minus(second, 2))


# (q, k) of a score product, and with the code of its `scale=` argument.
_QueryKey = tuple[cst.BaseExpression, cst.BaseExpression]
_ScaledProduct = tuple[cst.BaseExpression, cst.BaseExpression, "str | None"]


def _power_base(expr: cst.BaseExpression, exponent: str) -> cst.BaseExpression | None:
    """`x` for `x ** 0.5` (exponent "0.5") or `x ** -0.5` ("-0.5")."""
    if not isinstance(expr, cst.BinaryOperation) or not isinstance(expr.operator, cst.Power):
        return None
    power = expr.right
    if exponent.startswith("-"):
        if not (isinstance(power, cst.UnaryOperation) and isinstance(power.operator, cst.Minus)):
            return None
        power, exponent = power.expression, exponent[1:]
    return expr.left if isinstance(power, cst.Float) and power.value == exponent else None


class _Softmax(NamedTuple):
    input: cst.BaseExpression
    last_dim: bool
    input_and_dim_only: bool


def _is_query_key_equation(equation: str) -> bool:
    """`bhid,bhjd->bhij` (or `...id,...jd->...ij`): q @ k^T over the last two
    dimensions, the leading ones shared."""
    spec = equation.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    operands = inputs.split(",")
    if not arrow or len(operands) != 2:
        return False
    query, key = operands
    if not (len(query) == len(key) == len(output) >= 2):
        return False
    prefix = query[:-2]
    i, d, j = query[-2], query[-1], key[-2]
    letters = (i, j, d)
    return (
        key == prefix + j + d
        and output == prefix + i + j
        and len(set(letters)) == 3
        and all(letter.isalpha() for letter in letters)
        and not set(letters) & set(prefix)
    )


def _is_number(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float))


@register
class NaiveAttention(Rule):
    """
    ## What it does
    Flags attention computed by hand: a softmax over the last dimension of
    `q @ k.transpose(-2, -1)` (or `k.mT`, `torch.matmul`, an einsum such as
    `"bhid,bhjd->bhij"`), scaled, masked or
    not, directly or through a variable (`scores = q @ k.mT / d ** 0.5`, then
    `scores.softmax(-1)`), with `torch.softmax`, `F.softmax`, `.softmax()` or
    an `nn.Softmax(dim=-1)` module.

    ## Why is this bad?
    The score matrix has one entry per pair of positions: batch x heads x
    seq x seq. At 32 heads and 8k tokens that is 2 G elements, 4 GB in bf16
    per sample, and autograd keeps both the scores and their softmax (plus
    any mask and dropout copies) until backward. The memory grows with the
    square of the sequence length, and it is what runs out first on long
    inputs. `scaled_dot_product_attention` dispatches to fused kernels
    (FlashAttention, memory-efficient attention) that never store the matrix.

    ## Example
    ```python
    attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    out = attn @ v
    ```

    ## Use instead
    ```python
    out = F.scaled_dot_product_attention(q, k, v)
    ```

    ## Fix safety
    Safe, and offered only for the plain pattern whose result is
    mathematically the same: the scores (inline or in a variable used only
    there), a softmax over `dim=-1` with no other argument, and the next
    statement multiplying it by `v`, with `q`, `k`, `v` plain names and the
    intermediate variables used nowhere else. The scale is kept: none when it
    is provably `1/sqrt(q.size(-1))` (the kernel's default), `scale=...` when
    it is a float expression (`math.sqrt(d)`, a literal), `scale=1.0` when
    there is none; a scale that may be a tensor (`self.scale`) gets no fix.
    Masks and dropout between the softmax and `@ v` get no fix either: a mask
    maps onto `attn_mask`/`is_causal` only when its content is known. Results
    agree up to floating-point rounding (the fused kernels sum in another
    order). `scaled_dot_product_attention` needs torch >= 2.0, its `scale=`
    torch >= 2.1.
    """

    code = "OOM402"
    name = "naive-attention"
    summary = "Attention computed by hand materialises the full sequence x sequence score matrix."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """\
            import torch.nn.functional as F
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            """
        ),
        # A softmax over logits, not over q k^T.
        Valid("import torch\nprobs = torch.softmax(model(x), dim=-1)\n"),
        # q @ k^T without a softmax (e.g. a similarity score).
        Valid("import torch\nsim = q @ k.transpose(-2, -1)\nloss = sim.mean()\n"),
        # Softmax over another dimension than the keys'.
        Valid("import torch\nw = torch.softmax(q @ k.transpose(-2, -1), dim=1)\n"),
        # A local `softmax` function is not torch's.
        Valid(
            """\
            def softmax(x, dim):
                return x
            w = softmax(q @ k.transpose(-2, -1), dim=-1)
            """
        ),
        # The dim may come through a splat.
        Valid("import torch\nw = torch.softmax(q @ k.transpose(-2, -1), **options)\n"),
        # einsum that is not q k^T (a contraction over the sequence).
        Valid('import torch\nw = torch.einsum("bhid,bhje->bhde", q, k).softmax(-1)\n'),
        # A softmax module over another dimension.
        Valid(
            """\
            import torch.nn as nn
            class Attention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=1)
                def forward(self, q, k):
                    return self.softmax(q @ k.transpose(-2, -1))
            """
        ),
        # The scores variable was rebound to something else before the softmax.
        Valid(
            """\
            import torch
            scores = q @ k.transpose(-2, -1)
            scores = logits_of(batch)
            p = scores.softmax(-1)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """\
            import math
            import torch
            import torch.nn.functional as F

            def attention(q, k, v):
                attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
                out = attn @ v  # (B, H, T, D)
                return out
            """,
            line=6,
            expected_fix="""\
            import math
            import torch
            import torch.nn.functional as F

            def attention(q, k, v):
                out = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D)
                return out
            """,
        ),
        # Through a variable, a method softmax, a scale that is not the default.
        Invalid(
            """\
            import math
            import torch

            class Head(torch.nn.Module):
                def forward(self, q, k, v):
                    scores = torch.matmul(q, k.mT) / math.sqrt(self.head_dim)
                    weights = scores.softmax(dim=-1)
                    return torch.matmul(weights, v)
            """,
            line=7,
            expected_fix="""\
            import math
            import torch

            class Head(torch.nn.Module):
                def forward(self, q, k, v):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(self.head_dim))
            """,
        ),
        # No scale at all; F spelled through `import torch as T`.
        Invalid(
            """\
            import torch as T
            w = T.nn.functional.softmax(
                q @ k.transpose(-1, -2),
                dim=-1,
            )
            y = w @ v
            """,
            line=2,
            expected_fix="""\
            import torch as T
            y = T.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
            """,
        ),
        # The import of torch.nn.functional is added when nothing binds it.
        Invalid(
            """\
            from torch import softmax

            def attend(q, k, v):
                p = softmax(q @ k.transpose(-2, -1) * q.size(-1) ** -0.5, -1)
                return p @ v
            """,
            line=4,
            expected_fix="""\
            from torch import softmax
            import torch.nn.functional

            def attend(q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """,
        ),
        # A mask and dropout between: reported, no fix.
        Invalid(
            """\
            import torch
            import torch.nn.functional as F
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_drop(att)
            y = att @ v
            """,
            line=5,
        ),
        # An `nn.Softmax(dim=-1)` module.
        Invalid(
            """\
            import math
            import torch.nn as nn
            import torch.nn.functional as F

            class ScaledDotProductAttention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)

                def forward(self, q, k, v):
                    score = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                    attn = self.softmax(score)
                    return attn @ v
            """,
            line=12,
            expected_fix="""\
            import math
            import torch.nn as nn
            import torch.nn.functional as F

            class ScaledDotProductAttention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)

                def forward(self, q, k, v):
                    return F.scaled_dot_product_attention(q, k, v)
            """,
        ),
        # Scores through einsum (the weights are used twice: no fix).
        Invalid(
            """\
            from torch import einsum
            sim = einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
            attn = sim.softmax(dim=-1)
            out = einsum("b h i j, b h j d -> b h i d", attn, v)
            """,
            line=3,
        ),
        # A scale that may be a tensor: reported, no fix.
        Invalid(
            """\
            import torch
            attn = (q @ k.transpose(-2, -1)) * self.scale
            attn = attn.softmax(dim=-1)
            x = attn @ v
            """,
            line=3,
        ),
    ]

    def __init__(self, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context)
        # Per function: the local names currently holding a score matrix.
        self._scores: list[set[str]] = [set()]
        # Names and attributes bound to `nn.Softmax(dim=-1)` (False once bound
        # to anything else).
        self._softmax_modules: dict[str, bool] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scores.append(set())

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scores.pop()

    def leave_Assign(self, original_node: cst.Assign) -> None:
        self._rebind([target.target for target in original_node.targets], original_node.value)
        for target in original_node.targets:
            name = dotted_name(target.target)
            if name is not None:
                is_softmax = self._is_last_dim_softmax_module(original_node.value)
                self._softmax_modules[name] = is_softmax and self._softmax_modules.get(name, True)

    def _is_last_dim_softmax_module(self, value: cst.BaseExpression) -> bool:
        if not isinstance(value, cst.Call) or self.context.call_name(value) != "torch.nn.Softmax":
            return False
        dim = get_arg(value, "dim", 0)
        return isinstance(dim, cst.Arg) and _is_minus(dim.value, 1)

    def leave_AnnAssign(self, original_node: cst.AnnAssign) -> None:
        if original_node.value is not None:
            self._rebind([original_node.target], original_node.value)

    def _rebind(self, targets: list[cst.BaseExpression], value: cst.BaseExpression) -> None:
        names = self._scores[-1]
        is_score = self._is_scores(value)
        for target in targets:
            if isinstance(target, cst.Name):
                names.discard(target.value)
                if is_score:
                    names.add(target.value)
                continue
            for node in descendants(target):
                if isinstance(node, cst.Name):
                    names.discard(node.value)

    # --- recognising the score matrix --------------------------------------
    def _key_of_transposed(self, expr: cst.BaseExpression) -> cst.BaseExpression | None:
        """`k` for `k.transpose(-2, -1)`, `k.transpose(-1, -2)`, `k.mT`,
        `torch.transpose(k, -2, -1)`."""
        if isinstance(expr, cst.Attribute) and expr.attr.value == "mT":
            return expr.value
        if not isinstance(expr, cst.Call) or has_splat(expr):
            return None
        args = [arg.value for arg in expr.args if arg.keyword is None]
        if len(args) != len(expr.args):
            return None
        if self.context.call_name(expr) == "torch.transpose" and len(args) == 3:
            return args[0] if _swaps_last_two(args[1], args[2]) else None
        called = method_call(expr)
        if called is not None and called[1] in ("transpose", "swapaxes", "swapdims") and len(args) == 2:
            if self.context.qualified_name(called[0]) is None and _swaps_last_two(args[0], args[1]):
                return called[0]
        return None

    def _product(self, expr: cst.BaseExpression) -> _QueryKey | None:
        """(q, k) for `q @ k^T`, `torch.matmul(q, k^T)`,
        `torch.einsum("bhid,bhjd->bhij", q, k)`."""
        if isinstance(expr, cst.Call) and self.context.call_name(expr) == "torch.einsum":
            if has_splat(expr) or len(expr.args) != 3 or any(arg.keyword for arg in expr.args):
                return None
            equation = string_value(expr.args[0].value)
            if equation is None or not _is_query_key_equation(equation):
                return None
            return expr.args[1].value, expr.args[2].value
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
            left, right = expr.left, expr.right
        elif isinstance(expr, cst.Call) and self.context.call_name(expr) in _MATMUL:
            if has_splat(expr) or len(expr.args) != 2 or any(arg.keyword for arg in expr.args):
                return None
            left, right = expr.args[0].value, expr.args[1].value
        else:
            return None
        key = self._key_of_transposed(right)
        return (left, key) if key is not None else None

    def _is_scores(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Name):
            return expr.value in self._scores[-1]
        if self._product(expr) is not None:
            return True
        if isinstance(expr, cst.BinaryOperation):
            operator = expr.operator
            if isinstance(operator, (cst.Multiply, cst.Add, cst.Subtract)):
                return self._is_scores(expr.left) or self._is_scores(expr.right)
            if isinstance(operator, cst.Divide):
                return self._is_scores(expr.left)
            return False
        called = method_call(expr)
        if called is not None and called[1] in _SCORE_PRESERVING_METHODS:
            return self.context.qualified_name(called[0]) is None and self._is_scores(called[0])
        return False

    def _softmax_input(self, call: cst.Call) -> _Softmax | None:
        """The input of a softmax call, whether it runs over the last dimension,
        and whether it has no argument other than the input and the dim."""
        if has_splat(call):
            return None
        if self.context.call_name(call) in _SOFTMAX:
            source, dim = get_arg(call, "input", 0), get_arg(call, "dim", 1)
            if isinstance(source, cst.Arg) and isinstance(dim, cst.Arg):
                return _Softmax(source.value, _is_minus(dim.value, 1), len(call.args) == 2)
            return None
        module = dotted_name(call.func)
        if module is not None and self._softmax_modules.get(module):
            # `self.softmax = nn.Softmax(dim=-1)`, then `self.softmax(scores)`.
            if len(call.args) == 1 and call.args[0].keyword is None:
                return _Softmax(call.args[0].value, True, True)
            return None
        called = method_call(call)
        if called is None or called[1] != "softmax" or self.context.qualified_name(called[0]) is not None:
            return None
        dim = get_arg(call, "dim", 0)
        if not isinstance(dim, cst.Arg):
            return None
        return _Softmax(called[0], _is_minus(dim.value, 1), len(call.args) == 1)

    def visit_Call(self, node: cst.Call) -> None:
        softmax = self._softmax_input(node)
        if softmax is None or not softmax.last_dim or not self._is_scores(softmax.input):
            return
        self.report(
            node,
            "This softmax over `q @ k^T` materialises the whole sequence x sequence score matrix per "
            "head, and autograd keeps it and its softmax until backward: memory grows with the square "
            "of the sequence length. Use `torch.nn.functional.scaled_dot_product_attention`, whose "
            "fused kernels never store it.",
            fix=self._fix(node, softmax.input) if softmax.input_and_dim_only else None,
        )

    # --- the fix --------------------------------------------------------------
    def _fix(self, softmax: cst.Call, source: cst.BaseExpression) -> FixSpec | None:
        tracker = self.context.tracker
        statement = tracker.current_statement
        weights = _single_assignment(statement)
        if weights is None or weights.value is not softmax:
            return None
        if not isinstance(weights.targets[0].target, cst.Name):
            return None
        block = enclosing_block(tracker.statements, self.context.module, statement)
        if block is None:
            return None
        statements = list(block)
        index = next(i for i, candidate in enumerate(statements) if candidate is statement)
        if index + 1 >= len(statements):
            return None
        scope = scope_of(tracker.current_function, self.context.module)
        removed: list[cst.SimpleStatementLine] = [statement]  # type: ignore[list-item]
        if isinstance(source, cst.Name):
            previous = _single_assignment(statements[index - 1]) if index > 0 else None
            if (
                previous is None
                or dotted_name(previous.targets[0].target) != source.value
                or len(references(scope, source.value)) != 2
            ):
                return None
            removed.insert(0, statements[index - 1])  # type: ignore[arg-type]
            source = previous.value
        weights_name = weights.targets[0].target.value  # type: ignore[attr-defined]
        if len(references(scope, weights_name)) != 2:
            return None
        output = _output_expression(statements[index + 1])
        value = self._times_value(output, weights_name) if output is not None else None
        parsed = self._scaled_product(source)
        if value is None or parsed is None:
            return None
        query, key, scale = parsed
        names = [dotted_name(query), dotted_name(key), dotted_name(value)]
        if None in names:
            return None
        functional = self.context.imports.reference_to("torch.nn.functional")
        return FixSpec(
            title="Use `scaled_dot_product_attention`",
            edits=fused_attention(
                functional=functional or "torch.nn.functional",
                query=names[0],  # type: ignore[arg-type]
                key=names[1],  # type: ignore[arg-type]
                value=names[2],  # type: ignore[arg-type]
                scale=scale,
                removed=tuple(removed),
                output=output,  # type: ignore[arg-type]
            ),
            applicability=Applicability.SAFE,
            imports=() if functional else ("torch.nn.functional",),
        )

    def _times_value(self, expr: cst.BaseExpression, weights: str) -> cst.BaseExpression | None:
        """`v` for `weights @ v` / `torch.matmul(weights, v)`."""
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
            left, right = expr.left, expr.right
        elif isinstance(expr, cst.Call) and self.context.call_name(expr) in _MATMUL:
            if has_splat(expr) or len(expr.args) != 2 or any(arg.keyword for arg in expr.args):
                return None
            left, right = expr.args[0].value, expr.args[1].value
        else:
            return None
        if not (isinstance(left, cst.Name) and left.value == weights) or left.lpar or expr.lpar:
            return None
        return right

    def _scaled_product(self, expr: cst.BaseExpression) -> _ScaledProduct | None:
        """(q, k, code of `scale=`) when `expr` is `q @ k^T` times a scale
        provably equal to the kernel's (None), or a float."""
        product = self._product(expr)
        if product is not None:
            return (*product, "1.0")
        if not isinstance(expr, cst.BinaryOperation):
            return None
        if isinstance(expr.operator, cst.Divide):
            product = self._product(expr.left)
            if product is None:
                return None
            divisor = expr.right
            if self._is_sqrt_of_head_dim(divisor, product):
                return (*product, None)
            if self._is_float(divisor):
                return (*product, f"1 / {self.context.code_for(divisor)}")
            return None
        if not isinstance(expr.operator, cst.Multiply):
            return None
        for factor, product_side in ((expr.right, expr.left), (expr.left, expr.right)):
            product = self._product(product_side)
            if product is None:
                continue
            if self._is_inverse_sqrt_of_head_dim(factor, product):
                return (*product, None)
            if self._is_float(factor):
                return (*product, self.context.code_for(factor))
            return None
        return None

    def _is_head_dim(self, expr: cst.BaseExpression, product: _QueryKey) -> bool:
        """`q.size(-1)` or `q.shape[-1]` (or k's: q and k share the last dimension)."""
        operands = {dotted_name(product[0]), dotted_name(product[1])} - {None}
        called = method_call(expr)
        if called is not None and called[1] == "size" and isinstance(expr, cst.Call) and len(expr.args) == 1:
            return dotted_name(called[0]) in operands and _is_minus(expr.args[0].value, 1)
        if not (isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute)):
            return False
        index = expr.slice[0].slice if len(expr.slice) == 1 else None
        return (
            expr.value.attr.value == "shape"
            and dotted_name(expr.value.value) in operands
            and isinstance(index, cst.Index)
            and _is_minus(index.value, 1)
        )

    def _is_sqrt_of_head_dim(self, expr: cst.BaseExpression, product: _QueryKey) -> bool:
        """`math.sqrt(q.size(-1))`, `q.shape[-1] ** 0.5`."""
        if isinstance(expr, cst.Call) and self.context.call_name(expr) == "math.sqrt" and len(expr.args) == 1:
            return self._is_head_dim(expr.args[0].value, product)
        base = _power_base(expr, "0.5")
        return base is not None and self._is_head_dim(base, product)

    def _is_inverse_sqrt_of_head_dim(self, expr: cst.BaseExpression, product: _QueryKey) -> bool:
        """`q.size(-1) ** -0.5`, `1 / math.sqrt(q.size(-1))`, `1.0 / q.shape[-1] ** 0.5`."""
        if (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Divide)
            and isinstance(expr.left, (cst.Integer, cst.Float))
            and expr.left.value in ("1", "1.0")
        ):
            return self._is_sqrt_of_head_dim(expr.right, product)
        base = _power_base(expr, "-0.5")
        return base is not None and self._is_head_dim(base, product)

    def _is_float(self, expr: cst.BaseExpression) -> bool:
        """A Python number whatever the names in it hold: a literal, `math.sqrt(...)`,
        `1 / math.sqrt(...)`, or a literal raised to a literal power."""
        if _is_number(expr):
            return True
        if isinstance(expr, cst.Call):
            return self.context.call_name(expr) == "math.sqrt"
        if isinstance(expr, cst.BinaryOperation):
            arithmetic = isinstance(expr.operator, (cst.Divide, cst.Power, cst.Multiply))
            return arithmetic and self._is_float(expr.left) and self._is_float(expr.right)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return self._is_float(expr.expression)
        return False


def _single_assignment(statement: cst.CSTNode | None) -> cst.Assign | None:
    """The `Assign` of a line that holds exactly one assignment to one target."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        return assign
    return None


def _output_expression(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of `target = value` or `return value`, alone on its line."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return small.value
    if isinstance(small, cst.Return):
        return small.value
    return None
