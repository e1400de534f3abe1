"""OOM201: a CUDA training loop in float32 with no autocast.

The rule is about memory on the GPU, so it stays silent in files that never
touch CUDA: float32 training on the CPU is legitimate there. Whether a file
uses CUDA is decided once, at the end of the pass, and only when the rule has
a candidate to report.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, int_value, is_false, method_call, string_value
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid, deferred_report
from oom_lsp.analysis.facts.datasets import trains_on_small_inputs
from oom_lsp.analysis.facts.workload import MATTERS, Stake, workload_of
from oom_lsp.analysis.rules._devices import Found, device_scopes, file_uses_cuda, search
from oom_lsp.fixes.autocast import autocast_regions, wrap_in_autocast

# --- OOM201 ------------------------------------------------------------------

# Packages that own the precision of the loops they drive: Accelerate and
# DeepSpeed read it from a launcher config, Lightning/Fabric from a flag, apex
# from `amp.initialize`. The file alone cannot tell, so the rule stays silent.
_PRECISION_OWNING_PACKAGES = (
    "accelerate",
    "deepspeed",
    "lightning",
    "pytorch_lightning",
    "apex",
    "colossalai",
)
# Identifiers that show the file already deals with reduced precision.
# (`autocast` is looked for in each loop: one loop under autocast says
# nothing about the others.)
_MIXED_PRECISION_IDENTIFIERS = {
    "gradscaler",
    "fp16",
    "bf16",
    "use_amp",
    "enable_amp",
    "amp_dtype",
    "mixed_precision",
}
_MIXED_PRECISION_KEYWORDS = {"precision", "mixed_precision", "fp16", "bf16", "amp", "use_amp"}
_MIXED_PRECISION_STRINGS = {
    "fp16", "bf16", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "float16", "bfloat16", "amp",
}  # fmt: skip
_TORCH_NAMESPACES = {"torch", "torch.cuda", "torch.cpu"}
_REDUCED_DTYPES = {"torch.bfloat16", "torch.float16", "torch.half"}
_REDUCED_PRECISION_METHODS = {"half", "bfloat16"}
# Callees whose result is a loss when assigned: `l = criterion(out, y)`.
_LOSS_FUNCTION_RE = re.compile(r"loss|criterion|cross_entropy|nll|mse|bce|l1", re.IGNORECASE)


class _MixedPrecisionFinder(cst.BatchableCSTVisitor):
    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context
        # Inside the arguments of an autocast call, whose dtype is the
        # autocast's own, not the model's.
        self._autocast_depth = 0

    def visit_Call(self, node: cst.Call) -> None:
        if self.context.tracker.is_autocast(node):
            self._autocast_depth += 1
        called = method_call(node)
        if called is not None and called[1] in _REDUCED_PRECISION_METHODS and not node.args:
            raise Found

    def leave_Call(self, original_node: cst.Call) -> None:
        if self.context.tracker.is_autocast(original_node):
            self._autocast_depth -= 1

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # `args.amp`, `cfg.amp`, not torch's own `torch.cuda.amp` namespace.
        if node.attr.value == "amp" and self.context.qualified_name(node.value) not in _TORCH_NAMESPACES:
            raise Found
        if not self._autocast_depth and self.context.qualified_name(node) in _REDUCED_DTYPES:
            raise Found

    def visit_Name(self, node: cst.Name) -> None:
        # Attribute names and keywords are Name nodes too: `GradScaler`,
        # `fp16=True`, `args.use_amp`.
        if node.value.lower() in _MIXED_PRECISION_IDENTIFIERS:
            raise Found

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value.lower() in _MIXED_PRECISION_KEYWORDS:
            raise Found

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and value.lstrip("-").lower() in _MIXED_PRECISION_STRINGS:
            raise Found


def _file_handles_precision(context: FileContext) -> bool:
    if any(context.imports.is_bound(package) for package in _PRECISION_OWNING_PACKAGES):
        return True
    return search(context.module, _MixedPrecisionFinder(context))


class _AutocastFinder(cst.BatchableCSTVisitor):
    """Autocast in a loop: `torch.autocast(...)`, `amp.autocast()`, or, in a
    file that mentions autocast at all, a `with` over a context the analysis
    cannot resolve (nanoGPT's `ctx = torch.amp.autocast(...)`, then `with ctx:`)."""

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context
        self.file_mentions_autocast = "autocast" in context.source

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "autocast":
            raise Found

    def visit_With(self, node: cst.With) -> None:
        if not self.file_mentions_autocast:
            return
        for item in node.items:
            if not self.context.tracker.is_grad_disabling(item.item) and not _is_open_call(item.item):
                raise Found


def _is_open_call(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "open"


def _is_loss_like(expr: cst.BaseExpression, loss_names: set[str]) -> bool:
    if isinstance(expr, cst.Name):
        return "loss" in expr.value.lower() or expr.value in loss_names
    if isinstance(expr, cst.Attribute):
        return "loss" in expr.attr.value.lower()
    if isinstance(expr, cst.BinaryOperation):
        return _is_loss_like(expr.left, loss_names) or _is_loss_like(expr.right, loss_names)
    if isinstance(expr, cst.Subscript):
        return _is_loss_like(expr.value, loss_names)
    called = method_call(expr)
    if called is not None and called[1] in ("mean", "sum"):
        return _is_loss_like(called[0], loss_names)
    return False


# Uses of a batch tensor that neither run a model on it nor keep it: moves,
# casts and shape queries (`x = x.cuda()`, `x.size(0)`, `len(x)`).
_PASSIVE_METHODS = {"cuda", "to", "size", "dim", "float", "half", "contiguous", "numel", "cpu"}
_PASSIVE_ATTRIBUTES = {"shape", "device", "dtype", "ndim"}


def _loop_target_names(target: cst.BaseAssignTargetExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _loop_target_names(element.value)]
    return []


class _BatchUses:
    """Where a loop's batch variable is used: under a grad-disabling `with`
    or with autograd on, not counting moves, casts and shape queries."""

    def __init__(self, name: str, context: FileContext) -> None:
        self.name = name
        self.context = context
        self.without_grad = 0
        self.with_grad = 0

    def walk(self, node: cst.CSTNode, no_grad: bool) -> None:
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        if isinstance(node, cst.With):
            inner = no_grad or any(self.context.tracker.is_grad_disabling(item.item) for item in node.items)
            for item in node.items:
                self.walk(item.item, no_grad)
            self.walk(node.body, inner)
            return
        if isinstance(node, cst.Assign):
            # `inp = inp.cuda()`: binding the name is no use of it.
            for target in node.targets:
                self._walk_target(target.target, no_grad)
            self.walk(node.value, no_grad)
            return
        if isinstance(node, cst.Name):
            if node.value == self.name:
                if no_grad:
                    self.without_grad += 1
                else:
                    self.with_grad += 1
            return
        called = method_call(node)
        if called is not None and called[1] in _PASSIVE_METHODS and _is_name(called[0], self.name):
            for argument in node.args:  # type: ignore[attr-defined]
                self.walk(argument.value, no_grad)
            return
        if (
            isinstance(node, cst.Attribute)
            and node.attr.value in _PASSIVE_ATTRIBUTES
            and _is_name(node.value, self.name)
        ):
            return
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Name)
            and node.func.value == "len"
            and len(node.args) == 1
            and _is_name(node.args[0].value, self.name)
        ):
            return
        if isinstance(node, cst.Attribute):
            self.walk(node.value, no_grad)  # `obj.inp` is not the name
            return
        for child in node.children:
            self.walk(child, no_grad)

    def _walk_target(self, target: cst.BaseExpression, no_grad: bool) -> None:
        """The names an assignment binds are not uses; `store[inp] = ...` is."""
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._walk_target(element.value, no_grad)
        elif not isinstance(target, cst.Name):
            self.walk(target, no_grad)


def _is_name(expr: cst.BaseExpression, name: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == name


def _only_a_head_trains(loop: cst.For | cst.While, context: FileContext) -> bool:
    """`for inp, target in loader:` whose `inp` reaches a model only inside
    `with torch.no_grad():` (a frozen backbone computing features), the
    trained part being what runs on those features: a linear probe. Its
    float32 activations are the head's, a few per sample."""
    if not isinstance(loop, cst.For):
        return False
    for name in _loop_target_names(loop.target):
        uses = _BatchUses(name, context)
        uses.walk(loop.body, no_grad=False)
        if uses.without_grad and not uses.with_grad:
            return True
    return False


@dataclass
class _TrainingLoop:
    loop: cst.For | cst.While
    # The function the loop is in; None at module level.
    function: cst.FunctionDef | None
    # Statements enclosing the loop, outermost first, the loop last.
    path: tuple[cst.CSTNode, ...]
    backward_statement: cst.CSTNode | None
    loss: cst.BaseExpression
    # Indentation units of the blocks from the module down to the loop body;
    # None when the loop body is not an indented block.
    block_indents: tuple[str, ...] | None
    # `.backward()` calls in the loop: with several (a GAN's discriminator
    # and generator steps), wrapping one forward would be a partial fix.
    backward_calls: int = 1


class NoMixedPrecision(Rule):
    """
    ## What it does
    Flags a training loop (a loop that calls `.backward()` on a loss) in a file
    that trains on CUDA, when nothing in the file uses reduced precision: no
    `torch.autocast` / `torch.cuda.amp.autocast`, no `GradScaler`, no
    `.half()` / `.bfloat16()` model, no `dtype=torch.bfloat16|float16`, no
    Lightning `precision=` or Hugging Face `fp16=` / `bf16=`. Files driven by
    Accelerate, DeepSpeed, Lightning or apex are left alone: their precision
    comes from a launcher config the file does not show. So are two cases
    where float32 activations are too few to matter: a file that trains on
    small images (a torchvision MNIST, CIFAR, SVHN or USPS dataset, not
    resized past 64 pixels, no pretrained model), and a loop whose batch
    reaches a model only under `torch.no_grad()`: a frozen backbone feeding
    a trained head (a linear probe).

    ## Why is this bad?
    The activations saved for the backward pass dominate the memory of a
    training step, and in float32 each element takes 4 bytes. Under
    `torch.autocast` with bfloat16 (or float16) the matmuls and convolutions
    save their activations in 2 bytes, roughly halving activation memory, and
    run on the tensor cores several times faster.

    ## Example
    ```python
    for x, y in loader:
        x = x.cuda()
        y = y.cuda()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        x = x.cuda()
        y = y.cuda()
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```
    Only the forward pass and the loss go under autocast: data movement, the
    backward pass (which runs each op in the dtype its forward used) and the
    optimizer step (on the float32 weights) stay outside.

    On GPUs without bfloat16 (before Ampere: V100, T4, RTX 20xx), use float16,
    which needs a `GradScaler` so that small gradients do not underflow to
    zero; it changes the backward pass and the step too:
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # only before gradient clipping
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Fix safety
    Unsafe: autocast changes the numerics of the forward pass (bfloat16 keeps
    about 3 significant digits), which most models train fine with but some
    (e.g. ones with custom numerically sensitive ops) do not, and a forward
    output becomes bfloat16 (`.float()` it where float32 is needed). GPUs
    before Ampere have no bfloat16: autocast stops at the first step with
    "Current CUDA Device does not support bfloat16"; use float16 as above.

    The fix uses bfloat16 because it has float32's exponent range: gradients
    do not underflow, no `GradScaler` is needed, and the fix leaves the
    backward pass and the optimizer step as they are. It wraps the statements
    of the loop body from the forward pass to the loss (what computes the
    loss, and what sits between: a metric, an `assert`, an `if`); an optimizer
    call between them stays outside, between two autocast blocks. It adds
    `import torch` if needed. There is no fix where the shape is not
    understood: two backward passes in the loop, a loss computed in a `try` or
    outside the loop body, a nested function in the region, or `.numpy()` on
    what the region computes (NumPy has no bfloat16).
    """

    code = "OOM201"
    advisory = True
    name = "no-mixed-precision"
    summary = "A CUDA training loop runs entirely in float32: no autocast, bf16 or fp16."
    why = (
        "Every activation saved for backward takes 4 bytes per element in float32; under bfloat16 "
        "autocast, matmuls and convolutions save theirs in 2."
    )
    remedy = 'Wrap the forward pass and the loss in torch.autocast(device_type="cuda", dtype=torch.bfloat16).'
    fix_applicability = Applicability.UNSAFE

    VALID = [
        # Autocast around the forward pass.
        Valid(
            """\
            import torch
            model = model.cuda()
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
            """
        ),
        # fp16 with a GradScaler, through the legacy namespace.
        Valid(
            """\
            import torch
            from torch.cuda.amp import GradScaler, autocast
            scaler = GradScaler()
            for x, y in loader:
                with autocast():
                    loss = criterion(model(x.cuda()), y.cuda())
                scaler.scale(loss).backward()
            """
        ),
        # A bfloat16 model.
        Valid(
            """\
            import torch as T
            model = Net().to("cuda", dtype=T.bfloat16)
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """
        ),
        # CPU-only training: float32 is the right choice there.
        Valid(
            """\
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
            """
        ),
        # Accelerate owns the precision (set by `accelerate launch`).
        Valid(
            """\
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            device = torch.device("cuda")
            for batch in loader:
                loss = model(**batch).loss
                accelerator.backward(loss)
            """
        ),
        # An evaluation loop: no backward, nothing to save for it.
        Valid(
            """\
            import torch
            model.cuda().eval()
            with torch.no_grad():
                for x, y in loader:
                    total += criterion(model(x.cuda()), y.cuda()).item()
            """
        ),
        # A linear probe: the backbone runs under no_grad, only the head
        # trains and saves activations.
        Valid(
            """\
            import torch
            backbone, head = backbone.cuda().eval(), head.cuda()
            for images, labels in loader:
                images, labels = images.cuda(), labels.cuda()
                with torch.no_grad():
                    features = backbone(images)
                loss = criterion(head(features), labels)
                loss.backward()
            """
        ),
        # MNIST: 28x28 images, a few MB of activations at any batch.
        Valid(
            """\
            import torch
            from torchvision import datasets, transforms
            train_set = datasets.MNIST("data", train=True, transform=transforms.ToTensor())
            loader = torch.utils.data.DataLoader(train_set, batch_size=128)
            for x, y in loader:
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
            """
        ),
        # Precision chosen by a flag of the script.
        Valid(
            """\
            import torch
            parser.add_argument("--amp", action="store_true")
            ctx = get_precision_context(args)
            for x, y in loader:
                with ctx:
                    loss = criterion(model(x.to("cuda")), y.to("cuda"))
                loss.backward()
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            from transformers import GPT2LMHeadModel
            model = GPT2LMHeadModel.from_pretrained("gpt2").to("cuda")
            block_size = 1024
            loader = DataLoader(dataset, batch_size=8)
            opt = torch.optim.AdamW(model.parameters())
            for batch in loader:
                loss = model(batch.cuda(), labels=batch.cuda()).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            """,
            line=9,
            by_default=True,
        ),
        # The common shape: tensors moved in the loop, zero_grad, then the loss.
        Invalid(
            """\
            import torch
            model = Net().cuda()
            for x, y in loader:
                x = x.cuda()
                y = y.cuda()
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=3,
            expected_fix="""\
            import torch
            model = Net().cuda()
            for x, y in loader:
                x = x.cuda()
                y = y.cuda()
                optimizer.zero_grad()
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """\
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                out = model(x)
                loss = criterion(out, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            line=3,
            expected_fix="""\
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    out = model(x)
                    loss = criterion(out, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
        ),
        # An alias, nested loops (the inner loop is reported), a multi-line
        # forward call with a comment, and a scaled loss.
        Invalid(
            """\
            import torch as T
            def train(model, loader, steps):
                model.cuda()
                for epoch in range(3):
                    for batch in loader:
                        # forward
                        logits = model(
                            batch["input_ids"].cuda(),  # tokens
                        )
                        loss = T.nn.functional.cross_entropy(logits, batch["labels"].cuda())
                        loss = loss / steps
                        loss.backward()
            """,
            line=5,
            expected_fix="""\
            import torch as T
            def train(model, loader, steps):
                model.cuda()
                for epoch in range(3):
                    for batch in loader:
                        # forward
                        with T.autocast(device_type="cuda", dtype=T.bfloat16):
                            logits = model(
                                batch["input_ids"].cuda(),  # tokens
                            )
                            loss = T.nn.functional.cross_entropy(logits, batch["labels"].cuda())
                            loss = loss / steps
                        loss.backward()
            """,
        ),
        # `from torch import ...` only: the fix adds `import torch`.
        Invalid(
            """\
            from torch import nn, optim
            model = nn.Linear(10, 1).cuda()
            step = 0
            while step < 100:
                loss = model(next_batch()).pow(2).mean()
                loss.backward()
                step += 1
            """,
            line=4,
            expected_fix="""\
            from torch import nn, optim
            import torch
            model = nn.Linear(10, 1).cuda()
            step = 0
            while step < 100:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = model(next_batch()).pow(2).mean()
                loss.backward()
                step += 1
            """,
        ),
        # Distillation: the teacher runs under no_grad, but the student
        # trains on the same batch. Both forward passes go under autocast.
        Invalid(
            """\
            import torch
            student, teacher = student.cuda(), teacher.cuda().eval()
            for x, y in loader:
                x = x.cuda()
                with torch.no_grad():
                    soft = teacher(x)
                loss = distill_loss(student(x), soft)
                loss.backward()
            """,
            line=3,
            expected_fix="""\
            import torch
            student, teacher = student.cuda(), teacher.cuda().eval()
            for x, y in loader:
                x = x.cuda()
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    with torch.no_grad():
                        soft = teacher(x)
                    loss = distill_loss(student(x), soft)
                loss.backward()
            """,
        ),
        # The forward, zero_grad, then the loss: the optimizer call stays
        # outside, between two autocast blocks.
        Invalid(
            """\
            import torch
            for src, tgt in loader:
                src, tgt = src.cuda(), tgt.cuda()
                logits = model(src, tgt[:-1])
                optimizer.zero_grad()
                loss = criterion(logits.reshape(-1, logits.shape[-1]), tgt[1:].reshape(-1))
                loss.backward()
                optimizer.step()
            """,
            line=2,
            expected_fix="""\
            import torch
            for src, tgt in loader:
                src, tgt = src.cuda(), tgt.cuda()
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    logits = model(src, tgt[:-1])
                optimizer.zero_grad()
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = criterion(logits.reshape(-1, logits.shape[-1]), tgt[1:].reshape(-1))
                loss.backward()
                optimizer.step()
            """,
        ),
        # The loss is computed in a try: reported, but no fix.
        Invalid(
            """\
            import torch
            for x, y in loader:
                try:
                    loss = criterion(model(x.to("cuda:0")), y)
                except RuntimeError:
                    continue
                loss.backward()
            """,
            line=2,
        ),
        # The loop converts the output with .numpy(), which bfloat16 would break: no fix.
        Invalid(
            """\
            import torch
            for x, y in loader:
                out = model(x.cuda())
                loss = criterion(out, y.cuda())
                loss.backward()
                scores.append(out.detach().cpu().numpy())
            """,
            line=2,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._loops: list[_TrainingLoop] = []
        self._blocks: list[tuple[cst.IndentedBlock, str]] = []
        # Names assigned from a loss function (`l = criterion(out, y)`), file-wide.
        self._loss_names: set[str] = set()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        indent = node.indent if node.indent is not None else self.context.module.default_indent
        self._blocks.append((node, indent))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        # `l = criterion(out, y)`, `total = d_loss + g_loss`
        callee = dotted_name(node.value.func) if isinstance(node.value, cst.Call) else None
        from_loss_function = callee is not None and _LOSS_FUNCTION_RE.search(callee.rsplit(".", 1)[-1])
        if from_loss_function or _is_loss_like(node.value, self._loss_names):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self._loss_names.add(target.target.value)

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is None or called[1] != "backward":
            return
        tracker = self.context.tracker
        if not tracker.in_loop or tracker.in_no_grad or tracker.in_autocast:
            return
        if any(
            tracker.is_autocast(decorator.decorator) for f in tracker.functions for decorator in f.decorators
        ):
            return
        receiver = called[0]
        if not _is_loss_like(receiver, self._loss_names):
            return
        loop = tracker.loops[-1]
        seen = next((training for training in self._loops if training.loop is loop), None)
        if seen is not None:
            seen.backward_calls += 1
            return
        indents = None
        for depth, (block, _) in enumerate(self._blocks):
            if block is loop.body:
                indents = tuple(indent for _, indent in self._blocks[: depth + 1])
        path = tuple(tracker.statements)
        path = path[: path.index(loop) + 1]
        self._loops.append(
            _TrainingLoop(loop, tracker.current_function, path, tracker.current_statement, receiver, indents)
        )

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self._loops or not file_uses_cuda(self.context) or _file_handles_precision(self.context):
            return
        if trains_on_small_inputs(self.context):
            return
        scopes = device_scopes(self.context)
        for training in self._loops:
            if search(training.loop, _AutocastFinder(self.context)):
                continue
            if not scopes.on_gpu(training.function) or _only_a_head_trains(training.loop, self.context):
                continue
            stake = self._stake(training)
            message = "CUDA training loop runs entirely in float32 (no autocast or bf16/fp16)"
            if stake is not None:
                message = f"CUDA training loop runs in float32: {stake.text}"
            self.context.add_report(
                deferred_report(
                    self,
                    training.loop,
                    message,
                    self._fix(training),
                    training.path,
                    proven=stake is not None,
                )
            )

    def _stake(self, training: _TrainingLoop) -> Stake | None:
        """What autocast would save, when the sizes show it matters: half of
        the float32 activations (at least 1 GiB), or the loop trains a model
        of a billion parameters or more."""
        workload = workload_of(self.context)
        program = workload.program
        scope = program.function(training.function) if training.function is not None else program.module
        if scope is None:
            return None
        activations = workload.activations(training.loop, scope, element_bytes=4)
        if activations is not None and activations.bytes >= 2 * MATTERS:
            return activations
        return workload.model_stake(training.loop, scope)

    def _fix(self, training: _TrainingLoop) -> FixSpec | None:
        body = training.loop.body
        if (
            training.block_indents is None
            or not isinstance(body, cst.IndentedBlock)
            or training.backward_calls > 1
        ):
            return None
        if training.backward_statement is None or not isinstance(
            training.backward_statement, cst.BaseStatement
        ):
            return None
        regions = autocast_regions(body, training.backward_statement, training.loss)
        if regions is None:
            return None
        module = self.context.module
        torch_name = self.context.imports.reference_to("torch") or "torch"
        return FixSpec(
            title="Wrap the forward pass and the loss in `torch.autocast` (bfloat16)",
            edits=wrap_in_autocast(
                regions, training.block_indents, torch_name, module.default_indent, module.default_newline
            ),
            applicability=Applicability.UNSAFE,
            imports=("torch",),
        )


# --- OOM202 ------------------------------------------------------------------
