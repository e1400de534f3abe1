"""OOM202: double precision on the GPU (float64 numerics on the CPU are legitimate)."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.cst_helpers import get_arg, int_value, method_call, string_value
from oom_lsp.analysis.facts.sizes import tensor_size
from oom_lsp.analysis.facts.workload import MATTERS, format_bytes
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Report, Rule, Valid, deferred_report
from oom_lsp.analysis.rules._devices import device_scopes, file_uses_cuda, is_device_expression
from oom_lsp.edits import NodeEdit
from oom_lsp.fixes.precision import double_call_to_float, to_float32

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
    advisory = True
    name = "float64"
    summary = "Double precision on the GPU: 8 bytes per element, and a fraction of the speed."
    why = (
        "float64 takes 8 bytes per element, twice float32 and four times bfloat16 (for a .double() model: "
        "its weights, gradients and optimizer state too)."
    )
    remedy = "Use float32, or bfloat16 under autocast, unless this code truly needs float64."
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
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            import torch
            distances = torch.zeros(16384, 16384, dtype=torch.float64, device="cuda")
            """,
            line=3,
            by_default=True,
            expected_fix="""
            import torch
            distances = torch.zeros(16384, 16384, dtype=torch.float32, device="cuda")
            """,
        ),
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
                self._candidate(arg.value, to_float32(arg.value), tensor=node)

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
        self._candidate(node, double_call_to_float(node), tensor=receiver)

    def _candidate(
        self, node: cst.CSTNode, edits: tuple[NodeEdit, ...] | None, *, tensor: cst.BaseExpression | None = None
    ) -> None:
        function = self.context.tracker.current_function
        if function is not None and function.name.value == "double":
            return  # the implementation of a `.double()` API itself
        fix = None
        if edits is not None:
            fix = FixSpec(title="Use float32", edits=edits, applicability=Applicability.SAFE)
        # The size facts know the tensor's elements when the code states its shape.
        size = tensor_size(self.context, tensor, function) if tensor is not None else None
        stake = size.elements * 8 if size is not None and size.elements is not None else None
        message = "Double precision (float64) on the GPU: 8 bytes per element"
        if stake is not None:
            message = f"Double precision (float64) on the GPU: {format_bytes(stake)} here, half of it in float32"
        report = deferred_report(
            self,
            node,
            message,
            fix,
            tuple(self.context.tracker.statements),
            proven=stake is not None and stake >= MATTERS,
        )
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
