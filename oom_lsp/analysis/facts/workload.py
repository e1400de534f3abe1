"""What a training or evaluation loop runs: its model, batch and sequence, and
the memory at stake, when the code says them.

Advisory findings (mixed precision, checkpointing, where a checkpoint is
loaded) are worth acting on only at some sizes: autocast halves activations
that matter on a 124M-parameter GPT at 1,024 tokens and not on a LeNet. This
module turns the size facts (`sizes`, `known_models`, `memory`) into a
`Stake`: bytes and the words that say where they come from ("≈ 9.4 GiB of
float32 activations: gpt2, batch 8, 1,024 tokens"). A loop whose sizes the
code does not state has no stake, and an advisory finding there stays in
strict mode.

The facts used, each from the code:

- the model: a forward call in the loop, sized by `model_size` (a known
  pretrained checkpoint, a torchvision or timm architecture, a transformer
  config, a module whose layers the file builds);
- the batch: the `batch_size` of the `DataLoader` the loop iterates (through
  `enumerate`/`tqdm`), an argparse default or a constant;
- the sequence: a `max_length` / `block_size` / `seq_len` the file states, or
  the context a known checkpoint is trained at when nothing shorter is said;
- activations: a transformer's per-layer bytes (Korthikanti et al. 2022,
  `memory.transformer_activation_bytes_per_layer`) times its layers.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg
from oom_lsp.analysis.facts.evaluation import evaluation_facts
from oom_lsp.analysis.facts.modes import _argument_for
from oom_lsp.analysis.facts.memory import training_state_bytes, transformer_activation_bytes_per_layer
from oom_lsp.analysis.facts.program import BindingKind, Call, Function, program_of
from oom_lsp.analysis.facts.results import KnownInt, ModelSize
from oom_lsp.analysis.facts.sizes import int_value, model_size

# A model this large trains with gigabytes of activations at any batch and
# sequence a training run uses, and its weights alone are gigabytes.
LARGE_MODEL_PARAMETERS = 1_000_000_000
# A model this small has weights, gradients and optimizer state of a few tens of MB.
SMALL_MODEL_PARAMETERS = 10_000_000
# A notebook that trains a model this large in float32 holds several GiB of
# weights, gradients and optimizer state: an out-of-memory error is plausible
# on the GPUs notebooks run on, and what it pins matters.
NOTEBOOK_LARGE_MODEL = 300_000_000
# What a stake must reach to be worth a finding by default: a few percent of
# the smallest GPUs training runs on (16 GiB).
MATTERS = 1 << 30

_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "zip", "iter"})
_DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_SEQUENCE_NAMES = (
    "max_length", "max_seq_length", "max_seq_len", "seq_len", "seq_length", "sequence_length", "block_size",
    "context_length", "n_ctx", "max_len", "max_source_length", "max_target_length",
)  # fmt: skip


@dataclass(frozen=True)
class Stake:
    bytes: int
    text: str

    @property
    def matters(self) -> bool:
        return self.bytes >= MATTERS


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


class Workload:
    def __init__(self, context: FileContext) -> None:
        self._context = weakref.ref(context)
        self.program = program_of(context)

    @property
    def context(self) -> FileContext:
        context = self._context()
        assert context is not None
        return context

    # --- the parts ---------------------------------------------------------------
    def models_in(self, loop: cst.CSTNode, scope: Function) -> list[tuple[Call, ModelSize]]:
        """The models the loop runs forward, itself or through a function of
        the file it calls with the model (`calc_loss_batch(x, y, model)`), with
        their sizes when known."""
        evaluation = evaluation_facts(self.context)
        graph = evaluation.graph
        found: list[tuple[Call, ModelSize]] = []
        for call in scope.calls:
            if not any(enclosing is loop for enclosing in call.loops):
                continue
            if evaluation.forward_model(call) is not None:
                size = self._size_of_called(call.node.func, scope)
                if size is not None:
                    found.append((call, size))
                continue
            for callee in graph.callees(call):
                for inner in callee.calls:
                    model = evaluation.forward_model(inner)
                    if model is None:
                        continue
                    head = model.partition(".")[0]
                    argument = _argument_for(call.node, callee, head) if head in callee.params else None
                    if argument is None:
                        continue
                    size = self._size_of_called(argument, scope)
                    if size is not None:
                        found.append((call, size))
        return found

    def _size_of_called(self, func: cst.BaseExpression, scope: Function, depth: int = 0) -> ModelSize | None:
        """The size of the model `func` is, in `scope`: by the size facts, or,
        for a parameter of the function, by what its callers pass (a model
        built in `main` and handed to `train(model, ...)`)."""
        if type(func) is cst.Attribute and func.attr.value in ("forward", "__call__"):
            func = func.value
        size = model_size(self.context, func, _scope_node(scope))
        if size is not None or depth >= 3 or type(func) is not cst.Name or func.value not in scope.params:
            return size
        graph = evaluation_facts(self.context).graph
        for caller in graph.callers(scope):
            argument = _argument_for(caller.node, scope, func.value)
            if argument is not None:
                size = self._size_of_called(argument, caller.scope, depth + 1)
                if size is not None:
                    return size
        return None

    def batch_of(self, loop: cst.CSTNode, scope: Function) -> KnownInt | None:
        """The batch size of the DataLoader the loop iterates."""
        if type(loop) is not cst.For:
            return None
        iterable = loop.iter
        while type(iterable) is cst.Call and dotted_name(iterable.func) in _WRAPPERS and iterable.args:
            iterable = iterable.args[0].value
        loader = self._loader(iterable, scope)
        if loader is None:
            return None
        batch = get_arg(loader, "batch_size", 1)
        if not isinstance(batch, cst.Arg):
            return None
        return int_value(self.context, batch.value, _scope_node(scope))

    def _loader(self, iterable: cst.BaseExpression, scope: Function) -> cst.Call | None:
        if type(iterable) is cst.Call and self.context.qualified_name(iterable.func) in _DATALOADERS:
            return iterable
        if type(iterable) is not cst.Name:
            return None
        for binding in self.program.lookup(iterable.value, scope):
            value = binding.value
            if binding.kind is BindingKind.ASSIGN and type(value) is cst.Call:
                if self.context.qualified_name(value.func) in _DATALOADERS:
                    return value
        return None

    def sequence_length(self) -> KnownInt | None:
        """The longest sequence the file states (`max_length=512`, `block_size = 1024`)."""
        best: KnownInt | None = None
        for scope in self.program.functions:
            for call in scope.calls:
                for arg in call.node.args:
                    if arg.keyword is not None and arg.keyword.value in _SEQUENCE_NAMES:
                        value = int_value(self.context, arg.value, _scope_node(scope))
                        if value is not None and (best is None or value.value > best.value):
                            best = value
        for name in _SEQUENCE_NAMES:
            for binding in self.program.module.bindings.get(name, ()):
                if binding.kind is BindingKind.ASSIGN and binding.value is not None:
                    value = int_value(self.context, binding.value, None)
                    if value is not None and (best is None or value.value > best.value):
                        best = value
        return best

    # --- the stakes ---------------------------------------------------------------
    def activations(self, loop: cst.CSTNode, scope: Function, *, element_bytes: int = 4) -> Stake | None:
        """The activations the loop's model keeps for its backward pass, when
        the code states the model, the batch and the sequence."""
        for _, size in self.models_in(loop, scope):
            stake = self._transformer_activations(size, loop, scope, element_bytes)
            if stake is not None:
                return stake
        return None

    def _transformer_activations(
        self, size: ModelSize, loop: cst.CSTNode, scope: Function, element_bytes: int
    ) -> Stake | None:
        if size.layers is None or size.hidden is None or size.heads is None:
            return None
        batch = self.batch_of(loop, scope)
        sequence = self.sequence_length()
        if batch is None or sequence is None:
            return None
        per_layer = transformer_activation_bytes_per_layer(
            batch.value, sequence.value, size.hidden, size.heads, activation_bytes=element_bytes,
            flash_attention=True,  # the fused kernels transformers and torch pick by default
        )
        total = per_layer * size.layers
        name = size.name or size.family or "the model"
        return Stake(
            total,
            f"≈ {format_bytes(total)} of activations ({name}, batch {batch.value}, {sequence.value} tokens)",
        )

    def largest_model(self) -> ModelSize | None:
        """The largest model the file (or notebook) runs forward, when sized."""
        evaluation = evaluation_facts(self.context)
        largest: ModelSize | None = None
        for scope in self.program.functions:
            for call in scope.calls:
                if evaluation.forward_model(call) is None:
                    continue
                size = self._size_of_called(call.node.func, scope)
                if size is not None and (largest is None or size.parameters > largest.parameters):
                    largest = size
        return largest

    def program_stake(self) -> Stake | None:
        """What a failed or repeated step of the whole program holds, when the
        sizes show it is large: a model of 300 M parameters or more (its training
        state alone is several GiB), or a loop's activations of 2 GiB or more."""
        largest = self.largest_model()
        if largest is not None and largest.parameters >= NOTEBOOK_LARGE_MODEL:
            state = training_state_bytes(largest).total
            return Stake(state, f"{largest.name or 'a'} {parameter_count(largest.parameters)}-parameter model")
        seen: set[int] = set()
        for scope in self.program.functions:
            for call in scope.calls:
                for loop in call.loops:
                    if id(loop) in seen or type(loop) not in (cst.For, cst.While):
                        continue
                    seen.add(id(loop))
                    stake = self.activations(loop, scope)
                    if stake is not None and stake.bytes >= 2 * MATTERS:
                        return stake
        return None

    def model_stake(self, loop: cst.CSTNode, scope: Function) -> Stake | None:
        """A model so large that its training state alone is gigabytes."""
        for _, size in self.models_in(loop, scope):
            if size.parameters >= LARGE_MODEL_PARAMETERS:
                state = training_state_bytes(size).total
                return Stake(state, f"a {parameter_count(size.parameters)}-parameter model ({format_bytes(state)} of training state)")
        return None


def parameter_count(parameters: int) -> str:
    """`6.7 B`, `124 M`: a parameter count as people say it."""
    if parameters >= 1_000_000_000:
        return f"{parameters / 1e9:.1f} B"
    return f"{parameters / 1e6:.0f} M"


def _scope_node(scope: Function) -> cst.FunctionDef | None:
    node = scope.node
    return node if type(node) is cst.FunctionDef else None


_WORKLOADS: weakref.WeakKeyDictionary[FileContext, Workload] = weakref.WeakKeyDictionary()


def workload_of(context: FileContext) -> Workload:
    workload = _WORKLOADS.get(context)
    if workload is None:
        workload = _WORKLOADS[context] = Workload(context)
    return workload
