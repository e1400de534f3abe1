"""Which values hold an autograd graph: a small, explainable data flow.

The OOM3xx rules ask one question of an expression: does its value keep an
autograd graph alive? The answer is a `Kind`:

- GRAPH_SCALAR / GRAPH: graph-attached (a reduced loss / any other tensor or
  container of tensors with a graph);
- DETACHED: holds no graph (`.detach()`, `.data`, `.tolist()`, anything
  computed under `torch.no_grad()` / `torch.inference_mode()`);
- NUMBER: a Python number (`.item()`, `float(x)`, `len(x)`, a literal);
- UNKNOWN: the analysis cannot tell, and rules stay silent.

Where graphs come from (the sources):

- a call of a module: a name bound to `nn.X(...)`, to an instance of a class
  of the file that subclasses `nn.Module` (or a Lightning / transformers
  base), to `X.from_pretrained(...)` (X naming a model), `self(...)` inside
  such a class, or, when nothing says otherwise, the names people give
  models (`model`, `net`, `encoder`, `self.model`, `*_model`, ...);
- a loss: a call of a criterion (a name bound to `nn.*Loss()`, or named
  `criterion`, `loss_fn`, ...) or of `torch.nn.functional.*_loss` /
  `cross_entropy` / ... with at least one graph-attached argument;
  `outputs.loss` of a graph-attached output.

Graphs propagate through arithmetic (`loss_a + 0.1 * loss_b`), indexing and
attributes (`out[0]`, `out.logits`), tensor methods that keep the graph
(`.cpu()`, `.to(...)`, `.view(...)`, `.mean()`) and torch functions of
graph-attached arguments (`torch.stack(outs)`).

The analysis is flow-sensitive inside one function (or the module's
top-level code): statements run in order, both arms of an `if` are merged
(a name that is a graph on one path and detached on the other is UNKNOWN),
and loop bodies are iterated to a fixed point so that a value carried from
one iteration to the next is seen at the top of the body. Each evaluated
expression node records its kind; rules read it with `ScopeFlow.kind_of`.
Functions are analysed lazily, the first time a rule asks about them.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import enum
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import bound_arguments, get_arg, string_value
from oom_lsp.analysis.walker import child_fields, is_node

# Node types are tested exactly (`type(node) is cst.Call`) on the hot paths:
# libcst has no subclasses of its concrete node classes, and isinstance() on
# them goes through ABCMeta, slow for every class a node is not.
_SCOPE_TYPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
_NAME_TYPES = frozenset({cst.Name, cst.Attribute})
_SEQUENCE_TYPES = frozenset({cst.Tuple, cst.List})
_IMPORT_TYPES = frozenset({cst.Import, cst.ImportFrom})
_STRING_TYPES = frozenset({cst.SimpleString, cst.ConcatenatedString, cst.FormattedString})
_BINDING_TYPES = frozenset({cst.Assign, cst.AnnAssign, cst.For, cst.WithItem, cst.NamedExpr})
_RESULT_TYPES = frozenset({cst.Return, cst.Yield})
_SIGN_TYPES = frozenset({cst.Minus, cst.Plus})
# Statements whose blocks may define classes seen file-wide (`if TYPE_CHECKING:`).
_BLOCK_HOLDING_TYPES = frozenset({cst.If, cst.Try, cst.With})


class Kind(enum.Enum):
    GRAPH_SCALAR = "graph-attached scalar"
    GRAPH = "graph-attached"
    # A dict, list or model output known to hold a graph-attached tensor
    # (`out["loss"].backward()`), not a tensor: `.detach()` does not apply.
    GRAPH_CONTAINER = "container of a graph-attached tensor"
    DETACHED = "detached"
    # `None`: no tensor at all. A name that is None on one path and a tensor on
    # another (`result = None` before a loop that builds it) is that tensor
    # wherever it is used as one.
    NONE = "none"
    NUMBER = "number"
    UNKNOWN = "unknown"

    @property
    def attached(self) -> bool:
        return self in (Kind.GRAPH_SCALAR, Kind.GRAPH, Kind.GRAPH_CONTAINER)

    @property
    def free(self) -> bool:
        """Certainly holds no graph."""
        return self in (Kind.DETACHED, Kind.NUMBER, Kind.NONE)


def merge(first: Kind, second: Kind) -> Kind:
    """The kind of a value that may come from either of two paths."""
    if first is second:
        return first
    if first is Kind.NONE or second is Kind.NONE:
        return second if first is Kind.NONE else first
    if first.attached and second.attached:
        return Kind.GRAPH_CONTAINER if Kind.GRAPH_CONTAINER in (first, second) else Kind.GRAPH
    if first.free and second.free:
        return Kind.DETACHED
    if Kind.GRAPH_CONTAINER in (first, second) and (first.free or second.free):
        # A list made empty before a loop that appends graph-attached values to it
        # (or a container that is None on one path): on every path where it holds
        # anything, it holds a graph.
        return Kind.GRAPH_CONTAINER
    return Kind.UNKNOWN


# List and set methods that put their (last) argument in the receiver.
_GROWING_METHODS = frozenset({"append", "extend", "insert", "add", "appendleft"})


class Returned(NamedTuple):
    """What a call of a function of the file returns: its kind, and the kind of
    each position when it always returns a tuple display of one length."""

    kind: Kind
    positions: tuple[Kind, ...] | None


# The kinds a call passes to a function's parameters, by name, in parameter order.
ParameterKinds = tuple[tuple[str, Kind], ...]


class Role(enum.Enum):
    """What calling a name does, as far as graphs are concerned."""

    MODULE = "module"  # a forward pass
    CRITERION = "criterion"  # a loss
    NOT_MODULE = "not a module"  # a def, a lambda, a literal, a class, conflicting bindings
    UNKNOWN = "unknown"  # bound to something unknown: the naming heuristics decide


@dataclass(frozen=True)
class Callee:
    role: Role
    # The qualified constructor when known: "torch.nn.LSTM", "Net" (a class of the file).
    constructor: str | None = None
    # False for a criterion built with `reduction="none"` (or an unknown one): per-sample losses.
    reduces: bool = True


_UNKNOWN_CALLEE = Callee(Role.UNKNOWN)
_NOT_MODULE = Callee(Role.NOT_MODULE)

_MODEL_NAMES = frozenset(
    {
        "model", "net", "network", "encoder", "decoder", "generator", "discriminator", "backbone",
        "classifier", "rnn", "lstm", "gru", "transformer", "teacher", "student", "unet", "vae",
        "netg", "netd", "critic", "actor", "policy", "module",
    }
)  # fmt: skip
_MODEL_SUFFIXES = ("_model", "_net", "_encoder", "_decoder", "_rnn", "_lstm", "_gru")
_CRITERION_NAMES = frozenset({"criterion", "loss_fn", "loss_func", "loss_function", "loss_fct", "lossfn"})

_MODULE_BASES = frozenset(
    {
        "torch.nn.Module",
        "torch.nn.modules.module.Module",
        "lightning.LightningModule",
        "lightning.pytorch.LightningModule",
        "pytorch_lightning.LightningModule",
        "pytorch_lightning.core.LightningModule",
        "transformers.PreTrainedModel",
        "transformers.modeling_utils.PreTrainedModel",
    }
)
_MODEL_BASE_SUFFIXES = ("PreTrainedModel", "ModelMixin")
_NOT_MODEL_SUFFIXES = ("Output", "Config", "Loss", "Mixin", "Cache", "Tokenizer", "Processor")


def _is_library_model(qualified: str) -> bool:
    """A class of a transformers-style `modeling_*` module (`BertModel`,
    `Mask2FormerForUniversalSegmentation`, `Dinov2Layer`), imported by name."""
    module, _, last = qualified.rpartition(".")
    return (
        module.rpartition(".")[2].startswith("modeling_")
        and last[:1].isupper()
        and not last.endswith(_NOT_MODEL_SUFFIXES)
    )
_NOT_MODULE_CLASSES = frozenset({"Parameter", "ParameterList", "ParameterDict", "Buffer", "Module"})
# `model.to(device)` and friends return the module itself.
_MODULE_RETURNING_METHODS = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "train",
        "eval",
        "half",
        "float",
        "bfloat16",
        "double",
        "requires_grad_",
        "to_empty",
    }
)
_FRAMEWORKS = ("torch", "transformers", "lightning", "pytorch_lightning", "accelerate")

_LOSS_FUNCTIONS = frozenset(
    {
        "cross_entropy", "nll_loss", "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits",
        "poisson_nll_loss", "gaussian_nll_loss", "ctc_loss",
    }
)  # fmt: skip

# Tensor methods whose result is detached from any graph.
_DETACHING_METHODS = frozenset({"detach", "detach_", "tolist", "numpy"})
_NUMBER_METHODS = frozenset({"item", "dim", "numel", "nelement", "element_size", "ndimension", "get_device"})
# Integer / boolean results cannot require grad.
_NON_DIFFERENTIABLE_METHODS = frozenset(
    {
        "argmax", "argmin", "argsort", "eq", "ne", "lt", "gt", "le", "ge", "isnan", "isinf", "isfinite",
        "nonzero", "bool", "long", "int", "short", "byte", "sign", "round", "floor", "ceil", "size",
        "topk_indices", "unique", "bincount",
    }
)  # fmt: skip
# Methods that return the same scalar-ness and keep the graph.
_SCALAR_KEEPING_METHODS = frozenset(
    {"cpu", "cuda", "to", "float", "half", "double", "bfloat16", "clone", "contiguous", "squeeze", "abs", "sqrt",
     "exp", "log", "neg", "type_as"}
)  # fmt: skip
_REDUCTIONS = frozenset(
    {"mean", "sum", "norm", "prod", "max", "min", "amax", "amin", "std", "var", "logsumexp"}
)
_GRAPH_KEEPING_METHODS = _SCALAR_KEEPING_METHODS | frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "unsqueeze", "flatten", "permute", "transpose", "expand",
        "expand_as", "repeat", "softmax", "log_softmax", "sigmoid", "tanh", "relu", "pow", "clamp", "clip", "t",
        "chunk", "split", "narrow", "select", "gather", "masked_fill", "mul", "add", "sub", "div", "matmul", "mm",
        "bmm", "squeeze_", "unsqueeze_", "float_", "roll", "flip", "index_select", "masked_select", "sort",
        "topk", "cumsum", "diag", "tril", "triu", "square",
    }
) | _REDUCTIONS  # fmt: skip
_METADATA_ATTRIBUTES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "requires_grad",
        "is_cuda",
        "is_leaf",
        "grad_fn",
        "data",
        "grad",
        "layout",
    }
)
_SHAPE_ATTRIBUTES = frozenset({"shape"})
# torch functions whose result never carries a graph: factories (a copy,
# for `torch.tensor(x)`) and integer-valued results.
_TORCH_GRAPHLESS = frozenset(
    {
        "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange", "linspace", "logspace",
        "tensor", "as_tensor", "from_numpy", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
        "rand_like", "randn_like", "randint_like", "argmax", "argmin", "argsort", "eq", "isnan", "isinf",
        "numel",
    }
)  # fmt: skip
_LOSS_OPTIONS = frozenset(
    {
        "reduction",
        "weight",
        "ignore_index",
        "label_smoothing",
        "reduce",
        "size_average",
        "pos_weight",
        "blank",
    }
)
_NUMBER_BUILTINS = frozenset({"float", "int", "len", "bool", "round"})
_GRAD_ENABLING = frozenset({"torch.enable_grad", "torch.autograd.enable_grad"})

State = dict[str, Kind]


def _merge_states(first: State, second: State) -> State:
    merged = dict(first)
    if first == second:
        return merged  # a comparison in C; often so, when a branch binds nothing
    for name, kind in second.items():
        # Most names have the same kind on both paths, and `merge(k, k)` is `k`.
        if merged.get(name) is not kind:
            merged[name] = merge(merged[name], kind) if name in merged else kind
    return merged


# `wrap_model(...)`, `self._get_model(...)`: functions that return or act on a
# model, not a model. Seen as a false positive on transformers' Trainer.
_VERBS = frozenset(
    {
        "wrap", "unwrap", "get", "load", "build", "create", "init", "prepare", "save", "setup",
        "make", "train", "evaluate", "eval", "copy", "freeze", "unfreeze", "move", "set", "update",
        "compile", "export", "print", "log", "register", "reset", "to",
    }
)  # fmt: skip


_MODEL_ONLY_NAMES = frozenset({"model", "net", "network", "rnn", "lstm", "gru"})


def _names_a_model(name: str) -> bool:
    lowered = name.lower().lstrip("_")
    return lowered in _MODEL_ONLY_NAMES or lowered.endswith(("_model", "_net"))


def model_name_heuristic(name: str) -> Role:
    lowered = name.lower()
    if lowered.lstrip("_").split("_", 1)[0] in _VERBS:
        return Role.UNKNOWN
    if lowered in _MODEL_NAMES or lowered.endswith(_MODEL_SUFFIXES):
        return Role.MODULE
    if lowered in _CRITERION_NAMES or lowered.startswith("criterion_") or lowered.endswith("_criterion"):
        return Role.CRITERION
    return Role.UNKNOWN


class FileFacts:
    """What the whole file says about names: module classes, bindings of
    module-level names and of `self.x` attributes, and each scope's flow."""

    def __init__(self, context: FileContext) -> None:
        # A proxy: `_FACTS` is keyed by the context, and a strong reference
        # from its value would keep every analysed file alive.
        self.context: FileContext = weakref.proxy(context)
        self.uses_framework = any(
            bound.partition(".")[0] in _FRAMEWORKS for bound in context.imports.bindings.values()
        )
        self.module_classes: set[str] = set()
        self.class_of: dict[cst.FunctionDef, cst.ClassDef] = {}
        self.class_attributes: dict[cst.ClassDef, dict[str, Callee]] = {}
        self._classes: list[cst.ClassDef] = []
        self._find_classes(context.module.body, None)
        self._find_module_classes()
        self.class_by_name: dict[str, cst.ClassDef] = {}
        for class_def in self._classes:
            name = class_def.name.value
            # A name defined twice (`if cuda: class A ... else: class A ...`) is ambiguous.
            self.class_by_name[name] = class_def if name not in self.class_by_name else None  # type: ignore[assignment]
        self.module_functions = _module_functions(context.module.body)
        # The names a call can reach a function of the file by: a cheap test
        # before a call is resolved.
        self.method_names = frozenset(method.name.value for method in self.class_of)
        self.module_bindings: dict[str, Callee] = {}
        self.module_bindings = _BindingCollector(self, None).collect(context.module.body)
        for class_def in self._classes:
            self.class_attributes[class_def] = self._self_attributes(class_def)
        self._flows: dict[cst.FunctionDef | None, ScopeFlow] = {}
        self._summaries: dict[cst.FunctionDef | None, ScopeSummary] = {}
        # What the naming heuristics make of each name, worked out once.
        self._named_callees: dict[str, Callee] = {}
        self._module_names: frozenset[str] | None = None
        self._parameter_owners: frozenset[str] | None = None
        self._functions: list[cst.FunctionDef] | None = None
        self._given_returns: dict[tuple[cst.FunctionDef, ParameterKinds], Returned] = {}
        self._trains: bool | None = None
        # For `_scopes_whose_lines_mention`; False: not computed yet.
        self._spans: list[tuple[cst.FunctionDef, int, int]] | None | bool = False
        self._starts: list[int] | None = None

    # --- file-wide facts ---------------------------------------------------
    def _find_classes(self, body: Sequence[cst.CSTNode], owner: cst.ClassDef | None) -> None:
        for statement in body:
            if type(statement) is cst.ClassDef:
                self._classes.append(statement)
                self._find_classes(_block(statement.body), statement)
            elif type(statement) is cst.FunctionDef:
                if owner is not None:
                    self.class_of[statement] = owner
            elif type(statement) in _BLOCK_HOLDING_TYPES:
                for block in _nested_blocks(statement):
                    self._find_classes(block, owner)

    def _find_module_classes(self) -> None:
        changed = True
        while changed:
            changed = False
            for class_def in self._classes:
                name = class_def.name.value
                if name in self.module_classes:
                    continue
                if any(self._is_module_base(arg.value) for arg in class_def.bases):
                    self.module_classes.add(name)
                    changed = True

    def _is_module_base(self, base: cst.BaseExpression) -> bool:
        qualified = self.context.qualified_name(base)
        if qualified is not None:
            if qualified in _MODULE_BASES:
                return True
            head, _, last = qualified.rpartition(".")
            if (
                head in ("torch.nn", "torch.nn.modules")
                and last[:1].isupper()
                and last not in _NOT_MODULE_CLASSES
            ):
                return True
            if qualified.startswith("transformers.") and last.endswith(("PreTrainedModel", "Model")):
                return True
            return _is_library_model(qualified)
        dotted = dotted_name(base)
        if dotted is not None and dotted.rpartition(".")[2].endswith(_MODEL_BASE_SUFFIXES):
            return True  # transformers' and diffusers' own code import their bases relatively
        relative = self.context.imports.relative.get(dotted or "")
        if relative is not None and _is_library_model(relative):
            return True
        return dotted in self.module_classes

    def _self_attributes(self, class_def: cst.ClassDef) -> dict[str, Callee]:
        attributes: dict[str, Callee] = {}
        for statement in _block(class_def.body):
            if type(statement) is cst.FunctionDef:
                collector = _BindingCollector(self, None, self_attributes=True)
                for name, callee in collector.collect(_block(statement.body)).items():
                    if name.startswith("self."):
                        attributes[name[len("self.") :]] = _combine(
                            attributes.get(name[len("self.") :]), callee
                        )
        return attributes

    def classify_value(self, value: cst.BaseExpression, lookup: dict[str, Callee]) -> Callee | None:
        """What calling the value assigned to a name would do; None for `None`."""
        if type(value) is cst.Name:
            if value.value == "None":
                return None
            if value.value in lookup:
                return lookup[value.value]
            return self.module_bindings.get(value.value, _UNKNOWN_CALLEE)
        if type(value) in _LITERAL_TYPES:
            return _NOT_MODULE
        if type(value) is not cst.Call:
            return _UNKNOWN_CALLEE
        func = value.func
        qualified = self.context.call_name(value)
        if qualified is not None and not (
            type(func) is cst.Attribute and func.attr.value == "from_pretrained"
        ):
            return self._classify_qualified_call(value, qualified, lookup)
        if type(func) is cst.Name and func.value in self.module_classes:
            return Callee(Role.MODULE, func.value)
        if type(func) is cst.Name and self.class_by_name.get(func.value) is not None:
            return Callee(Role.UNKNOWN, func.value)  # an instance of a class of the file: its methods are known
        if type(func) is cst.Attribute:
            method = func.attr.value
            if method == "from_pretrained":
                owner = dotted_name(func.value) or ""
                last = owner.rsplit(".", 1)[-1]
                if any(
                    word in last
                    for word in ("Tokenizer", "Processor", "Config", "Scheduler", "Extractor", "Pipeline")
                ):
                    return _NOT_MODULE  # diffusers and transformers pipelines run under no_grad
                if "Model" in last or "For" in last or "Net" in last:
                    return Callee(Role.MODULE, owner + ".from_pretrained")
                return _UNKNOWN_CALLEE
            if method in _MODULE_RETURNING_METHODS:
                return self.classify_value(func.value, lookup)
        return _UNKNOWN_CALLEE

    def _classify_qualified_call(self, call: cst.Call, qualified: str, lookup: dict[str, Callee]) -> Callee:
        if qualified.startswith(("diffusers.", "transformers.")) and "ipeline" in qualified.rpartition(".")[2]:
            return _NOT_MODULE  # `StableDiffusionPipeline(...)`, `transformers.pipeline(...)`: no_grad inside
        if qualified in ("torch.compile", "torch.jit.script", "torch.jit.trace") and call.args:
            inner = self.classify_value(call.args[0].value, lookup)
            return inner if inner is not None else _UNKNOWN_CALLEE
        head, _, last = qualified.rpartition(".")
        if head.startswith("torch.nn") and not head.startswith(("torch.nn.functional", "torch.nn.init")):
            if last.endswith("Loss"):
                reduction = get_arg(call, "reduction")
                reduces = reduction is None or (
                    isinstance(reduction, cst.Arg) and string_value(reduction.value) in ("mean", "sum")
                )
                return Callee(Role.CRITERION, qualified, reduces=reduces)
            if (
                last[:1].isupper()
                and last not in _NOT_MODULE_CLASSES
                and not head.startswith("torch.nn.utils")
            ):
                return Callee(Role.MODULE, qualified)
        return _UNKNOWN_CALLEE

    # --- scopes ------------------------------------------------------------
    def flow(self, function: cst.FunctionDef | None) -> ScopeFlow:
        """The flow of `function`'s body (None: the module's top-level code)."""
        flow = self._flows.get(function)
        if flow is None:
            flow = ScopeFlow(self, function)
            self._flows[function] = flow
        return flow

    def summary(self, function: cst.FunctionDef | None) -> ScopeSummary:
        summary = self._summaries.get(function)
        if summary is None:
            body = _block(function.body) if function is not None else self.context.module.body
            summary = ScopeSummary(self.context, body)
            self._summaries[function] = summary
        return summary

    # --- functions of the file, summarised ---------------------------------
    def method_of(self, class_def: cst.ClassDef, name: str, depth: int = 0) -> cst.FunctionDef | None:
        """The method `name` of a class of the file, defined in it or in a
        base class of the file; None when absent or defined twice."""
        found = [
            statement
            for statement in _block(class_def.body)
            if type(statement) is cst.FunctionDef and statement.name.value == name
        ]
        if len(found) == 1:
            return found[0]
        if found or depth > 3:
            return None
        for base in class_def.bases:
            base_class = self.class_by_name.get(dotted_name(base.value) or "")
            if base_class is not None and base_class is not class_def:
                method = self.method_of(base_class, name, depth + 1)
                if method is not None:
                    return method
        return None

    def returned_given(self, function: cst.FunctionDef, parameters: ParameterKinds) -> Returned:
        """What calling `function` returns when its parameters hold values of the
        given kinds (the others unknown; `()`: its own flow): a loss helper handed a
        model's output returns graph-attached losses, whatever its name. DETACHED
        for a function without a `return` value, UNKNOWN for a generator or a
        recursive call. With the kind of each
        position when every `return` returns a tuple of the same length
        (`return total, recon, kld`), so that `loss, recon, acc = helper(out)`
        gives each name its own kind."""
        key = (function, parameters)
        known = self._given_returns.get(key)
        if known is not None:
            return known
        self._given_returns[key] = Returned(Kind.UNKNOWN, None)  # while it is worked out: recursion
        flow = self.flow(function)
        if parameters:
            kinds: dict[int, Kind] = {}
            _Interpreter(flow, kinds, {}).run_block(_block(function.body), dict(parameters), flow._no_grad)
        else:
            flow.kind_of(function.name)  # the function's own flow, interpreted once
            kinds = flow._kinds  # type: ignore[assignment]
        merged: Kind | None = None
        positions: list[Kind] | None = None
        tuples_only = True
        for statement in _block(function.body):
            for node in iter_nodes(statement):
                node_type = type(node)
                if node_type is cst.Yield or node_type is cst.Await:
                    self._given_returns[key] = result = Returned(Kind.UNKNOWN, None)
                    return result
                if node_type is not cst.Return or node.value is None:
                    continue
                kind = kinds.get(id(node.value), Kind.UNKNOWN)
                merged = kind if merged is None else merge(merged, kind)
                value = node.value
                if type(value) is cst.Tuple and not any(type(e) is cst.StarredElement for e in value.elements):
                    each = [kinds.get(id(element.value), Kind.UNKNOWN) for element in value.elements]
                    if positions is None:
                        positions = each
                    elif len(positions) == len(each):
                        positions = [merge(a, b) for a, b in zip(positions, each)]
                    else:
                        tuples_only = False
                else:
                    tuples_only = False
        result = Returned(
            Kind.DETACHED if merged is None else merged,
            tuple(positions) if tuples_only and positions is not None else None,
        )
        self._given_returns[key] = result
        return result

    # --- who calls a function ---------------------------------------------
    def functions(self) -> list[cst.FunctionDef]:
        """Every function of the file, methods and nested ones included."""
        if self._functions is None:
            found: list[cst.FunctionDef] = []
            pending: list[cst.CSTNode] = list(self.context.module.body)
            while pending:
                statement = pending.pop()
                if type(statement) is cst.FunctionDef:
                    found.append(statement)
                if type(statement) is not cst.SimpleStatementLine:
                    for block in _nested_blocks(statement):
                        pending.extend(block)
            self._functions = found
        return self._functions

    def trains(self) -> bool:
        """Something in the file runs a backward pass."""
        if self._trains is None:
            self._trains = "backward" in self.context.source and any(
                self.summary(scope).backward_calls for scope in (None, *self.functions())
            )
        return self._trains

    def runs_without_grad_for_its_callers(self, function: cst.FunctionDef, depth: int = 0) -> bool | None:
        """True when every call of `function` in the file runs with autograd
        off (in a `with torch.no_grad():` block, or in a function that runs
        without grad itself, one level up); None when its callers cannot be
        known (it is passed or stored as a value: a callback); False when a
        call runs with grad, or nothing in the file calls it (a public API)."""
        owner = self.class_of.get(function)
        name = function.name.value
        if len(re.findall(rf"\b{re.escape(name)}\b", self.context.source)) <= 1:
            return False  # only its `def` names it: nothing in the file calls or passes it
        dotted = f"self.{name}" if owner is not None else name
        scopes: list[cst.FunctionDef | None] = [
            method for method, method_owner in self.class_of.items() if method_owner is owner
        ] if owner is not None else [None, *self.functions()]
        scopes = self._scopes_whose_lines_mention(name, scopes)
        calls = 0
        for scope in scopes:
            for mention, ancestors in self.summary(scope).uses_of(dotted):
                parent = ancestors[-1] if ancestors else None
                if type(parent) is not cst.Call or parent.func is not mention:
                    if type(parent) is cst.Attribute:
                        continue  # `name.attr`: not this function being referenced
                    return None
                calls += 1
                if not self._call_runs_without_grad(scope, ancestors, depth):
                    return False
        return calls > 0

    def _scopes_whose_lines_mention(
        self, name: str, scopes: list[cst.FunctionDef | None]
    ) -> list[cst.FunctionDef | None]:
        """Those of `scopes` with the word `name` on a line of their own code
        (not of a function nested in them): the others cannot mention it, and
        summarising every function of a file to find a function's callers
        cost more than the rest of the analysis. All of them when the lines
        are not known."""
        spans = self._function_spans()
        if spans is None:
            return scopes
        line_starts = self._line_starts()
        lines = {
            bisect.bisect_right(line_starts, match.start())
            for match in re.finditer(rf"\b{re.escape(name)}\b", self.context.source)
        }
        mentioned: set[cst.FunctionDef | None] = set()
        for line in lines:
            innermost = None
            for function, first, last in spans:  # outer functions before the ones nested in them
                if first <= line <= last:
                    innermost = function
            mentioned.add(innermost)
        return [scope for scope in scopes if scope in mentioned]

    def _function_spans(self) -> list[tuple[cst.FunctionDef, int, int]] | None:
        """Every function of the file with its first and last line, in source
        order; None when the stdlib tree does not match libcst's."""
        if self._spans is False:
            self._spans = None
            tree = self.context.syntax_tree()
            if tree is not None:
                ours = _functions_in_source_order(self.context.module.body)
                theirs = _ast_functions_in_source_order(tree.body)
                if len(ours) == len(theirs) and all(
                    function.name.value == node.name for function, node in zip(ours, theirs)
                ):
                    self._spans = [
                        (function, node.lineno, node.end_lineno or node.lineno)
                        for function, node in zip(ours, theirs)
                    ]
        return self._spans  # type: ignore[return-value]

    def _line_starts(self) -> list[int]:
        """The offset at which each line after the first starts."""
        if self._starts is None:
            self._starts = [match.end() for match in _LINE_END.finditer(self.context.source)]
        return self._starts

    def _call_runs_without_grad(
        self, scope: cst.FunctionDef | None, ancestors: tuple[cst.CSTNode, ...], depth: int
    ) -> bool:
        tracker = self.context.tracker
        if inside_no_grad_block(ancestors, self.context):
            return True
        if scope is None:
            return False
        if any(tracker.is_grad_disabling(decorator.decorator) for decorator in scope.decorators):
            return True
        if self.is_framework_no_grad_hook(scope):
            return True
        return depth < 1 and self.runs_without_grad_for_its_callers(scope, depth + 1) is True

    def is_framework_no_grad_hook(self, function: cst.FunctionDef) -> bool:
        """A method its framework runs under `torch.no_grad()`: Lightning's
        `validation_step` / `test_step` / `predict_step`, a transformers
        `Pipeline`'s `_forward`."""
        owner = self.class_of.get(function)
        if owner is None:
            return False
        name = function.name.value
        if name in _LIGHTNING_NO_GRAD_HOOKS:
            return owner.name.value in self.module_classes
        if name == "_forward":
            return any((dotted_name(base.value) or "").endswith("Pipeline") for base in owner.bases)
        return False

    def callee_by_name(self, name: str, *, of_a_module: bool = False) -> Callee:
        """What a name whose binding the file does not show is, from its name
        (`model`, `criterion`). Only `model`, `net` (`*_model`, `*_net`) and the
        recurrent layers' names name nothing but a model in PyTorch code; a name
        that also names other things
        (`policy`, `encoder`, `generator`, `rnn`) is a module only when the file
        calls a module's methods on it (`policy.parameters()`,
        `encoder.eval()`) or hands it to what takes a module (`DDP(actor)`), so
        that a function or a tokenizer's encoder is not taken for a model."""
        callee = self._named_callees.get(name)
        if callee is None:
            role = model_name_heuristic(name)
            if role is Role.MODULE and not _names_a_model(name) and name not in self._module_used_names():
                role = Role.UNKNOWN
            elif role is Role.UNKNOWN and name in self._parameter_owners_named():
                role = Role.MODULE  # `vit.parameters()` handed to an optimizer: `vit(images)` is a forward pass
            callee = self._named_callees[name] = Callee(role)
        if of_a_module and callee.role is Role.UNKNOWN and model_name_heuristic(name) is Role.MODULE:
            # `model.module(x)`, `net.encoder(x)`: a submodule of a module is a module.
            return Callee(Role.MODULE)
        return callee

    def _parameter_owners_named(self) -> frozenset[str]:
        """The names the file calls what only a module has on (`.parameters()`;
        `.train()`, `.to()` and `.zero_grad()` are also a trainer's, a tensor's,
        an optimizer's)."""
        if self._parameter_owners is None:
            self._parameter_owners = frozenset(
                match.group(1) for match in _ONLY_MODULES_HAVE_RE.finditer(self.context.source)
            )
        return self._parameter_owners

    def _module_used_names(self) -> frozenset[str]:
        if self._module_names is None:
            self._module_names = frozenset(
                match.group(1) or match.group(2) for match in _MODULE_USE_RE.finditer(self.context.source)
            )
        return self._module_names


_LIGHTNING_NO_GRAD_HOOKS = frozenset({"validation_step", "test_step", "predict_step"})
# `name.parameters()`, `name.eval()`, ...: nn.Module's API used on a name (the
# last part of a dotted name: `self.policy.train()` names `policy`).
_MODULE_USE_RE = re.compile(
    r"\b([A-Za-z_]\w*)\s*\.\s*(?:parameters|named_parameters|train|eval|state_dict|load_state_dict|zero_grad|"
    r"to|cuda|requires_grad_|modules|named_modules|children|apply|half|bfloat16|forward|register_forward_hook|"
    r"gradient_checkpointing_enable)\s*\("
    # Handed to what only takes a module: DDP(model), torch.compile(net), accelerator.prepare(model, ...).
    r"|(?:DataParallel|DDP|FSDP|FullyShardedDataParallel|compile|prepare)\s*\(\s*(?:self\.)?([A-Za-z_]\w*)"
)
_ONLY_MODULES_HAVE_RE = re.compile(
    r"\b([A-Za-z_]\w*)\s*\.\s*(?:parameters|named_parameters|named_modules|register_forward_hook|"
    r"gradient_checkpointing_enable)\s*\("
)
# Values that make a name no module: literals, and lambdas.
_LITERAL_TYPES = frozenset(
    {
        cst.Lambda,
        cst.SimpleString,
        cst.ConcatenatedString,
        cst.FormattedString,
        cst.Integer,
        cst.Float,
        cst.Imaginary,
        cst.List,
        cst.Dict,
        cst.Set,
        cst.Tuple,
        cst.ListComp,
        cst.DictComp,
        cst.SetComp,
    }
)


def _module_functions(body: Sequence[cst.BaseStatement]) -> dict[str, cst.FunctionDef]:
    """The module-level functions bound by their `def` alone (a name also
    assigned, imported or defined twice at the top level is left out)."""
    functions: dict[str, cst.FunctionDef] = {}
    rebound: set[str] = set()
    for statement in body:
        if type(statement) is cst.FunctionDef:
            name = statement.name.value
            if name in functions:
                rebound.add(name)
            functions[name] = statement
        elif type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                rebound.update(name for name, _ in assigned_names(small))
                if type(small) in _IMPORT_TYPES and type(small.names) is not cst.ImportStar:
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname is not None else alias.name
                        if type(bound) is cst.Name:
                            rebound.add(bound.value)
    return {name: function for name, function in functions.items() if name not in rebound}


def _combine(first: Callee | None, second: Callee | None) -> Callee:
    """Two bindings of the same name: agreeing ones stand, others conflict."""
    if first is None:
        return second if second is not None else _UNKNOWN_CALLEE
    if second is None or first == second:
        return first
    if Role.NOT_MODULE in (first.role, second.role):
        return _NOT_MODULE
    if first.role is second.role:
        return Callee(first.role)
    if Role.UNKNOWN in (first.role, second.role):
        # `model = Net(); model = accelerator.prepare(model)`: one binding
        # is unknown, so the naming heuristics decide.
        return _UNKNOWN_CALLEE
    return _NOT_MODULE  # a module here, a criterion there


def _block(body: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return body.body if type(body) is cst.IndentedBlock else ()


def _functions_in_source_order(body: Sequence[cst.CSTNode]) -> list[cst.FunctionDef]:
    found: list[cst.FunctionDef] = []
    for statement in body:
        if type(statement) is cst.FunctionDef:
            found.append(statement)
        if type(statement) is not cst.SimpleStatementLine:
            for block in _blocks_in_source_order(statement):
                found.extend(_functions_in_source_order(block))
    return found


def _blocks_in_source_order(statement: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    """The statement blocks of a compound statement, as they come in the text
    (a `try`'s handlers before its `else`)."""
    blocks: list[Sequence[cst.BaseStatement]] = []
    body = getattr(statement, "body", None)
    if type(body) is cst.IndentedBlock:
        blocks.append(body.body)
    for handler in getattr(statement, "handlers", ()):
        if type(handler.body) is cst.IndentedBlock:
            blocks.append(handler.body.body)
    for case in getattr(statement, "cases", ()):
        if type(case.body) is cst.IndentedBlock:
            blocks.append(case.body.body)
    orelse = getattr(statement, "orelse", None)
    if type(orelse) is cst.If:
        blocks.extend(_blocks_in_source_order(orelse))
    elif type(orelse) is cst.Else and type(orelse.body) is cst.IndentedBlock:
        blocks.append(orelse.body.body)
    finalbody = getattr(statement, "finalbody", None)
    if type(finalbody) is cst.Finally and type(finalbody.body) is cst.IndentedBlock:
        blocks.append(finalbody.body.body)
    return blocks


def _ast_functions_in_source_order(body: list[ast.stmt]) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(statement)
        blocks = [getattr(statement, "body", None)]
        blocks += [handler.body for handler in getattr(statement, "handlers", ())]
        blocks += [case.body for case in getattr(statement, "cases", ())]
        blocks += [getattr(statement, "orelse", None), getattr(statement, "finalbody", None)]
        for block in blocks:
            if isinstance(block, list):
                found.extend(_ast_functions_in_source_order(block))
    return found


_LINE_END = re.compile(r"\r\n?|\n")


def _nested_blocks(statement: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    blocks: list[Sequence[cst.BaseStatement]] = []
    body = getattr(statement, "body", None)
    if type(body) is cst.IndentedBlock:
        blocks.append(body.body)
    orelse = getattr(statement, "orelse", None)
    if type(orelse) is cst.If:
        blocks.extend(_nested_blocks(orelse))
    elif type(orelse) is cst.Else and type(orelse.body) is cst.IndentedBlock:
        blocks.append(orelse.body.body)
    for handler in getattr(statement, "handlers", ()):
        if type(handler.body) is cst.IndentedBlock:
            blocks.append(handler.body.body)
    finalbody = getattr(statement, "finalbody", None)
    if type(finalbody) is cst.Finally and type(finalbody.body) is cst.IndentedBlock:
        blocks.append(finalbody.body.body)
    for case in getattr(statement, "cases", ()):
        if type(case.body) is cst.IndentedBlock:
            blocks.append(case.body.body)
    return blocks


class _BindingCollector:
    """Flow-insensitive: what each name of one scope is bound to, for
    deciding what calling it does. Nested functions and classes bind their
    name; their bodies are other scopes."""

    def __init__(
        self, facts: FileFacts, function: cst.FunctionDef | None, *, self_attributes: bool = False
    ) -> None:
        self.facts = facts
        self.self_attributes = self_attributes
        self.bindings: dict[str, Callee] = {}
        if function is not None:
            params = function.params
            for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                self.bindings[param.name.value] = _UNKNOWN_CALLEE
            for star in (params.star_arg, params.star_kwarg):
                if isinstance(star, cst.Param):
                    self.bindings[star.name.value] = _NOT_MODULE

    def collect(self, body: Iterable[cst.BaseStatement]) -> dict[str, Callee]:
        for statement in body:
            self._statement(statement)
        return self.bindings

    def _bind(self, name: str, callee: Callee | None) -> None:
        if name in self.bindings:
            self.bindings[name] = _combine(self.bindings[name], callee)
        elif callee is not None:
            self.bindings[name] = callee

    def _bind_target(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if type(target) is cst.Name:
            callee = self.facts.classify_value(value, self.bindings) if value is not None else _UNKNOWN_CALLEE
            self._bind(target.value, callee)
        elif type(target) in _SEQUENCE_TYPES:
            for element in target.elements:
                inner = element.value
                self._bind_target(inner, None)
        elif type(target) is cst.StarredElement:
            self._bind_target(target.value, None)
        elif self.self_attributes and type(target) is cst.Attribute:
            dotted = dotted_name(target)
            if dotted is not None and dotted.count(".") == 1 and dotted.startswith("self."):
                callee = (
                    self.facts.classify_value(value, self.bindings) if value is not None else _UNKNOWN_CALLEE
                )
                self._bind(dotted, callee)

    def _statement(self, statement: cst.CSTNode) -> None:
        if type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                if type(small) is cst.Assign:
                    for target in small.targets:
                        self._bind_target(target.target, small.value)
                elif type(small) is cst.AnnAssign and small.value is not None:
                    self._bind_target(small.target, small.value)
                elif type(small) is cst.AugAssign:
                    self._bind_target(small.target, None)
                elif type(small) in _IMPORT_TYPES and type(small.names) is not cst.ImportStar:
                    for alias in small.names:
                        bound = alias.asname.name if alias.asname is not None else alias.name
                        if type(bound) is cst.Name:
                            self._bind(bound.value, _NOT_MODULE)
                        elif type(bound) is cst.Attribute:
                            head = (dotted_name(bound) or "").split(".")[0]
                            self._bind(head, _NOT_MODULE)
            return
        if type(statement) is cst.FunctionDef or type(statement) is cst.ClassDef:
            self._bind(statement.name.value, _NOT_MODULE)
            return
        if type(statement) is cst.For:
            self._bind_target(statement.target, None)
        elif type(statement) is cst.With:
            for item in statement.items:
                if item.asname is not None:
                    self._bind_target(item.asname.name, None)
        for block in _nested_blocks(statement):
            for inner in block:
                self._statement(inner)


class ScopeFlow:
    """The kinds of the expressions of one scope, after the data flow."""

    def __init__(self, facts: FileFacts, function: cst.FunctionDef | None) -> None:
        self.facts = facts
        self.context = facts.context
        self.function = function
        self.class_def = facts.class_of.get(function) if function is not None else None
        if function is None:
            self.bindings = facts.module_bindings
            body: Sequence[cst.BaseStatement] = facts.context.module.body
            no_grad = False
        else:
            self.bindings = _BindingCollector(facts, function).collect(_block(function.body))
            body = _block(function.body)
            no_grad = any(self.context.tracker.is_grad_disabling(d.decorator) for d in function.decorators)
        self._body = body
        self._no_grad = no_grad
        # Interpreted on the first `kind_of`: some rules only ask `callee`.
        # Keyed by id(): libcst nodes hash through a Python-level __hash__.
        self._kinds: dict[int, Kind] | None = None
        self._loop_ends: dict[int, State] = {}

    def kind_of(self, node: cst.BaseExpression) -> Kind:
        if self._kinds is None:
            self._interpret()
        return self._kinds.get(id(node), Kind.UNKNOWN)  # type: ignore[union-attr]

    def kinds_at_loop_end(self, loop: cst.For | cst.While) -> Mapping[str, Kind]:
        """What each path holds at the end of the loop's body, when the next
        iteration starts (merged over the body's paths): a graph-attached
        value there is alive while the next iteration computes its own."""
        if self._kinds is None:
            self._interpret()
        return self._loop_ends.get(id(loop), {})

    def _interpret(self) -> None:
        self._kinds = {}
        _Interpreter(self, self._kinds, self._loop_ends).run_block(self._body, {}, self._no_grad)

    def callee(self, func: cst.BaseExpression, call: cst.Call | None = None) -> Callee:
        """What calling `func` does in this scope. With `call`, the naming
        heuristics also want an argument: a forward pass takes an input
        (`solver.model()` is no forward pass)."""
        if type(func) is cst.Name:
            name = func.value
            if name == "self" and self.class_def is not None:
                if self.class_def.name.value in self.facts.module_classes:
                    return Callee(Role.MODULE, self.class_def.name.value)
                return _NOT_MODULE
            if self.context.imports.bindings.get(name) is not None and name not in self.bindings:
                return _NOT_MODULE
            bound = self.bindings.get(name)
            if bound is None and self.function is not None:
                bound = self.facts.module_bindings.get(name)
            if bound is not None and bound.role is not Role.UNKNOWN:
                return bound
            return self._by_name(name, call)
        if type(func) is cst.Attribute:
            if self.context.qualified_name(func) is not None:
                return _NOT_MODULE
            dotted = dotted_name(func)
            if dotted is None:
                return _UNKNOWN_CALLEE
            attribute = func.attr.value
            if attribute == "forward":
                inner = self.callee(func.value)
                return inner if inner.role is Role.MODULE else _UNKNOWN_CALLEE
            if dotted == f"self.{attribute}":
                if self.class_def is not None:
                    bound = self.facts.class_attributes.get(self.class_def, {}).get(attribute)
                    if bound is not None and bound.role is not Role.UNKNOWN:
                        return bound
                return self._by_name(attribute, call)
            # `model.encoder(x)`: a submodule of a module; `solver.model()` is not one.
            if self.callee(func.value).role is Role.MODULE:
                return self._by_name(attribute, call, of_a_module=True)
        if type(func) is cst.Call:
            # Built and called at once: `nn.CrossEntropyLoss()(out, y)`.
            built = self.facts.classify_value(func, self.bindings)
            return built if built is not None else _UNKNOWN_CALLEE
        return _UNKNOWN_CALLEE

    def local_function(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The function of this file that calling `func` runs: a module-level
        `def`, a method of the enclosing class (`self.step(...)`), or a method
        of an instance of a class of the file (`meter.update(...)`)."""
        facts = self.facts
        if type(func) is cst.Name:
            if self.function is not None and func.value in self.bindings:
                return None  # a parameter or a local name shadows it
            return facts.module_functions.get(func.value)
        if type(func) is not cst.Attribute:
            return None
        receiver = dotted_name(func.value)
        if receiver is None:
            return None
        class_def: cst.ClassDef | None = None
        if receiver == "self":
            class_def = self.class_def
        else:
            bound: Callee | None = None
            if "." not in receiver:
                bound = self.bindings.get(receiver)
                if bound is None and self.function is not None:
                    bound = facts.module_bindings.get(receiver)
            elif receiver.count(".") == 1 and receiver.startswith("self.") and self.class_def is not None:
                bound = facts.class_attributes.get(self.class_def, {}).get(receiver[len("self.") :])
            if bound is not None and bound.constructor is not None:
                class_def = facts.class_by_name.get(bound.constructor)
        return facts.method_of(class_def, func.attr.value) if class_def is not None else None

    def _by_name(self, name: str, call: cst.Call | None, *, of_a_module: bool = False) -> Callee:
        if not self.facts.uses_framework or (call is not None and not call.args):
            return _UNKNOWN_CALLEE
        return self.facts.callee_by_name(name, of_a_module=of_a_module)


_SET_GRAD_ENABLED = frozenset(
    {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.autograd.grad_mode.set_grad_enabled"}
)


def maybe_grad_disabling(expr: cst.BaseExpression, context: FileContext) -> bool:
    """A context manager that may turn autograd off, depending on a value:
    `torch.set_grad_enabled(is_train)`, `torch.no_grad() if eval else nullcontext()`."""
    if type(expr) is cst.IfExp:
        return any(
            context.tracker.is_grad_disabling(branch) or maybe_grad_disabling(branch, context)
            for branch in (expr.body, expr.orelse)
        )
    if type(expr) is not cst.Call or context.call_name(expr) not in _SET_GRAD_ENABLED:
        return False
    mode = get_arg(expr, "mode", 0)
    return not (
        isinstance(mode, cst.Arg)
        and isinstance(mode.value, cst.Name)
        and mode.value.value in ("True", "False")
    )


def inside_no_grad_block(ancestors: tuple[cst.CSTNode, ...], context: FileContext) -> bool:
    """A node whose ancestors (outermost first) include the body of a `with`
    that turns autograd off."""
    return any(
        type(ancestor) is cst.With
        and ancestors[index + 1] is ancestor.body
        and any(
            context.tracker.is_grad_disabling(item.item) or maybe_grad_disabling(item.item, context)
            for item in ancestor.items
        )
        for index, ancestor in enumerate(ancestors[:-1])
    )


class _Interpreter:
    """Runs a scope's statements over abstract states (name -> Kind)."""

    MAX_LOOP_PASSES = 3

    def __init__(self, flow: ScopeFlow, kinds: dict[int, Kind], loop_ends: dict[int, State] | None = None) -> None:
        self.flow = flow
        self.context = flow.context
        self.kinds = kinds
        # The state at the end of each loop's body, at its fixed point.
        self.loop_ends: dict[int, State] = {} if loop_ends is None else loop_ends
        # Every path (`self.total`, `out['loss']`) bound so far: no state holds
        # any other, so unbinding `self` needs to look at these names only.
        self._dotted_names: set[str] = set()
        # The paths bound under each name (`out` -> {"out['loss']"}): a name of
        # unknown kind with a graph-attached element is a container of one.
        self._element_paths: dict[str, set[str]] = {}
        # Per block (by id): statement index -> the paths it binds that a later
        # backward call of the same block proves graph-attached.
        self._backpropagated_later: dict[int, dict[int, list[tuple[str, Kind]]]] = {}
        # Per call of a function of the file (by id): the kind of each position of
        # the tuple it returns, when it always returns one of that length.
        self._last_returned: dict[int, tuple[Kind, ...]] = {}

    # --- statements ----------------------------------------------------------
    def run_block(self, body: Sequence[cst.CSTNode], state: State, no_grad: bool) -> State:
        evidence = self._backpropagated_later.get(id(body))
        if evidence is None:
            evidence = self._backpropagated_later[id(body)] = self._find_backpropagated_later(body)
        for index, statement in enumerate(body):
            state = self.run_statement(statement, state, no_grad)
            for path, kind in () if no_grad else evidence.get(index, ()):
                if state.get(path, Kind.UNKNOWN) is Kind.UNKNOWN:
                    state[path] = kind
            switched = self.context.tracker.grad_switch(statement)
            if switched is not None:
                no_grad = switched
        return state

    def _find_backpropagated_later(self, body: Sequence[cst.CSTNode]) -> dict[int, list[tuple[str, Kind]]]:
        """`loss = crit(out, y)` followed in the same block by `loss.backward()`,
        with nothing in between rebinding `loss`: the value bound is graph-attached."""
        found: dict[int, list[tuple[str, Kind]]] = {}
        for later, statement in enumerate(body):
            call = _sole_call(statement)
            if call is None or not is_backward_call(call, self.context):
                continue
            for expr, scalar in backward_evidence(call, self.context.call_name(call)):
                path = value_path(expr)
                if path is None:
                    continue
                heads = _heads(path)
                for index in range(later - 1, -1, -1):
                    bound = [name for node in iter_nodes(body[index]) for name, _ in assigned_names(node)]
                    if path in bound and type(body[index]) is cst.SimpleStatementLine:
                        found.setdefault(index, []).append((path, Kind.GRAPH_SCALAR if scalar else Kind.GRAPH))
                        break
                    if heads.intersection(bound):
                        break
        return found

    def run_statement(self, statement: cst.CSTNode, state: State, no_grad: bool) -> State:
        statement_type = type(statement)
        if statement_type is cst.SimpleStatementLine:
            for small in statement.body:
                state = self._small(small, state, no_grad)
            return state
        if statement_type is cst.FunctionDef or statement_type is cst.ClassDef:
            return self._unbind(state, statement.name.value)
        if statement_type is cst.If:
            self.evaluate(statement.test, state, no_grad)
            taken = self.run_block(_block(statement.body), dict(state), no_grad)
            if type(statement.orelse) is cst.If:
                other = self.run_statement(statement.orelse, dict(state), no_grad)
            elif type(statement.orelse) is cst.Else:
                other = self.run_block(_block(statement.orelse.body), dict(state), no_grad)
            else:
                other = state
            return _merge_states(taken, other)
        if statement_type is cst.For or statement_type is cst.While:
            return self._loop(statement, state, no_grad)
        if statement_type is cst.With:
            inner_no_grad = no_grad
            for item in statement.items:
                self.evaluate(item.item, state, no_grad)
                # A grad mode that depends on a value (`set_grad_enabled(train)`)
                # counts as disabled: precision first.
                if self.context.tracker.is_grad_disabling(item.item) or maybe_grad_disabling(
                    item.item, self.context
                ):
                    inner_no_grad = True
                elif self._is_grad_enabling(item.item):
                    inner_no_grad = False
                if item.asname is not None:
                    state = self._bind(item.asname.name, Kind.UNKNOWN, state)
            return self.run_block(_block(statement.body), state, inner_no_grad)
        if statement_type is cst.Try or statement_type is cst.TryStar:
            after_body = self.run_block(_block(statement.body), dict(state), no_grad)
            merged = after_body
            for handler in statement.handlers:
                merged = _merge_states(merged, self.run_block(_block(handler.body), dict(state), no_grad))
            if statement.orelse is not None:
                merged = _merge_states(
                    merged, self.run_block(_block(statement.orelse.body), after_body, no_grad)
                )
            if statement.finalbody is not None:
                merged = self.run_block(_block(statement.finalbody.body), merged, no_grad)
            return merged
        if statement_type is cst.Match:
            self.evaluate(statement.subject, state, no_grad)
            merged = state
            for case in statement.cases:
                merged = _merge_states(merged, self.run_block(_block(case.body), dict(state), no_grad))
            return merged
        return state

    def _is_grad_enabling(self, expr: cst.BaseExpression) -> bool:
        target = expr.func if isinstance(expr, cst.Call) else expr
        qualified = self.context.qualified_name(target)
        if qualified in _GRAD_ENABLING:
            return True
        if qualified in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled") and isinstance(
            expr, cst.Call
        ):
            first = expr.args[0].value if expr.args else None
            return isinstance(first, cst.Name) and first.value == "True"
        return False

    def _loop(self, loop: cst.For | cst.While, before: State, no_grad: bool) -> State:
        start = dict(before)
        for _ in range(self.MAX_LOOP_PASSES):
            state = dict(start)
            if type(loop) is cst.For:
                self.evaluate(loop.iter, state, no_grad)
                state = self._bind_loop_target(loop, state, no_grad)
            else:
                self.evaluate(loop.test, state, no_grad)
            end = self.run_block(_block(loop.body), state, no_grad)
            self.loop_ends[id(loop)] = end
            after = _merge_states(before, end)
            # A pass from the same state would repeat this one, kinds and all:
            # the fixed point is reached.
            if after == start:
                break
            start = after
        if loop.orelse is not None:
            after = self.run_block(_block(loop.orelse.body), after, no_grad)
        return after

    def _bind_loop_target(self, loop: cst.For, state: State, no_grad: bool) -> State:
        """The loop's target, bound to what each iteration takes. An element of a
        graph-attached container is graph-attached (`for name, value in
        loss_dict.items()`, `for loss in outputs.values()`: the model's losses, as
        `loss_dict["cls"]` would be; each row of a graph-attached tensor, each map of
        a graph-attached sequence a model returned); anything else iterated is
        unknown (a container's elements and a dict's keys look alike here)."""
        iterated = loop.iter
        if not no_grad and self.kinds.get(id(iterated)) is Kind.GRAPH and not _indexes(loop, iterated):
            # A tensor's rows, or the layers' maps a model returned (`for attn in
            # attn_layers`); not the keys of a dict output (`out[name]` in the body).
            return self._bind(loop.target, Kind.GRAPH, state)
        if (
            not no_grad
            and type(iterated) is cst.Call
            and not iterated.args
            and type(iterated.func) is cst.Attribute
            and iterated.func.attr.value in ("items", "values")
            and self.evaluate(iterated.func.value, state, no_grad).attached
        ):
            target = loop.target
            if iterated.func.attr.value == "values":
                return self._bind(target, Kind.GRAPH, state)
            if type(target) in _SEQUENCE_TYPES and len(target.elements) == 2:  # type: ignore[attr-defined]
                key, value = (element.value for element in target.elements)  # type: ignore[attr-defined]
                return self._bind(value, Kind.GRAPH, self._bind(key, Kind.UNKNOWN, state))
        return self._bind(loop.target, Kind.UNKNOWN, state)

    def _small(self, small: cst.BaseSmallStatement, state: State, no_grad: bool) -> State:
        small_type = type(small)
        if small_type is cst.Assign:
            kind = self.evaluate(small.value, state, no_grad)
            for target in small.targets:
                state = self._assign(target.target, small.value, kind, state, no_grad)
            return state
        if small_type is cst.AnnAssign:
            if small.value is None:
                return state
            kind = self.evaluate(small.value, state, no_grad)
            return self._assign(small.target, small.value, kind, state, no_grad)
        if small_type is cst.AugAssign:
            current = self.evaluate(small.target, state, no_grad)
            value = self.evaluate(small.value, state, no_grad)
            return self._bind(small.target, _arithmetic(current, value, no_grad), state)
        if small_type is cst.Expr:
            self.evaluate(small.value, state, no_grad)
            call = small.value
            if type(call) is not cst.Call:
                return state
            if type(call.func) is cst.Attribute and call.func.attr.value == "detach_":
                return self._bind(call.func.value, Kind.DETACHED, state)
            if type(call.func) is cst.Attribute and call.func.attr.value in _GROWING_METHODS and call.args:
                state = self._grown(call, state, no_grad)
            if not no_grad and is_backward_call(call, self.context):
                for expr, scalar in backward_evidence(call, self.context.call_name(call)):
                    if value_path(expr) is not None and self.kind_of(expr) is Kind.UNKNOWN:
                        state = self._bind(expr, Kind.GRAPH_SCALAR if scalar else Kind.GRAPH, state)
            return state
        if small_type is cst.Del:
            return self._bind(small.target, Kind.UNKNOWN, state)
        if small_type in _IMPORT_TYPES:
            if type(small.names) is not cst.ImportStar:
                for alias in small.names:
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    if type(bound) in _NAME_TYPES:
                        state = self._bind(bound, Kind.UNKNOWN, state)
            return state
        if small_type is cst.Return and small.value is not None:
            self.evaluate(small.value, state, no_grad)
        return state

    def _grown(self, call: cst.Call, state: State, no_grad: bool) -> State:
        """`values.append(value)`: a list is what was put in it. One that holds a
        graph-attached value is a container of one (`torch.stack(values)` then
        carries the graph); one given something unknown is no longer known free,
        whatever it was made as (`values = []`)."""
        container = call.func.value  # type: ignore[attr-defined]
        if value_path(container) is None:
            return state
        added = self.kinds.get(id(call.args[-1].value), Kind.UNKNOWN)
        current = self.evaluate(container, state, no_grad)
        if added.attached and not no_grad:
            grown = Kind.GRAPH_CONTAINER
        elif current.free and added.free:
            return state
        elif current.attached:
            return state
        else:
            grown = Kind.UNKNOWN
        return self._bind(container, grown, state) if grown is not current else state

    def _assign(
        self,
        target: cst.BaseExpression,
        value: cst.BaseExpression,
        kind: Kind,
        state: State,
        no_grad: bool,
    ) -> State:
        if type(target) in _SEQUENCE_TYPES:
            elements = [element.value for element in target.elements]
            if (
                type(value) in _SEQUENCE_TYPES
                and len(value.elements) == len(elements)
                and not any(type(element) is cst.StarredElement for element in value.elements)
            ):
                for element, source in zip(elements, value.elements):
                    state = self._assign(element, source.value, self.kind_of(source.value), state, no_grad)
                return state
            positions = self._returned_positions(value, no_grad)
            if positions is not None and len(positions) == len(elements):
                # A position the function's flow cannot tell is taken as any element
                # of what it returns, as without positions.
                for element, position in zip(elements, positions):
                    state = self._bind(element, _element_kind(kind) if position is Kind.UNKNOWN else position, state)
                return state
            for element in elements:
                state = self._bind(element, _element_kind(kind), state)
            return state
        if type(target) is cst.Subscript:
            self.evaluate(target.value, state, no_grad)
            return self._bind(target, kind, state) if value_path(target) is not None else state
        return self._bind(target, kind, state)

    def kind_of(self, node: cst.BaseExpression) -> Kind:
        return self.kinds.get(id(node), Kind.UNKNOWN)

    def _bind(self, target: cst.BaseExpression, kind: Kind, state: State) -> State:
        if type(target) in _SEQUENCE_TYPES:
            for element in target.elements:
                state = self._bind(element.value, _element_kind(kind), state)
            return state
        if type(target) is cst.StarredElement:
            return self._bind(target.value, Kind.UNKNOWN, state)
        dotted = value_path(target)
        if dotted is None:
            return state
        state = self._unbind(state, dotted)
        state[dotted] = kind
        if "." in dotted or "[" in dotted:
            self._dotted_names.add(dotted)
            parent = _parent_path(target)
            if parent is not None:
                self._element_paths.setdefault(parent, set()).add(dotted)
        return state

    def _unbind(self, state: State, dotted: str) -> State:
        """`state` without `dotted` and its elements (`dotted.x`, `dotted['k']`)."""
        prefixes = (dotted + ".", dotted + "[")
        stale = [name for name in self._dotted_names if name.startswith(prefixes) and name in state]
        if dotted in state:
            stale.append(dotted)
        if not stale:
            return state
        state = dict(state)
        for name in stale:
            del state[name]
        return state

    # --- expressions ---------------------------------------------------------
    def evaluate(self, node: cst.BaseExpression, state: State, no_grad: bool) -> Kind:
        kind = self._eval(node, state, no_grad)
        self.kinds[id(node)] = kind
        return kind

    def _eval(self, node: cst.BaseExpression, state: State, no_grad: bool) -> Kind:
        node_type = type(node)
        if node_type is cst.Name:
            if node.value == "None":
                return Kind.NONE
            if node.value in ("True", "False"):
                return Kind.DETACHED
            kind = state.get(node.value, Kind.UNKNOWN)
            if kind is Kind.UNKNOWN and node.value in self._element_paths:
                return self._container_of_attached(node.value, state)
            return kind
        if node_type is cst.Integer or node_type is cst.Float:
            return Kind.NUMBER
        if node_type in _STRING_TYPES:
            return Kind.DETACHED
        if node_type is cst.Attribute:
            return self._attribute(node, state, no_grad)
        if node_type is cst.Subscript:
            return self._subscript(node, state, no_grad)
        if node_type is cst.Call:
            return self._call(node, state, no_grad)
        if node_type is cst.BinaryOperation:
            left = self.evaluate(node.left, state, no_grad)
            right = self.evaluate(node.right, state, no_grad)
            return _arithmetic(left, right, no_grad)
        if node_type is cst.UnaryOperation:
            operand = self.evaluate(node.expression, state, no_grad)
            return operand if type(node.operator) in _SIGN_TYPES else Kind.UNKNOWN
        if node_type is cst.Comparison:
            kinds = [self.evaluate(node.left, state, no_grad)]
            kinds += [self.evaluate(target.comparator, state, no_grad) for target in node.comparisons]
            return Kind.DETACHED if any(kind is not Kind.UNKNOWN for kind in kinds) else Kind.UNKNOWN
        if node_type is cst.BooleanOperation:
            self.evaluate(node.left, state, no_grad)
            self.evaluate(node.right, state, no_grad)
            return Kind.UNKNOWN
        if node_type is cst.IfExp:
            self.evaluate(node.test, state, no_grad)
            return merge(self.evaluate(node.body, state, no_grad), self.evaluate(node.orelse, state, no_grad))
        if node_type in _SEQUENCE_TYPES:
            return _container([self.evaluate(element.value, state, no_grad) for element in node.elements])
        if node_type is cst.Dict:
            kinds = []
            for element in node.elements:
                if type(element) is cst.DictElement:
                    self.evaluate(element.key, state, no_grad)
                kinds.append(self.evaluate(element.value, state, no_grad))
            return _container(kinds)
        if node_type is cst.StarredElement:
            return self.evaluate(node.value, state, no_grad)
        if node_type is cst.Await:
            return self.evaluate(node.expression, state, no_grad)
        if node_type is cst.NamedExpr:
            kind = self.evaluate(node.value, state, no_grad)
            self._bind(node.target, kind, state)
            return kind
        return Kind.UNKNOWN

    def _attribute(self, node: cst.Attribute, state: State, no_grad: bool) -> Kind:
        dotted = dotted_name(node)
        if dotted is not None and dotted in state:
            self.evaluate(node.value, state, no_grad)
            return state[dotted]
        receiver = self.evaluate(node.value, state, no_grad)
        attribute = node.attr.value
        if attribute in _METADATA_ATTRIBUTES:
            return Kind.DETACHED if receiver is not Kind.UNKNOWN else Kind.UNKNOWN
        if attribute in ("T", "mT", "H", "mH", "real", "imag"):
            return Kind.GRAPH if receiver.attached else receiver
        if receiver.attached:
            return Kind.GRAPH_SCALAR if attribute == "loss" else Kind.GRAPH
        if receiver is Kind.DETACHED:
            return Kind.DETACHED
        return Kind.UNKNOWN

    def _container_of_attached(self, name: str, state: State) -> Kind:
        """GRAPH_CONTAINER when an element of `name` (`out['loss']`, `out.loss`)
        is known graph-attached, else UNKNOWN. `self` is never a container."""
        if name == "self":
            return Kind.UNKNOWN
        if any(state.get(path, Kind.UNKNOWN).attached for path in self._element_paths[name]):
            return Kind.GRAPH_CONTAINER
        return Kind.UNKNOWN

    def _subscript(self, node: cst.Subscript, state: State, no_grad: bool) -> Kind:
        receiver = self.evaluate(node.value, state, no_grad)
        for element in node.slice:
            if type(element.slice) is cst.Index:
                self.evaluate(element.slice.value, state, no_grad)
        if self._dotted_names:
            path = value_path(node)
            if path is not None and path in state:
                return state[path]
        if type(node.value) is cst.Attribute and node.value.attr.value in _SHAPE_ATTRIBUTES:
            return Kind.NUMBER
        if receiver.attached:
            if no_grad:
                return Kind.UNKNOWN  # a view made under no_grad, or an element of a container: cannot tell
            key = node.slice[0].slice if len(node.slice) == 1 else None
            if type(key) is cst.Index and string_value(key.value) == "loss":
                return Kind.GRAPH_SCALAR
            return Kind.GRAPH
        return Kind.DETACHED if receiver is Kind.DETACHED else Kind.UNKNOWN

    def _call(self, node: cst.Call, state: State, no_grad: bool) -> Kind:
        arg_kinds = [self.evaluate(arg.value, state, no_grad) for arg in node.args]
        func = node.func
        qualified = self.context.call_name(node)
        if qualified is not None:
            return self._qualified_call(node, qualified, arg_kinds, no_grad)
        if type(func) is cst.Name and func.value in _NUMBER_BUILTINS and self._is_builtin(func.value):
            return Kind.NUMBER
        if type(func) is cst.Attribute:
            receiver = self.evaluate(func.value, state, no_grad)
            method = func.attr.value
            tensor_result = self._method(method, receiver, bool(node.args), no_grad)
            if tensor_result is not None:
                return tensor_result
        callee = self.flow.callee(func, node)
        if callee.role is Role.MODULE:
            return Kind.DETACHED if no_grad else Kind.GRAPH
        if callee.role is Role.CRITERION:
            kind = _loss_result(node, arg_kinds, no_grad)
            return Kind.GRAPH if kind is Kind.GRAPH_SCALAR and not callee.reduces else kind
        function = self.flow.local_function(func)
        if function is not None:
            returned = self._returned(node, function, state, no_grad)
            if returned.positions is not None:
                self._last_returned[id(node)] = returned.positions
            return Kind.DETACHED if no_grad and returned.kind.attached else returned.kind
        return Kind.UNKNOWN

    def _returned(self, call: cst.Call, function: cst.FunctionDef, state: State, no_grad: bool) -> Returned:
        """What `call` of a function of the file returns: from the function's own
        flow with its parameters unknown, or, when the call passes it a
        graph-attached value, with those parameters holding it."""
        facts = self.flow.facts
        attached: list[tuple[str, Kind]] = []
        if not no_grad:
            names = [param.name.value for param in (*function.params.posonly_params, *function.params.params)]
            is_static = any(dotted_name(d.decorator) == "staticmethod" for d in function.decorators)
            if type(call.func) is cst.Attribute and names and not is_static:
                names = names[1:]  # `self.helper(out)`, `meter.update(loss)`
            names += [param.name.value for param in function.params.kwonly_params]
            for name, argument in bound_arguments(call, names).items():
                kind = self.kinds.get(id(argument), Kind.UNKNOWN)
                if kind.attached:
                    attached.append((name, kind))
        if not attached:
            return facts.returned_given(function, ())
        order = {name: index for index, name in enumerate(names)}
        return facts.returned_given(function, tuple(sorted(attached, key=lambda pair: order.get(pair[0], 0))))

    def _returned_positions(self, value: cst.BaseExpression, no_grad: bool) -> tuple[Kind, ...] | None:
        """The kind of each position of what a call of a function of the file
        returns, when it always returns a tuple display of one length."""
        if no_grad or type(value) is not cst.Call:
            return None
        return self._last_returned.get(id(value))

    def _is_builtin(self, name: str) -> bool:
        return name not in self.flow.bindings and name not in self.flow.facts.module_bindings

    def _qualified_call(self, node: cst.Call, qualified: str, arg_kinds: list[Kind], no_grad: bool) -> Kind:
        head, _, last = qualified.rpartition(".")
        if head == "torch.nn.functional" and (last in _LOSS_FUNCTIONS or last.endswith("_loss")):
            return _loss_result(node, arg_kinds, no_grad)
        if not qualified.startswith("torch."):
            return Kind.UNKNOWN
        if last in _TORCH_GRAPHLESS:
            return Kind.DETACHED
        if any(kind.attached for kind in arg_kinds):
            return Kind.DETACHED if no_grad else Kind.GRAPH
        if arg_kinds and all(kind.free for kind in arg_kinds):
            return Kind.DETACHED
        return Kind.UNKNOWN

    @staticmethod
    def _method(method: str, receiver: Kind, has_args: bool, no_grad: bool) -> Kind | None:
        """The kind of `receiver.method(...)` for known tensor methods; None
        when the method is not one of them."""
        # Whatever the receiver, these results hold no graph.
        if method in _NUMBER_METHODS or (method == "size" and has_args):
            return Kind.NUMBER
        if method in _DETACHING_METHODS or method in _NON_DIFFERENTIABLE_METHODS:
            return Kind.DETACHED
        if method in _GRAPH_KEEPING_METHODS:
            if receiver.attached:
                if no_grad:
                    return Kind.DETACHED
                if method in _REDUCTIONS and not has_args:
                    return Kind.GRAPH_SCALAR
                if method in _SCALAR_KEEPING_METHODS:
                    return receiver
                return Kind.GRAPH
            return Kind.DETACHED if receiver is Kind.DETACHED else Kind.UNKNOWN
        return None


def _parent_path(target: cst.BaseExpression) -> str | None:
    """The simple name whose element a path is (`out` for `out['loss']` and
    `out.loss`), or None for deeper paths."""
    inner = target.value if type(target) in (cst.Subscript, cst.Attribute) else None
    return inner.value if type(inner) is cst.Name else None


def _sole_call(statement: cst.CSTNode) -> cst.Call | None:
    """The call a simple statement consists of (`loss.backward()`), if so."""
    if type(statement) is cst.SimpleStatementLine and len(statement.body) == 1:
        small = statement.body[0]
        if type(small) is cst.Expr and type(small.value) is cst.Call:
            return small.value
    return None


def _indexes(loop: cst.For, iterated: cst.BaseExpression) -> bool:
    """The loop's body indexes what it iterates with the loop's name
    (`for name in outputs: total += outputs[name]`): the name is a key."""
    container, key = dotted_name(iterated), dotted_name(loop.target)
    if container is None or key is None:
        return False
    for node in iter_nodes(loop.body):
        if type(node) is cst.Subscript and dotted_name(node.value) == container and len(node.slice) == 1:
            index = node.slice[0].slice
            if type(index) is cst.Index and dotted_name(index.value) == key:
                return True
    return False


def _element_kind(kind: Kind) -> Kind:
    """The kind of each element unpacked from a value of `kind`."""
    if kind.attached:
        return Kind.GRAPH
    return Kind.DETACHED if kind is Kind.DETACHED else Kind.UNKNOWN


def _container(kinds: list[Kind]) -> Kind:
    if any(kind.attached for kind in kinds):
        return Kind.GRAPH_CONTAINER
    if all(kind.free for kind in kinds):
        return Kind.DETACHED
    return Kind.UNKNOWN


def _arithmetic(left: Kind, right: Kind, no_grad: bool) -> Kind:
    if left.attached or right.attached:
        if no_grad:
            return Kind.DETACHED
        scalar_like = (Kind.GRAPH_SCALAR, Kind.NUMBER)
        return Kind.GRAPH_SCALAR if left in scalar_like and right in scalar_like else Kind.GRAPH
    if left is Kind.NUMBER and right is Kind.NUMBER:
        return Kind.NUMBER
    if left.free and right.free:
        return Kind.DETACHED
    return Kind.UNKNOWN


def _loss_result(call: cst.Call, arg_kinds: list[Kind], no_grad: bool) -> Kind:
    if no_grad:
        return Kind.DETACHED
    tensor_kinds = [
        kind
        for arg, kind in zip(call.args, arg_kinds)
        if arg.keyword is None or arg.keyword.value not in _LOSS_OPTIONS
    ]
    if any(kind.attached for kind in tensor_kinds):
        reduction = next(
            (arg for arg in call.args if arg.keyword is not None and arg.keyword.value == "reduction"), None
        )
        if reduction is None:
            return Kind.GRAPH_SCALAR
        value = string_value(reduction.value)
        return Kind.GRAPH_SCALAR if value in ("mean", "sum") else Kind.GRAPH
    if tensor_kinds and all(kind.free for kind in tensor_kinds):
        return Kind.DETACHED
    return Kind.UNKNOWN


# --- syntactic summaries ----------------------------------------------------

# Per node type: a function reading the fields that can hold a child the data
# flow looks at (one C call for all of them), and whether there is a single
# one (read as the bare value). None: there are none, as for names and
# numbers. Whitespace, brackets and punctuation never matter to the data
# flow, and fields typed `str` (`Name.value`) hold no node.
_FIELD_READERS: dict[type, tuple[Callable[[cst.CSTNode], object], bool] | None] = {}
# Per type of a field's value: whether it is a node of the same scope (not a
# string, None, or a nested function, class or lambda).
_IN_SCOPE: dict[type, bool] = {}


def _field_reader(node_type: type) -> tuple[Callable[[cst.CSTNode], object], bool] | None:
    annotations = {field.name: field.type for field in dataclasses.fields(node_type)}
    names = [name for name in child_fields(node_type) if annotations[name] is not str]
    return (attrgetter(*names), len(names) == 1) if names else None


def _in_scope(value: object) -> bool:
    value_type = type(value)
    known = _IN_SCOPE.get(value_type)
    if known is None:
        known = _IN_SCOPE[value_type] = is_node(value) and value_type not in _SCOPE_TYPES
    return known


def _collect(
    root: cst.CSTNode, nodes: list[cst.CSTNode], parents: dict[int, cst.CSTNode] | None = None
) -> None:
    """Appends `root` and its descendants to `nodes` in source order, not
    entering nested functions, classes and lambdas (other scopes); with
    `parents`, records the parent of each descendant (by id(): libcst nodes
    hash through a Python-level __hash__).

    The hottest loop of the data flow, hence written out: a stack rather than
    recursive generators (a frame per level for every node), cached lookups
    per type rather than calls."""
    pending = [root]
    while pending:
        node = pending.pop()
        nodes.append(node)
        node_type = type(node)
        reader = _FIELD_READERS.get(node_type, False)
        if reader is False:
            reader = _FIELD_READERS[node_type] = _field_reader(node_type)
        if reader is None:
            continue
        read, single = reader
        values = (read(node),) if single else read(node)
        children: list[cst.CSTNode] = []
        for value in values:
            for child in value if type(value) is tuple or type(value) is list else (value,):
                known = _IN_SCOPE.get(type(child))
                if known or (known is None and _in_scope(child)):
                    children.append(child)
        if parents is not None:
            for child in children:
                parents[id(child)] = node
        # Reversed onto the stack, to come off in source order.
        children.reverse()
        pending += children


def iter_nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and its descendants in source order, not entering nested
    functions, classes and lambdas (other scopes)."""
    nodes: list[cst.CSTNode] = []
    _collect(node, nodes)
    return nodes


def dotted_names_in(expr: cst.CSTNode) -> set[str]:
    """Every name and attribute chain mentioned in `expr` (`a.b.c` gives
    `a`, `a.b` and `a.b.c`)."""
    names: set[str] = set()
    for node in iter_nodes(expr):
        if type(node) in _NAME_TYPES:
            dotted = dotted_name(node)
            if dotted is not None:
                names.add(dotted)
    return names


def value_path(expr: cst.BaseExpression) -> str | None:
    """The name the data flow tracks a value under: `a.b.c` for an attribute
    chain, `out['loss']` / `outs[0]` for a constant key of one, else None."""
    if type(expr) is cst.Subscript and len(expr.slice) == 1:
        index = expr.slice[0].slice
        if type(index) is not cst.Index:
            return None
        base = value_path(expr.value)
        if base is None:
            return None
        key = index.value
        if type(key) is cst.Integer:
            return f"{base}[{key.value}]"
        text = string_value(key)
        return f"{base}[{text!r}]" if text is not None else None
    return dotted_name(expr)


# Objects whose `.backward(x)` backpropagates the argument (Accelerate, Fabric,
# DeepSpeed engines, Lightning's `self.manual_backward`).
_BACKWARD_RUNNERS = ("accelerator", "fabric", "engine", "strategy", "trainer", "self")


def backward_evidence(call: cst.Call, qualified: str | None) -> list[tuple[cst.BaseExpression, bool]]:
    """The expressions a backward call (`is_backward_call`; `qualified`: the
    callee's qualified name) proves graph-attached, each with whether it is a
    scalar (a backward without a `gradient` needs one): `loss` in
    `loss.backward()`, `(loss / accum).backward()`, `scaler.scale(loss).backward()`,
    `accelerator.backward(loss)`, `torch.autograd.grad(loss, params)`."""
    if qualified in _BACKWARD_FUNCTIONS:
        grad = qualified.endswith(".grad")
        outputs = get_arg(call, "outputs" if grad else "tensors", 0)
        if not isinstance(outputs, cst.Arg):
            return []
        gradients = get_arg(call, "grad_outputs", 2) if grad else get_arg(call, "grad_tensors", 1)
        return [(outputs.value, gradients is None)]
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value not in _BACKWARD_METHODS:
        return []
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    runner = dotted_name(func.value)
    if positional and runner is not None and runner.rpartition(".")[2].lower().endswith(_BACKWARD_RUNNERS):
        return [(positional[0].value, True)]
    receiver = func.value
    while True:
        if type(receiver) is cst.BinaryOperation and type(receiver.operator) is cst.Divide:
            receiver = receiver.left
        elif (
            type(receiver) is cst.Call
            and type(receiver.func) is cst.Attribute
            and receiver.func.attr.value == "scale"
            and len(receiver.args) == 1
        ):
            receiver = receiver.args[0].value  # a GradScaler's `scale(loss)`
        else:
            break
    return [(receiver, not positional and get_arg(call, "gradient") is None)]


_BACKWARD_FUNCTIONS = frozenset({"torch.autograd.backward", "torch.autograd.grad"})
_BACKWARD_FUNCTION_NAMES = frozenset(qualified.rpartition(".")[2] for qualified in _BACKWARD_FUNCTIONS)
_BACKWARD_METHODS = frozenset({"backward", "manual_backward"})


def is_backward_call(node: cst.CSTNode, context: FileContext) -> bool:
    """`loss.backward()`, `accelerator.backward(loss)`, `torch.autograd.grad(...)`."""
    if type(node) is not cst.Call:
        return False
    func = node.func
    if type(func) is cst.Attribute:
        if func.attr.value in _BACKWARD_METHODS:
            return True
        # The qualified name of `a.b.c` ends in `c`: most calls are ruled
        # out without looking it up.
        if func.attr.value not in _BACKWARD_FUNCTION_NAMES:
            return False
    return context.call_name(node) in _BACKWARD_FUNCTIONS


def assigned_names(statement: cst.CSTNode) -> list[tuple[str, cst.BaseExpression | None]]:
    """(dotted name, value) for each plain binding a small statement or a
    compound header makes (`x = ...`, `for x in`, `with ... as x`); the
    value is None when not a single expression."""
    statement_type = type(statement)
    if statement_type not in _BINDING_TYPES:
        return []  # most nodes: decided without a chain of type tests
    targets: list[tuple[cst.BaseExpression, cst.BaseExpression | None]] = []
    if statement_type is cst.Assign:
        targets = [(target.target, statement.value) for target in statement.targets]
    elif statement_type is cst.AnnAssign and statement.value is not None:
        targets = [(statement.target, statement.value)]
    elif statement_type is cst.For:
        targets = [(statement.target, None)]
    elif statement_type is cst.WithItem and statement.asname is not None:
        targets = [(statement.asname.name, None)]
    elif statement_type is cst.NamedExpr:
        targets = [(statement.target, statement.value)]
    bound: list[tuple[str, cst.BaseExpression | None]] = []
    while targets:
        target, value = targets.pop()
        if type(target) in _SEQUENCE_TYPES:
            values: list[cst.BaseExpression | None] = [None] * len(target.elements)
            if (
                type(value) in _SEQUENCE_TYPES
                and len(value.elements) == len(target.elements)
                and not any(type(element) is cst.StarredElement for element in value.elements)
            ):
                values = [element.value for element in value.elements]
            targets.extend((element.value, source) for element, source in zip(target.elements, values))
        elif type(target) is cst.StarredElement:
            targets.append((target.value, None))
        else:
            dotted = dotted_name(target)
            if dotted is not None:
                bound.append((dotted, value))
    return bound


class _Site(NamedTuple):
    """Where a statement runs in a scope: its place in source order, the loops around it."""

    position: int
    loops: frozenset[int]


class ScopeSummary:
    """Syntactic facts about one scope that the OOM3xx rules share."""

    def __init__(self, context: FileContext, body: Sequence[cst.CSTNode]) -> None:
        self.context = context
        self.backward_calls: list[cst.Call] = []
        self.returned: set[str] = set()
        self.bindings: dict[str, list[cst.BaseExpression | None]] = {}
        # For `uses_of`: each node's parent, and the name nodes by name.
        self._parents: dict[int, cst.CSTNode] = {}
        self._names: dict[str, list[cst.Name]] = {}
        nodes: list[cst.CSTNode] = []
        for statement in body:
            if type(statement) not in _SCOPE_TYPES:
                _collect(statement, nodes, self._parents)
        # Where each binding of `bindings` runs: its place in source order and the
        # loops around it (by id), for what can reach a backward call.
        self._sites: dict[str, list[_Site]] = {}
        seeds: list[tuple[str, _Site]] = []
        for position, node in enumerate(nodes):
            node_type = type(node)
            if node_type is cst.Name:
                self._names.setdefault(node.value, []).append(node)
            elif node_type is cst.Call:
                if is_backward_call(node, context):
                    assert isinstance(node, cst.Call)
                    self.backward_calls.append(node)
                    site = _Site(position, self._loops_around(node))
                    names = dotted_names_in(node.func) if type(node.func) is cst.Attribute else set()
                    for arg in node.args:
                        names |= dotted_names_in(arg.value)
                    seeds += [(name, site) for name in names]
            elif node_type in _RESULT_TYPES:
                if node.value is not None:
                    self.returned |= dotted_names_in(node.value)
            elif node_type in _BINDING_TYPES:
                site = _Site(position, self._loops_around(node))
                for name, value in assigned_names(node):
                    self.bindings.setdefault(name, []).append(value)
                    self._sites.setdefault(name, []).append(site)
            elif node_type is cst.AugAssign:
                # `loss += perceptual_loss`: loss is made of what is added to it too.
                target = dotted_name(node.target)
                if target is not None:
                    self.bindings.setdefault(target, []).append(node.value)
                    self._sites.setdefault(target, []).append(_Site(position, self._loops_around(node)))
        self.feeds_backward = self._reaching(seeds)
        # What a return statement hands back, and every name it is made of.
        self.returned = self._closure(self.returned)

    def _loops_around(self, node: cst.CSTNode) -> frozenset[int]:
        """The loops of the scope around `node` (a `for` binding its target is in its own loop)."""
        loops = []
        current: cst.CSTNode | None = node
        while current is not None:
            if type(current) is cst.For or type(current) is cst.While:
                loops.append(id(current))
            current = self._parents.get(id(current))
        return frozenset(loops)

    def _reaching(self, seeds: list[tuple[str, _Site]]) -> set[str]:
        """The names whose values flow into the seeds through assignments that can
        run before them: a binding earlier in the scope, or one in a loop around
        the use (the next iteration). `logits = torch.cat(all_logits)` after the
        training loop does not make `all_logits` feed the loop's `backward()`."""
        needed: dict[str, _Site] = {}
        frontier: list[str] = []

        def need(name: str, site: _Site) -> None:
            known = needed.get(name)
            wider = site if known is None else _Site(max(known.position, site.position), known.loops | site.loops)
            if wider != known:
                needed[name] = wider
                frontier.append(name)

        for name, site in seeds:
            need(name, site)
        while frontier:
            name = frontier.pop()
            use = needed[name]
            for value, site in zip(self.bindings.get(name, ()), self._sites.get(name, ())):
                if value is None or not (site.position < use.position or site.loops & use.loops):
                    continue
                for source in dotted_names_in(value):
                    need(source, site)
        return set(needed)

    def _closure(self, seeds: set[str]) -> set[str]:
        """The names whose values flow into `seeds` through assignments."""
        reached = set(seeds)
        frontier = list(seeds)
        while frontier:
            name = frontier.pop()
            for value in self.bindings.get(name, ()):
                if value is None:
                    continue
                for source in dotted_names_in(value) - reached:
                    reached.add(source)
                    frontier.append(source)
        return reached

    def uses_of(self, dotted: str) -> list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]]:
        """Each mention of `dotted` in the scope, in source order, with its
        ancestors (outermost first), not entering nested scopes.

        A mention is the chain `dotted` names, found from its first name up,
        or for a plain name also the attribute it names (the `total` of
        `self.total`): what a search for nodes whose dotted name is `dotted`
        finds. No mention lies inside another (the nodes of a chain are
        shorter chains and single names), so the first names, in source
        order, give the mentions in source order."""
        first, *rest = dotted.split(".")
        uses: list[tuple[cst.CSTNode, tuple[cst.CSTNode, ...]]] = []
        for name in self._names.get(first, ()):
            mention: cst.CSTNode = name
            for attribute in rest:
                parent = self._parents.get(id(mention))
                if (
                    type(parent) is not cst.Attribute
                    or parent.value is not mention
                    or parent.attr.value != attribute
                ):
                    break
                mention = parent
            else:
                uses.append((mention, self._ancestors(mention)))
        return uses

    def _ancestors(self, node: cst.CSTNode) -> tuple[cst.CSTNode, ...]:
        ancestors: list[cst.CSTNode] = []
        parent = self._parents.get(id(node))
        while parent is not None:
            ancestors.append(parent)
            parent = self._parents.get(id(parent))
        ancestors.reverse()
        return tuple(ancestors)


def contains_backward(node: cst.CSTNode, context: FileContext) -> bool:
    return any(is_backward_call(inner, context) for inner in iter_nodes(node))


def _heads(dotted: str) -> set[str]:
    """`a.b['c']` -> {"a", "a.b", "a.b['c']"}: rebinding any of them rebinds `a.b['c']`."""
    heads = {dotted[:index] for index, char in enumerate(dotted) if char in ".["}
    heads.add(dotted)
    return heads


def rebinds_every_iteration(body: cst.BaseSuite, dotted: str, *, besides: cst.CSTNode | None = None) -> bool:
    """Whether the value of `dotted` cannot pass from one iteration of the loop
    whose body is `body` to the next: a fresh binding of it (one that does not
    read its old value) runs on every path through the iteration, other than
    `besides`. With `besides` (the statement that updates it), a fresh binding
    on every path through any block that holds `besides` counts too: before it,
    what it reads is this iteration's; after it, what it made dies here
    (`else: loss = a; loss = loss + b`). A reset on one path only
    (`if step % 100 == 0: total = 0`) does not count: the value then outlives
    the iterations in between."""
    heads = _heads(dotted)
    block: Sequence[cst.BaseStatement] | None = _block(body)
    while block is not None:
        holding: cst.BaseStatement | None = None
        for statement in block:
            if besides is not None and holding is None and _holds(statement, besides):
                holding = statement
            elif _always_rebinds(statement, dotted, heads, besides):
                return True
        if holding is None or type(holding) in (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef):
            return False
        block = next(
            (inner for inner in _blocks_in_source_order(holding) if any(_holds(s, besides) for s in inner)),
            None,
        )
    return False


def _holds(statement: cst.CSTNode, node: cst.CSTNode | None) -> bool:
    return node is not None and any(child is node for child in iter_nodes(statement))


def _always_rebinds(
    statement: cst.BaseStatement, dotted: str, heads: set[str], besides: cst.CSTNode | None
) -> bool:
    """Whether every normal path through `statement` binds `dotted` afresh."""

    def block_rebinds(suite: cst.BaseSuite) -> bool:
        return any(_always_rebinds(inner, dotted, heads, besides) for inner in _block(suite))

    kind = type(statement)
    if kind is cst.SimpleStatementLine:
        return any(
            small is not besides and _binds_afresh(small, dotted, heads)
            for small in statement.body  # type: ignore[attr-defined]
        )
    if kind is cst.If:
        orelse = statement.orelse  # type: ignore[attr-defined]
        if orelse is None or not block_rebinds(statement.body):
            return False
        if type(orelse) is cst.If:
            return _always_rebinds(orelse, dotted, heads, besides)
        return block_rebinds(orelse.body)
    if kind is cst.With:
        return block_rebinds(statement.body)
    if kind is cst.Try:
        finalbody = statement.finalbody  # type: ignore[attr-defined]
        if finalbody is not None and block_rebinds(finalbody.body):
            return True
        return block_rebinds(statement.body) and all(
            block_rebinds(handler.body) for handler in statement.handlers  # type: ignore[attr-defined]
        )
    return False  # a loop may run no iteration; a match may match no case


def _binds_afresh(small: cst.CSTNode, dotted: str, heads: set[str]) -> bool:
    """`x = <an expression that does not read x>` (x or an object it belongs to)."""
    for name, value in assigned_names(small):
        if name not in heads:
            continue
        if value is None:
            return True
        read = dotted_names_in(value)
        if not any(mention == dotted or mention.startswith((dotted + ".", dotted + "[")) for mention in read):
            return True
    return False


def binds_inside(
    loop: cst.CSTNode, dotted: str, *, besides: cst.CSTNode | None = None, afresh: bool = False
) -> bool:
    """Whether anything in the loop's body rebinds `dotted` (or the object
    it is an attribute of) with a plain binding, other than the statement
    `besides`; with `afresh`, only a binding that does not read the old value
    (a reset, not another update)."""
    heads = _heads(dotted)
    body = loop.body
    for node in iter_nodes(body):
        if node is besides:
            continue
        if afresh:
            if _binds_afresh(node, dotted, heads):
                return True
        elif any(name in heads for name, _ in assigned_names(node)):
            return True
        if type(node) is cst.Del and dotted_names_in(node.target) & heads:
            return True
    return False


_FACTS: weakref.WeakKeyDictionary[FileContext, FileFacts] = weakref.WeakKeyDictionary()


def facts_for(context: FileContext) -> FileFacts:
    """The file's facts, built once per analysis and shared by every rule."""
    facts = _FACTS.get(context)
    if facts is None:
        facts = FileFacts(context)
        _FACTS[context] = facts
    return facts
