"""OOM501: `torch.load` of a CUDA model's checkpoint onto the GPU: without
`map_location`, or with one that names the GPU."""

from __future__ import annotations

import collections
import re
import weakref
from dataclasses import dataclass, field

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, is_true, method_call, string_value
from oom_lsp.analysis.facts.devices import Device, device_facts
from oom_lsp.analysis.facts.program import Function, program_of
from oom_lsp.analysis.facts.sizes import model_size
from oom_lsp.analysis.facts.workload import MATTERS, Stake, format_bytes, parameter_count
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid, deferred_report
from oom_lsp.analysis.rules._devices import file_uses_cuda
from oom_lsp.analysis.rules._scan import SCOPES, descendants, names_read, scope_of
from oom_lsp.fixes.map_location import add_map_location, map_location_to_cpu


class TorchLoadWithoutMapLocation(Rule):
    """
    ## What it does
    Flags `torch.load(...)` without `map_location` when what it loads is a
    model's or an optimizer's state in a file that uses CUDA: the result
    goes to `load_state_dict` (`model.load_state_dict(torch.load(path))`,
    or through a checkpoint dict: `ckpt["model"]`), or the same file saves a
    `state_dict()` to that path. Also `torch.load(..., map_location=device)`
    where `device` is the GPU (`"cuda"`, `torch.device("cuda:0")`, the
    file's `device` when it uses CUDA) and the result goes to
    `load_state_dict`: the checkpoint is built on the GPU beside the model
    it is then copied into. A `map_location` that is None on some path
    (`"cpu" if args.cpu else None`) is no `map_location` there.

    Shown by default when the copy is at least 4 GiB: the weights of the
    model the checkpoint is loaded into, when the size facts know it, plus
    the optimizer state restored from the same checkpoint (two weight-sized
    tensors per parameter for Adam and AdamW, one for SGD with momentum).

    It stays silent on a file with no CUDA use (CPU-only code, an XLA/TPU
    strategy), on checkpoints the file shows are on the CPU (saved with
    `.cpu()`, from a model moved to the CPU, or FSDP full state dicts with
    `offload_to_cpu=True`), and on loads of anything else: scheduler,
    GradScaler or sampler state, RNG state, metadata, cached features, a
    whole pickled model that is then moved where it belongs.

    ## Why is this bad?
    Without `map_location`, every tensor in the checkpoint is restored onto the
    device it was saved from. A checkpoint saved during GPU training lands on
    the GPU a second time, next to the model's own parameters and optimizer
    state: loading a 7 GB checkpoint briefly needs 7 GB of free GPU memory on
    top of the model, and on a multi-GPU machine every rank loads onto GPU 0.

    ## Example
    ```python
    model = Net().cuda()
    state = torch.load("checkpoint.pt")
    model.load_state_dict(state)
    ```

    ## Use instead
    ```python
    model = Net().cuda()
    state = torch.load("checkpoint.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    ```

    ## Fix safety
    Safe: `load_state_dict` copies the values into the model's tensors on
    their device, so loading onto the CPU first changes no result. When the
    whole loaded object goes straight into `load_state_dict` (and the call
    passes neither `weights_only` nor a `pickle_module`), the fix also passes
    `weights_only=True`, so that it leaves no finding for security linters
    (bandit B614, TorchFix TOR102): a state dict is tensors in a mapping,
    which is what `weights_only` loads, and it is the default since torch
    2.6. Anywhere else (a checkpoint dict that may hold other objects) it
    adds only `map_location`, and keeps a `weights_only` the call has.
    """

    code = "OOM501"
    advisory = True
    name = "torch-load-without-map-location"
    summary = "`torch.load` restores a checkpoint onto the GPU next to the model it is loaded into."
    why = "The checkpoint's tensors come back onto the GPU (the one they were saved from, or the one map_location names), next to the model's own copy."
    remedy = 'Pass map_location="cpu" and move what you need.'
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            'import torch\nmodel.cuda()\nmodel.load_state_dict(torch.load("ckpt.pt", map_location="cpu"))\n'
        ),
        Valid('import torch\nmodel.cuda()\nmodel.load_state_dict(torch.load("ckpt.pt", "cpu"))\n'),
        Valid(
            'import torch\nmodel.cuda()\nkwargs = {"map_location": "cpu"}\n'
            'model.load_state_dict(torch.load("ckpt.pt", **kwargs))\n'
        ),
        # A local function called `load` is not torch's.
        Valid(
            'import pickle\nmodel.cuda()\ndef load(path):\n    return pickle.load(open(path, "rb"))\n'
            'model.load_state_dict(load("ckpt.pt"))\n'
        ),
        # No CUDA anywhere in the file: what it saved is on the CPU.
        Valid(
            """\
            import torch
            net = Net()
            torch.save(net.state_dict(), "net.pt")
            net.load_state_dict(torch.load("net.pt"))
            """
        ),
        # Features saved with `.cpu()` by the same file.
        Valid(
            """\
            import torch
            feats = extract(model.cuda(), loader)
            torch.save(feats.cpu(), os.path.join(out_dir, "feats.pth"))
            feats = torch.load(os.path.join(out_dir, "feats.pth"))
            """
        ),
        # The file saves its model from the CPU.
        Valid(
            """\
            import torch

            def train(args):
                net = Net().cuda()
                fit(net)
                net.eval().cpu()
                torch.save(net.state_dict(), args.save_path)

            def infer(args):
                net = Net()
                net.load_state_dict(torch.load(args.model))
                net.cuda()
            """
        ),
        # FSDP gathers full state dicts to the CPU.
        Valid(
            """\
            import torch
            from torch.distributed.fsdp import FullStateDictConfig
            torch.cuda.set_device(local_rank)
            policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)

            def load(model, path):
                model.load_state_dict(torch.load(path))
            """
        ),
        # Scheduler and GradScaler states hold Python numbers.
        Valid(
            """\
            import torch
            model.cuda()
            scheduler.load_state_dict(torch.load(os.path.join(ckpt, "scheduler.pt")))
            self.scaler.load_state_dict(torch.load(os.path.join(ckpt, "scaler.pt")))
            """
        ),
        # RNG state and other small things that never meet the model.
        Valid(
            """\
            import torch
            torch.cuda.manual_seed(0)
            rng = torch.load(rng_file)
            torch.cuda.set_rng_state_all(rng["cuda"])
            meta = torch.load(path / META_FILE)
            """
        ),
        # Tensors loaded onto the GPU to be used there, not copied into a
        # model: no second copy of anything.
        Valid(
            """\
            import torch
            device = torch.device("cuda")
            features = torch.load(path, map_location=device)
            scores = features @ queries.T
            """
        ),
        # A device variable the file sets to the CPU where it loads.
        Valid(
            """\
            import torch

            def export(model, path):
                device = torch.device("cpu")
                model.load_state_dict(torch.load(path, map_location=device))

            def train(model):
                model.cuda()
            """
        ),
        # A map_location that decides per tensor: not known to be the GPU.
        Valid(
            """\
            import torch
            model.cuda()
            model.load_state_dict(torch.load(path, map_location=lambda storage, loc: storage))
            """
        ),
        # A whole pickled model, moved where it belongs: no second copy.
        Valid(
            """\
            import torch
            device = torch.device("cuda")
            model = torch.load(args.model, weights_only=False)
            model = model.to(device).eval()
            """
        ),
    ]
    INVALID = [
        # The size facts show the memory at stake: shown by default.
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf").cuda()
            model.load_state_dict(torch.load("finetuned.pt"))
            """,
            line=5,
            by_default=True,
        ),
        Invalid(
            'import torch\nmodel.cuda()\nmodel.load_state_dict(torch.load("ckpt.pt"))\n',
            line=3,
            expected_fix=(
                "import torch\nmodel.cuda()\n"
                'model.load_state_dict(torch.load("ckpt.pt", map_location="cpu", weights_only=True))\n'
            ),
        ),
        # A checkpoint dict: it may hold more than tensors, so no weights_only.
        Invalid(
            """\
            import torch as T
            device = T.device("cuda" if T.cuda.is_available() else "cpu")
            model = Net().to(device)
            checkpoint = T.load(args.resume)
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            start_epoch = checkpoint["epoch"]
            """,
            line=4,
            expected_fix="""\
            import torch as T
            device = T.device("cuda" if T.cuda.is_available() else "cpu")
            model = Net().to(device)
            checkpoint = T.load(args.resume, map_location="cpu")
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            start_epoch = checkpoint["epoch"]
            """,
        ),
        # Through a renaming of the keys; `weights_only` kept as it is.
        Invalid(
            """\
            from torch import load

            def restore(net, path):
                net.cuda()
                state = load(
                    path, weights_only=False,
                )
                state = {k.removeprefix("module."): v for k, v in state.items()}
                net.load_state_dict(state)
            """,
            line=5,
            expected_fix="""\
            from torch import load

            def restore(net, path):
                net.cuda()
                state = load(
                    path, weights_only=False, map_location="cpu",
                )
                state = {k.removeprefix("module."): v for k, v in state.items()}
                net.load_state_dict(state)
            """,
        ),
        # map_location names the GPU, and the state is copied into a model
        # already there: two copies at once (loading onto the CPU gives the
        # same model, load_state_dict copies onto each parameter's device).
        Invalid(
            """\
            import torch

            class Runner:
                def __init__(self, model):
                    self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                    self.model = model.to(self.device)

                def resume(self, path):
                    state = torch.load(path, map_location=self.device)
                    self.model.load_state_dict(state)
            """,
            line=9,
            expected_fix="""\
            import torch

            class Runner:
                def __init__(self, model):
                    self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                    self.model = model.to(self.device)

                def resume(self, path):
                    state = torch.load(path, map_location="cpu")
                    self.model.load_state_dict(state)
            """,
        ),
        # A checkpoint dict onto the GPU: reported, but the loaded dict may
        # hold tensors used on the GPU as they are (no certain fix).
        Invalid(
            """\
            import torch
            model = Net().cuda()
            checkpoint = torch.load(args.resume, map_location="cuda:0")
            model.load_state_dict(checkpoint["model"])
            anchors = checkpoint["anchors"]
            """,
            line=3,
            expected_fix=None,
        ),
        # The result is unused, but the file saved a GPU model's state there.
        Invalid(
            """\
            import torch
            heads = Heads().to(torch.accelerator.current_accelerator())
            torch.save(heads.state_dict(), os.path.join(out, "heads.pt"))
            heads_state = torch.load(os.path.join(out, "heads.pt"))
            """,
            line=4,
            expected_fix="""\
            import torch
            heads = Heads().to(torch.accelerator.current_accelerator())
            torch.save(heads.state_dict(), os.path.join(out, "heads.pt"))
            heads_state = torch.load(os.path.join(out, "heads.pt"), map_location="cpu")
            """,
        ),
        # A map_location that is None on the GPU path restores onto the GPU there.
        Invalid(
            """\
            import torch
            model = Net().cuda()
            where = "cpu" if args.cpu else None
            state = torch.load(args.ckpt, map_location=where)
            model.load_state_dict(state)
            """,
            line=4,
            expected_fix="""\
            import torch
            model = Net().cuda()
            where = "cpu" if args.cpu else None
            state = torch.load(args.ckpt, map_location="cpu")
            model.load_state_dict(state)
            """,
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        # The loads without `map_location`, decided once the whole file is
        # known (a checkpoint is often saved below the code that resumes it).
        self._loads: list[_Load] = []
        self._saves: list[_Save] = []
        # Per block, the models it moved to the CPU so far (`net.eval().cpu()`
        # before `torch.save(net.state_dict(), ...)`).
        self._on_cpu: list[set[str]] = [set()]

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._on_cpu.append(set())

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._on_cpu.pop()

    def visit_Call(self, node: cst.Call) -> None:
        moved = _move(node)
        if moved is not None:
            name, to_cpu = moved
            (self._on_cpu[-1].add if to_cpu else self._on_cpu[-1].discard)(name)
        qualified = self.context.call_name(node)
        if qualified == "torch.save":
            saved = get_arg(node, "obj", 0)
            if isinstance(saved, cst.Arg):
                self._saves.append(
                    _Save(
                        keys=frozenset(_path_keys(get_arg(node, "f", 1))),
                        on_cpu=_on_cpu(saved.value, self._on_cpu[-1]),
                        holds_state=_holds_state(saved.value),
                    )
                )
        elif qualified == "torch.load":
            location = get_arg(node, "map_location", 1)
            if location is not None and (not isinstance(location, cst.Arg) or has_splat(node)):
                return  # UNKNOWN via a splat: not a candidate
            tracker = self.context.tracker
            self._loads.append(_Load(node, tracker.current_function, tuple(tracker.statements), location))

    def leave_Module(self, original_node: cst.Module) -> None:
        if not self._loads:
            return
        context = self.context
        if not _uses_gpu(context) or _offloaded_to_cpu(context):
            return
        for load in self._loads:
            self._decide(load)

    def _decide(self, load: _Load) -> None:
        if load.location is not None and not self._may_be_none(load.location.value, load):
            self._decide_gpu_location(load, load.location)
            return
        node = load.call
        saved = [save for save in self._saves if _path_keys(get_arg(node, "f", 0)) & save.keys]
        if saved and all(save.on_cpu for save in saved):
            return
        if not saved and self._saves and all(save.on_cpu for save in self._saves):
            # Every checkpoint this file writes is on the CPU.
            return
        scope = scope_of(load.function, self.context.module)
        statement = load.path[-1] if load.path else None
        sinks = _state_sinks(_scope_index(self.context, scope), node, statement)
        if sinks is None and not any(save.holds_state and not save.on_cpu for save in saved):
            return
        whole = sinks is not None and sinks.whole_only
        weights_only = (
            whole and get_arg(node, "weights_only") is None and get_arg(node, "pickle_module", 2) is None
        )
        if load.location is None:
            without = "torch.load without map_location"
            fix = FixSpec(
                title='Pass `map_location="cpu"`' + (" and `weights_only=True`" if weights_only else ""),
                edits=add_map_location(node, weights_only=weights_only),
                applicability=Applicability.SAFE,
            )
        else:
            # `map_location=map_loc` that is None on some path.
            without = "torch.load with a None map_location"
            fix = FixSpec(
                title='Load onto the CPU: `map_location="cpu"`',
                edits=map_location_to_cpu(load.location),
                applicability=Applicability.SAFE,
            )
        message = f"{without} restores tensors onto the device they were saved from"
        stake = self._stake(load)
        if stake is not None:
            message = f"{without} puts {stake.text} back on the GPU it was saved from"
        self.context.add_report(
            deferred_report(
                self, node, message, fix, load.path, proven=stake is not None and stake.bytes >= 4 * MATTERS
            )
        )

    def _may_be_none(self, location: cst.BaseExpression, load: _Load, depth: int = 0) -> bool:
        """`map_location` is None on some path (`None`, `"cpu" if args.cpu else
        None`, a name every binding of which may be None): there `torch.load`
        runs as if it had none, and restores tensors where they were saved."""
        if type(location) is cst.Name and location.value == "None":
            return True
        if type(location) is cst.IfExp:
            return self._may_be_none(location.body, load, depth) or self._may_be_none(location.orelse, load, depth)
        if type(location) is cst.Name and depth < 3:
            program = program_of(self.context)
            scope = program.function(load.function) if load.function is not None else program.module
            if scope is None:
                return False
            return any(
                binding.value is not None and self._may_be_none(binding.value, load, depth + 1)
                for binding in program.lookup(location.value, scope)
            )
        return False

    def _decide_gpu_location(self, load: _Load, location: cst.Arg) -> None:
        """`map_location` names the GPU and the state goes into a model or an
        optimizer already there (their tensors are what `load_state_dict`
        copies into): the checkpoint is a second copy on the GPU."""
        context = self.context
        if device_facts(context, True).target_device(location.value) is not Device.GPU:
            return
        scope = scope_of(load.function, context.module)
        statement = load.path[-1] if load.path else None
        index = _scope_index(context, scope)
        sinks = _state_sinks(index, load.call, statement)
        if sinks is None or not _reaches_sink_by_access(index, load.call, statement):
            return
        where = context.code_for(location.value)
        call = f"torch.load(map_location={where})" if len(where) <= 40 and "\n" not in where else "torch.load"
        stake = self._stake(load)
        held = stake.text if stake is not None else "the checkpoint"
        # Onto the CPU instead: the same model (load_state_dict copies onto each
        # parameter's device), certain only when everything loaded goes there.
        fix = FixSpec(
            title='Load onto the CPU: `map_location="cpu"`',
            edits=map_location_to_cpu(location),
            applicability=Applicability.SAFE,
        ) if sinks.whole_only else None
        context.add_report(
            deferred_report(
                self, load.call, f"{call} builds {held} on the GPU beside the model it is loaded into",
                fix, load.path, proven=stake is not None and stake.bytes >= 4 * MATTERS,
            )
        )

    def _stake(self, load: _Load) -> Stake | None:
        """The checkpoint's size, from the model that loads it (`model.load_state_dict(...)`
        in the same function): a copy of its weights on the GPU beside the model."""
        program = program_of(self.context)
        scope = program.function(load.function) if load.function is not None else program.module
        if scope is None:
            return None
        largest = None
        states = 0
        for call in scope.calls:
            func = call.node.func
            if type(func) is cst.Attribute and func.attr.value == "load_state_dict":
                size = model_size(self.context, func.value, load.function)
                if size is not None and size.exact and (largest is None or size.parameters > largest.parameters):
                    largest = size
                states = max(states, self._optimizer_states(func.value, scope))
        if largest is None:
            return None
        weights = largest.parameters * 4
        if states:
            # The optimizer's state restored from the same checkpoint: fp32 tensors
            # shaped like the weights, `states` of them per parameter.
            total = weights * (1 + states)
            return Stake(total, f"≈ {format_bytes(total)} of weights and optimizer state")
        return Stake(weights, f"≈ {format_bytes(weights)} of weights ({parameter_count(largest.parameters)} parameters)")

    def _optimizer_states(self, receiver: cst.BaseExpression, scope: Function) -> int:
        """How many weight-shaped tensors per parameter the optimizer bound to
        `receiver` keeps (Adam's two moments, SGD's momentum buffer), when the
        scope makes it with a torch.optim class; 0 otherwise."""
        name = dotted_name(receiver)
        if name is None or "." in name:
            return 0
        found = 0
        for binding in program_of(self.context).lookup(name, scope):
            value = binding.value
            if type(value) is not cst.Call:
                continue
            qualified = self.context.qualified_name(value.func) or ""
            optimizer = qualified.removeprefix("torch.optim.").rpartition(".")[2]
            if not qualified.startswith("torch.optim."):
                continue
            if optimizer in _TWO_STATES:
                found = max(found, 2)
            elif optimizer in _ONE_STATE or optimizer == "SGD" and _nonzero(get_arg(value, "momentum")):
                found = max(found, 1)
        return found


# torch.optim classes by the weight-shaped fp32 states they keep per parameter.
_TWO_STATES = frozenset({"Adam", "AdamW", "NAdam", "RAdam", "Adamax"})
_ONE_STATE = frozenset({"Adagrad", "RMSprop", "Adadelta"})


def _nonzero(arg: object) -> bool:
    """A `momentum=` argument that is not the literal 0."""
    if not isinstance(arg, cst.Arg):
        return False
    value = arg.value
    return not (type(value) in (cst.Integer, cst.Float) and float(value.value) == 0)


@dataclass(frozen=True)
class _Load:
    """A `torch.load` without `map_location`, where the pass met it."""

    call: cst.Call
    function: cst.FunctionDef | None
    path: tuple[cst.CSTNode, ...]
    # The `map_location` argument, when the call passes one.
    location: cst.Arg | None = None


# `.load_state_dict` of these holds Python numbers or CPU state, not a model's tensors.
_SMALL_STATE_OWNERS = ("sched", "scaler", "sampler", "loader", "rng")


def _is_state_sink(call: cst.Call) -> bool:
    """`model.load_state_dict(...)`, `optimizer.load_state_dict(...)`,
    `set_peft_model_state_dict(...)`, `set_model_state_dict(...)`: where a
    model's or optimizer's tensors are copied in (not a scheduler's state)."""
    if isinstance(call.func, cst.Attribute):
        # `model.load_state_dict`, `self.lr_scheduler.load_state_dict`,
        # `net.cuda().load_state_dict`: the owner is what the method is called on.
        last = call.func.attr.value
        receiver = call.func.value
        while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute):
            receiver = receiver.func.value
        owner = (dotted_name(receiver) or "").rsplit(".", 1)[-1].lower()
    elif isinstance(call.func, cst.Name):
        last, owner = call.func.value, ""
    else:
        return False
    if "state_dict" not in last or not last.startswith(("load", "set", "_load", "_set")):
        return False
    return not any(word in owner for word in _SMALL_STATE_OWNERS)


@dataclass
class _Sinks:
    # Whether the loaded object only ever goes whole into a state sink
    # (`m.load_state_dict(torch.load(p))`, or through a name used nowhere else).
    whole_only: bool


@dataclass
class _ScopeIndex:
    """What `_state_sinks` reads of a scope, gathered in one walk and shared
    by every load of the scope."""

    scope: cst.CSTNode
    sinks: list[cst.Call] = field(default_factory=list)
    # Each binding's targets and the names its value mentions.
    bindings: list[tuple[list[cst.BaseExpression], frozenset[str]]] = field(default_factory=list)
    _reads: collections.Counter[str] | None = None

    def reads(self) -> collections.Counter[str]:
        """How often each plain name is read in the scope, nested scopes
        included (as `references` counts: not `obj.name`, not the keyword of
        `f(name=1)`). A walk of the whole scope: asked only when it decides."""
        if self._reads is None:
            self._reads = collections.Counter(names_read(self.scope))
        return self._reads


_SCOPE_INDEXES: weakref.WeakKeyDictionary[FileContext, dict[int, _ScopeIndex]] = weakref.WeakKeyDictionary()


def _scope_index(context: FileContext, scope: cst.CSTNode) -> _ScopeIndex:
    indexes = _SCOPE_INDEXES.setdefault(context, {})
    index = indexes.get(id(scope))
    if index is None:
        index = indexes[id(scope)] = _ScopeIndex(scope)
        for node in descendants(scope, skip=SCOPES):
            node_type = type(node)
            if node_type is cst.Call:
                if _is_state_sink(node):
                    index.sinks.append(node)
            elif node_type is cst.Assign:
                index.bindings.append(([target.target for target in node.targets], _names_in(node.value)))
            elif (node_type is cst.AugAssign or node_type is cst.AnnAssign) and node.value is not None:
                index.bindings.append(([node.target], _names_in(node.value)))
            elif node_type is cst.For:
                index.bindings.append(([node.target], _names_in(node.iter)))
    return index


def _names_in(expression: cst.CSTNode) -> frozenset[str]:
    """Every name in `expression`, attribute names included."""
    return frozenset(node.value for node in descendants(expression) if type(node) is cst.Name)


def _state_sinks(index: _ScopeIndex, load: cst.Call, statement: cst.CSTNode | None) -> _Sinks | None:
    """How the result of `load` reaches a state sink in the scope, or None
    when it does not: as an argument in the same statement, or through the
    names the statement assigns it to and the names computed from those (a
    renaming of the keys, `ckpt["model"]`)."""
    if statement is None:
        return None
    sinks = [
        node
        for node in descendants(statement, skip=SCOPES)
        if isinstance(node, cst.Call) and _is_state_sink(node)
    ]
    for sink in sinks:
        for arg in sink.args:
            if arg.value is load:
                return _Sinks(whole_only=True)
            if any(inner is load for inner in descendants(arg.value, skip=SCOPES)):
                return _Sinks(whole_only=False)
    assigned = _assigned_from(statement, load)
    if not assigned:
        return None
    tainted = set(assigned)
    derived = _derived_names(index, tainted)
    whole_uses = 0
    other_uses = 0
    reached = False
    for node in index.sinks:
        for arg in node.args:
            if isinstance(arg.value, cst.Name) and arg.value.value in assigned:
                reached = True
                whole_uses += 1
            elif any(
                isinstance(inner, cst.Name) and inner.value in derived for inner in descendants(arg.value)
            ):
                reached = True
                other_uses += 1
    if not reached:
        return None
    if other_uses or len(derived) != len(assigned):
        return _Sinks(whole_only=False)
    reads = sum(index.reads()[name] for name in assigned) - len(assigned)
    return _Sinks(whole_only=whole_uses == reads)


def _reaches_sink_by_access(index: _ScopeIndex, load: cst.Call, statement: cst.CSTNode | None) -> bool:
    """Whether what `load` returns is itself what a state sink copies: passed
    to it, or reached from it by indexing, attributes, methods and key
    renaming (`ckpt["model"].float().state_dict()`, `{k: v for k, v in
    state.items()}`), not by being handed to some other call (`Logger(...,
    torch.load(p).get("run_id"))`, whose result only depends on it)."""
    if statement is None:
        return False
    for node in descendants(statement, skip=SCOPES):
        if isinstance(node, cst.Call) and _is_state_sink(node):
            if any(_accessed_from(arg.value, lambda e: e is load) for arg in node.args):
                return True
    names = set(_assigned_from(statement, load))
    if not names:
        return False
    scope_statements = [n for n in descendants(index.scope, skip=SCOPES) if isinstance(n, cst.Assign)]
    changed = True
    while changed:
        changed = False
        for assign in scope_statements:
            if _accessed_from(assign.value, lambda e: isinstance(e, cst.Name) and e.value in names):
                for target in assign.targets:
                    if isinstance(target.target, cst.Name) and target.target.value not in names:
                        names.add(target.target.value)
                        changed = True
    return any(
        _accessed_from(arg.value, lambda e: isinstance(e, cst.Name) and e.value in names)
        for sink in index.sinks
        for arg in sink.args
    )


def _accessed_from(expr: cst.BaseExpression, is_root) -> bool:  # type: ignore[no-untyped-def]
    """`expr` is a root value, or reached from one by subscripts, attributes,
    method calls on it, or a comprehension over such a value."""
    while True:
        if is_root(expr):
            return True
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Attribute):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            expr = expr.func.value
        elif isinstance(expr, (cst.DictComp, cst.ListComp, cst.GeneratorExp)):
            expr = expr.for_in.iter
        else:
            return False


def _assigned_from(statement: cst.CSTNode, load: cst.Call) -> set[str]:
    """The plain name that `x = <... torch.load(...) ...>` binds, in a line
    of one or more simple statements."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    for small in statement.body:
        if (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and any(node is load for node in descendants(small.value, skip=SCOPES))
        ):
            return {small.targets[0].target.value}
    return set()


def _derived_names(index: _ScopeIndex, seeds: set[str]) -> set[str]:
    """`seeds` and the names computed from them in the scope: assigned from an
    expression that reads one, a loop over one, an item written into a
    dict from one (`new[k] = v`)."""
    names = set(seeds)
    changed = True
    while changed:
        changed = False
        for targets, value_names in index.bindings:
            if names.isdisjoint(value_names):
                continue
            for target in targets:
                for bound in _written_names(target):
                    if bound not in names:
                        names.add(bound)
                        changed = True
    return names


def _written_names(target: cst.BaseExpression) -> list[str]:
    """`x` for `x`, `x[k]`, `x.attr`; each name of a tuple target."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _written_names(element.value)]
    while isinstance(target, (cst.Subscript, cst.Attribute, cst.StarredElement)):
        target = target.value
    return [target.value] if isinstance(target, cst.Name) else []


def _path_keys(path: object) -> set[str]:
    """What ties a save to a load: the file names in the path (its string
    literals, `"feats.pth"`) and its constants (`SCALER_NAME`); for a path
    with neither, its attributes (`args.vector_cache`). The functions it
    calls (`os.path.join`) are not part of it."""
    if not isinstance(path, cst.Arg):
        return set()
    names: set[str] = set()
    attributes: set[str] = set()
    callees: set[int] = set()
    for node in descendants(path.value, skip=(cst.Attribute,)):
        if isinstance(node, cst.Call):
            callees.add(id(node.func))
        elif id(node) in callees:
            continue
        elif isinstance(node, (cst.SimpleString, cst.FormattedStringText)):
            value = string_value(node) if isinstance(node, cst.SimpleString) else node.value
            if value is not None and len(value) >= 4 and any(c.isalpha() for c in value):
                names.add(value)
        elif isinstance(node, cst.Name) and node.value.isupper() and len(node.value) > 1:
            names.add(node.value)
        elif isinstance(node, cst.Attribute) and (name := dotted_name(node)) is not None:
            attributes.add(name)
    return names or attributes


_MOVES = frozenset({"cpu", "cuda", "to"})
# Methods whose result is the receiver, for `net.eval().cpu()`.
_RETURNS_SELF = frozenset({"eval", "train", "float", "half", "bfloat16", "requires_grad_", "share_memory"})


def _move(expression: cst.BaseExpression) -> tuple[str, bool] | None:
    """For `net.cpu()`, `net.eval().to("cpu")`, `net.to(device).train()`:
    (the moved name, whether it ends on the CPU); None for anything else."""
    move: tuple[str, cst.Call] | None = None
    while (called := method_call(expression)) is not None:
        receiver, method = called
        if method in _MOVES:
            # The outermost move is the one that counts.
            if move is None and isinstance(expression, cst.Call):
                move = (method, expression)
        elif method not in _RETURNS_SELF:
            return None
        expression = receiver
    name = dotted_name(expression)
    if move is None or name is None:
        return None
    return name, _goes_to_cpu(*move)


def _goes_to_cpu(method: str, call: cst.Call) -> bool:
    if method == "cpu":
        return True
    if method != "to" or not call.args:
        return False
    first = call.args[0].value
    if string_value(first) == "cpu":
        return True
    return (
        isinstance(first, cst.Call)
        and dotted_name(first.func) in ("torch.device", "device")
        and bool(first.args)
        and string_value(first.args[0].value) == "cpu"
    )


@dataclass(frozen=True)
class _Save:
    """A `torch.save` call of the file."""

    # What ties it to a load (see `_path_keys`).
    keys: frozenset[str]
    on_cpu: bool
    # Whether it saves a model's or an optimizer's state.
    holds_state: bool


def _offloaded_to_cpu(context: FileContext) -> bool:
    """FSDP full state dicts gathered to the CPU (`FullStateDictConfig(offload_to_cpu=True)`)."""
    return "offload_to_cpu" in context.source and any(
        type(node) is cst.Arg
        and node.keyword is not None
        and node.keyword.value == "offload_to_cpu"
        and is_true(node.value)
        for node in descendants(context.module)
    )


_ACCELERATOR_RE = re.compile(r"\btorch\.accelerator\b|\bfrom\s+torch\s+import\b[^\n]*\baccelerator\b")


def _uses_gpu(context: FileContext) -> bool:
    """CUDA (`.cuda()`, "cuda" devices, `torch.cuda.*`), or torch's
    accelerator API (`torch.accelerator.current_accelerator()`)."""
    if file_uses_cuda(context):
        return True
    return _ACCELERATOR_RE.search(context.source) is not None and any(
        isinstance(node, cst.Attribute)
        and (context.qualified_name(node) or "").startswith("torch.accelerator.")
        for node in descendants(context.module)
    )


def _on_cpu(expression: cst.BaseExpression, on_cpu: set[str]) -> bool:
    """`x.cpu()`, `x.to("cpu")`, `x.numpy()`, `net.state_dict()` after
    `net.cpu()`, and containers of those."""
    if isinstance(expression, (cst.Dict, cst.List, cst.Tuple)):
        values = [
            element.value
            for element in expression.elements
            if isinstance(element, (cst.DictElement, cst.Element))
        ]
        return (
            bool(values)
            and len(values) == len(expression.elements)
            and all(_on_cpu(value, on_cpu) for value in values)
        )
    if isinstance(expression, (cst.DictComp, cst.ListComp)):
        return _on_cpu(expression.value if isinstance(expression, cst.DictComp) else expression.elt, on_cpu)
    called = method_call(expression)
    if called is None:
        return False
    receiver, method = called
    if method in ("numpy", "tolist", "item"):
        return True
    if method == "state_dict":
        return dotted_name(receiver) in on_cpu
    moved = _move(expression)
    return moved is not None and moved[1]


def _holds_state(expression: cst.BaseExpression) -> bool:
    """Whether a saved value holds a model's or an optimizer's `state_dict()`."""
    return any(
        isinstance(node, cst.Call)
        and (called := method_call(node)) is not None
        and called[1] == "state_dict"
        and not any(word in (dotted_name(called[0]) or "").lower() for word in _SMALL_STATE_OWNERS)
        for node in descendants(expression, skip=SCOPES)
    )
