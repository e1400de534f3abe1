"""OOM502 and OOM503: runtime calls that slow every step or keep gradients allocated."""

from __future__ import annotations

import re
import weakref

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.cst_helpers import get_arg, is_false, method_call
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.analysis.rules._scan import (
    SCOPES,
    descendants,
    enclosing_block,
    is_optimizer_like,
)
from oom_lsp.fixes.empty_cache import remove_call_statement
from oom_lsp.fixes.zero_grad import set_to_none

_EMPTY_CACHE = {"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"}


def _builds_and_deletes_its_model(loop: cst.CSTNode) -> bool:
    """Each iteration builds what it runs and deletes it (`model = GPTModel(config)`, `model(x)`,
    `del model`): a trial per iteration (a batch-size or model-size search), not a training loop.
    The deleted model's blocks are cached in sizes the next trial's model may not reuse, and
    emptying the cache returns them."""
    built: set[str] = set()
    called: set[str] = set()
    deleted: set[str] = set()
    for node in descendants(loop, skip=SCOPES):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
            built.update(target.target.value for target in node.targets if isinstance(target.target, cst.Name))
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
            called.add(node.func.value)
        elif isinstance(node, cst.Del):
            targets = node.target.elements if isinstance(node.target, cst.Tuple) else [node.target]
            for target in targets:
                value = target.value if isinstance(target, cst.Element) else target
                if isinstance(value, cst.Name):
                    deleted.add(value.value)
    return bool(built & called & deleted)


def _is_training_step(node: cst.CSTNode, context: FileContext) -> bool:
    """`loss.backward()`, `accelerator.backward(loss)`, `torch.autograd.backward(...)`,
    `optimizer.step()`."""
    if not isinstance(node, cst.Call):
        return False
    called = method_call(node)
    if called is not None:
        receiver, method = called
        if method == "backward":
            return True
        if method == "step" and is_optimizer_like(receiver):
            return True
    return context.call_name(node) == "torch.autograd.backward"


class EmptyCacheInLoop(Rule):
    """
    ## What it does
    Flags `torch.cuda.empty_cache()` called in the loop that runs the
    training step (the same loop body calls `backward()` or
    `optimizer.step()`), unless it is periodic (`if step % 100 == 0:`) or
    in an exception handler (recovering from an OOM is what it is for).

    ## Why is this bad?
    `empty_cache` returns to the driver only the cached blocks that no tensor
    uses; it cannot free anything still referenced, so it never prevents an
    out-of-memory error in the same process. What it does is force the
    allocator to ask CUDA for the memory again at the next step
    (`cudaMalloc` is synchronous and slow), and it hides the real cause: a
    reference that keeps activations, losses or outputs alive.

    ## Example
    ```python
    for batch in loader:
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.empty_cache()
    ```

    ## Use instead
    ```python
    for batch in loader:
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    ## Fix safety
    Safe: `empty_cache` changes no value a program can compute, only how
    much memory other processes see as free between steps. The statement is
    removed (replaced by `pass` when it is alone in its block); a comment on
    its line goes with it.
    """

    code = "OOM502"
    name = "empty-cache-in-loop"
    summary = "`torch.cuda.empty_cache()` at every training step frees nothing that is still referenced."
    why = (
        "It frees only cached blocks no tensor uses, so it cannot prevent an OOM, and the next step must "
        "allocate from CUDA again."
    )
    remedy = "Remove it, and release the reference that holds the memory instead."
    fix_applicability = Applicability.SAFE

    VALID = [
        # A search: each iteration builds a model of another size, runs it, deletes it.
        Valid(
            """\
            import torch
            for batch_size in (64, 32, 16):
                model = Net().cuda()
                try:
                    model(torch.randn(batch_size, 3, 224, 224, device="cuda")).sum().backward()
                except torch.OutOfMemoryError:
                    pass
                del model
                torch.cuda.empty_cache()
            """
        ),
        # Once per epoch, outside the loop that steps.
        Valid(
            """\
            import torch
            for epoch in range(epochs):
                for batch in loader:
                    model(batch).loss.backward()
                    optimizer.step()
                torch.cuda.empty_cache()
            """
        ),
        # Periodic.
        Valid(
            """\
            import torch
            for step, batch in enumerate(loader):
                model(batch).loss.backward()
                optimizer.step()
                if step % 500 == 0:
                    torch.cuda.empty_cache()
            """
        ),
        # OOM recovery in an exception handler.
        Valid(
            """\
            import torch
            for batch in loader:
                try:
                    model(batch).loss.backward()
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                optimizer.step()
            """
        ),
        # A loop that does not train (releasing memory between models).
        Valid(
            """\
            import torch
            for name in names:
                evaluate(load(name))
                torch.cuda.empty_cache()
            """
        ),
        # Not torch's.
        Valid(
            """\
            from mylib import empty_cache
            for batch in loader:
                loss.backward()
                empty_cache()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """\
            import torch
            for batch in loader:
                loss = model(batch).loss
                loss.backward()
                optimizer.step()
                torch.cuda.empty_cache()  # free memory
                optimizer.zero_grad()
            """,
            line=6,
            expected_fix="""\
            import torch
            for batch in loader:
                loss = model(batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
        ),
        # `from torch.cuda import empty_cache`, alone in a block: becomes `pass`.
        Invalid(
            """\
            from torch.cuda import empty_cache

            def train(model, loader, opt):
                while True:
                    for x, y in loader:
                        accelerator.backward(model(x, y))
                        opt.step()
                        if torch_available:
                            empty_cache()
            """,
            line=9,
            expected_fix="""\
            from torch.cuda import empty_cache

            def train(model, loader, opt):
                while True:
                    for x, y in loader:
                        accelerator.backward(model(x, y))
                        opt.step()
                        if torch_available:
                            pass
            """,
        ),
        # Sharing its line with another statement: reported, no fix.
        Invalid(
            """\
            import torch as T
            for batch in loader:
                step(batch); T.cuda.empty_cache()
                self.optimizer.step()
            """,
            line=3,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        tracker = self.context.tracker
        if not tracker.in_loop or self.context.call_name(node) not in _EMPTY_CACHE:
            return
        loop = tracker.loops[-1]
        between = self._statements_inside(loop)
        if any(self._is_periodic(statement) or self._in_handler(statement, node) for statement in between):
            return
        steps = descendants(loop.body, skip=(*SCOPES, cst.For, cst.While))
        if not any(_is_training_step(candidate, self.context) for candidate in steps):
            return
        if _builds_and_deletes_its_model(loop):
            return
        self.report(
            node,
            "torch.cuda.empty_cache() at every training step cannot prevent an OOM and slows each step",
            fix=self._fix(node),
        )

    def _statements_inside(self, loop: cst.CSTNode) -> list[cst.CSTNode]:
        statements = self.context.tracker.statements
        index = next(i for i in range(len(statements) - 1, -1, -1) if statements[i] is loop)
        return list(statements[index + 1 :])

    @staticmethod
    def _is_periodic(statement: cst.CSTNode) -> bool:
        return isinstance(statement, cst.If) and any(
            isinstance(node, cst.Modulo) for node in descendants(statement.test)
        )

    @staticmethod
    def _in_handler(statement: cst.CSTNode, call: cst.Call) -> bool:
        if not isinstance(statement, (cst.Try, cst.TryStar)):
            return False
        return any(node is call for handler in statement.handlers for node in descendants(handler))

    def _fix(self, call: cst.Call) -> FixSpec | None:
        tracker = self.context.tracker
        statement = tracker.current_statement
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        expression = statement.body[0]
        if not isinstance(expression, cst.Expr) or expression.value is not call:
            return None
        block = enclosing_block(tracker.statements, self.context.module, statement)
        if block is None:
            return None
        return FixSpec(
            title="Remove `torch.cuda.empty_cache()`",
            edits=remove_call_statement(statement, expression, only_statement_of_block=len(block) == 1),
            applicability=Applicability.SAFE,
        )


class ZeroGradKeepsGrads(Rule):
    """
    ## What it does
    Flags `zero_grad(set_to_none=False)` (or `zero_grad(False)`) on an
    optimizer or a module, unless the file adds or copies gradients into
    `.grad` itself (`p.grad += g`, `p.grad.add_(g)`, `p.grad.copy_(g)`, as a
    parameter server or a hand-written gradient accumulation does): that code
    needs the buffers allocated, and a None gradient would make it fail.

    ## Why is this bad?
    With `set_to_none=False` every parameter's `.grad` stays allocated
    between steps and is overwritten with zeros, so a full copy of the
    parameters' size is held through the forward pass, when activations need
    the memory most. With `set_to_none=True` (the default since torch 2.0)
    the gradients are freed and reallocated by backward, and the zero-fill
    kernel is skipped.

    ## Example
    ```python
    optimizer.zero_grad(set_to_none=False)
    ```

    ## Use instead
    ```python
    optimizer.zero_grad(set_to_none=True)
    ```

    ## Fix safety
    Unsafe: code that reads `.grad` between `zero_grad` and `backward`
    (`p.grad.add_(...)`, logging gradient norms) gets `None` instead of zeros,
    and torch optimizers skip a parameter whose gradient is `None` where they
    applied momentum and weight decay to a zero gradient, so parameters that
    received no gradient in a step are updated differently.
    """

    code = "OOM503"
    name = "zero-grad-keeps-grads"
    summary = "`zero_grad(set_to_none=False)` keeps every gradient buffer allocated between steps."
    why = "The gradient buffers, as large as the parameters, stay allocated through the next forward pass."
    remedy = "zero_grad(set_to_none=True), the default."
    fix_applicability = Applicability.UNSAFE

    VALID = [
        Valid("import torch\noptimizer.zero_grad()\n"),
        Valid("import torch\noptimizer.zero_grad(set_to_none=True)\n"),
        Valid("import torch\nmodel.zero_grad(True)\n"),
        # The value is not known.
        Valid("import torch\noptimizer.zero_grad(set_to_none=args.keep_grads)\n"),
        Valid("import torch\noptimizer.zero_grad(**options)\n"),
        # Gradients sent by workers are added into `.grad`: it must stay allocated.
        Valid(
            """\
            import torch

            class Server:
                def apply(self, grads):
                    for p, g in zip(self.model.parameters(), grads):
                        p.grad += g
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=False)
            """
        ),
    ]
    INVALID = [
        Invalid(
            "import torch\noptimizer.zero_grad(set_to_none=False)\n",
            line=2,
            expected_fix="import torch\noptimizer.zero_grad(set_to_none=True)\n",
        ),
        Invalid(
            "import torch\nfor batch in loader:\n    model.zero_grad(False)  # reset\n",
            line=3,
            expected_fix="import torch\nfor batch in loader:\n    model.zero_grad(True)  # reset\n",
        ),
        Invalid(
            "import torch\nself.opt.zero_grad(\n    set_to_none = False,\n)\n",
            line=2,
            expected_fix="import torch\nself.opt.zero_grad(\n    set_to_none = True,\n)\n",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is None or called[1] != "zero_grad" or self.context.qualified_name(called[0]) is not None:
            return
        argument = get_arg(node, "set_to_none", 0)
        if not isinstance(argument, cst.Arg) or not is_false(argument.value):
            return
        if _writes_into_grads(self.context):
            return
        self.report(
            node,
            "zero_grad(set_to_none=False) keeps every gradient buffer allocated between steps",
            fix=FixSpec(
                title="Pass `set_to_none=True`",
                edits=set_to_none(argument),
                applicability=Applicability.UNSAFE,
            ),
        )


# In-place writes that add or copy into a gradient buffer (scaling one that
# backward filled, `p.grad.mul_(c)`, needs no buffer before backward).
_GRAD_WRITES = frozenset({"add_", "sub_", "copy_", "index_add_", "addcmul_", "addcdiv_", "fill_"})
_WRITES_INTO_GRADS: weakref.WeakKeyDictionary[FileContext, bool] = weakref.WeakKeyDictionary()


# A cheap first test on the text: `.grad` followed by `+=`, `-=`, `[` or a writing
# method (also through `.data`).
_GRAD_WRITE_RE = re.compile(
    r"\.grad\s*(?:[-+]=|\[)|\.grad(?:\.data)?\.(?:" + "|".join(sorted(_GRAD_WRITES)) + r")\("
)


def _is_grad(expression: cst.BaseExpression) -> bool:
    """`p.grad`, `p.grad.data`, `p.grad[i]`."""
    while isinstance(expression, cst.Subscript) or (
        isinstance(expression, cst.Attribute) and expression.attr.value == "data"
    ):
        expression = expression.value
    return isinstance(expression, cst.Attribute) and expression.attr.value == "grad"


def _writes_into_grads(context: FileContext) -> bool:
    """Whether the file adds or copies values into `.grad` buffers: `p.grad
    += g`, `p.grad.add_(g)`, `p.grad.copy_(g)`, `p.grad[i] = g`. Computed
    once per file, for the first candidate; a search of the text rules most
    files out before the tree is read."""
    answer = _WRITES_INTO_GRADS.get(context)
    if answer is None:
        answer = _GRAD_WRITE_RE.search(context.source) is not None and any(
            _adds_into_grad(node) for node in descendants(context.module)
        )
        _WRITES_INTO_GRADS[context] = answer
    return answer


def _adds_into_grad(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.AugAssign):
        return isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign)) and _is_grad(node.target)
    if isinstance(node, cst.Assign):
        return any(
            isinstance(target.target, cst.Subscript) and _is_grad(target.target) for target in node.targets
        )
    called = method_call(node) if isinstance(node, cst.Call) else None
    return called is not None and called[1] in _GRAD_WRITES and _is_grad(called[0])
