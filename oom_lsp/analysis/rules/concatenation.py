"""OOM401: a tensor grown by concatenation inside a loop."""

from __future__ import annotations

import re
from typing import Iterator, Sequence

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.dataflow import value_path
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, method_call
from oom_lsp.analysis.facts.sizes import KnownInt, int_value
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid, short_code
from oom_lsp.analysis.rules._scan import (
    SCOPES,
    descendants,
    enclosing_block,
    free_name,
    is_int_literal,
    references,
    scope_of,
    single_assignment,
)
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


class CatInLoop(Rule):
    """
    ## What it does
    Flags a tensor grown by concatenation at every batch of a data loader,
    `preds = torch.cat([preds, model(batch)])`, where `preds` carries over
    from one iteration to the next: the loop iterates over a data loader or a
    data set (`for batch in loader`, `enumerate(tqdm(val_dataloader))`),
    steps through one in batches (`range(0, n, batch_size)`,
    `range(num_batches)`), its target is a batch, or the code states a
    count of at least a thousand iterations (`range(horizon)` with
    `--horizon` defaulting to 8760). Predictions, labels or features
    collected over an evaluation set are what it is for.

    It stays silent on a loop that reads the whole accumulator at every
    iteration (a generation loop feeding `idx[:, -block:]` or `model(ys)` the
    tokens so far: each step already reads the whole tensor, and a list would
    not do), on loops over a few groups (crop resolutions, regions, the chunks
    of one batch) or a count of steps not known to reach a thousand, and on
    a tensor set afresh at every iteration.

    ## Why is this bad?
    Each `torch.cat` allocates a new tensor holding everything accumulated so
    far and copies it: n batches copy O(n^2) elements, and at every step the
    old and the new accumulator are alive together, so the peak is twice the
    final size plus the fragmentation left by n ever-larger blocks. On the
    GPU, collecting predictions this way over an evaluation set is a classic
    late OOM.

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
    A loop that reads the accumulator's size (`if x.shape[0] >= n: break`) is
    reported without a fix.
    """

    code = "OOM401"
    name = "cat-in-loop"
    summary = "A tensor grown with `torch.cat` at every batch is copied whole at every iteration."
    why = (
        "Each concatenation copies everything accumulated so far into a new tensor: the copies are "
        "quadratic, and the old and new tensors are alive together."
    )
    remedy = "Append the pieces to a list and concatenate once after the loop."
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
            for frame in frame_loader:
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
            for y in loader:
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
            for pair in pair_loader:
                acc = torch.cat(*pair)
            """
        ),
        # Concatenating other tensors in a loop does not grow anything.
        Valid(
            """\
            from torch import cat
            for a, b in loader:
                x = cat([a, b], dim=-1)
            """
        ),
        # Autoregressive decoding: each step feeds the whole sequence back to
        # the model, so the sequence is needed whole at every iteration.
        Valid(
            """\
            import torch

            @torch.no_grad()
            def sample(model, tokens, steps, context):
                for _ in range(steps):
                    window = tokens[:, -context:]
                    scores = model(window)[:, -1]
                    tokens = torch.cat([tokens, scores.argmax(-1, keepdim=True)], dim=1)
                return tokens
            """
        ),
        # Greedy decoding over a loader of sentences: `out` restarts for each
        # sentence, and the decoder reads all of it at every token.
        Valid(
            """\
            import torch
            for sentence in test_loader:
                out = torch.full((1, 1), bos)
                for _ in range(max_len):
                    step = decoder(out, encoder(sentence))
                    out = torch.cat([out, step[-1:].argmax(-1)], dim=0)
            """
        ),
        # A handful of groups (one per input resolution), not a data set.
        Valid(
            """\
            import torch

            def forward(self, crops):
                feats = torch.empty(0, device=crops[0].device)
                for group in self.resolution_groups(crops):
                    feats = torch.cat([feats, self.backbone(torch.cat(group))])
                return self.head(feats)
            """
        ),
        # Each iteration extends a different object's own tensor, once.
        Valid(
            """\
            import torch
            for region in regions:
                region.embedding = torch.cat([blank, region.embedding])
            """
        ),
        # Per-image calls over the chunks of one batch: `preds` restarts at
        # every batch, so it never outgrows one batch.
        Valid(
            """\
            import torch
            for images in dataset:
                preds = None
                for image in images.chunk(len(images)):
                    if preds is None:
                        preds = runtime(image)
                    else:
                        preds = torch.cat([preds, runtime(image)])
                keep(preds)
            """
        ),
        # A stride through a literal length runs a fixed, small number of times.
        Valid(
            """\
            import torch
            acc = torch.empty(0)
            for start in range(0, 8, 2):
                acc = torch.cat([acc, x[start:start + 2]])
            """
        ),
        # A short stated count of steps: a few copies, nothing that grows.
        Valid(
            """\
            import torch
            def rollout(model, state, horizon=16):
                path = state.new_empty(state.size(0), 0)
                for _ in range(horizon):
                    state = model(state)
                    path = torch.hstack([path, state[:, :1]])
                return path
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
        # `from torch import cat`, keyword `dim`, a name already taken, a
        # loader wrapped in a progress bar.
        Invalid(
            """\
            from torch import cat
            from tqdm import tqdm
            out_parts = None
            out = start
            for step, inputs in enumerate(tqdm(self.eval_dataloader())):
                out = cat([out, encode(inputs)], dim=-1)
            """,
            line=6,
            expected_fix="""\
            from torch import cat
            from tqdm import tqdm
            out_parts = None
            out = start
            out_parts_2 = [out]
            for step, inputs in enumerate(tqdm(self.eval_dataloader())):
                out_parts_2.append(encode(inputs))
            out = cat(out_parts_2, dim=-1)
            """,
        ),
        # Prepending: reported, no fix.
        Invalid(
            """\
            import torch
            h = torch.empty(0)
            for batch in val_dataset:
                h = torch.vstack([encode(batch), h])
            """,
            line=4,
        ),
        # The loop reads only the accumulator's size: reported, no fix.
        Invalid(
            """\
            import torch
            embeddings = torch.empty(0, dim)
            for images, _ in test_loader:
                embeddings = torch.cat([embeddings, encoder(images)])
                if embeddings.shape[0] >= limit:
                    break
            """,
            line=4,
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
            for batch in batches:
                acc = torch.cat([acc, batch], **options)
            """,
            line=4,
        ),
        # torch.stack grows too; stacking once would give another shape: no fix.
        Invalid(
            """\
            import torch
            for i, minibatch in enumerate(stream):
                history = torch.stack([history, minibatch])
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
        # Collected across the epochs of an outer loop: no fix.
        Invalid(
            """\
            import torch
            seen = torch.empty(0)
            for epoch in range(epochs):
                for x, y in train_loader:
                    for part in x.split(2):
                        seen = torch.cat([seen, part])
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
        # A long input walked through in chunks: the pieces add up to all of it.
        Invalid(
            """            import torch
            def separate(model, wav, seg):
                out = torch.empty(2, 0)
                for start in range(0, wav.shape[-1], seg):
                    out = torch.cat([out, model(wav[:, start:start + seg])], dim=-1)
                return out
            """,
            line=5,
        ),
        # A count of steps the code states in thousands (an argparse default
        # reaching the function through its caller): quadratic copying,
        # whatever the loop iterates over.
        Invalid(
            """\
            import argparse
            import torch

            @torch.no_grad()
            def rollout(model, state, horizon):
                path = state.new_empty(state.size(0), 0)
                for _ in range(horizon):
                    state = model(state)
                    path = torch.hstack([path, state[:, :1]])
                return path

            parser = argparse.ArgumentParser()
            parser.add_argument("--horizon", type=int, default=24 * 365)
            args = parser.parse_args()
            rollout(net, start, args.horizon)
            """,
            line=9,
        ),
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        tracker = self.context.tracker
        if not tracker.in_loop or len(node.targets) != 1:
            return
        call = node.value
        conditional = False
        if isinstance(call, cst.IfExp):
            # `x = torch.cat((x, y)) if ok else None`: the arm that grows it.
            grown = [arm for arm in (call.body, call.orelse) if isinstance(arm, cst.Call)]
            call = next((arm for arm in grown if self.context.call_name(arm) in _CONCATENATIONS), None)
            conditional = True
        if not isinstance(call, cst.Call):
            return
        function = self.context.call_name(call)
        if function not in _CONCATENATIONS:
            return
        # A name, an attribute, or an entry of a dict with a constant key (`embeddings["query"]`).
        accumulator = value_path(node.targets[0].target)
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
                if isinstance(element, cst.Element) and value_path(element.value) == accumulator
            ),
            None,
        )
        if position is None:
            return
        loop = tracker.loops[-1]
        many: KnownInt | None = None
        # The cheap test first: most loops that grow a tensor are not over data.
        if not any(_iterates_over_data(outer) for outer in _loops_carrying(tracker.loops, accumulator)):
            # A few groups (crop resolutions, regions, the chunks of one batch)
            # or a short count of steps: nothing says the tensor grows much,
            # unless the code states a count of thousands.
            scope = tracker.current_function
            many = next(
                (
                    count
                    for outer in _loops_carrying(tracker.loops, accumulator)
                    if (count := _stated_iterations(self.context, outer, scope)) is not None
                    and count.value >= _MANY_ITERATIONS
                ),
                None,
            )
            if many is None:
                return
        if _owner_bound_by(loop, accumulator):
            # `region.prompt = cat([uncond, region.prompt])` over `for region in
            # regions`: each iteration extends a different object's attribute once.
            return
        # The loop reads the accumulator nowhere else (but the first-piece
        # idiom `if x is None: x = y else: x = cat([x, y])` is accumulation too).
        others = [
            reference
            for part in _repeated_parts(loop)
            for reference in references(part, accumulator)
            if reference is not node.targets[0].target and reference is not elements[position].value
        ]
        if not _only_first_piece_idiom(loop.body, accumulator, others):
            if _rebinds(loop, accumulator, others):
                # Set or transformed elsewhere in the loop (`x = up(x)`, `x = f(batch)`):
                # nothing says it grows from one iteration to the next.
                return
            if not _only_size_reads(loop, accumulator, others):
                # The loop feeds the whole tensor back (a generation loop:
                # `model(idx[:, -block:])` at every new token): each step
                # already reads it whole, so the copy is not what costs, and a
                # list would not do.
                return
        fix = None
        if not conditional and position == 0 and len(elements) == 2 and isinstance(elements[1], cst.Element):
            fix = self._fix(node, call, loop, accumulator, function, elements[1].value, others)
        grown = f"{short_code(accumulator)} is grown with {function.rsplit('.', 1)[-1]}"
        if many is not None:
            message = f"{grown} at each of {many.value:,} iterations, copying all of it every time"
        else:
            message = f"{grown} inside a loop, copying all of it at every iteration"
        self.report(node, message, fix=fix)

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
        first = single_assignment(first_block.body[0]) if isinstance(first_block, cst.IndentedBlock) else None
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


def _binding_targets(loop: cst.For | cst.While) -> list[cst.CSTNode]:
    """What the loop binds at each iteration: its target, and the targets of
    assignments, augmented and annotated assignments, walruses, inner `for`s,
    comprehensions and `with ... as` in its body."""
    targets: list[cst.CSTNode] = [loop.target] if isinstance(loop, cst.For) else []
    for node in descendants(loop.body):
        if isinstance(node, cst.Assign):
            targets.extend(target.target for target in node.targets)
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.NamedExpr, cst.For, cst.CompFor)):
            targets.append(node.target)
        elif isinstance(node, cst.AsName):
            targets.append(node.name)
    return targets


def _bound_names(target: cst.CSTNode) -> list[str]:
    """The dotted names a binding target binds as a whole (`a`, `a.b`, each
    name of `a, (b, c)`), not the names it only reads (`a` of `a[i] = ...`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _bound_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    name = dotted_name(target) if isinstance(target, cst.BaseExpression) else None
    return [name] if name is not None else []


def _owner_bound_by(loop: cst.For | cst.While, accumulator: str) -> bool:
    """Whether `accumulator` is an attribute of an object the loop binds
    afresh at each iteration (`region.prompt` in `for region in regions`)."""
    parts = accumulator.split(".")
    owners = {".".join(parts[:end]) for end in range(1, len(parts))}
    return bool(owners) and any(
        name in owners for target in _binding_targets(loop) for name in _bound_names(target)
    )


def _rebinds(loop: cst.For | cst.While, accumulator: str, others: list[cst.BaseExpression]) -> bool:
    """Whether one of `others` is a binding of `accumulator` (an assignment,
    a loop target, a `with ... as`, a walrus) rather than a read."""
    bindings = {
        id(reference) for target in _binding_targets(loop) for reference in references(target, accumulator)
    }
    return any(id(reference) in bindings for reference in others)


# What a loop may read of the accumulator without needing its values: its
# size, and what it is.
_SIZE_ATTRIBUTES = frozenset({"shape", "size", "ndim", "dim", "numel", "nelement", "device", "dtype"})


def _only_size_reads(loop: cst.For | cst.While, accumulator: str, others: list[cst.BaseExpression]) -> bool:
    """Whether every reference in `others` reads only the accumulator's size
    or type (`x.shape[0]`, `x.size(0)`, `len(x)`, `x.device`)."""
    if not others:
        return True
    size_reads: set[int] = set()
    for part in _repeated_parts(loop):
        for node in descendants(part, skip=SCOPES):
            if isinstance(node, cst.Attribute) and node.attr.value in _SIZE_ATTRIBUTES:
                size_reads.add(id(node.value))
            elif (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Name)
                and node.func.value == "len"
                and len(node.args) == 1
            ):
                size_reads.add(id(node.args[0].value))
    return all(id(reference) in size_reads for reference in others)


def _loops_carrying(loops: Sequence[cst.For | cst.While], accumulator: str) -> Iterator[cst.For | cst.While]:
    """The innermost loop, then each enclosing loop that carries the
    accumulator over from one of its iterations to the next: it stops at the
    first one that binds it outside the inner loop (`pred = None` before the
    loop over one batch's chunks restarts it at every batch). Lazily: the
    enclosing loops are looked at only when the inner ones do not settle it."""
    inner = loops[-1]
    yield inner
    for outer in reversed(loops[:-1]):
        inside = {id(target) for target in _binding_targets(inner)}
        if any(
            id(target) not in inside and accumulator in _bound_names(target)
            for target in _binding_targets(outer)
        ):
            return
        yield outer
        inner = outer


# Calls that iterate over what they are given (`enumerate(tqdm(loader))`).
_ITERATION_WRAPPERS = frozenset({"enumerate", "zip", "iter", "tqdm", "islice", "chain", "track"})
_DATA_WORDS = frozenset({"dl", "ds", "iter", "iterator", "batches", "minibatches"})


def _words(identifier: str) -> list[str]:
    return [word for word in re.split(r"[_\d]+", identifier.lower()) if word]


def _names_data(identifier: str) -> bool:
    """`train_loader`, `testloader`, `eval_dataloader`, `val_dataset`,
    `data_iter`, `batches`: the names PyTorch code gives what yields batches."""
    lower = identifier.lower()
    return "loader" in lower or "dataset" in lower or any(word in _DATA_WORDS for word in _words(identifier))


def _names_a_batch(identifier: str) -> bool:
    """`batch`, `batch_idx`, `x_batch`, `minibatch` (not `batch_size`)."""
    words = _words(identifier)
    return identifier.lower().endswith("batch") or ("batch" in words and not {"size", "sizes"} & set(words))


def _batched_range(call: cst.Call) -> bool:
    """`range(0, len(data), batch_size)`, `range(0, n, chunk)`,
    `range(num_batches)`, `range(len(loader))`: a step through a data set or
    a long input in batches or chunks (not `range(batch_size)`, the samples of
    one batch)."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if len(positional) == 3 and not isinstance(positional[1], (cst.Integer, cst.Float)):
        # A walk through a length in strides (`range(0, n, chunk)`, `range(0,
        # length, step)`): each iteration handles the next chunk of one input, so
        # the pieces concatenated add up to the whole of it, an input big enough
        # that the code splits it. A literal end bounds the count instead.
        return True
    return any(
        (name := dotted_name(node)) is not None and _names_data(name.rsplit(".", 1)[-1])
        for value in positional
        for node in descendants(value, skip=(cst.Attribute,))
        if isinstance(node, (cst.Name, cst.Attribute))
    )


# A loop the code runs this many times or more grows its accumulator by
# quadratic copying whatever it iterates over: n concatenations copy n²/2
# pieces, and the last one holds the whole result twice.
_MANY_ITERATIONS = 1000


def _stated_iterations(context: FileContext, loop: cst.For | cst.While, scope: cst.FunctionDef | None) -> KnownInt | None:
    """How many times `for _ in range(n)` runs when the code states `n` (a
    literal, a constant, a default, a caller's argument): `range(stop)` or
    `range(start, stop)` with a literal start. None otherwise."""
    if not isinstance(loop, cst.For) or not isinstance(loop.iter, cst.Call):
        return None
    if dotted_name(loop.iter.func) != "range" or has_splat(loop.iter):
        return None
    positional = [arg.value for arg in loop.iter.args if arg.keyword is None]
    if len(positional) == 1:
        start, stop = 0, positional[0]
    elif len(positional) == 2 and isinstance(positional[0], cst.Integer):
        start, stop = int(positional[0].value), positional[1]
    else:
        return None
    count = int_value(context, stop, scope)
    if count is None:
        return None
    return KnownInt(value=count.value - start, evidence=count.evidence, from_default=count.from_default)


def _data_source(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Call):
        called = dotted_name(expr.func)
        last = called.rsplit(".", 1)[-1] if called is not None else None
        if last == "range":
            return _batched_range(expr)
        if last in _ITERATION_WRAPPERS:
            return any(_data_source(arg.value) for arg in expr.args if arg.keyword is None and not arg.star)
        # `self.val_dataloader()`, `get_loader(split)`
        return last is not None and _names_data(last)
    name = dotted_name(expr)
    return name is not None and _names_data(name.rsplit(".", 1)[-1])


def _iterates_over_data(loop: cst.For | cst.While) -> bool:
    """Whether the loop runs once per batch of a data set: it iterates over a
    data loader or a data set, steps through one in batches, or its target is
    named as a batch."""
    if not isinstance(loop, cst.For):
        return False
    if any(_names_a_batch(name.rsplit(".", 1)[-1]) for name in _bound_names(loop.target)):
        return True
    return _data_source(loop.iter)


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
        assign = single_assignment(statement)
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
