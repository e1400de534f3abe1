"""The size, dtype and device of the tensors and arrays the code builds.

Constructors (`torch.zeros/ones/empty/full/rand/randn/randint/arange/
linspace/eye/tensor/...`, their `_like` forms, NumPy's), conversions between
the two (`torch.from_numpy`, `torch.tensor(array)`, `.numpy()`), and the
methods that keep the elements (`.to(...)`, `.cuda()`, `.half()`,
`.view(...)`, `.reshape(...)`, `.detach()`, ...) through the bindings of the
scope. Defaults are the libraries': torch's float factories make float32
(unless the file changes the default dtype), NumPy's make float64; `arange`
of integers makes int64; a factory's device is the CPU unless `device=` says
otherwise (or the file sets a default device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.facts.results import Device, TensorSize
from oom_lsp.analysis.facts.values import Evaluator, Frame, Items, Known, _merge, known_number

# torch.* dtype attributes and aliases -> the dtype's name.
_TORCH_DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32", "int16": "int16",
    "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool",
    "complex64": "complex64", "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}  # fmt: skip
# numpy.* dtype names (and Python's builtins as NumPy reads them).
_NUMPY_DTYPES = {
    "float64": "float64", "float_": "float64", "double": "float64", "float32": "float32", "single": "float32",
    "float16": "float16", "half": "float16", "int64": "int64", "int_": "int64", "int32": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool_": "bool", "complex128": "complex128",
    "complex64": "complex64", "longlong": "int64",
}  # fmt: skip
_BUILTIN_DTYPES = {"float": "float64", "int": "int64", "bool": "bool", "complex": "complex128"}
# Methods that return a tensor of the same elements, dtype and device.
_SAME = frozenset({
    "detach", "clone", "contiguous", "requires_grad_", "squeeze", "unsqueeze", "permute", "transpose",
    "t", "flatten", "ravel", "copy", "pin_memory", "share_memory_", "detach_", "float_power",
    "abs", "exp", "log", "sqrt", "sigmoid", "tanh", "relu", "neg", "clamp", "clip", "normal_", "uniform_",
    "zero_", "fill_", "copy_",
})  # fmt: skip
_CASTS = {
    "double": "float64", "float": "float32", "half": "float16", "bfloat16": "bfloat16", "long": "int64",
    "int": "int32", "short": "int16", "bool": "bool", "byte": "uint8", "char": "int8",
}  # fmt: skip
_FLOAT_FACTORIES = frozenset({"zeros", "ones", "empty", "rand", "randn", "full"})
_LIKE = frozenset({"zeros_like", "ones_like", "empty_like", "rand_like", "randn_like", "full_like", "randint_like"})
_NUMPY_SHAPE_FACTORIES = frozenset({"zeros", "ones", "empty", "full"})


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int | None, ...] | None
    dtype: str | None
    device: Device
    evidence: tuple[str, ...] = ()
    default: bool = False
    numpy: bool = False

    def elements(self) -> int | None:
        if self.shape is None or any(dim is None for dim in self.shape):
            return None
        return math.prod(self.shape)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> _Tensor:
        fields = dict(self.__dict__)
        fields.update(changes)
        return _Tensor(**fields)  # type: ignore[arg-type]


class TensorFacts:
    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.context = evaluator.context
        source = self.context.source
        # A file that changes torch's defaults: its float factories' dtype
        # (or device) is whatever it chose, unknown here.
        self.float_default = None if ("set_default_dtype" in source or "set_default_tensor_type" in source) else "float32"
        self.device_default = Device.UNKNOWN if "set_default_device" in source else Device.CPU
        evaluator.shape_of = self.shape_of

    def size(self, expr: cst.BaseExpression, frame: Frame) -> TensorSize | None:
        tensor = self.tensor(expr, frame)
        if tensor is None:
            return None
        evidence = ", ".join(tensor.evidence) or self.context.code_for(expr).strip()
        return TensorSize(
            shape=tensor.shape,
            elements=tensor.elements(),
            dtype=tensor.dtype,
            device=tensor.device,
            evidence=evidence,
            from_default=tensor.default,
            numpy=tensor.numpy,
        )

    def shape_of(self, expr: cst.BaseExpression, frame: Frame) -> tuple[int | None, ...] | None:
        tensor = self.tensor(expr, frame)
        return tensor.shape if tensor is not None else None

    # --- evaluation -----------------------------------------------------------------------
    def tensor(self, expr: cst.BaseExpression, frame: Frame) -> _Tensor | None:
        self.evaluator.step(frame)
        kind = type(expr)
        if kind is cst.Name or kind is cst.Attribute:
            if kind is cst.Attribute and expr.attr.value in ("T", "data", "mT"):
                return self.tensor(expr.value, frame)
            resolved = self.evaluator.resolve(expr, frame)
            if resolved is None:
                return None
            return self.tensor(*resolved)
        if kind is not cst.Call:
            return None
        func = expr.func
        qualified = self.context.qualified_name(func)
        if qualified is not None:
            if qualified.startswith("torch."):
                return self.torch_call(qualified[len("torch.") :], expr, frame)
            if qualified.startswith("numpy."):
                return self.numpy_call(qualified[len("numpy.") :], expr, frame)
            return None
        if type(func) is cst.Attribute:
            return self.method(expr.func.value, func.attr.value, expr, frame)
        return None

    def method(self, receiver: cst.BaseExpression, method: str, call: cst.Call, frame: Frame) -> _Tensor | None:
        if method in _SAME or method in ("view", "reshape", "expand_as", "view_as", "reshape_as"):
            base = self.tensor(receiver, frame)
            if base is None:
                return None
            if method in ("view", "reshape") and base.elements() is not None:
                shape = self.shape(call, frame, 0, allow_minus_one=base.elements())
                if shape is not None:
                    return base.replace(shape=shape[0], evidence=_merge(base.evidence, shape[1]))
            return base
        if method in _CASTS and not call.args:
            base = self.tensor(receiver, frame)
            return base.replace(dtype=_CASTS[method]) if base is not None else None
        if method == "cuda":
            base = self.tensor(receiver, frame)
            return base.replace(device=Device.CUDA, numpy=False) if base is not None else None
        if method == "cpu":
            base = self.tensor(receiver, frame)
            return base.replace(device=Device.CPU) if base is not None else None
        if method == "numpy":
            base = self.tensor(receiver, frame)
            return base.replace(device=Device.CPU, numpy=True) if base is not None else None
        if method in ("to", "type", "astype"):
            base = self.tensor(receiver, frame)
            if base is None:
                return None
            return self.converted(base, call, frame, numpy_names=method == "astype")
        return None

    def converted(self, base: _Tensor, call: cst.Call, frame: Frame, *, numpy_names: bool) -> _Tensor | None:
        """`.to(device)`, `.to(dtype)`, `.to(device, dtype)`, `.to(other)`, `.type(dtype)`, `.astype(dtype)`."""
        result = base
        for arg in call.args:
            if arg.star:
                return None
            if arg.keyword is not None and arg.keyword.value not in ("dtype", "device"):
                continue
            value = arg.value
            dtype = self.dtype(value, frame, numpy=base.numpy or numpy_names)
            if dtype is not None and (arg.keyword is None or arg.keyword.value == "dtype"):
                result = result.replace(dtype=dtype)
                continue
            if arg.keyword is not None and arg.keyword.value == "dtype":
                result = result.replace(dtype=None)
                continue
            device = self.device(value, frame)
            if device is not None:
                result = result.replace(device=device[0], default=result.default or device[1])
                continue
            other = self.tensor(value, frame)
            if other is not None:  # `.to(other)`: its dtype and device
                result = result.replace(dtype=other.dtype, device=other.device)
                continue
            # Something we cannot read: a device or a dtype, we do not know which.
            result = result.replace(device=Device.UNKNOWN, dtype=None if arg.keyword is None else result.dtype)
        return result

    # --- torch ------------------------------------------------------------------------
    def torch_call(self, name: str, call: cst.Call, frame: Frame) -> _Tensor | None:
        if name.startswith("nn.init.") or name.startswith("nn.Parameter"):
            return self.tensor(call.args[0].value, frame) if call.args else None
        if name in _FLOAT_FACTORIES:
            shape = self.shape(call, frame, 0)
            if shape is None:
                return None
            dtype = self.float_default
            if name == "full":
                fill = self.evaluator.evaluate(_arg(call, 1, "fill_value"), frame) if _arg(call, 1, "fill_value") else None
                dtype = _fill_dtype(fill, self.float_default)
            return self.finish(call, frame, shape, dtype, numpy=False)
        if name == "randint":
            positional = [arg for arg in call.args if arg.keyword is None]
            size_position = 2 if len(positional) >= 3 else 1
            shape = self.shape_arg(_arg(call, size_position, "size"), frame)
            if shape is None:
                return None
            return self.finish(call, frame, shape, "int64", numpy=False)
        if name == "randperm":
            count = known_number(self.evaluator.evaluate(call.args[0].value, frame)) if call.args else None
            if count is None or not isinstance(count.value, int):
                return None
            return self.finish(call, frame, ((count.value,), count.evidence, count.default), "int64", numpy=False)
        if name == "arange":
            return self.arange(call, frame, numpy=False)
        if name in ("linspace", "logspace"):
            steps = _arg(call, 2, "steps")
            count = known_number(self.evaluator.evaluate(steps, frame)) if steps is not None else None
            if count is None:
                return None
            return self.finish(call, frame, ((int(count.value),), count.evidence, count.default), self.float_default, numpy=False)
        if name == "eye":
            return self.eye(call, frame, self.float_default, numpy=False)
        if name in _LIKE:
            if not call.args:
                return None
            like = self.tensor(call.args[0].value, frame)
            if like is None:
                return None
            result = like.replace(numpy=False)
            return self.finish(call, frame, (like.shape, like.evidence, like.default), result.dtype, numpy=False, base=result)
        if name in ("tensor", "as_tensor", "from_numpy", "asarray", "Tensor", "FloatTensor", "LongTensor"):
            if not call.args:
                return None
            data = self.data(call.args[0].value, frame)
            if data is None:
                return None
            dtype = data.dtype
            if name == "tensor" and data.numpy is False and dtype == "float64" and data.evidence == ("literal",):
                dtype = self.float_default
            if name in ("Tensor", "FloatTensor"):
                dtype = "float32"
            elif name == "LongTensor":
                dtype = "int64"
            device = data.device if name in ("as_tensor", "from_numpy", "asarray") else Device.CPU
            base = data.replace(numpy=False, device=device, dtype=dtype, evidence=tuple(e for e in data.evidence if e != "literal"))
            if name == "from_numpy":
                return base
            return self.finish(call, frame, (base.shape, base.evidence, base.default), base.dtype, numpy=False, base=base)
        return None

    def data(self, expr: cst.BaseExpression, frame: Frame) -> _Tensor | None:
        """The data of `torch.tensor(x)` / `np.array(x)`: a literal or a known array."""
        kind = type(expr)
        if kind in (cst.List, cst.Tuple):
            shape, dtype = _literal_shape(expr)
            if shape is None:
                return None
            # Marked so that torch.tensor() reads float literals as its default float dtype.
            return _Tensor(shape, dtype, Device.CPU, ("literal",))
        return self.tensor(expr, frame)

    def arange(self, call: cst.Call, frame: Frame, *, numpy: bool) -> _Tensor | None:
        bounds = []
        for arg in call.args:
            if arg.star:
                return None
            if arg.keyword is None or arg.keyword.value in ("start", "end", "stop", "step"):
                bounds.append((arg.keyword.value if arg.keyword else None, known_number(self.evaluator.evaluate(arg.value, frame))))
        values = [value for _, value in bounds]
        if not values or any(value is None for value in values) or len(values) > 3:
            return None
        numbers = [value.value for value in values]  # type: ignore[union-attr]
        start, end, step = (0, numbers[0], 1) if len(numbers) == 1 else (numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1)
        if step == 0:
            return None
        count = max(0, math.ceil((end - start) / step))
        integers = all(isinstance(n, int) for n in numbers)
        dtype = "int64" if integers else ("float64" if numpy else self.float_default)
        evidence = _merge(*[value.evidence for value in values])  # type: ignore[union-attr]
        default = any(value.default for value in values)  # type: ignore[union-attr]
        return self.finish(call, frame, ((count,), evidence, default), dtype, numpy=numpy)

    def eye(self, call: cst.Call, frame: Frame, dtype: str | None, *, numpy: bool) -> _Tensor | None:
        rows = known_number(self.evaluator.evaluate(call.args[0].value, frame)) if call.args else None
        if rows is None:
            return None
        columns_arg = _arg(call, 1, "M" if numpy else "m")
        columns = known_number(self.evaluator.evaluate(columns_arg, frame)) if columns_arg is not None else rows
        if columns is None:
            return None
        shape = (int(rows.value), int(columns.value))
        return self.finish(call, frame, (shape, _merge(rows.evidence, columns.evidence), rows.default or columns.default), dtype, numpy=numpy)

    # --- numpy ------------------------------------------------------------------------
    def numpy_call(self, name: str, call: cst.Call, frame: Frame) -> _Tensor | None:
        if name in _NUMPY_SHAPE_FACTORIES:
            shape = self.shape_arg(_arg(call, 0, "shape"), frame)
            if shape is None:
                return None
            dtype = "float64"
            if name == "full":
                fill = _arg(call, 1, "fill_value")
                dtype = _fill_dtype(self.evaluator.evaluate(fill, frame) if fill else None, "float64", numpy=True)
            return self.finish(call, frame, shape, dtype, numpy=True, dtype_position=2 if name == "full" else 1)
        if name in ("random.randn", "random.rand"):
            shape = self.shape(call, frame, 0)
            return self.finish(call, frame, shape, "float64", numpy=True) if shape is not None else None
        if name in ("random.random", "random.random_sample", "random.standard_normal", "random.sample"):
            shape = self.shape_arg(_arg(call, 0, "size"), frame)
            return self.finish(call, frame, shape, "float64", numpy=True) if shape is not None else None
        if name in ("random.normal", "random.uniform"):
            shape = self.shape_arg(_arg(call, 2, "size"), frame)
            return self.finish(call, frame, shape, "float64", numpy=True) if shape is not None else None
        if name == "random.randint":
            shape = self.shape_arg(_arg(call, 2, "size"), frame)
            return self.finish(call, frame, shape, "int64", numpy=True) if shape is not None else None
        if name == "arange":
            return self.arange(call, frame, numpy=True)
        if name == "linspace":
            num = _arg(call, 2, "num")
            count = known_number(self.evaluator.evaluate(num, frame)) if num is not None else Known(50)
            if count is None:
                return None
            return self.finish(call, frame, ((int(count.value),), count.evidence, count.default), "float64", numpy=True)
        if name == "eye":
            return self.eye(call, frame, "float64", numpy=True)
        if name in ("array", "asarray", "ascontiguousarray"):
            if not call.args:
                return None
            data = self.data(call.args[0].value, frame)
            if data is None:
                return None
            base = data.replace(numpy=True, device=Device.CPU, evidence=tuple(e for e in data.evidence if e != "literal"))
            return self.finish(call, frame, (base.shape, base.evidence, base.default), base.dtype, numpy=True, base=base)
        if name in ("zeros_like", "ones_like", "empty_like", "full_like"):
            like = self.tensor(call.args[0].value, frame) if call.args else None
            if like is None:
                return None
            return self.finish(call, frame, (like.shape, like.evidence, like.default), like.dtype, numpy=True, base=like)
        return None

    # --- arguments -------------------------------------------------------------------
    def finish(
        self,
        call: cst.Call,
        frame: Frame,
        shape: tuple[tuple[int | None, ...] | None, tuple[str, ...], bool],
        dtype: str | None,
        *,
        numpy: bool,
        base: _Tensor | None = None,
        dtype_position: int | None = None,
    ) -> _Tensor | None:
        """Apply `dtype=` and `device=` to a constructor's result."""
        dims, evidence, default = shape
        device = base.device if base is not None else (Device.CPU if numpy else self.device_default)
        dtype_arg = _arg(call, dtype_position, "dtype") if dtype_position is not None else _keyword(call, "dtype")
        if dtype_arg is not None:
            dtype = self.dtype(dtype_arg, frame, numpy=numpy)
        device_arg = _keyword(call, "device")
        if device_arg is not None:
            found = self.device(device_arg, frame)
            device = found[0] if found is not None else Device.UNKNOWN
            default = default or (found[1] if found is not None else False)
        return _Tensor(dims, dtype, device, evidence, default, numpy)

    def shape(
        self, call: cst.Call, frame: Frame, start: int, *, allow_minus_one: int | None = None
    ) -> tuple[tuple[int | None, ...], tuple[str, ...], bool] | None:
        """A size given as `f(2, 3)`, `f((2, 3))`, `f([2, 3])`, `f(size=(2, 3))`, `f(*shape)`."""
        positional = [arg for arg in call.args if arg.keyword is None][start:]
        size_keyword = _keyword(call, "size") or _keyword(call, "shape")
        if size_keyword is not None:
            return self.shape_arg(size_keyword, frame, allow_minus_one=allow_minus_one)
        if len(positional) == 1 and not positional[0].star:
            return self.shape_arg(positional[0].value, frame, allow_minus_one=allow_minus_one)
        if len(positional) == 1 and positional[0].star == "*":
            return self.shape_arg(positional[0].value, frame, allow_minus_one=allow_minus_one)
        if not positional or any(arg.star for arg in positional):
            return None
        values = [self.evaluator.evaluate(arg.value, frame) for arg in positional]
        return _dims(values, allow_minus_one)

    def shape_arg(
        self, expr: cst.BaseExpression | None, frame: Frame, *, allow_minus_one: int | None = None
    ) -> tuple[tuple[int | None, ...], tuple[str, ...], bool] | None:
        if expr is None:
            return None
        if type(expr) is cst.Attribute and expr.attr.value == "shape":
            other = self.tensor(expr.value, frame)
            return (other.shape, other.evidence, other.default) if other is not None and other.shape is not None else None
        value = self.evaluator.evaluate(expr, frame)
        if type(value) is Items:
            return _dims(list(value.items), allow_minus_one)
        if type(value) is Known and isinstance(value.value, int) and not isinstance(value.value, bool):
            return _dims([value], allow_minus_one)
        if type(expr) in (cst.Tuple, cst.List):
            return _dims([self.evaluator.evaluate(element.value, frame) for element in expr.elements], allow_minus_one)
        return None

    def dtype(self, expr: cst.BaseExpression, frame: Frame, *, numpy: bool) -> str | None:
        qualified = self.context.qualified_name(expr)
        if qualified is not None:
            module, _, last = qualified.rpartition(".")
            if module == "torch":
                return _TORCH_DTYPES.get(last)
            if module == "numpy":
                return _NUMPY_DTYPES.get(last)
            return None
        if type(expr) is cst.Name and expr.value in _BUILTIN_DTYPES:
            return _BUILTIN_DTYPES[expr.value] if numpy else {"float": "float32", "int": "int64", "bool": "bool"}.get(expr.value)
        if type(expr) in (cst.SimpleString, cst.ConcatenatedString):
            value = expr.evaluated_value
            return _NUMPY_DTYPES.get(value) or _TORCH_DTYPES.get(value) if isinstance(value, str) else None
        if type(expr) in (cst.Name, cst.Attribute):
            resolved = self.evaluator.resolve(expr, frame)
            if resolved is not None and resolved[0] is not expr:
                self.evaluator.step(frame)
                return self.dtype(resolved[0], resolved[1], numpy=numpy)
        return None

    def device(self, expr: cst.BaseExpression, frame: Frame) -> tuple[Device, bool] | None:
        """The device an argument names, and whether it is a default (argparse)."""
        kind = type(expr)
        if kind is cst.Call:
            qualified = self.context.qualified_name(expr.func)
            if qualified == "torch.device" and expr.args:
                return self.device(expr.args[0].value, frame)
            return None
        if kind is cst.IfExp:
            # `"cuda" if torch.cuda.is_available() else "cpu"`: the code targets the GPU when there is one.
            test = self.context.code_for(expr.test)
            branches = [self.device(expr.body, frame), self.device(expr.orelse, frame)]
            if "is_available" in test and any(found and found[0] is Device.CUDA for found in branches):
                return Device.CUDA, False
            if branches[0] is not None and branches[1] is not None and branches[0][0] is branches[1][0]:
                return branches[0]
            return None
        if kind is cst.FormattedString:
            head = expr.parts[0] if expr.parts else None
            if type(head) is cst.FormattedStringText and head.value.startswith("cuda"):
                return Device.CUDA, False
            return None
        if kind is cst.Attribute and expr.attr.value == "device":
            other = self.tensor(expr.value, frame)
            return (other.device, other.default) if other is not None and other.device is not Device.UNKNOWN else None
        value = self.evaluator.evaluate(expr, frame)
        if type(value) is Known:
            if isinstance(value.value, str):
                kind_name = value.value.split(":")[0]
                if kind_name == "cuda":
                    return Device.CUDA, value.default
                if kind_name == "cpu":
                    return Device.CPU, value.default
                return None
            if isinstance(value.value, int) and not isinstance(value.value, bool):
                return Device.CUDA, value.default  # an ordinal names a GPU
        if kind in (cst.Name, cst.Attribute):
            resolved = self.evaluator.resolve(expr, frame)
            if resolved is not None and type(resolved[0]) in (cst.Call, cst.IfExp, cst.FormattedString):
                return self.device(*resolved)
        return None


def _arg(call: cst.Call, position: int | None, keyword: str) -> cst.BaseExpression | None:
    found = _keyword(call, keyword)
    if found is not None:
        return found
    if position is None:
        return None
    positional = [arg for arg in call.args if arg.keyword is None]
    if any(arg.star for arg in positional[: position + 1]):
        return None
    return positional[position].value if position < len(positional) else None


def _keyword(call: cst.Call, keyword: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    return None


def _dims(values: list[object], allow_minus_one: int | None) -> tuple[tuple[int | None, ...], tuple[str, ...], bool] | None:
    dims: list[int | None] = []
    evidence: tuple[str, ...] = ()
    default = False
    for value in values:
        number = known_number(value)  # type: ignore[arg-type]
        if number is None or not isinstance(number.value, int):
            dims.append(None)
            continue
        if number.value < 0 and not (number.value == -1 and allow_minus_one):
            return None
        dims.append(number.value)
        evidence = _merge(evidence, number.evidence)
        default = default or number.default
    if allow_minus_one and dims.count(-1) == 1 and None not in dims:
        rest = math.prod(dim for dim in dims if dim != -1)  # type: ignore[misc]
        if rest and allow_minus_one % rest == 0:
            dims[dims.index(-1)] = allow_minus_one // rest
    return tuple(dims), evidence, default


def _fill_dtype(fill: object, float_default: str | None, *, numpy: bool = False) -> str | None:
    if type(fill) is not Known:
        return None if not numpy else "float64"
    if isinstance(fill.value, bool):
        return "bool"
    if isinstance(fill.value, int):
        return "int64"
    if isinstance(fill.value, float):
        return float_default
    return None


def _literal_shape(expr: cst.BaseExpression) -> tuple[tuple[int, ...] | None, str | None]:
    """The shape and dtype of a nested list/tuple literal of numbers."""
    if type(expr) not in (cst.List, cst.Tuple):
        if type(expr) is cst.Integer:
            return (), "int64"
        if type(expr) is cst.Float:
            return (), "float64"
        if type(expr) is cst.Name and expr.value in ("True", "False"):
            return (), "bool"
        if type(expr) is cst.UnaryOperation:
            return _literal_shape(expr.expression)
        return None, None
    elements = expr.elements
    if any(type(element) is cst.StarredElement for element in elements):
        return None, None
    if not elements:
        return (0,), "float64"
    inner = [_literal_shape(element.value) for element in elements]
    shapes = {shape for shape, _ in inner}
    if len(shapes) != 1 or None in shapes:
        return None, None
    dtypes = {dtype for _, dtype in inner}
    dtype = "float64" if "float64" in dtypes else ("int64" if "int64" in dtypes else "bool")
    return (len(elements), *next(iter(shapes))), dtype
