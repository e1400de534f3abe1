"""The parameter count of the models the code builds or loads.

- `torch.nn` layers, from their constructor arguments (the formulas follow
  torch's `reset_parameters`: weights, biases, affine norms, gates of the
  recurrent layers, in/out projections of attention), and containers
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

import math
from dataclasses import dataclass, replace

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.facts import known_models
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
# Layers without parameters (activations, pooling, dropout, reshaping, padding, losses).
_PARAMETER_FREE = frozenset({
    "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Tanh", "Sigmoid", "Softmax", "Softmax2d", "LogSoftmax", "Softmin",
    "ELU", "CELU", "SELU", "LeakyReLU", "Softplus", "Softsign", "Hardswish", "Hardsigmoid", "Hardtanh",
    "Hardshrink", "Softshrink", "Tanhshrink", "LogSigmoid", "Threshold", "GLU",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout", "Identity",
    "Flatten", "Unflatten", "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle",
    "PixelUnshuffle", "ChannelShuffle", "Fold", "Unfold", "CosineSimilarity", "PairwiseDistance",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "LPPool1d", "LPPool2d", "LPPool3d", "FractionalMaxPool2d", "FractionalMaxPool3d", "MaxUnpool1d",
    "MaxUnpool2d", "MaxUnpool3d", "ZeroPad1d", "ZeroPad2d", "ZeroPad3d", "ConstantPad1d", "ConstantPad2d",
    "ConstantPad3d", "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d",
    "ReplicationPad2d", "ReplicationPad3d", "CircularPad1d", "CircularPad2d", "CircularPad3d",
})  # fmt: skip
# Layer signatures: positional parameter names and defaults (torch 2.13).
_SIGNATURES: dict[str, tuple[tuple[str, object], ...]] = {
    "Linear": (("in_features", None), ("out_features", None), ("bias", True)),
    "Bilinear": (("in1_features", None), ("in2_features", None), ("out_features", None), ("bias", True)),
    "Embedding": (("num_embeddings", None), ("embedding_dim", None)),
    "EmbeddingBag": (("num_embeddings", None), ("embedding_dim", None)),
    "LayerNorm": (("normalized_shape", None), ("eps", 1e-5), ("elementwise_affine", True), ("bias", True)),
    "RMSNorm": (("normalized_shape", None), ("eps", None), ("elementwise_affine", True)),
    "GroupNorm": (("num_groups", None), ("num_channels", None), ("eps", 1e-5), ("affine", True)),
    "PReLU": (("num_parameters", 1),),
    "MultiheadAttention": (
        ("embed_dim", None), ("num_heads", None), ("dropout", 0.0), ("bias", True), ("add_bias_kv", False),
        ("add_zero_attn", False), ("kdim", None), ("vdim", None),
    ),
    "TransformerEncoderLayer": (
        ("d_model", None), ("nhead", None), ("dim_feedforward", 2048), ("dropout", 0.1), ("activation", None),
        ("layer_norm_eps", 1e-5), ("batch_first", False), ("norm_first", False), ("bias", True),
    ),
    "TransformerDecoderLayer": (
        ("d_model", None), ("nhead", None), ("dim_feedforward", 2048), ("dropout", 0.1), ("activation", None),
        ("layer_norm_eps", 1e-5), ("batch_first", False), ("norm_first", False), ("bias", True),
    ),
    "TransformerEncoder": (("encoder_layer", None), ("num_layers", None), ("norm", None)),
    "TransformerDecoder": (("decoder_layer", None), ("num_layers", None), ("norm", None)),
    "Transformer": (
        ("d_model", 512), ("nhead", 8), ("num_encoder_layers", 6), ("num_decoder_layers", 6),
        ("dim_feedforward", 2048), ("dropout", 0.1), ("activation", None), ("custom_encoder", None),
        ("custom_decoder", None), ("layer_norm_eps", 1e-5), ("batch_first", False), ("norm_first", False),
        ("bias", True),
    ),
    "LSTM": (
        ("input_size", None), ("hidden_size", None), ("num_layers", 1), ("bias", True), ("batch_first", False),
        ("dropout", 0.0), ("bidirectional", False), ("proj_size", 0),
    ),
    "GRU": (
        ("input_size", None), ("hidden_size", None), ("num_layers", 1), ("bias", True), ("batch_first", False),
        ("dropout", 0.0), ("bidirectional", False),
    ),
    "RNN": (
        ("input_size", None), ("hidden_size", None), ("num_layers", 1), ("nonlinearity", "tanh"), ("bias", True),
        ("batch_first", False), ("dropout", 0.0), ("bidirectional", False),
    ),
    "LSTMCell": (("input_size", None), ("hidden_size", None), ("bias", True)),
    "GRUCell": (("input_size", None), ("hidden_size", None), ("bias", True)),
    "RNNCell": (("input_size", None), ("hidden_size", None), ("bias", True)),
}  # fmt: skip
for _dims in (1, 2, 3):
    _SIGNATURES[f"Conv{_dims}d"] = (
        ("in_channels", None), ("out_channels", None), ("kernel_size", None), ("stride", 1), ("padding", 0),
        ("dilation", 1), ("groups", 1), ("bias", True),
    )  # fmt: skip
    _SIGNATURES[f"ConvTranspose{_dims}d"] = (
        ("in_channels", None), ("out_channels", None), ("kernel_size", None), ("stride", 1), ("padding", 0),
        ("output_padding", 0), ("groups", 1), ("bias", True), ("dilation", 1),
    )  # fmt: skip
    for _norm in ("BatchNorm", "InstanceNorm", "LazyBatchNorm"):
        _SIGNATURES[f"{_norm}{_dims}d"] = (("num_features", None), ("eps", 1e-5), ("momentum", 0.1), ("affine", _norm != "InstanceNorm"))
_SIGNATURES["SyncBatchNorm"] = _SIGNATURES["BatchNorm1d"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1, "LSTMCell": 4, "GRUCell": 3, "RNNCell": 1}
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
        if name in _PARAMETER_FREE or name.endswith("Loss"):
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
        signature = _SIGNATURES.get(name)
        if signature is None:
            return None
        args = self.bind(signature, call, frame)
        if args is None:
            return None
        return self.layer_formula(name, args, call, frame)

    def bind(self, signature: tuple[tuple[str, object], ...], call: cst.Call, frame: Frame) -> dict[str, object] | None:
        """The layer's arguments by name: Known values, or the raw expression
        for module-valued ones (`encoder_layer`)."""
        names = [name for name, _ in signature]
        bound: dict[str, object] = {name: Known(default) for name, default in signature}
        expressions: dict[str, cst.BaseExpression] = {}
        position = 0
        for arg in call.args:
            if arg.star:
                return None
            if arg.keyword is not None:
                key = arg.keyword.value
            elif position < len(names):
                key = names[position]
                position += 1
            else:
                continue
            expressions[key] = arg.value
        for key, expr in expressions.items():
            bound[key] = self.evaluator.evaluate(expr, frame)
            bound[f"{key}:expr"] = expr
        return bound

    def layer_formula(self, name: str, args: dict[str, object], call: cst.Call, frame: Frame) -> _Model | None:
        numbers: dict[str, int] = {}
        evidence: tuple[str, ...] = ()
        default = False

        def number(key: str) -> int | None:
            nonlocal evidence, default
            value = known_number(args.get(key))  # type: ignore[arg-type]
            if value is None or not isinstance(value.value, int):
                return None
            evidence = _merge(evidence, value.evidence)
            default = default or value.default
            return value.value

        def flag(key: str) -> bool | None:
            value = args.get(key)
            if type(value) is Known and isinstance(value.value, bool):
                return value.value
            if type(value) is Known and value.value is None:
                return False
            return None

        def shape_product(key: str) -> int | None:
            nonlocal evidence, default
            value = args.get(key)
            if type(value) is Items:
                dims = [known_number(item) for item in value.items]  # type: ignore[arg-type]
                if any(dim is None or not isinstance(dim.value, int) for dim in dims):
                    return None
                for dim in dims:
                    evidence = _merge(evidence, dim.evidence)  # type: ignore[union-attr]
                    default = default or dim.default  # type: ignore[union-attr]
                return math.prod(dim.value for dim in dims)  # type: ignore[union-attr,misc]
            return number(key)

        count: int | None = None
        shape: dict[str, int | None] = {}
        if name == "Linear":
            a, b, bias = number("in_features"), number("out_features"), flag("bias")
            if None not in (a, b, bias):
                count = a * b + (b if bias else 0)  # type: ignore[operator]
                shape = {"hidden": b}
        elif name == "Bilinear":
            a, b, c, bias = number("in1_features"), number("in2_features"), number("out_features"), flag("bias")
            if None not in (a, b, c, bias):
                count = a * b * c + (c if bias else 0)  # type: ignore[operator]
        elif name in ("Embedding", "EmbeddingBag"):
            a, b = number("num_embeddings"), number("embedding_dim")
            if None not in (a, b):
                count = a * b  # type: ignore[operator]
                shape = {"vocab": a, "hidden": b}
        elif name == "LayerNorm":
            size, affine, bias = shape_product("normalized_shape"), flag("elementwise_affine"), flag("bias")
            if None not in (size, affine, bias):
                count = (size * (2 if bias else 1)) if affine else 0  # type: ignore[operator]
        elif name == "RMSNorm":
            size, affine = shape_product("normalized_shape"), flag("elementwise_affine")
            if None not in (size, affine):
                count = size if affine else 0
        elif name == "GroupNorm":
            channels, affine = number("num_channels"), flag("affine")
            if None not in (channels, affine):
                count = 2 * channels if affine else 0  # type: ignore[operator]
        elif "BatchNorm" in name or name.startswith("InstanceNorm"):
            features, affine = number("num_features"), flag("affine")
            if None not in (features, affine):
                count = 2 * features if affine else 0  # type: ignore[operator]
        elif name == "PReLU":
            count = number("num_parameters")
        elif name.startswith("Conv"):
            count = self.convolution(name, args, number, flag)
        elif name in _GATES:
            count = self.recurrent(name, number, flag)
            shape = {"layers": number("num_layers") if "num_layers" in args else 1, "hidden": number("hidden_size")}
        elif name == "MultiheadAttention":
            embed, heads, bias, bias_kv = number("embed_dim"), number("num_heads"), flag("bias"), flag("add_bias_kv")
            kdim = number("kdim") if args.get("kdim") != Known(None) else embed
            vdim = number("vdim") if args.get("vdim") != Known(None) else embed
            if None not in (embed, heads, bias, bias_kv, kdim, vdim):
                count = _attention(embed, kdim, vdim, bias, bias_kv)  # type: ignore[arg-type]
                shape = {"hidden": embed, "heads": heads}
        elif name in ("TransformerEncoderLayer", "TransformerDecoderLayer"):
            d, heads, ff, bias = number("d_model"), number("nhead"), number("dim_feedforward"), flag("bias")
            if None not in (d, heads, ff, bias):
                count = _transformer_layer(d, ff, bias, decoder=name == "TransformerDecoderLayer")  # type: ignore[arg-type]
                shape = {"layers": 1, "hidden": d, "heads": heads}
        elif name in ("TransformerEncoder", "TransformerDecoder"):
            key = "encoder_layer" if name == "TransformerEncoder" else "decoder_layer"
            layers = number("num_layers")
            inner = self.model(args[f"{key}:expr"], frame) if f"{key}:expr" in args else None  # type: ignore[arg-type]
            norm = args.get("norm:expr")
            norm_model = self.model(norm, frame) if norm is not None else _ZERO  # type: ignore[arg-type]
            if layers is None or inner is None or norm_model is None:
                return None
            return _Model(
                layers * inner.parameters + norm_model.parameters,
                inner.exact and norm_model.exact,
                _merge(evidence, inner.evidence),
                default or inner.default,
                layers=layers,
                hidden=inner.hidden,
                heads=inner.heads,
            )
        elif name == "Transformer":
            d, heads, ff, bias = number("d_model"), number("nhead"), number("dim_feedforward"), flag("bias")
            encoders, decoders = number("num_encoder_layers"), number("num_decoder_layers")
            custom = any(type(args.get(k)) is not Known or args[k] != Known(None) for k in ("custom_encoder", "custom_decoder"))
            if None not in (d, heads, ff, bias, encoders, decoders) and not custom:
                norm = 2 * d if bias else d  # type: ignore[operator]
                count = (
                    encoders * _transformer_layer(d, ff, bias, decoder=False)  # type: ignore[operator,arg-type]
                    + norm
                    + decoders * _transformer_layer(d, ff, bias, decoder=True)  # type: ignore[operator,arg-type]
                    + norm
                )
                shape = {"layers": encoders + decoders, "hidden": d, "heads": heads}  # type: ignore[operator]
        if count is None:
            return None
        return _Model(count, True, evidence, default, **shape)  # type: ignore[arg-type]

    @staticmethod
    def convolution(name: str, args: dict[str, object], number, flag) -> int | None:  # type: ignore[no-untyped-def]
        dims = int(name[-2])
        channels_in, channels_out, groups, bias = number("in_channels"), number("out_channels"), number("groups"), flag("bias")
        kernel = args.get("kernel_size")
        if type(kernel) is Items:
            sizes = [known_number(item) for item in kernel.items]  # type: ignore[arg-type]
            if any(size is None for size in sizes) or len(sizes) != dims:
                return None
            kernel_elements = math.prod(int(size.value) for size in sizes)  # type: ignore[union-attr]
        else:
            side = number("kernel_size")
            if side is None:
                return None
            kernel_elements = side**dims
        if None in (channels_in, channels_out, groups, bias) or groups == 0:
            return None
        if name.startswith("ConvTranspose"):
            weight = channels_in * (channels_out // groups) * kernel_elements
        else:
            weight = channels_out * (channels_in // groups) * kernel_elements
        return weight + (channels_out if bias else 0)

    @staticmethod
    def recurrent(name: str, number, flag) -> int | None:  # type: ignore[no-untyped-def]
        gates = _GATES[name]
        size_in, hidden, bias = number("input_size"), number("hidden_size"), flag("bias")
        if None in (size_in, hidden, bias):
            return None
        if name.endswith("Cell"):
            return gates * hidden * (size_in + hidden) + (2 * gates * hidden if bias else 0)
        layers, bidirectional = number("num_layers"), flag("bidirectional")
        projection = number("proj_size") if name == "LSTM" else 0
        if None in (layers, bidirectional, projection):
            return None
        directions = 2 if bidirectional else 1
        recurrent_size = projection or hidden
        total = 0
        for layer in range(layers):
            layer_in = size_in if layer == 0 else recurrent_size * directions
            per_direction = gates * hidden * layer_in + gates * hidden * recurrent_size
            if bias:
                per_direction += 2 * gates * hidden
            if projection:
                per_direction += projection * hidden
            total += directions * per_direction
        return total

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


def _attention(embed: int, kdim: int, vdim: int, bias: bool, bias_kv: bool) -> int:
    """nn.MultiheadAttention: in-projection (one packed weight when k/v dims
    equal the embedding, else three), its bias, the out-projection, and the
    optional learned key/value biases."""
    count = embed * embed + embed * kdim + embed * vdim + embed * embed
    if bias:
        count += 3 * embed + embed
    if bias_kv:
        count += 2 * embed
    return count


def _transformer_layer(d: int, ff: int, bias: bool, *, decoder: bool) -> int:
    """nn.TransformerEncoderLayer / DecoderLayer: self-attention (and, in a
    decoder, cross-attention), the two feed-forward linears, a LayerNorm per
    sublayer; `bias=False` drops every bias, the norms' too."""
    attention = _attention(d, d, d, bias, False)
    feed_forward = d * ff + ff * d + ((ff + d) if bias else 0)
    norm = 2 * d if bias else d
    if decoder:
        return 2 * attention + feed_forward + 3 * norm
    return attention + feed_forward + 2 * norm


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
