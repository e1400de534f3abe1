"""The facts the prompt is filled from: the user's environment, what the code itself
says (AMP, torch.compile, DDP, batch size, sequence length, dtype), and the region of
code a fix may touch (the enclosing function plus the file's imports).

The environment is read from the user's interpreter (the one with their torch), in a
subprocess with a timeout: oom-lsp itself never imports torch. Everything else is pure.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from oom_lsp import python_ast
from oom_lsp.analysis.context import ImportMap
from oom_lsp.llm.edits import Region
from oom_lsp.probes import run_probe

PROBE_TIMEOUT = 30.0
_PROBE = r"""
import json, platform
facts = {"python": platform.python_version()}
try:
    import torch
except Exception as error:  # reported to the user: a broken install raises more than ImportError
    facts["torch_error"] = f"{type(error).__name__}: {error}"
else:
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["hip"] = getattr(torch.version, "hip", None)
    try:
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            facts["gpu_name"], facts["gpu_memory"] = props.name, props.total_memory
    except Exception as error:
        facts["gpu_error"] = f"{type(error).__name__}: {error}"
print("OOM_LSP_FACTS " + json.dumps(facts))
"""


@dataclass(frozen=True)
class EnvironmentFacts:
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None
    hip: str | None = None
    gpu_name: str | None = None
    gpu_memory: int | None = None
    problem: str | None = None  # why some facts are missing

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> EnvironmentFacts:
        fields = cls.__dataclass_fields__
        return cls(**{key: value for key, value in data.items() if key in fields})  # type: ignore[arg-type]


def probe_environment(python: str, timeout: float = PROBE_TIMEOUT) -> EnvironmentFacts:
    """Python, torch, CUDA and GPU as the user's interpreter sees them."""
    try:
        completed = run_probe(python, _PROBE, timeout=timeout)  # from an empty folder: no project module
    except subprocess.TimeoutExpired:
        return EnvironmentFacts(problem=f"{python} did not answer within {timeout:g} s")
    except OSError as error:
        return EnvironmentFacts(problem=f"cannot run {python}: {error.strerror or error}")
    for line in completed.stdout.splitlines():
        if line.startswith("OOM_LSP_FACTS "):
            data = json.loads(line.removeprefix("OOM_LSP_FACTS "))
            problem = data.pop("torch_error", None) or data.pop("gpu_error", None)
            return EnvironmentFacts.from_dict({**data, "problem": problem})
    last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
    return EnvironmentFacts(problem=f"{python} exited with code {completed.returncode}: {last}")


# --- Facts found in the code ---------------------------------------------------------------


@dataclass(frozen=True)
class CodeFact:
    value: str
    line: int


@dataclass
class CodeFacts:
    amp: list[CodeFact] = field(default_factory=list)
    compile: list[CodeFact] = field(default_factory=list)
    distributed: list[CodeFact] = field(default_factory=list)
    batch_size: list[CodeFact] = field(default_factory=list)
    sequence_length: list[CodeFact] = field(default_factory=list)
    dtype: list[CodeFact] = field(default_factory=list)


MAX_FACTS_PER_KIND = 3
_AMP_CALLS = {
    "torch.autocast": "torch.autocast",
    "torch.amp.autocast": "torch.amp.autocast",
    "torch.cuda.amp.autocast": "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast": "torch.cpu.amp.autocast",
    "torch.amp.GradScaler": "GradScaler",
    "torch.cuda.amp.GradScaler": "GradScaler",
}
_DISTRIBUTED_CALLS = {
    "torch.nn.parallel.DistributedDataParallel": "DistributedDataParallel",
    "torch.nn.DataParallel": "DataParallel",
    "torch.nn.parallel.DataParallel": "DataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel": "FSDP",
    "torch.distributed.fsdp.fully_shard": "FSDP2 fully_shard",
    "torch.distributed.init_process_group": "torch.distributed.init_process_group",
    "accelerate.Accelerator": "accelerate.Accelerator",
}
_DTYPES = {
    "torch.float16": "float16",
    "torch.half": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float32": "float32",
    "torch.float": "float32",
    "torch.float64": "float64",
    "torch.double": "float64",
}
_DTYPE_METHODS = {"half": "float16", "bfloat16": "bfloat16", "double": "float64"}
# Keyword arguments of HF TrainingArguments (fp16/bf16=True), Lightning's Trainer
# (precision="16-mixed") and accelerate (mixed_precision="bf16") that turn on AMP.
_AMP_FLAGS = {"fp16", "bf16"}
_AMP_MODES = {"mixed_precision", "precision"}
_BATCH_NAME = re.compile(r"^(?:per_device_)?(?:train_|eval_|micro_)?batch_?size$|^bs$", re.I)
_SEQUENCE_NAME = re.compile(
    r"^(?:max_)?(?:seq(?:uence)?_?len(?:gth)?|block_size|context_length|max_length|max_len|n_ctx|n_positions)$",
    re.I,
)
_ARGPARSE_BATCH = re.compile(r"^--?(?:per[_-]device[_-])?(?:train[_-])?batch[_-]?size$|^--bs$", re.I)
_ARGPARSE_SEQUENCE = re.compile(
    r"^--(?:max[_-])?(?:seq(?:uence)?[_-]?len(?:gth)?|block[_-]size|max[_-]length)$", re.I
)


def _turns_on_amp(keyword: str, value: cst.BaseExpression) -> bool:
    if keyword in _AMP_FLAGS:
        return isinstance(value, cst.Name) and value.value == "True"
    if keyword in _AMP_MODES and isinstance(value, cst.SimpleString):
        mode = python_ast.evaluated_value(value)
        return isinstance(mode, str) and ("16" in mode or "mixed" in mode)
    return False


def _int_literal(node: cst.BaseExpression | None) -> str | None:
    if isinstance(node, cst.Integer):
        return node.value
    return None


class _FactFinder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.facts = CodeFacts()

    def _add(self, kind: list[CodeFact], value: str, node: cst.CSTNode) -> None:
        if len(kind) < MAX_FACTS_PER_KIND and all(fact.value != value for fact in kind):
            kind.append(CodeFact(value, self.get_metadata(PositionProvider, node).start.line))

    def visit_Call(self, node: cst.Call) -> None:
        name = self.imports.qualified_name(node.func)
        if name in _AMP_CALLS:
            dtype = next(
                (
                    _DTYPES.get(self.imports.qualified_name(arg.value) or "")
                    for arg in node.args
                    if arg.keyword is not None and arg.keyword.value == "dtype"
                ),
                None,
            )
            self._add(self.facts.amp, _AMP_CALLS[name] + (f" ({dtype})" if dtype else ""), node)
        elif name == "torch.compile":
            self._add(self.facts.compile, "torch.compile", node)
        elif name in _DISTRIBUTED_CALLS:
            self._add(self.facts.distributed, _DISTRIBUTED_CALLS[name], node)
        if isinstance(node.func, cst.Attribute) and not node.args:
            method = node.func.attr.value
            if method in _DTYPE_METHODS:
                self._add(self.facts.dtype, f"{_DTYPE_METHODS[method]} (.{method}())", node)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            self._argparse_option(node)
        for arg in node.args:
            if arg.keyword is None:
                continue
            keyword = arg.keyword.value
            literal = _int_literal(arg.value)
            if literal and _BATCH_NAME.match(keyword):
                self._add(self.facts.batch_size, f"{keyword}={literal}", arg)
            elif literal and _SEQUENCE_NAME.match(keyword):
                self._add(self.facts.sequence_length, f"{keyword}={literal}", arg)
            elif _turns_on_amp(keyword, arg.value):
                self._add(self.facts.amp, f"{keyword}={cst.Module([]).code_for_node(arg.value)}", arg)

    def _argparse_option(self, node: cst.Call) -> None:
        flags = [
            python_ast.evaluated_value(arg.value)
            for arg in node.args
            if arg.keyword is None and isinstance(arg.value, cst.SimpleString)
        ]
        default = next(
            (arg.value for arg in node.args if arg.keyword and arg.keyword.value == "default"), None
        )
        literal = _int_literal(default)
        if not literal:
            return
        for flag in flags:
            if isinstance(flag, str) and _ARGPARSE_BATCH.match(flag):
                self._add(self.facts.batch_size, f"{flag} default {literal}", node)
            elif isinstance(flag, str) and _ARGPARSE_SEQUENCE.match(flag):
                self._add(self.facts.sequence_length, f"{flag} default {literal}", node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = self.imports.qualified_name(node)
        if name in _DTYPES:
            self._add(self.facts.dtype, _DTYPES[name], node)

    def _assigned(
        self, target: cst.BaseExpression, value: cst.BaseExpression | None, node: cst.CSTNode
    ) -> None:
        literal = _int_literal(value)
        name = (
            target.value
            if isinstance(target, cst.Name)
            else (target.attr.value if isinstance(target, cst.Attribute) else None)
        )
        if not literal or name is None:
            return
        if _BATCH_NAME.match(name):
            self._add(self.facts.batch_size, f"{name} = {literal}", node)
        elif _SEQUENCE_NAME.match(name):
            self._add(self.facts.sequence_length, f"{name} = {literal}", node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assigned(target.target, node.value, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assigned(node.target, node.value, node)


def detect_code_facts(module: cst.Module) -> CodeFacts:
    finder = _FactFinder(ImportMap.from_module(module))
    MetadataWrapper(module, unsafe_skip_copy=True).visit(finder)
    return finder.facts


# --- The code a fix may touch --------------------------------------------------------------

MODULE_LEVEL_WINDOW = 15  # lines of neighbouring top-level statements taken with a module-level line


@dataclass(frozen=True)
class CodeRegion:
    region: Region
    name: str  # "function `train`", "method `Net.forward`", "module-level code"
    import_lines: tuple[int, ...]  # 1-based lines of the top-level imports


class _Scopes(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.stack: list[tuple[str, str]] = []  # (kind, name) of the enclosing classes and functions
        self.best: tuple[Region, str] | None = None

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append(("class", node.name.value))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        position = self.get_metadata(PositionProvider, node)
        if position.start.line <= self.line <= position.end.line:
            kind = "method" if self.stack and self.stack[-1][0] == "class" else "function"
            qualified = ".".join([*(name for _, name in self.stack), node.name.value])
            self.best = (Region(position.start.line, position.end.line), f"{kind} `{qualified}`")
        self.stack.append(("def", node.name.value))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()


def code_region(module: cst.Module, line: int) -> CodeRegion:
    """The innermost function around `line`; at module level, the top-level statement
    there with its neighbouring top-level statements (a script's training loop)."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = _Scopes(line)
    wrapper.visit(scopes)
    positions = wrapper.resolve(PositionProvider)
    import_lines: list[int] = []
    spans: list[tuple[int, int, cst.CSTNode]] = []
    for statement in module.body:
        position = positions[statement]
        spans.append((position.start.line, position.end.line, statement))
        if isinstance(statement, cst.SimpleStatementLine) and all(
            isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
        ):
            import_lines.extend(range(position.start.line, position.end.line + 1))
    if scopes.best is not None:
        region, name = scopes.best
        return CodeRegion(region, name, tuple(import_lines))
    index = next((i for i, (start, end, _) in enumerate(spans) if start <= line <= end), None)
    if index is None:  # a blank line or comment between statements: the next statement
        index = next((i for i, (start, _, _) in enumerate(spans) if start > line), len(spans) - 1)
    first, last = index, index

    def joinable(i: int) -> bool:
        statement = spans[i][2]
        return not isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and spans[i][0] not in import_lines

    while first > 0 and joinable(first - 1) and spans[index][0] - spans[first - 1][0] <= MODULE_LEVEL_WINDOW:
        first -= 1
    while (
        last + 1 < len(spans)
        and joinable(last + 1)
        and spans[last + 1][1] - spans[index][1] <= MODULE_LEVEL_WINDOW
    ):
        last += 1
    region = Region(spans[first][0], spans[last][1]) if spans else Region(1, max(line, 1))
    return CodeRegion(region, "module-level code", tuple(import_lines))
