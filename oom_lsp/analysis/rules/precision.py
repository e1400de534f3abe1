"""OOM2xx: numeric precision (mixed precision, float64).

Both rules are about memory on the GPU, so both stay silent in files that
never touch CUDA: float32 training on the CPU and float64 numerics are
legitimate there. Whether a file uses CUDA is decided once, at the end of
the pass, and only when a rule has a candidate to report.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, int_value, is_false, method_call, string_value
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Report, Rule, Valid
from oom_lsp.analysis.walker import walk
from oom_lsp.edits import NodeEdit
from oom_lsp.fixes.autocast import forward_and_loss, wrap_in_autocast
from oom_lsp.fixes.precision import double_call_to_float, to_float32

_CUDA_DEVICE_RE = re.compile(r"^cuda(:\d+)?$")


class _Found(Exception):
    """Stops a search walk at the first hit."""


class _CudaFinder(cst.BatchableCSTVisitor):
    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and (_CUDA_DEVICE_RE.match(value) or value.startswith("torch.cuda.")):
            raise _Found  # "cuda:0", "torch.cuda.FloatTensor"

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        # f"cuda:{local_rank}"
        first = node.parts[0] if node.parts else None
        if isinstance(first, cst.FormattedStringText) and (
            first.value == "cuda" or first.value.startswith("cuda:")
        ):
            raise _Found

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is not None and called[1] == "cuda":
            raise _Found

    def visit_Attribute(self, node: cst.Attribute) -> None:
        qualified = self.context.qualified_name(node)
        if qualified is not None and qualified.startswith("torch.cuda."):
            raise _Found


class _DeviceUseFinder(_CudaFinder):
    """CUDA, or a move to a device chosen elsewhere: `.to(device)`,
    `.to(self.device)`, `torch.zeros(..., device=device)`."""

    def visit_Call(self, node: cst.Call) -> None:
        super().visit_Call(node)
        called = method_call(node)
        target = (
            get_arg(node, "device", 0)
            if called is not None and called[1] == "to"
            else get_arg(node, "device")
        )
        if isinstance(target, cst.Arg) and is_device_expression(target.value, self.context):
            raise _Found


class DeviceScopes:
    """Which functions of a file (that uses CUDA) run on the GPU: those that
    touch it themselves (`.cuda()`, `.to(device)`, `device=...`), or all of
    them when the top-level code does. A file of tests may run one test on
    CUDA and the next on the CPU. Computed lazily, once per scope."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._functions: dict[cst.FunctionDef, bool] = {}
        self._top_level: bool | None = None

    def on_gpu(self, function: cst.FunctionDef | None) -> bool:
        if function is None:
            return True
        if function not in self._functions:
            self._functions[function] = search(function, _DeviceUseFinder(self.context))
        return self._functions[function] or self._top_level_uses_device()

    def _top_level_uses_device(self) -> bool:
        if self._top_level is None:
            finder = _DeviceUseFinder(self.context)
            self._top_level = any(
                search(statement, finder)
                for statement in self.context.module.body
                if not isinstance(statement, (cst.FunctionDef, cst.ClassDef))
            )
        return self._top_level


# Per-file answers shared by the rules of one analysis (OOM102, OOM201 and
# OOM202 all ask), dropped with the file's context.
_USES_CUDA: weakref.WeakKeyDictionary[FileContext, bool] = weakref.WeakKeyDictionary()
_DEVICE_SCOPES: weakref.WeakKeyDictionary[FileContext, DeviceScopes] = weakref.WeakKeyDictionary()


def file_uses_cuda(context: FileContext) -> bool:
    """Whether the file puts anything on a CUDA device: `.cuda()`, a "cuda"
    device string (`device="cuda"`, `torch.device("cuda:0")`, `.to("cuda")`,
    `"cuda" if ... else "cpu"`), `f"cuda:{rank}"`, or any `torch.cuda.*` API."""
    answer = _USES_CUDA.get(context)
    if answer is None:
        answer = "cuda" in context.source and search(context.module, _CudaFinder(context))
        _USES_CUDA[context] = answer
    return answer


def device_scopes(context: FileContext) -> DeviceScopes:
    scopes = _DEVICE_SCOPES.get(context)
    if scopes is None:
        scopes = _DEVICE_SCOPES[context] = DeviceScopes(context)
    return scopes


# torchvision datasets of images 32 pixels wide or less (MNIST's 28x28,
# CIFAR's and SVHN's 32x32, USPS's 16x16).
_SMALL_IMAGE_DATASETS = {
    "MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST", "CIFAR10", "CIFAR100", "SVHN", "USPS",
}  # fmt: skip
_SMALL_IMAGE_WORDS = ("MNIST", "CIFAR", "SVHN", "USPS")
# Transforms that set the size of the images the model sees.
_SIZING_TRANSFORMS = {
    "Resize",
    "RandomResizedCrop",
    "CenterCrop",
    "RandomCrop",
    "FiveCrop",
    "TenCrop",
    "Scale",
}
# The largest side that keeps images "small": a CIFAR crop, a 64x64 DCGAN.
_SMALL_IMAGE_SIDE = 64
_SMALL_IMAGES: weakref.WeakKeyDictionary[FileContext, bool] = weakref.WeakKeyDictionary()


class _LargerInputFinder(cst.BatchableCSTVisitor):
    """Raises `_Found` at the first sign that the file's model may see more
    than small images: another torchvision dataset, an image resized or
    cropped above 64 pixels (or to a size the call does not show), or a
    pretrained model (`from_pretrained`, `timm.create_model`, a
    `torchvision.models` network with weights), whose processor or recipe
    resizes its inputs.
    Records whether a small-image dataset is built at all."""

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context
        self.small_dataset = False

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is not None and called[1] == "from_pretrained":
            raise _Found
        qualified = self.context.call_name(node)
        if qualified is None:
            return
        last = qualified.rsplit(".", 1)[-1]
        if qualified.startswith("torchvision.datasets."):
            if last not in _SMALL_IMAGE_DATASETS:
                raise _Found
            self.small_dataset = True
        elif qualified == "timm.create_model" or (
            qualified.startswith("torchvision.models.") and _loads_weights(node)
        ):
            raise _Found
        elif qualified.startswith("torchvision.transforms.") and last in _SIZING_TRANSFORMS:
            size = get_arg(node, "size", 0)
            if not isinstance(size, cst.Arg) or not _is_small_side(size.value):
                raise _Found


def _loads_weights(call: cst.Call) -> bool:
    """`resnet18(weights="DEFAULT")`, `resnet18(pretrained=True)`: ImageNet
    weights, trained (and meant to be fine-tuned) on 224-pixel inputs. A
    network built from scratch (`resnet18(num_classes=10)`) takes any size."""
    if has_splat(call):
        return True
    weights = get_arg(call, "weights")
    pretrained = get_arg(call, "pretrained")
    return (isinstance(weights, cst.Arg) and not _is_none(weights.value)) or (
        isinstance(pretrained, cst.Arg) and not is_false(pretrained.value)
    )


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _is_small_side(expr: cst.BaseExpression) -> bool:
    """`32`, `(28, 28)`: literal sides of at most 64 pixels."""
    sides = (
        [element.value for element in expr.elements] if isinstance(expr, (cst.Tuple, cst.List)) else [expr]
    )
    values = [int_value(side) for side in sides]
    return bool(values) and all(value is not None and value <= _SMALL_IMAGE_SIDE for value in values)


def trains_on_small_images(context: FileContext) -> bool:
    """Whether the file's data are small images: it builds a torchvision
    MNIST / CIFAR / SVHN / USPS dataset, and nothing in it resizes the
    images past 64 pixels, loads another dataset or a pretrained model.
    Activations of a network on 32x32 images are a fraction of a GPU's
    memory at any batch a training script uses (a 224x224 ImageNet image
    has 49 times the pixels). Computed once per file, on demand."""
    answer = _SMALL_IMAGES.get(context)
    if answer is None:
        answer = False
        if any(word in context.source for word in _SMALL_IMAGE_WORDS):
            finder = _LargerInputFinder(context)
            answer = not search(context.module, finder) and finder.small_dataset
        _SMALL_IMAGES[context] = answer
    return answer


def search(root: cst.CSTNode, finder: cst.BatchableCSTVisitor) -> bool:
    """Run `finder` over `root` and its descendants; True when it raised `_Found`."""
    try:
        walk(root, [finder], before_visit=_ignore, after_leave=_ignore, hooked_types=())
    except _Found:
        return True
    return False


def _ignore(node: cst.CSTNode) -> None:
    return None


def is_device_expression(expr: cst.BaseExpression, context: FileContext) -> bool:
    """`"cuda"`, `"cuda:1"`, `device`, `args.device`, `torch.device(...)`."""
    value = string_value(expr)
    if value is not None:
        return value.startswith("cuda")
    if isinstance(expr, cst.Call):
        return context.call_name(expr) == "torch.device"
    name = dotted_name(expr)
    return name is not None and "device" in name.rsplit(".", 1)[-1].lower()


def deferred_report(
    rule: Rule, node: cst.CSTNode, message: str, fix: FixSpec | None, path: tuple[cst.CSTNode, ...]
) -> Report:
    """A report made after the pass: `path` is the statement path the
    Tracker had where `node` was found, outermost first."""
    return Report(
        rule=type(rule),
        node=node,
        message=message,
        fix=fix,
        statement=path[-1] if path else None,
        statement_path=path,
    )


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
            raise _Found

    def leave_Call(self, original_node: cst.Call) -> None:
        if self.context.tracker.is_autocast(original_node):
            self._autocast_depth -= 1

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # `args.amp`, `cfg.amp`, not torch's own `torch.cuda.amp` namespace.
        if node.attr.value == "amp" and self.context.qualified_name(node.value) not in _TORCH_NAMESPACES:
            raise _Found
        if not self._autocast_depth and self.context.qualified_name(node) in _REDUCED_DTYPES:
            raise _Found

    def visit_Name(self, node: cst.Name) -> None:
        # Attribute names and keywords are Name nodes too: `GradScaler`,
        # `fp16=True`, `args.use_amp`.
        if node.value.lower() in _MIXED_PRECISION_IDENTIFIERS:
            raise _Found

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value.lower() in _MIXED_PRECISION_KEYWORDS:
            raise _Found

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and value.lstrip("-").lower() in _MIXED_PRECISION_STRINGS:
            raise _Found


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
            raise _Found

    def visit_With(self, node: cst.With) -> None:
        if not self.file_mentions_autocast:
            return
        for item in node.items:
            if not self.context.tracker.is_grad_disabling(item.item) and not _is_open_call(item.item):
                raise _Found


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


@register
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
    device = torch.device("cuda")
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = criterion(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    device = torch.device("cuda")
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = criterion(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ```
    On GPUs without bfloat16 (before Ampere), use `dtype=torch.float16` with
    `torch.amp.GradScaler("cuda")` to keep small gradients from underflowing.

    ## Fix safety
    Unsafe: autocast changes the numerics of the forward pass (bfloat16 keeps
    about 3 significant digits), which most models train fine with but some
    (e.g. ones with custom numerically sensitive ops) do not, and GPUs older
    than Ampere have no fast bfloat16. The fix is offered only when the forward
    pass and the loss are consecutive simple statements before the
    `.backward()`; it wraps exactly those, adding `import torch` if needed.
    """

    code = "OOM201"
    name = "no-mixed-precision"
    summary = "A CUDA training loop runs entirely in float32: no autocast, bf16 or fp16."
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
                with torch.autocast("cuda", dtype=torch.bfloat16):
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
                        with T.autocast("cuda", dtype=T.bfloat16):
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
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(next_batch()).pow(2).mean()
                loss.backward()
                step += 1
            """,
        ),
        # Distillation: the teacher runs under no_grad, but the student
        # trains on the same batch.
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
        ),
        # The loss is computed in a branch: reported, but no fix.
        Invalid(
            """\
            import torch
            for x, y in loader:
                if aux:
                    loss = criterion(model(x.to("cuda:0")), y) + aux_loss
                else:
                    loss = criterion(model(x.to("cuda:0")), y)
                loss.backward()
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
        if trains_on_small_images(self.context):
            return
        scopes = device_scopes(self.context)
        for training in self._loops:
            if search(training.loop, _AutocastFinder(self.context)):
                continue
            if not scopes.on_gpu(training.function) or _only_a_head_trains(training.loop, self.context):
                continue
            self.context.add_report(
                deferred_report(
                    self,
                    training.loop,
                    "This CUDA training loop runs entirely in float32, so every activation saved for "
                    "`backward()` takes 4 bytes per element, twice what bfloat16 needs. Wrap the forward "
                    'pass and the loss in `torch.autocast("cuda", dtype=torch.bfloat16)` '
                    "(or float16 with a `GradScaler`).",
                    self._fix(training),
                    training.path,
                )
            )

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
        chain = forward_and_loss(body, training.backward_statement, training.loss)
        if chain is None:
            return None
        module = self.context.module
        torch_name = self.context.imports.reference_to("torch") or "torch"
        return FixSpec(
            title='Run the forward pass and the loss under `torch.autocast("cuda", dtype=torch.bfloat16)`',
            edits=wrap_in_autocast(
                chain, training.block_indents, torch_name, module.default_indent, module.default_newline
            ),
            applicability=Applicability.UNSAFE,
            imports=("torch",),
        )


# --- OOM202 ------------------------------------------------------------------

_DOUBLE_DTYPES = {"torch.float64", "torch.double"}
_DOUBLE_TENSOR_TYPES = {"torch.cuda.DoubleTensor", "torch.DoubleTensor"}
_DTYPE_KEYWORDS = {"dtype", "torch_dtype"}
# Functions that create a tensor from nothing or from host data: on the CPU
# unless given a device (ops like `torch.sum(x, dtype=...)` follow `x`).
_CPU_FACTORIES = {
    f"torch.{name}"
    for name in (
        "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
        "randperm", "arange", "linspace", "logspace", "eye", "Tensor",
    )
}  # fmt: skip
# Methods whose positional argument may be a dtype: `x.to(torch.float64)`.
_DTYPE_METHODS = {"to", "type"}
# A `.double()` reduced at once to a scalar or moved off the GPU costs nothing
# worth a diagnostic: `(pred == y).double().mean()`.
_REDUCTIONS = {"sum", "mean", "item", "tolist", "cpu", "numpy"}


# Fewer elements than this cost under half a MiB in float64: a metric's
# `[count, total]` for `all_reduce`, a 3x3 covariance. Exact sums are a good
# reason for float64 there, and the memory is nothing.
_NEGLIGIBLE_ELEMENTS = 65_536
# Factories whose positional arguments (or a tuple/list as the first) are the shape.
_SHAPED_FACTORIES = {f"torch.{name}" for name in ("zeros", "ones", "empty", "rand", "randn")}


def _element_count(call: cst.Call, qualified: str | None) -> int | None:
    """How many elements a factory call with literal data or a literal shape
    creates: `torch.tensor([a, b])` has 2, `torch.zeros(3, 3)` 9; None when
    the call does not show it."""
    if qualified in ("torch.tensor", "torch.as_tensor") and call.args and call.args[0].keyword is None:
        return _display_size(call.args[0].value)
    if qualified in _SHAPED_FACTORIES or qualified == "torch.full":
        shape = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        if qualified == "torch.full":
            shape = shape[:1]
        if len(shape) == 1 and isinstance(shape[0], (cst.Tuple, cst.List)):
            shape = [element.value for element in shape[0].elements]
        sizes = [int_value(dimension) for dimension in shape]
        if not sizes or None in sizes or any(arg.star for arg in call.args):
            return None
        count = 1
        for size in sizes:
            count *= size  # type: ignore[operator]
        return count
    return None


def _display_size(expr: cst.BaseExpression) -> int | None:
    """The number of scalars in a (nested) list or tuple display written out
    element by element; None for comprehensions and starred elements."""
    if not isinstance(expr, (cst.List, cst.Tuple)):
        return None
    count = 0
    for element in expr.elements:
        if isinstance(element, cst.StarredElement) or isinstance(
            element.value, (cst.ListComp, cst.GeneratorExp)
        ):
            return None
        inner = _display_size(element.value) if isinstance(element.value, (cst.List, cst.Tuple)) else 1
        if inner is None:
            return None
        count += inner
    return count


def _mentions_cpu(call: cst.Call) -> bool:
    """`device="cpu"`, `.to("cpu", torch.float64)`: explicitly not on the GPU."""
    return any(string_value(arg.value) == "cpu" for arg in call.args)


@register
class Float64OnGpu(Rule):
    """
    ## What it does
    Flags double precision in a file that uses CUDA: `dtype=torch.float64` /
    `torch.double` arguments, `.double()`, `.to(torch.float64)`,
    `torch.set_default_dtype(torch.float64)` and
    `torch.set_default_tensor_type(torch.cuda.DoubleTensor)`. Files that never
    touch CUDA are left alone: float64 numerics on the CPU are legitimate.
    So is a tensor created with fewer than 65,536 elements written out in the
    call (`torch.tensor([count, total], ...)`, `torch.zeros(3, 3, ...)`):
    under half a MiB, often float64 on purpose for exact sums.

    ## Why is this bad?
    A float64 tensor takes 8 bytes per element: twice float32, four times
    bfloat16. A `.double()` model doubles the memory of its weights, its
    gradients, its optimizer state and every activation it saves for the
    backward pass, and consumer and most data-center GPUs run float64 between
    2x and 64x slower than float32.

    ## Example
    ```python
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float64)
    model = model.double().cuda()
    ```

    ## Use instead
    ```python
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float32)
    model = model.float().cuda()
    ```

    ## Fix safety
    Safe: float32 is PyTorch's default precision for training, and the fix
    keeps the file's own spelling of torch (`T.float64` becomes `T.float32`).
    Results change only beyond float32's ~7 significant digits; code that
    truly needs double precision on the GPU (some solvers, some physics)
    should keep it and suppress the diagnostic on that line.
    """

    code = "OOM202"
    name = "float64"
    summary = "Double precision on the GPU: 8 bytes per element, and a fraction of the speed."
    fix_applicability = Applicability.SAFE

    VALID = [
        # CPU-only numerics: float64 is legitimate.
        Valid(
            """\
            import torch
            cov = torch.zeros(64, 64, dtype=torch.float64)
            eigvals = torch.linalg.eigvalsh(cov.double())
            """
        ),
        # float32 on the GPU.
        Valid(
            """\
            import torch
            x = torch.randn(8, 8, device="cuda", dtype=torch.float32)
            model = model.float().cuda()
            """
        ),
        # Explicitly on the CPU in a CUDA file, and a dtype check, not a cast.
        Valid(
            """\
            import torch
            model.cuda()
            stats = torch.zeros(10, device="cpu", dtype=torch.float64)
            if x.dtype == torch.float64:
                x = x.float()
            """
        ),
        # A mask reduced at once to a scalar; a local `double` that is not torch's.
        Valid(
            """\
            import torch
            model.cuda()
            acc = (pred == y).double().mean()
            def double(x):
                return 2 * x
            dtype = "float64"
            z = double(x)
            """
        ),
        # The dtype comes through a splat.
        Valid(
            """\
            import torch
            x = torch.randn(8, 8, device="cuda", **factory_kwargs)
            y = x.to(*target)
            """
        ),
        # A few elements (a metric's count and total for `all_reduce`):
        # float64 on purpose, and no memory to speak of.
        Valid(
            """\
            import torch
            totals = torch.tensor([count, total], dtype=torch.float64, device="cuda")
            cov = torch.zeros(3, 3, dtype=torch.double, device="cuda")
            """
        ),
        # A torch factory without a device creates on the CPU.
        Valid(
            """\
            import torch
            model.cuda()
            weights = torch.tensor(class_counts, dtype=torch.float64)
            stats = torch.from_numpy(histogram).double()
            """
        ),
        # numpy's float64 is host memory.
        Valid(
            """\
            import numpy as np
            import torch
            model.cuda()
            weights = np.zeros(3, dtype=np.float64)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """\
            import torch
            x = torch.randn(1024, 1024, device="cuda", dtype=torch.float64)
            """,
            line=2,
            expected_fix="""\
            import torch
            x = torch.randn(1024, 1024, device="cuda", dtype=torch.float32)
            """,
        ),
        Invalid(
            """\
            import torch as T
            model = Net().double().cuda()
            """,
            line=2,
            expected_fix="""\
            import torch as T
            model = Net().float().cuda()
            """,
        ),
        Invalid(
            """\
            import torch as T
            T.set_default_dtype(T.double)
            device = T.device("cuda:0")
            batch = batch.to(
                device,
                T.float64,  # keep precision
            )
            """,
            line=2,
            expected_fix="""\
            import torch as T
            T.set_default_dtype(T.float32)
            device = T.device("cuda:0")
            batch = batch.to(
                device,
                T.float32,  # keep precision
            )
            """,
        ),
        Invalid(
            """\
            import torch
            torch.set_default_tensor_type(torch.cuda.DoubleTensor)
            """,
            line=2,
            expected_fix="""\
            import torch
            torch.set_default_tensor_type(torch.cuda.FloatTensor)
            """,
        ),
        # Created on the CPU, then moved: the move is seen.
        Invalid(
            """\
            from torch import zeros, float64
            import torch
            buffer = zeros(4096, 4096, dtype=torch.double).to("cuda")
            """,
            line=3,
            expected_fix="""\
            from torch import zeros, float64
            import torch
            buffer = zeros(4096, 4096, dtype=torch.float32).to("cuda")
            """,
        ),
        # Hugging Face loading straight into float64 on a DDP rank.
        Invalid(
            """\
            import torch
            model = AutoModel.from_pretrained(name, torch_dtype=torch.float64)
            model.to(f"cuda:{rank}")
            """,
            line=2,
            expected_fix="""\
            import torch
            model = AutoModel.from_pretrained(name, torch_dtype=torch.float32)
            model.to(f"cuda:{rank}")
            """,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        # Reports to make if the file uses CUDA, with the function they are in.
        self._candidates: list[tuple[Report, cst.FunctionDef | None]] = []
        # `.double()` calls whose result is reduced or moved at once.
        self._exempt: set[cst.Call] = set()
        # Calls whose result is moved to the GPU: `torch.zeros(..., dtype=...).cuda()`.
        self._on_device: set[cst.Call] = set()

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is not None and isinstance(called[0], cst.Call) and self._moves_to_device(node, called[1]):
            self._on_device.add(called[0])
        if called is not None and called[1] in _REDUCTIONS:
            inner = method_call(called[0])
            if inner is not None and inner[1] == "double":
                self._exempt.add(called[0])  # type: ignore[arg-type]
        if called is not None and called[1] == "double" and not node.args:
            self._check_double_call(node, called[0])
            return
        qualified = self.context.call_name(node)
        if qualified == "torch.set_default_tensor_type" and node.args:
            value = node.args[0].value
            spelled = self.context.qualified_name(value) or string_value(value)
            if spelled in _DOUBLE_TENSOR_TYPES:
                self._candidate(value, to_float32(value))
            return
        if qualified in _DOUBLE_TENSOR_TYPES:
            self._candidate(node.func, to_float32(node.func))
            return
        if _mentions_cpu(node):
            return
        if qualified in _CPU_FACTORIES:
            # Created on the CPU unless given a device or moved at once.
            device = get_arg(node, "device")
            on_device = node in self._on_device or (
                isinstance(device, cst.Arg) and is_device_expression(device.value, self.context)
            )
            if not on_device:
                return
            count = _element_count(node, qualified)
            if count is not None and count < _NEGLIGIBLE_ELEMENTS:
                return
        positional_dtype = qualified == "torch.set_default_dtype" or (
            called is not None and called[1] in _DTYPE_METHODS
        )
        for arg in node.args:
            is_dtype_slot = (arg.keyword is not None and arg.keyword.value in _DTYPE_KEYWORDS) or (
                arg.keyword is None and not arg.star and positional_dtype
            )
            if is_dtype_slot and self.context.qualified_name(arg.value) in _DOUBLE_DTYPES:
                self._candidate(arg.value, to_float32(arg.value))

    def _moves_to_device(self, node: cst.Call, method: str) -> bool:
        if method == "cuda":
            return True
        if method != "to":
            return False
        device = get_arg(node, "device", 0)
        return isinstance(device, cst.Arg) and is_device_expression(device.value, self.context)

    def _check_double_call(self, node: cst.Call, receiver: cst.BaseExpression) -> None:
        if node in self._exempt or self.context.tracker.in_no_grad or isinstance(receiver, cst.Comparison):
            return
        moved = method_call(receiver)
        if moved is not None and moved[1] in ("cpu", "numpy"):
            return
        if isinstance(receiver, cst.Call) and node not in self._on_device:
            created = self.context.call_name(receiver)
            device = get_arg(receiver, "device")
            if created in _CPU_FACTORIES and not (
                isinstance(device, cst.Arg) and is_device_expression(device.value, self.context)
            ):
                return  # `torch.from_numpy(a).double()`: a CPU tensor
        self._candidate(node, double_call_to_float(node))

    def _candidate(self, node: cst.CSTNode, edits: tuple[NodeEdit, ...] | None) -> None:
        function = self.context.tracker.current_function
        if function is not None and function.name.value == "double":
            return  # the implementation of a `.double()` API itself
        fix = None
        if edits is not None:
            fix = FixSpec(title="Use float32", edits=edits, applicability=Applicability.SAFE)
        message = (
            "Double precision on the GPU takes 8 bytes per element, twice float32 and four times "
            "bfloat16, for every tensor it creates (and weights, gradients and optimizer state for a "
            "`.double()` model). Use float32, or bfloat16 under autocast, unless this code truly needs float64."
        )
        report = deferred_report(self, node, message, fix, tuple(self.context.tracker.statements))
        self._candidates.append((report, self.context.tracker.current_function))

    def leave_Module(self, original_node: cst.Module) -> None:
        # `torch.autograd.gradcheck` needs float64 inputs: a file that runs it
        # uses double precision on purpose.
        if "gradcheck" in self.context.source:
            return
        if not self._candidates or not file_uses_cuda(self.context):
            return
        scopes = device_scopes(self.context)
        for report, function in self._candidates:
            if scopes.on_gpu(function):
                self.context.add_report(report)
