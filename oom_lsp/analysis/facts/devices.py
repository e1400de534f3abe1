"""Where a tensor lives, and whether it is a whole output or a few numbers.

`device_of(expr, scope)` follows an expression back through the bindings of
its scope (every binding of a name must agree; given `at`, the statements
around the place it is read, only the bindings that reach there) to where
its storage was made:

- moved: `.cuda()`, `.to("cuda")`, `.to(device)` where `device` is the file's
  device (the file uses CUDA) -> GPU; `.cpu()`, `.numpy()`, `.tolist()`,
  `.item()`, `float(...)` -> HOST;
- computed: a model's forward (a module of a file that puts its models on the
  GPU) -> GPU; a tensor method or torch function keeps its first tensor's
  device (`out.detach()`, `out[0]`, `F.softmax(out)`, `out * 2`);
- anything else (a batch straight from a loader, a parameter, an unknown
  call) -> UNKNOWN, and rules stay silent.

`reduced(expr)` says whether the value is a reduction of a tensor to a few
numbers per sample or fewer (`argmax`, `sum`, `mean`, a comparison, `.item()`):
what such a value keeps per batch is a handful of bytes.
"""

from __future__ import annotations

import enum
import re
import weakref

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import bound_arguments, get_arg, string_value, target_names
from oom_lsp.analysis.facts.contexts import call_graph
from oom_lsp.analysis.facts.evaluation import evaluation_facts
from oom_lsp.analysis.facts.program import Binding, BindingKind, Function, Program, program_of


class Device(enum.Enum):
    GPU = "gpu"
    HOST = "host"
    UNKNOWN = "unknown"


_TO_HOST = frozenset({"cpu", "numpy", "tolist", "item"})
_HOST_BUILTINS = frozenset({"float", "int", "bool", "len", "list", "tuple", "str"})
# Methods whose result lives where their receiver does.
_SAME_DEVICE_METHODS = frozenset(
    {
        "detach", "clone", "contiguous", "float", "half", "double", "bfloat16", "view", "reshape", "squeeze",
        "unsqueeze", "flatten", "permute", "transpose", "t", "softmax", "log_softmax", "sigmoid", "tanh",
        "relu", "exp", "log", "abs", "pow", "mul", "add", "sub", "div", "masked_fill", "type_as", "chunk",
        "split", "narrow", "expand", "repeat", "gather", "index_select", "squeeze_", "unsqueeze_", "detach_",
        "requires_grad_", "to_dense", "unbind", "unflatten", "movedim", "tensor_split",
    }
)  # fmt: skip
# Reductions: a few numbers per sample (or per batch) at most.
_REDUCING_METHODS = frozenset(
    {
        "argmax", "argmin", "sum", "mean", "max", "min", "item", "norm", "std", "var", "all", "any", "eq",
        "ne", "lt", "gt", "le", "ge", "count_nonzero", "numel", "size", "topk", "prod", "median", "mode",
        "nansum", "nanmean", "logsumexp", "amax", "amin", "long", "int", "bool",
    }
)  # fmt: skip
_REDUCING_TORCH = frozenset(
    {"torch.argmax", "torch.argmin", "torch.sum", "torch.mean", "torch.max", "torch.min", "torch.eq",
     "torch.topk", "torch.norm", "torch.count_nonzero", "torch.logsumexp"}
)  # fmt: skip
_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_MAX_DEPTH = 16  # deep enough for a value passed through a helper and back


class DeviceFacts:
    def __init__(self, context: FileContext, uses_cuda: bool) -> None:
        self._context = weakref.ref(context)  # no strong reference back: a per-context cache holds this
        self.imports = context.imports
        self.program: Program = program_of(context)
        self.uses_cuda = uses_cuda
        self._memo: dict[tuple[int, int, int], Device] = {}
        # A compound statement's id -> the ids of the statements in it (the file's nodes live as long as this).
        self._inside: dict[int, frozenset[int]] = {}

    def device_of(
        self, expr: cst.BaseExpression, scope: Function, depth: int = 0, at: tuple[cst.CSTNode, ...] | None = None
    ) -> Device:
        """Where `expr` lives. With `at`, the statements around the place it is
        read (outermost first, the reading statement last): its names take only
        the bindings that reach there (`logits = model(x)` earlier in the loop's
        body, not `logits = torch.cat(all_logits)` after the loop)."""
        key = (id(expr), id(scope), id(at[-1]) if at else 0)
        known = self._memo.get(key)
        if known is not None:
            return known
        self._memo[key] = Device.UNKNOWN  # while it is worked out: cycles through names
        result = self._device(expr, scope, depth, at) if depth <= _MAX_DEPTH else Device.UNKNOWN
        self._memo[key] = result
        return result

    def _device(
        self, expr: cst.BaseExpression, scope: Function, depth: int, at: tuple[cst.CSTNode, ...] | None = None
    ) -> Device:
        expr_type = type(expr)
        if expr_type is cst.Call:
            return self._call(expr, scope, depth, at)
        if expr_type is cst.Name:
            return self._name(expr.value, scope, depth, at)
        if expr_type is cst.Subscript:
            return self.device_of(expr.value, scope, depth + 1, at)
        if expr_type is cst.BinaryOperation:
            left = self.device_of(expr.left, scope, depth + 1, at)
            return left if left is not Device.UNKNOWN else self.device_of(expr.right, scope, depth + 1, at)
        if expr_type is cst.UnaryOperation:
            return self.device_of(expr.expression, scope, depth + 1, at)
        if expr_type is cst.Attribute:
            if expr.attr.value in ("data", "T", "mT", "real", "imag"):
                return self.device_of(expr.value, scope, depth + 1, at)
            if expr.attr.value in ("logits", "last_hidden_state", "hidden_states", "pooler_output", "loss"):
                return self.device_of(expr.value, scope, depth + 1, at)  # a model output's fields
        return Device.UNKNOWN

    def _call(self, call: cst.Call, scope: Function, depth: int, at: tuple[cst.CSTNode, ...] | None = None) -> Device:
        func = call.func
        if type(func) is cst.Name and func.value in _HOST_BUILTINS:
            return Device.HOST
        qualified = self.imports.qualified_name(func)
        if qualified is not None:
            if qualified.startswith(("numpy.", "np.")):
                return Device.HOST
            if qualified.startswith("torch.") and call.args:
                device = get_arg(call, "device")
                if isinstance(device, cst.Arg):
                    return self._target(device.value)
                return self.device_of(call.args[0].value, scope, depth + 1, at)
            return Device.UNKNOWN
        if type(func) is cst.Attribute:
            method = func.attr.value
            if method in _TO_HOST:
                return Device.HOST
            if method == "cuda":
                return Device.GPU
            if method == "to":
                target = get_arg(call, "device", 0)
                if isinstance(target, cst.Arg):
                    moved = self._target(target.value)
                    if moved is not Device.UNKNOWN:
                        return moved
                return self.device_of(func.value, scope, depth + 1, at)
            if method in _SAME_DEVICE_METHODS or method in _REDUCING_METHODS:
                return self.device_of(func.value, scope, depth + 1, at)
        if self._is_forward(call, scope):
            return Device.GPU if self.uses_cuda else Device.UNKNOWN
        return self._returned(call, depth)

    def _returned(self, call: cst.Call, depth: int) -> Device:
        """A call of a function of the file (`pooled = mean_pool(out, mask)`):
        where every value it returns lives, each worked out in the callee, its
        parameters from what its callers pass."""
        context = self._context()
        site = self.program.call(call)
        if context is None or site is None:
            return Device.UNKNOWN
        callees = call_graph(context).callees(site)
        found: Device | None = None
        for callee in callees:
            if type(callee.node) is not cst.FunctionDef:
                return Device.UNKNOWN
            for value in _returned_values(callee.node):
                device = self.device_of(value, callee, depth + 1)
                if device is Device.UNKNOWN or (found is not None and device is not found):
                    return Device.UNKNOWN
                found = device
        return found or Device.UNKNOWN

    def target_device(self, target: cst.BaseExpression) -> Device:
        """Where `.to(target)`, `device=target` or `map_location=target` puts a
        tensor; a device variable the file ever sets to the CPU is not known
        to be the GPU (`device = torch.device("cpu")` in a file that has CUDA
        elsewhere)."""
        found = self._target(target)
        name = dotted_name(target)
        context = self._context()
        if found is Device.GPU and name is not None and context is not None:
            pending: list[cst.CSTNode] = [context.module]
            while pending:
                node = pending.pop()
                if type(node) is cst.Assign and any(dotted_name(t.target) == name for t in node.targets):
                    if self._target(node.value) is Device.HOST:
                        return Device.UNKNOWN
                pending.extend(node.children)
        return found

    def _target(self, target: cst.BaseExpression) -> Device:
        """Where `.to(target)` / `device=target` puts a tensor."""
        text = string_value(target)
        if text is not None:
            if _CUDA_STRING.match(text):
                return Device.GPU
            return Device.HOST if text == "cpu" else Device.UNKNOWN
        if type(target) is cst.Call and self.imports.qualified_name(target.func) == "torch.device" and target.args:
            return self._target(target.args[0].value)
        name = dotted_name(target)
        if name is not None and "device" in name.rpartition(".")[2].lower():
            return Device.GPU if self.uses_cuda else Device.UNKNOWN
        return Device.UNKNOWN

    def _name(self, name: str, scope: Function, depth: int, at: tuple[cst.CSTNode, ...] | None = None) -> Device:
        if at is None:
            bindings: list[tuple[Binding, tuple[cst.CSTNode, ...] | None]] = [
                (binding, None) for binding in self.program.lookup(name, scope)
            ]
        else:
            bindings = self._reaching(name, scope, at)
        if not bindings:
            return Device.UNKNOWN
        found: Device | None = None
        for binding, binding_at in bindings:
            where = binding.scope or scope
            if binding.kind is BindingKind.PARAM:
                device = self._parameter(name, where, depth)
            elif binding.kind is BindingKind.LOOP and type(binding.node) is cst.For:
                source = _element_source(binding.node, name)
                device = Device.UNKNOWN if source is None else self.device_of(source, where, depth + 1)
            elif binding.kind is not BindingKind.ASSIGN or binding.value is None:
                return Device.UNKNOWN
            else:
                # Read where it is bound: `f = normalize(f)` reads the `f` bound before it.
                device = self.device_of(binding.value, where, depth + 1, binding_at)
            if device is Device.UNKNOWN or (found is not None and device is not found):
                return Device.UNKNOWN
            found = device
        return found or Device.UNKNOWN

    def _reaching(
        self, name: str, scope: Function, at: tuple[cst.CSTNode, ...]
    ) -> list[tuple[Binding, tuple[cst.CSTNode, ...] | None]]:
        """The bindings of `name` that may reach the statement `at[-1]`: walking
        back from it through the blocks around it, the first statement that
        binds the name outright ends the walk (it kills the older ones); a
        compound statement on the way adds what it binds inside (it may or
        may not run), and so does a loop around the reading statement (what
        its body binds later reaches the next iteration). Every binding when
        the statements cannot be placed. Each with the statements around its
        own statement when it is the one that kills the older bindings (its
        value is then read there in turn), else None."""
        own = scope.bindings.get(name)
        if not own or name in scope.outer_names:
            return [(binding, None) for binding in self.program.lookup(name, scope)]
        everything: list[tuple[Binding, tuple[cst.CSTNode, ...] | None]] = [(binding, None) for binding in own]
        if scope.is_module:
            if any(type(statement) in (cst.FunctionDef, cst.ClassDef) for statement in at):
                return everything
            prefix: tuple[cst.CSTNode, ...] = ()
            inner, block = at, list(self.program.module_node.body)
        else:
            start = next((i for i, statement in enumerate(at) if statement is scope.node), None)
            body = scope.node.body  # type: ignore[union-attr]
            if start is None or type(body) is not cst.IndentedBlock:
                return everything
            prefix, inner, block = at[: start + 1], at[start + 1 :], list(body.body)
        if not inner:
            return everything
        by_statement: dict[int, list[Binding]] = {}
        for binding in own:
            by_statement.setdefault(id(binding.node), []).append(binding)
        levels: list[tuple[list[cst.CSTNode], int]] = []
        for depth, statement in enumerate(inner):
            position = next((i for i, candidate in enumerate(block) if candidate is statement), None)
            if position is None:
                return everything
            levels.append((block, position))
            if depth + 1 < len(inner):
                found = _block_holding(statement, inner[depth + 1])
                if found is None:
                    return everything
                block = found
        reaching: dict[int, tuple[Binding, tuple[cst.CSTNode, ...] | None]] = {}

        def add_inside(statement: cst.CSTNode) -> None:
            inside = self._inside.get(id(statement))
            if inside is None:
                inside = self._inside[id(statement)] = _statements_in(statement)
            for binding in own:
                if id(binding.node) in inside:
                    reaching[id(binding)] = (binding, None)

        for level in range(len(levels) - 1, -1, -1):
            block, position = levels[level]
            for earlier in reversed(block[:position]):
                direct = by_statement.get(id(earlier))
                if direct is not None and type(earlier) in (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef):
                    where = (*prefix, *inner[:level], earlier)
                    for binding in direct:
                        reaching[id(binding)] = (binding, where)
                    return list(reaching.values())
                add_inside(earlier)
            if level == 0:
                break
            container = inner[level - 1]
            if type(container) in (cst.For, cst.With) and id(container) in by_statement:
                for binding in by_statement[id(container)]:  # the loop's target, `with ... as name`
                    reaching[id(binding)] = (binding, None)
                return list(reaching.values())
            if type(container) in (cst.For, cst.While):
                add_inside(container)  # bound later in the body: the next iteration reads it
        for binding in own:
            if binding.kind is BindingKind.PARAM:
                reaching[id(binding)] = (binding, None)
        return list(reaching.values()) or everything

    def _parameter(self, name: str, function: Function, depth: int) -> Device:
        """A parameter lives where what every caller of the file passes for it
        lives; UNKNOWN when a caller passes nothing known, or the function is
        called from outside the file (it has no caller here)."""
        context = self._context()
        if context is None or type(function.node) is not cst.FunctionDef:
            return Device.UNKNOWN
        params = list(function.params)
        callers = call_graph(context).callers(function)
        found: Device | None = None
        for caller in callers:
            names = params
            if function.self_name is not None and type(caller.node.func) is cst.Attribute:
                names = params[1:]
            passed = bound_arguments(caller.node, names).get(name)
            if passed is None:
                return Device.UNKNOWN
            device = self.device_of(passed, caller.scope, depth + 1)
            if device is Device.UNKNOWN or (found is not None and device is not found):
                return Device.UNKNOWN
            found = device
        return found or Device.UNKNOWN

    def _is_forward(self, call: cst.Call, scope: Function) -> bool:
        context = self._context()
        site = self.program.call(call)
        if context is None or site is None:
            return False
        return evaluation_facts(context).forward_model(site) is not None


def _block_holding(statement: cst.CSTNode, child: cst.CSTNode) -> list[cst.CSTNode] | None:
    """The list of statements, among the blocks of the compound `statement`,
    that holds `child`."""
    suites: list[cst.CSTNode | None] = []
    statement_type = type(statement)
    if statement_type in (cst.For, cst.While, cst.With, cst.If, cst.Try, cst.TryStar):
        suites.append(statement.body)  # type: ignore[attr-defined]
    if statement_type in (cst.For, cst.While, cst.If, cst.Try, cst.TryStar):
        orelse = statement.orelse  # type: ignore[attr-defined]
        if type(orelse) is cst.If:
            return [orelse] if orelse is child else None
        suites.append(orelse.body if orelse is not None else None)
    if statement_type in (cst.Try, cst.TryStar):
        suites.extend(handler.body for handler in statement.handlers)  # type: ignore[attr-defined]
        final = statement.finalbody  # type: ignore[attr-defined]
        suites.append(final.body if final is not None else None)
    if statement_type is cst.Match:
        suites.extend(case.body for case in statement.cases)  # type: ignore[attr-defined]
    for suite in suites:
        if type(suite) is cst.IndentedBlock and any(candidate is child for candidate in suite.body):
            return list(suite.body)
    return None


def _statements_in(statement: cst.CSTNode) -> frozenset[int]:
    """The ids of the statements (and except clauses) in a compound statement, itself included."""
    found = set()
    pending = [statement]
    while pending:
        node = pending.pop()
        if isinstance(node, (cst.BaseStatement, cst.ExceptHandler, cst.ExceptStarHandler)):
            found.add(id(node))
        pending.extend(node.children)
    return frozenset(found)


def _returned_values(function: cst.FunctionDef) -> list[cst.BaseExpression]:
    """The values the function's own `return` statements give (not those of
    functions nested in it)."""
    values: list[cst.BaseExpression] = []
    pending: list[cst.CSTNode] = list(function.body.children)
    while pending:
        node = pending.pop()
        if type(node) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            continue
        if type(node) is cst.Return:
            if node.value is None:
                return []
            values.append(node.value)
            continue
        pending.extend(node.children)
    return values


def _element_source(loop: cst.For, name: str) -> cst.BaseExpression | None:
    """What `name`, bound by the loop's target, takes the elements of: the
    iterable for `for x in xs`, the matching argument of `zip(...)` for
    `for a, b in zip(as, bs)`, the iterable of `enumerate(xs)` for its second
    position. None when the target does not say (the index of `enumerate`,
    a pair unpacked from one element)."""
    target, iterable = loop.target, loop.iter
    while True:
        if type(target) is cst.Name:
            return iterable if target.value == name else None
        if type(target) not in (cst.Tuple, cst.List) or type(iterable) is not cst.Call:
            return None
        called = dotted_name(iterable.func)
        args = [arg.value for arg in iterable.args if arg.keyword is None and not arg.star]
        elements = [element.value for element in target.elements]
        if any(type(element) is cst.StarredElement for element in target.elements):
            return None
        if called == "enumerate" and len(elements) == 2 and args:
            target, iterable = elements[1], args[0]
            continue
        if called == "zip" and len(elements) == len(args):
            for element, arg in zip(elements, args):
                if name in target_names(element):
                    target, iterable = element, arg
                    break
            else:
                return None
            if type(target) is not cst.Name:
                return None  # a pair unpacked from one zipped element
            continue
        return None


def reduced(expr: cst.BaseExpression, context: FileContext) -> bool:
    """A value that is a reduction (per sample or per batch) of a tensor."""
    if type(expr) is cst.Comparison:
        return True
    if type(expr) is not cst.Call:
        return False
    func = expr.func
    if type(func) is cst.Attribute:
        if func.attr.value in _REDUCING_METHODS:
            return True
        if func.attr.value in _SAME_DEVICE_METHODS or func.attr.value in _TO_HOST or func.attr.value in ("to", "cuda"):
            return reduced(func.value, context)
    return context.qualified_name(func) in _REDUCING_TORCH


_FACTS: weakref.WeakKeyDictionary[FileContext, DeviceFacts] = weakref.WeakKeyDictionary()


def device_facts(context: FileContext, uses_cuda: bool) -> DeviceFacts:
    facts = _FACTS.get(context)
    if facts is None:
        facts = _FACTS[context] = DeviceFacts(context, uses_cuda)
    return facts
