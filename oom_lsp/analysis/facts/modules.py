"""The parameter count of the models the code builds or loads.

- `torch.nn` layers, from their constructor arguments (`layers`), and containers
  (`Sequential`, `ModuleList`, `ModuleDict`, lists built by comprehension or
  by `append` in a `for` over a `range`);
- a class of the file: the sum of the modules and `nn.Parameter`s its
  `__init__` assigns to `self` (and `super().__init__` of a class of the
  file), with the instantiation's arguments bound to its parameters,
  recursively (depth-capped); a submodule that is not understood makes the
  count a lower bound (`exact` False);
- known models (`known_models`): `X.from_pretrained("name")`, configs built
  in code, `timm.create_model`, `torchvision.models.*`, Stable Diffusion parts.
Wrappers that keep the parameters (`.to()`, `.cuda()`, `torch.compile`,
`DistributedDataParallel`, `get_peft_model`, ...) pass the count through.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.facts import known_models, layers
from oom_lsp.analysis.facts.bindings import Binding, BindingKind
from oom_lsp.analysis.facts.results import ModelSize
from oom_lsp.analysis.facts.tensors import TensorFacts
from oom_lsp.analysis.facts.values import (
    Definition,
    Evaluator,
    Frame,
    Items,
    Known,
    LibraryConfig,
    _merge,
    known_number,
)


@dataclass(frozen=True)
class _Model:
    parameters: int
    exact: bool = True
    evidence: tuple[str, ...] = ()
    default: bool = False
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    family: str | None = None
    name: str | None = None


_ZERO = _Model(0)
# Methods and wrappers that return the same parameters.
_SAME_MODEL_METHODS = frozenset({
    "to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train", "eval", "requires_grad_",
    "to_empty", "share_memory", "xpu", "type",
})  # fmt: skip
_WRAPPERS = frozenset({
    "torch.compile", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.fsdp.FullyShardedDataParallel", "torch.jit.script", "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "peft.get_peft_model", "peft.prepare_model_for_kbit_training", "torch.distributed.fsdp.fully_shard",
})  # fmt: skip
_WRAPPER_NAMES = frozenset({"DDP", "FSDP", "DataParallel", "DistributedDataParallel", "get_peft_model"})
# Names that are not modules even when capitalised and called.
_NOT_MODULE_SUFFIXES = ("Config", "Tokenizer", "Processor", "Dataset", "DataLoader", "Loader", "Optimizer", "Scheduler", "Error")
_MAX_UNROLL = 64


class ModelFacts:
    def __init__(self, evaluator: Evaluator, tensors: TensorFacts) -> None:
        self.evaluator = evaluator
        self.tensors = tensors
        self.context = evaluator.context
        self.index = evaluator.index
        self._classes: dict[tuple[cst.ClassDef, Frame | None], _Model | None] = {}

    def size(self, expr: cst.BaseExpression, frame: Frame) -> ModelSize | None:
        model = self.model(expr, frame)
        if model is None:
            return None
        evidence = ", ".join(model.evidence) or self.context.code_for(expr).strip()
        return ModelSize(
            parameters=model.parameters,
            exact=model.exact,
            evidence=evidence,
            from_default=model.default,
            layers=model.layers,
            hidden=model.hidden,
            heads=model.heads,
            vocab=model.vocab,
            family=model.family,
            name=model.name,
        )

    # --- dispatch -------------------------------------------------------------------------
    def model(self, expr: cst.BaseExpression, frame: Frame) -> _Model | None:
        self.evaluator.step(frame)
        kind = type(expr)
        if kind is cst.Name or kind is cst.Attribute:
            if kind is cst.Attribute and expr.attr.value == "module":  # DDP(model).module
                inner = self.model(expr.value, frame)
                if inner is not None:
                    return inner
            resolved = self.evaluator.resolve(expr, frame)
            return self.model(*resolved) if resolved is not None else None
        if kind is not cst.Call:
            return None
        func = expr.func
        qualified = self.context.qualified_name(func)
        last = (qualified or dotted_name(func) or "").rpartition(".")[2]
        if qualified is not None:
            if qualified.startswith("torch.nn.") and qualified.count(".") == 2:
                return self.layer(last, expr, frame)
            if qualified in _WRAPPERS:
                return self.model(expr.args[0].value, frame) if expr.args else None
            if qualified in ("timm.create_model", "timm.models.create_model"):
                return self.vision(expr, frame, known_models.timm_model)
            if qualified.startswith("torchvision.models."):
                return self.torchvision(qualified, expr, frame)
        if type(func) is cst.Attribute:
            method = func.attr.value
            if method in _SAME_MODEL_METHODS:
                return self.model(func.value, frame)
            if method == "from_pretrained":
                return self.pretrained(func.value, expr, frame)
            if method == "from_config":
                return self.configured(func.value, expr.args[0].value if expr.args else None, frame)
            if method == "prepare" and len(expr.args) == 1:  # accelerator.prepare(model)
                return self.model(expr.args[0].value, frame)
        if last in _WRAPPER_NAMES and expr.args and qualified is None or (qualified or "").endswith(("DistributedDataParallel", "FullyShardedDataParallel")):
            return self.model(expr.args[0].value, frame) if expr.args else None
        if qualified is not None and known_models.model_class(last) is not None and expr.args:
            return self.configured(func, expr.args[0].value, frame)
        if qualified is None:
            target = self.evaluator.evaluate(func, frame) if type(func) in (cst.Name, cst.Attribute) else None
            if type(target) is Definition:
                if type(target.node) is cst.ClassDef:
                    return self.instance(target.node, expr, frame)
                return self.function_result(target.node, expr, frame)
        return None

    # --- torch.nn ------------------------------------------------------------------------
    def layer(self, name: str, call: cst.Call, frame: Frame) -> _Model | None:
        if layers.is_parameter_free(name):
            return _ZERO
        if name in ("Sequential", "ModuleList", "ParameterList"):
            if name == "Sequential" and len(call.args) == 1 and not call.args[0].star:
                ordered = self.ordered_dict_values(call.args[0].value, frame)
                if ordered is not None:
                    return ordered
            if name == "Sequential":
                return self.total(self.members_of_args(call, frame))
            return self.total(self.members(call.args[0].value, frame)) if call.args else _ZERO
        if name in ("ModuleDict", "ParameterDict"):
            if not call.args:
                return _ZERO
            return self.ordered_dict_values(call.args[0].value, frame)
        if name == "Parameter":
            tensor = self.tensors.tensor(call.args[0].value, frame) if call.args else None
            elements = tensor.elements() if tensor is not None else None
            if elements is None:
                return None
            return _Model(elements, evidence=tensor.evidence, default=tensor.default)
        args = layers.bind(name, call, frame, self.evaluator)
        if args is None:
            return None
        if name in ("TransformerEncoder", "TransformerDecoder"):
            return self.transformer_stack(name, args, frame)
        counted = layers.count_layer(name, args)
        if counted is None:
            return None
        return _Model(counted.parameters, True, counted.evidence, counted.default, **counted.shape)  # type: ignore[arg-type]

    def transformer_stack(self, name: str, args: dict[str, object], frame: Frame) -> _Model | None:
        """`nn.TransformerEncoder(layer, num_layers, norm)`: the layer's parameters, num_layers times, and the norm's."""
        key = "encoder_layer" if name == "TransformerEncoder" else "decoder_layer"
        layers_count = known_number(args.get("num_layers"))  # type: ignore[arg-type]
        inner = self.model(args[f"{key}:expr"], frame) if f"{key}:expr" in args else None  # type: ignore[arg-type]
        norm = args.get("norm:expr")
        norm_model = self.model(norm, frame) if norm is not None else _ZERO  # type: ignore[arg-type]
        if layers_count is None or not isinstance(layers_count.value, int) or inner is None or norm_model is None:
            return None
        return _Model(
            layers_count.value * inner.parameters + norm_model.parameters,
            inner.exact and norm_model.exact,
            _merge(layers_count.evidence, inner.evidence),
            layers_count.default or inner.default,
            layers=layers_count.value,
            hidden=inner.hidden,
            heads=inner.heads,
        )

    # --- containers --------------------------------------------------------------------
    def total(self, members: list[_Model | None] | None) -> _Model | None:
        if members is None:
            return None
        known = [member for member in members if member is not None]
        if not known and members:
            return None
        return _Model(
            sum(member.parameters for member in known),
            all(member.exact for member in known) and len(known) == len(members),
            _merge(*[member.evidence for member in known]),
            any(member.default for member in known),
        )

    def members_of_args(self, call: cst.Call, frame: Frame) -> list[_Model | None] | None:
        members: list[_Model | None] = []
        for arg in call.args:
            if arg.keyword is not None:
                continue
            if arg.star == "*":
                inner = self.members(arg.value, frame)
                if inner is None:
                    return None
                members.extend(inner)
            elif arg.star:
                return None
            else:
                members.append(self.model(arg.value, frame))
        return members

    def members(self, expr: cst.BaseExpression, frame: Frame, depth: int = 0) -> list[_Model | None] | None:
        """The modules an iterable expression holds."""
        self.evaluator.step(frame)
        kind = type(expr)
        if kind in (cst.List, cst.Tuple):
            members: list[_Model | None] = []
            for element in expr.elements:
                if type(element) is cst.StarredElement:
                    inner = self.members(element.value, frame, depth)
                    if inner is None:
                        return None
                    members.extend(inner)
                else:
                    members.append(self.model(element.value, frame))
            return members
        if kind in (cst.ListComp, cst.GeneratorExp):
            return self.comprehension(expr, frame)
        if kind is cst.BinaryOperation and type(expr.operator) is cst.Add:
            left, right = self.members(expr.left, frame, depth), self.members(expr.right, frame, depth)
            return None if left is None or right is None else left + right
        if kind is cst.BinaryOperation and type(expr.operator) is cst.Multiply:
            count = known_number(self.evaluator.evaluate(expr.right, frame))
            inner = self.members(expr.left, frame, depth)
            if inner is None or count is None or not isinstance(count.value, int):
                return None
            return inner * count.value
        if kind is cst.Name or kind is cst.Attribute:
            if depth > 4:
                return None
            dotted = dotted_name(expr)
            resolved = self.evaluator.resolve(expr, frame)
            if resolved is None:
                return None
            value, where = resolved
            members = self.members(value, where, depth + 1)
            if members is None or dotted is None:
                return members
            grown = self.appended(dotted, where)
            return None if grown is None else members + grown
        return None

    def appended(self, receiver: str, frame: Frame) -> list[_Model | None] | None:
        """`layers.append(block)` (in loops over known ranges) in the receiver's scope."""
        members: list[_Model | None] = []
        for call in self.index.method_calls_on(receiver, frame.scope):
            if call.method not in ("append", "extend", "add_module") or not call.call.args:
                continue
            loops = self.index.enclosing_loops(call.statement, frame.scope)
            item = call.call.args[-1].value
            found = self.repeated(item, loops, frame, extend=call.method == "extend")
            if found is None:
                return None
            members.extend(found)
        return members

    def repeated(
        self, item: cst.BaseExpression, loops: list[cst.For | cst.While], frame: Frame, *, extend: bool
    ) -> list[_Model | None] | None:
        """`item` evaluated once per iteration of the enclosing `for` loops."""
        if any(type(loop) is not cst.For for loop in loops):
            return None
        return self.iterated(item, [(loop.target, loop.iter) for loop in loops], frame, extend=extend)

    def comprehension(self, expr: cst.ListComp | cst.GeneratorExp, frame: Frame) -> list[_Model | None] | None:
        clause = expr.for_in
        if clause.inner_for_in is not None or clause.ifs:
            return None
        return self.iterated(expr.elt, [(clause.target, clause.iter)], frame, extend=False)

    def iterated(
        self,
        item: cst.BaseExpression,
        clauses: list[tuple[cst.BaseExpression, cst.BaseExpression]],
        frame: Frame,
        *,
        extend: bool,
    ) -> list[_Model | None] | None:
        """`item` once per combination of the `for` clauses' values (`for target in iterable`):
        evaluated once and repeated when it does not read the targets, else unrolled (capped)."""
        overlays: list[dict[str, object]] = [{}]
        names: set[str] = set()
        for target, iterable in clauses:
            values = self.evaluator.evaluate(iterable, frame)
            targets = _target_names(target)
            if type(values) is not Items or targets is None:
                return None
            names.update(targets)
            overlays = [
                {**overlay, **{name: (value if len(targets) == 1 else None) for name in targets}}
                for overlay in overlays
                for value in values.items
            ]
            if len(overlays) > 4096:
                return None
        if not _names_in(item) & names:
            hidden = replace(frame, overlay={**frame.overlay, **{name: None for name in names}})
            one = self.members(item, hidden) if extend else [self.model(item, hidden)]
            return None if one is None else one * len(overlays)
        if len(overlays) > _MAX_UNROLL:
            return None
        members: list[_Model | None] = []
        for overlay in overlays:
            inner = replace(frame, overlay={**frame.overlay, **overlay})
            one = self.members(item, inner) if extend else [self.model(item, inner)]
            if one is None:
                return None
            members.extend(one)
        return members

    def ordered_dict_values(self, expr: cst.BaseExpression, frame: Frame) -> _Model | None:
        """`OrderedDict([("fc", nn.Linear(...)), ...])`, `{"fc": nn.Linear(...)}`."""
        if type(expr) is cst.Dict:
            return self.total([self.model(element.value, frame) for element in expr.elements if type(element) is cst.DictElement])
        if type(expr) is cst.Call and (dotted_name(expr.func) or "").endswith("OrderedDict") and expr.args:
            pairs = expr.args[0].value
            if type(pairs) in (cst.List, cst.Tuple):
                values = []
                for element in pairs.elements:
                    pair = element.value
                    if type(pair) is not cst.Tuple or len(pair.elements) != 2:
                        return None
                    values.append(self.model(pair.elements[1].value, frame))
                return self.total(values)
        return None

    # --- classes and functions of the file ---------------------------------------------------
    def instance(self, cls: cst.ClassDef, call: cst.Call | None, frame: Frame) -> _Model | None:
        init = self.evaluator.find_method(cls, "__init__")
        if init is None:
            return None
        if call is None or not call.args:
            key: tuple[cst.ClassDef, Frame | None] = (cls, None)
            init_frame = self.evaluator.frame_for(init[1])
        else:
            init_frame = self.evaluator.enter(init[1], call, frame, skip_self=True)
            key = (cls, init_frame)
        if key in self._classes:
            return self._classes[key]
        self._classes[key] = None  # recursion guard
        model = self.class_parameters(cls, init[0], init[1], init_frame)
        if model is not None and model.parameters == 0 and not self.subclasses_module(cls):
            model = None
        if model is not None:
            # Named by its instantiation; of the figures inside, only the defaults (which a caller may change).
            spelled = self.context.code_for(call).strip() if call is not None else f"{cls.name.value}()"
            if len(spelled) > 60 or "\n" in spelled:
                spelled = f"{cls.name.value}(...)"
            defaults = tuple(part for part in model.evidence if "default)" in part)
            model = replace(model, evidence=(spelled, *defaults))
        self._classes[key] = model
        return model

    def subclasses_module(self, cls: cst.ClassDef) -> bool:
        for owner in self.evaluator.lineage(cls):
            for base in owner.bases:
                qualified = self.context.qualified_name(base.value) or dotted_name(base.value) or ""
                if qualified.endswith(("Module", "LightningModule", "PreTrainedModel", "ModelMixin")):
                    return True
        return False

    def class_parameters(self, cls: cst.ClassDef, owner: cst.ClassDef, init: cst.FunctionDef, frame: Frame) -> _Model | None:
        """The parameters `init` (of `owner`, a class in `cls`'s lineage) assigns to `self`."""
        parts: list[_Model | None] = []
        attributes = self.index.self_bindings.get(owner, {})
        for attribute, bindings in attributes.items():
            mine = [b for b in bindings if self.index.scope_of.get(b.statement) is init]
            if not mine:
                continue
            parts.append(self.attribute_parameters(f"self.{attribute}", mine, frame))
        for method in ("add_module", "register_parameter", "register_module"):
            for call in self.index.method_calls_on("self", init):
                if call.method != method or len(call.call.args) < 2:
                    continue
                loops = self.index.enclosing_loops(call.statement, init)
                found = self.repeated(call.call.args[1].value, loops, frame, extend=False)
                parts.extend(found if found is not None else [None])
        super_call = self.super_init_call(init)
        if super_call is not None:
            lineage = self.evaluator.lineage(cls)
            later = lineage[lineage.index(owner) + 1 :] if owner in lineage else []
            for base in later:
                base_init = self.index.methods.get(base, {}).get("__init__")
                if base_init is not None:
                    base_frame = self.evaluator.enter(base_init, super_call, frame, skip_self=True)
                    parts.append(self.class_parameters(cls, base, base_init, base_frame))
                    break
        parts = [part for part in parts if part is not _NOT_A_MODULE]
        if not parts:
            return _ZERO
        return self.total(parts) or _Model(0, exact=False)

    def attribute_parameters(self, target: str, bindings: list[Binding], frame: Frame) -> _Model | None:
        """What `self.<attr> = ...` adds: a module's parameters, a container's
        (with the `append`s made on it), or nothing for a plain value."""
        values = []
        for binding in bindings:
            if binding.kind is not BindingKind.VALUE:
                continue
            values.append(self.assigned(binding.value, frame))
        grown = self.appended(target, frame)
        values = [value for value in values if value is not _NOT_A_MODULE]
        if not values:
            return _NOT_A_MODULE if not grown else self.total(grown)
        if grown:
            extra = self.total(grown)
            values = [self.total([value, extra]) if value is not None else None for value in values]
        if any(value is None for value in values):
            return None
        if len({value.parameters for value in values}) > 1:  # alternative branches: at least the smallest
            smallest = min(values, key=lambda value: value.parameters)
            return replace(smallest, exact=False)
        return values[0]

    def assigned(self, expr: cst.BaseExpression, frame: Frame) -> _Model | None:
        try:
            model = self.model(expr, frame)
        except RecursionError:
            model = None
        if model is not None:
            return model
        if type(expr) in (cst.List, cst.ListComp):
            return _NOT_A_MODULE  # a plain list of modules registers nothing
        return None if self.looks_like_module(expr, frame) else _NOT_A_MODULE

    def looks_like_module(self, expr: cst.BaseExpression, frame: Frame) -> bool:
        """A value that is probably a module we could not size: a call of a
        capitalised class that is not a config, tokenizer, dataset, ..."""
        if type(expr) in (cst.Name, cst.Attribute):
            resolved = self.evaluator.resolve(expr, frame)
            return resolved is not None and type(resolved[0]) is cst.Call and self.looks_like_module(*resolved)
        if type(expr) is not cst.Call:
            return False
        qualified = self.context.qualified_name(expr.func) or dotted_name(expr.func) or ""
        last = qualified.rpartition(".")[2]
        if qualified.startswith("torch.nn.") and last[:1].isupper():
            return True
        if type(expr.func) is cst.Attribute and expr.func.attr.value in ("from_pretrained", "create_model"):
            return True
        return last[:1].isupper() and not last.endswith(_NOT_MODULE_SUFFIXES) and not qualified.startswith(("torch.", "numpy."))

    def super_init_call(self, init: cst.FunctionDef) -> cst.Call | None:
        for call in self._expression_calls(init):
            func = call.func
            if type(func) is cst.Attribute and func.attr.value == "__init__":
                receiver = func.value
                if type(receiver) is cst.Call and dotted_name(receiver.func) == "super":
                    return call
        return None

    def _expression_calls(self, scope: cst.FunctionDef) -> list[cst.Call]:
        calls = []
        for statement in self.index.statements.get(scope, ()):
            if type(statement) is cst.SimpleStatementLine:
                for small in statement.body:
                    if type(small) is cst.Expr and type(small.value) is cst.Call:
                        calls.append(small.value)
        return calls

    def function_result(self, function: cst.FunctionDef, call: cst.Call, frame: Frame) -> _Model | None:
        """A factory of the file: the model its `return` builds."""
        if function in self.index.class_of_method:
            return None
        callee = self.evaluator.enter(function, call, frame, skip_self=False)
        results = self.evaluator.return_expressions(function)
        if len(results) != 1:
            return None
        return self.model(results[0], callee)

    # --- known models ---------------------------------------------------------------
    def pretrained(self, owner: cst.BaseExpression, call: cst.Call, frame: Frame) -> _Model | None:
        class_name = self.context.qualified_name(owner) or dotted_name(owner)
        if class_name is None or not call.args or call.args[0].keyword is not None:
            return None
        name = self.evaluator.evaluate(call.args[0].value, frame)
        if type(name) is not Known or not isinstance(name.value, str):
            return None
        last = class_name.rpartition(".")[2]
        if last.endswith("Config") or last.endswith("Tokenizer") or last.endswith("Processor"):
            return None
        subfolder = None
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "subfolder":
                value = self.evaluator.evaluate(arg.value, frame)
                subfolder = value.value if type(value) is Known and isinstance(value.value, str) else None
        found = known_models.diffusers_part(name.value, last, subfolder) if class_name.startswith("diffusers") or last in (
            "UNet2DConditionModel", "AutoencoderKL") or last.endswith("Pipeline") else None
        if found is None:
            found = known_models.pretrained(name.value, last)
        if found is None:
            return None
        label = f"{found.name} ({found.parameters / 1e6:,.1f}M parameters, known model)"
        return _from_known(found, _merge(name.evidence, (label,)), name.default)

    def configured(self, owner: cst.BaseExpression, config: cst.BaseExpression | None, frame: Frame) -> _Model | None:
        """`GPT2LMHeadModel(config)`, `AutoModelForCausalLM.from_config(config)`."""
        if config is None:
            return None
        class_name = (self.context.qualified_name(owner) or dotted_name(owner) or "").rpartition(".")[2]
        value = self.evaluator.evaluate(config, frame)
        if type(value) is not LibraryConfig:
            return None
        model_type = known_models.config_family(value.class_name)
        if model_type is None and value.checkpoint is not None:
            entry = known_models.checkpoint_config(value.checkpoint)
            model_type = entry.get("model_type") if entry else None  # type: ignore[assignment]
        if model_type is None:
            return None
        found_class = known_models.model_class(class_name)
        if found_class is not None:
            family, head = found_class
            if family != model_type:
                return None
        elif class_name.startswith("AutoModel"):
            head = "lm" if class_name in ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM") else "base"
        else:
            return None
        fields: dict[str, object] = {}
        evidence: tuple[str, ...] = ()
        default = False
        for key, item in value.fields.items():
            field_value = self.evaluator.value_of(item, key)
            if type(field_value) is not Known:
                return None
            fields[key] = field_value.value
            evidence = _merge(evidence, field_value.evidence)
            default = default or field_value.default
        # `config.n_layer = 6` after the config was built.
        if type(config) is cst.Name:
            for key in _config_keys(model_type):
                found = self.evaluator.find_dotted(f"{config.value}.{key}", config, frame)
                if found is not None:
                    override = self.evaluator.binding_value(found[0], found[1], f"{config.value}.{key}")
                    if type(override) is not Known:
                        return None
                    fields[key] = override.value
                    evidence = _merge(evidence, override.evidence)
        result = known_models.from_config(model_type, head, fields, value.checkpoint)
        if result is None:
            return None
        label = f"{value.class_name}({', '.join(f'{k}={v}' for k, v in fields.items())})"
        return _from_known(result, _merge((label,), evidence), default)

    def vision(self, call: cst.Call, frame: Frame, lookup) -> _Model | None:  # type: ignore[no-untyped-def]
        if not call.args or call.args[0].keyword is not None:
            return None
        name = self.evaluator.evaluate(call.args[0].value, frame)
        if type(name) is not Known or not isinstance(name.value, str):
            return None
        classes = self.num_classes(call, frame)
        if classes is False:
            return None
        found = lookup(name.value, classes)
        if found is None:
            return None
        return _from_known(found, _merge(name.evidence, (f"{found.name} ({found.parameters / 1e6:,.1f}M parameters, known model)",)), name.default)

    def torchvision(self, qualified: str, call: cst.Call, frame: Frame) -> _Model | None:
        last = qualified.rpartition(".")[2]
        if last == "get_model":
            return self.vision(call, frame, known_models.torchvision_model)
        classes = self.num_classes(call, frame)
        if classes is False:
            return None
        found = known_models.torchvision_model(last, classes)
        if found is None:
            return None
        return _from_known(found, (f"{last} ({found.parameters / 1e6:,.1f}M parameters, known model)",), False)

    def num_classes(self, call: cst.Call, frame: Frame) -> int | None | bool:
        """`num_classes=` when given: an int, None when absent, False when unreadable."""
        for arg in call.args:
            if arg.star == "**":
                return False
            if arg.keyword is not None and arg.keyword.value == "num_classes":
                value = known_number(self.evaluator.evaluate(arg.value, frame))
                return int(value.value) if value is not None else False
        return None


class _NotAModule:
    """Marks an assignment to `self` that holds no parameters (a number, a list, a function)."""


_NOT_A_MODULE = _NotAModule()  # type: ignore[assignment]


def _from_known(found: known_models.KnownModel, evidence: tuple[str, ...], default: bool) -> _Model:
    return _Model(
        parameters=found.parameters,
        exact=found.exact,
        evidence=evidence,
        default=default,
        layers=found.layers,
        hidden=found.hidden,
        heads=found.heads,
        vocab=found.vocab,
        family=found.family,
        name=found.name,
    )


def _target_names(target: cst.BaseExpression) -> list[str] | None:
    if type(target) is cst.Name:
        return [target.value]
    if type(target) in (cst.Tuple, cst.List):
        names = []
        for element in target.elements:
            inner = _target_names(element.value)
            if inner is None:
                return None
            names.extend(inner)
        return names
    return None


def _names_in(expr: cst.CSTNode) -> set[str]:
    found = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if type(node) is cst.Name:
            found.add(node.value)
        stack.extend(child for child in node.children)
    return found


def _config_keys(model_type: str) -> tuple[str, ...]:
    return {
        "gpt2": ("n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions"),
        "t5": ("num_layers", "num_decoder_layers", "d_model", "d_ff", "d_kv", "num_heads", "vocab_size"),
    }.get(model_type, (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "max_position_embeddings", "head_dim", "tie_word_embeddings",
    ))  # fmt: skip
