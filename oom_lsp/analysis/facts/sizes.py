"""Size facts: the integers, tensors and models a file's code builds.

The rules ask three questions of an expression, in the scope it appears in
(the enclosing `cst.FunctionDef`, or None at module level):

- `int_value(context, expr, scope) -> KnownInt | None`: the integer it
  evaluates to when the code says so: literals and arithmetic (`4 * 1024`,
  `2**20`, `//`), module constants, names bound once (or by the binding that
  dominates the use) in the function, parameter defaults (labelled as
  defaults), argparse defaults read through `args.x`, config literals
  (dataclass fields, `Config(hidden=768)`, `config["hidden"]`, `cfg.model.dim`
  of a module-level dict or namespace), `len()` of a literal list;
- `tensor_size(context, expr, scope) -> TensorSize | None`: elements, dtype,
  bytes and device of a tensor or array the code builds (`oom_lsp.analysis.
  facts.tensors`);
- `model_size(context, expr, scope) -> ModelSize | None`: parameter count
  (and layers, width, heads, vocabulary, family when known) of a model the
  code builds or loads (`oom_lsp.analysis.facts.modules`).

Unknown stays None: no guess is ever returned. Every answer carries its
evidence, a short string for messages ("batch_size=256 (argparse default)").
Queries are cached per file (`sizes_for`, a weak map on the `FileContext`),
and each is bounded (a few thousand node visits at most).
"""

from __future__ import annotations

import weakref

import libcst as cst

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.bindings import FileIndex, Scope
from oom_lsp.analysis.facts.modules import ModelFacts
from oom_lsp.analysis.facts.results import Device, KnownInt, ModelSize, TensorSize
from oom_lsp.analysis.facts.tensors import TensorFacts
from oom_lsp.analysis.facts.values import BudgetExceeded, Evaluator, known_number

__all__ = [
    "Device",
    "KnownInt",
    "ModelSize",
    "SizeFacts",
    "TensorSize",
    "int_value",
    "model_size",
    "sizes_for",
    "tensor_size",
]


class SizeFacts:
    """The size facts of one file; built on the first query (one walk over
    the file's statements), answers cached per (expression, scope)."""

    def __init__(self, context: FileContext) -> None:
        self.context: FileContext = weakref.proxy(context)
        self._context_ref = weakref.ref(context)
        self._index: FileIndex | None = None
        self._evaluator: Evaluator | None = None
        self._tensors: TensorFacts | None = None
        self._models: ModelFacts | None = None
        self._answers: dict[tuple[str, cst.CSTNode, Scope], object] = {}

    @property
    def index(self) -> FileIndex:
        if self._index is None:
            self._index = FileIndex(self.context.module)
        return self._index

    def _ready(self) -> Evaluator:
        if self._evaluator is None:
            self._evaluator = Evaluator(self.context, self.index)
            self._evaluator.passed_by_callers = self._passed_by_callers
            self._tensors = TensorFacts(self._evaluator)
            self._models = ModelFacts(self._evaluator, self._tensors)
        return self._evaluator

    def _passed_by_callers(self, function: cst.FunctionDef, name: str) -> list[tuple[cst.BaseExpression, Scope]]:
        """The arguments the file's callers of `function` pass for `name`, each
        with the caller's scope (from the call graph); [] when a caller passes
        none or cannot be told (then nothing is concluded)."""
        # Imported here: the call graph's module imports the data flow, which these facts stay below.
        from oom_lsp.analysis.facts.contexts import call_graph
        from oom_lsp.analysis.facts.modes import _argument_for

        context = self._context_ref()
        if context is None:
            return []
        graph = call_graph(context)
        target = graph.program.function(function)
        if target is None:
            return []
        passed = []
        for caller in graph.callers(target):
            argument = _argument_for(caller.node, target, name)
            if argument is None:
                return []
            scope_node = caller.scope.node
            passed.append((argument, scope_node if type(scope_node) is cst.FunctionDef else None))
        return passed

    def _ask(self, kind: str, expr: cst.BaseExpression, scope: Scope) -> object:
        key = (kind, expr, scope)
        if key in self._answers:
            return self._answers[key]
        evaluator = self._ready()
        evaluator.steps = 0
        frame = evaluator.frame_for(scope)
        try:
            if kind == "int":
                answer: object = _as_int(evaluator.evaluate(expr, frame), self.context, expr)
            elif kind == "tensor":
                answer = self._tensors.size(expr, frame)  # type: ignore[union-attr]
            else:
                answer = self._models.size(expr, frame)  # type: ignore[union-attr]
        except (BudgetExceeded, RecursionError):
            answer = None
        self._answers[key] = answer
        return answer

    def int_value(self, expr: cst.BaseExpression, scope: Scope = None) -> KnownInt | None:
        return self._ask("int", expr, scope)  # type: ignore[return-value]

    def tensor_size(self, expr: cst.BaseExpression, scope: Scope = None) -> TensorSize | None:
        return self._ask("tensor", expr, scope)  # type: ignore[return-value]

    def model_size(self, expr: cst.BaseExpression, scope: Scope = None) -> ModelSize | None:
        return self._ask("model", expr, scope)  # type: ignore[return-value]

    def enclosing_function(self, statement: cst.CSTNode) -> cst.FunctionDef | None:
        """The function whose body holds a statement (None at module level or in a class body)."""
        scope = self.index.scope_of.get(statement)
        return scope if type(scope) is cst.FunctionDef else None


def _as_int(value: object, context: FileContext, expr: cst.BaseExpression) -> KnownInt | None:
    number = known_number(value)  # type: ignore[arg-type]
    if number is None:
        return None
    result = number.value
    if isinstance(result, float):
        if not result.is_integer():
            return None
        result = int(result)
    evidence = ", ".join(number.evidence) or (expr.value if type(expr) is cst.Integer else context.code_for(expr).strip())
    return KnownInt(value=result, evidence=evidence, from_default=number.default)


_SIZES: weakref.WeakKeyDictionary[FileContext, SizeFacts] = weakref.WeakKeyDictionary()


def sizes_for(context: FileContext) -> SizeFacts:
    """The file's size facts, built once per analysis and shared by every rule."""
    facts = _SIZES.get(context)
    if facts is None:
        facts = _SIZES[context] = SizeFacts(context)
    return facts


def int_value(context: FileContext, expr: cst.BaseExpression, scope: Scope = None) -> KnownInt | None:
    return sizes_for(context).int_value(expr, scope)


def tensor_size(context: FileContext, expr: cst.BaseExpression, scope: Scope = None) -> TensorSize | None:
    return sizes_for(context).tensor_size(expr, scope)


def model_size(context: FileContext, expr: cst.BaseExpression, scope: Scope = None) -> ModelSize | None:
    return sizes_for(context).model_size(expr, scope)
