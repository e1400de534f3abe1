"""Facts across the files of one project: who calls a function from another file, and how.

A file is analysed alone, but its functions are often called from another
file of the same project: `train.py` runs `engine.evaluate(model, loader)`
under `with torch.no_grad():`, and `engine.py` alone cannot know it. A
checker of a folder is to run in two phases (the pieces are here and tested;
`oom-lsp check` does not run them yet, so its files are analysed alone):

1. each file's analysis also yields its `FileSummary`: the calls it makes to
   names it imports (resolved to qualified names, relative imports included),
   each with the grad mode its own facts give the call site;
2. `incoming_calls` gathers, for every module of the project, the grad modes
   its functions are called with from the other files; a file whose functions
   are called that way is analysed again with them (`ProjectFacts`), and its
   call graph merges them with its own callers.

Only what the files show is used: a function that no file of the project calls
keeps an unknown context. Summaries are plain data (JSON), cached with the
file's results.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.facts.contexts import call_graph
from oom_lsp.analysis.facts.library import Grad
from oom_lsp.analysis.facts.program import BindingKind


@dataclass(frozen=True)
class CrossFileCall:
    """A call of an imported name: the function's qualified name and the grad
    modes the call site runs under (the value of a `Grad` flag set)."""

    target: str
    grad: int

    def to_dict(self) -> dict[str, object]:
        return {"target": self.target, "grad": self.grad}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CrossFileCall:
        return cls(str(data["target"]), int(data["grad"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class FileSummary:
    module: str
    calls: tuple[CrossFileCall, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"module": self.module, "calls": [call.to_dict() for call in self.calls]}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> FileSummary:
        calls = data.get("calls", ())
        return cls(
            str(data["module"]),
            tuple(CrossFileCall.from_dict(call) for call in calls),  # type: ignore[union-attr]
        )


@dataclass(frozen=True)
class ProjectFacts:
    """What the other files of the project say about this file's functions:
    their qualified name in the module (`evaluate`, `Trainer.validate`) -> the
    grad modes they are called with from elsewhere."""

    incoming: dict[str, Grad] = field(default_factory=dict)

    def digest(self) -> str:
        """A stable text of the facts, for the results cache's key."""
        return ";".join(f"{name}={self.incoming[name].value}" for name in sorted(self.incoming))


def module_name(relative_path: str) -> str | None:
    """`pkg/engine.py` -> `pkg.engine`; `pkg/__init__.py` -> `pkg`; None for a
    path that names no importable module."""
    path = PurePosixPath(relative_path)
    if path.suffix != ".py":
        return None
    parts = list(path.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


def summarize(context: FileContext, module: str) -> FileSummary:
    """The calls this file makes to imported names, with their grad modes."""
    graph = call_graph(context)
    program = graph.program
    imports = context.imports
    calls: list[CrossFileCall] = []
    seen: set[tuple[str, int]] = set()
    for scope in program.functions:
        for call in scope.calls:
            if graph.callees(call):
                continue  # a function of this file
            target = _imported_target(call.node.func, scope, program, imports, module)
            if target is None or target.startswith(_LIBRARIES):
                continue
            if target.rpartition(".")[2][:1].isupper():
                target += ".__init__"  # `Runner(...)`: a class (CapWords) is called through its __init__
            grad = graph.grad_at(call).value
            if (target, grad) not in seen:
                seen.add((target, grad))
                calls.append(CrossFileCall(target, grad))
    return FileSummary(module, tuple(calls))


# Calls into these are never calls of the project's own functions.
_LIBRARIES = (
    "torch.", "numpy.", "transformers.", "lightning.", "pytorch_lightning.", "accelerate.", "diffusers.",
    "timm.", "torchvision.", "peft.", "datasets.", "os.", "sys.", "math.", "json.", "logging.",
)  # fmt: skip


def _imported_target(
    func: cst.BaseExpression, scope: object, program: object, imports: object, module: str
) -> str | None:
    """The qualified name a call of an imported function or of a method of
    an instance of an imported class refers to."""
    dotted = dotted_name(func)
    if dotted is None:
        return None
    qualified = imports.qualified_name(func)  # type: ignore[attr-defined]
    if qualified is not None:
        return qualified
    head, _, rest = dotted.partition(".")
    relative = imports.relative.get(head)  # type: ignore[attr-defined]
    if relative is not None:
        absolute = _absolute(relative, module)
        if absolute is not None:
            return f"{absolute}.{rest}" if rest else absolute
    if "." in dotted:
        # `trainer.validate()` where `trainer = Trainer(...)` of an imported class.
        receiver, _, method = dotted.rpartition(".")
        if "." not in receiver:
            for binding in program.lookup(receiver, scope):  # type: ignore[attr-defined]
                value = binding.value
                if binding.kind is BindingKind.ASSIGN and type(value) is cst.Call:
                    klass = _imported_target(value.func, scope, program, imports, module)
                    if klass is not None and klass.rpartition(".")[2][:1].isupper():
                        return f"{klass}.{method}"
                return None
    return None


def _absolute(relative: str, module: str) -> str | None:
    """`..models.Net` seen from `pkg.sub.train` -> `pkg.models.Net`."""
    dots = len(relative) - len(relative.lstrip("."))
    package = module.split(".")[:-1]
    up = dots - 1
    if up > len(package):
        return None
    base = package[: len(package) - up] if up else package
    rest = relative[dots:]
    return ".".join([*base, rest]) if rest else ".".join(base) or None


def incoming_calls(summaries: Iterable[FileSummary]) -> dict[str, ProjectFacts]:
    """For each module, the grad modes its functions are called with by the others."""
    by_module: dict[str, dict[str, Grad]] = {}
    summaries = list(summaries)
    modules = sorted((summary.module for summary in summaries), key=len, reverse=True)
    for summary in summaries:
        for call in summary.calls:
            owner = next(
                (module for module in modules if call.target.startswith(module + ".") and module != summary.module),
                None,
            )
            if owner is None:
                continue
            local = call.target[len(owner) + 1 :]
            incoming = by_module.setdefault(owner, {})
            incoming[local] = incoming.get(local, Grad.NONE) | Grad(call.grad)
    return {module: ProjectFacts(incoming) for module, incoming in by_module.items()}
