"""Parameter counts of `torch.nn` layers from their constructor arguments.

The formulas follow torch 2.13's modules (what each `__init__` allocates as
`nn.Parameter`): weights and biases of linear and convolution layers, affine
norms, the gates of the recurrent layers (with their projections), the packed
or separate in-projections of attention, and the transformer layers built of
them. `tests/analysis/facts/test_sizes.py` checks them against torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import libcst as cst

from oom_lsp.analysis.facts.values import Evaluator, Frame, Items, Known, _merge, known_number


@dataclass(frozen=True)
class LayerCount:
    parameters: int
    evidence: tuple[str, ...] = ()
    default: bool = False
    shape: dict[str, int | None] = field(default_factory=dict)


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


def is_parameter_free(name: str) -> bool:
    return name in _PARAMETER_FREE or name.endswith("Loss")


def bind(name: str, call: cst.Call, frame: Frame, evaluator: Evaluator) -> dict[str, object] | None:
    """The arguments of `torch.nn.<name>(...)` by parameter name: their values (Known, Items, ...),
    the signature's defaults for the others, and under "<name>:expr" the expressions passed (for
    module-valued ones: `encoder_layer`). None for a layer not in the table or a call with a splat."""
    signature = _SIGNATURES.get(name)
    if signature is None:
        return None
    names = [parameter for parameter, _ in signature]
    bound: dict[str, object] = {parameter: Known(default) for parameter, default in signature}
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
        bound[key] = evaluator.evaluate(arg.value, frame)
        bound[f"{key}:expr"] = arg.value
    return bound


def count_layer(name: str, args: Mapping[str, object]) -> LayerCount | None:
    """The parameters of `torch.nn.<name>` built with `args` (from `bind`), None when an argument
    that decides the count is unknown."""
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
        count = convolution(name, args, number, flag)
    elif name in _GATES:
        count = recurrent(name, number, flag)
        shape = {"layers": number("num_layers") if "num_layers" in args else 1, "hidden": number("hidden_size")}
    elif name == "MultiheadAttention":
        embed, heads, bias, bias_kv = number("embed_dim"), number("num_heads"), flag("bias"), flag("add_bias_kv")
        kdim = number("kdim") if args.get("kdim") != Known(None) else embed
        vdim = number("vdim") if args.get("vdim") != Known(None) else embed
        if None not in (embed, heads, bias, bias_kv, kdim, vdim):
            count = attention_parameters(embed, kdim, vdim, bias, bias_kv)  # type: ignore[arg-type]
            shape = {"hidden": embed, "heads": heads}
    elif name in ("TransformerEncoderLayer", "TransformerDecoderLayer"):
        d, heads, ff, bias = number("d_model"), number("nhead"), number("dim_feedforward"), flag("bias")
        if None not in (d, heads, ff, bias):
            count = transformer_layer_parameters(d, ff, bias, decoder=name == "TransformerDecoderLayer")  # type: ignore[arg-type]
            shape = {"layers": 1, "hidden": d, "heads": heads}
    elif name == "Transformer":
        d, heads, ff, bias = number("d_model"), number("nhead"), number("dim_feedforward"), flag("bias")
        encoders, decoders = number("num_encoder_layers"), number("num_decoder_layers")
        custom = any(type(args.get(k)) is not Known or args[k] != Known(None) for k in ("custom_encoder", "custom_decoder"))
        if None not in (d, heads, ff, bias, encoders, decoders) and not custom:
            norm = 2 * d if bias else d  # type: ignore[operator]
            count = (
                encoders * transformer_layer_parameters(d, ff, bias, decoder=False)  # type: ignore[operator,arg-type]
                + norm
                + decoders * transformer_layer_parameters(d, ff, bias, decoder=True)  # type: ignore[operator,arg-type]
                + norm
            )
            shape = {"layers": encoders + decoders, "hidden": d, "heads": heads}  # type: ignore[operator]
    if count is None:
        return None
    return LayerCount(count, evidence, default, shape)


def convolution(
    name: str, args: Mapping[str, object], number: Callable[[str], int | None], flag: Callable[[str], bool | None]
) -> int | None:
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

def recurrent(name: str, number: Callable[[str], int | None], flag: Callable[[str], bool | None]) -> int | None:
    """LSTM/GRU/RNN (and cells): per layer and direction, input and recurrent weights of each gate,
    two biases per gate, and LSTM's projection."""
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


def attention_parameters(embed: int, kdim: int, vdim: int, bias: bool, bias_kv: bool) -> int:
    """nn.MultiheadAttention: in-projection (one packed weight when k/v dims
    equal the embedding, else three), its bias, the out-projection, and the
    optional learned key/value biases."""
    count = embed * embed + embed * kdim + embed * vdim + embed * embed
    if bias:
        count += 3 * embed + embed
    if bias_kv:
        count += 2 * embed
    return count


def transformer_layer_parameters(d: int, ff: int, bias: bool, *, decoder: bool) -> int:
    """nn.TransformerEncoderLayer / DecoderLayer: self-attention (and, in a
    decoder, cross-attention), the two feed-forward linears, a LayerNorm per
    sublayer; `bias=False` drops every bias, the norms' too."""
    attention = attention_parameters(d, d, d, bias, False)
    feed_forward = d * ff + ff * d + ((ff + d) if bias else 0)
    norm = 2 * d if bias else d
    if decoder:
        return 2 * attention + feed_forward + 3 * norm
    return attention + feed_forward + 2 * norm
