"""Where a file runs: whether it puts anything on a CUDA device, and which of
its functions run on the GPU. Shared by the rules that only matter on a GPU
(OOM102, OOM201, OOM202, OOM501), computed once per file and only when a
rule has a candidate."""

from __future__ import annotations

import re
import weakref

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, method_call, string_value
from oom_lsp.analysis.walker import walk

_CUDA_DEVICE_RE = re.compile(r"^cuda(:\d+)?$")


class Found(Exception):
    """Stops a search walk at the first hit."""


class _CudaFinder(cst.BatchableCSTVisitor):
    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and (_CUDA_DEVICE_RE.match(value) or value.startswith("torch.cuda.")):
            raise Found  # "cuda:0", "torch.cuda.FloatTensor"

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        # f"cuda:{local_rank}"
        first = node.parts[0] if node.parts else None
        if isinstance(first, cst.FormattedStringText) and (
            first.value == "cuda" or first.value.startswith("cuda:")
        ):
            raise Found

    def visit_Call(self, node: cst.Call) -> None:
        called = method_call(node)
        if called is not None and called[1] == "cuda":
            raise Found

    def visit_Attribute(self, node: cst.Attribute) -> None:
        qualified = self.context.qualified_name(node)
        if qualified is not None and qualified.startswith("torch.cuda."):
            raise Found


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
            raise Found


class DeviceScopes:
    """Which functions of a file (that uses CUDA) run on the GPU: those that
    touch it themselves (`.cuda()`, `.to(device)`, `device=...`), or all of
    them when the top-level code does. A file of tests may run one test on
    CUDA and the next on the CPU. Computed lazily, once per scope."""

    def __init__(self, context: FileContext) -> None:
        # A proxy: `_DEVICE_SCOPES` is keyed by the context, and a strong reference
        # from its value would keep every analysed file alive.
        self.context: FileContext = weakref.proxy(context)
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


def search(root: cst.CSTNode, finder: cst.BatchableCSTVisitor) -> bool:
    """Run `finder` over `root` and its descendants; True when it raised `Found`."""
    try:
        walk(root, [finder], before_visit=_ignore, after_leave=_ignore, hooked_types=())
    except Found:
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
