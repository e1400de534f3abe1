"""Parameter counts of known models: pretrained checkpoints, torchvision and
timm architectures, Stable Diffusion's parts, and Hugging Face configs built
in code.

The counts are data, measured rather than guessed: `bench/known_models_table.py`
builds every model from its published config on torch's meta device (no
weights, no network) with the pinned transformers / timm / torchvision /
diffusers releases and writes `known_models_table.py` next to this file.
Reading the table needs no torch; it is imported on first use only.

A config built in code (`GPT2Config(n_layer=6)`, `AutoConfig.from_pretrained(
"gpt2", n_layer=6)`) is counted with the closed forms below, one per family
whose modules they spell out; the bench checks each against the measured
count of every checkpoint of its family.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType


@dataclass(frozen=True)
class KnownModel:
    parameters: int
    name: str
    family: str | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    # False: a head the table does not hold (`AutoModelForSequenceClassification`
    # of a causal LM): `parameters` then counts the model without it.
    exact: bool = True


@lru_cache(maxsize=1)
def _table() -> ModuleType:
    from oom_lsp.analysis.facts import known_models_table

    return known_models_table


# --- Hugging Face checkpoints ------------------------------------------------------------

# A class name's task, for choosing between a checkpoint's own count (with the
# head it was published with) and its bare backbone's.
_BASE_CLASSES = re.compile(r"^(Auto|TFAuto|FlaxAuto)?([A-Za-z0-9]*)Model$")
_HEAD_TASKS = {
    "AutoModelForCausalLM": ("ForCausalLM", "LMHeadModel"),
    "AutoModelForMaskedLM": ("ForMaskedLM",),
    "AutoModelForSeq2SeqLM": ("ForConditionalGeneration",),
    "AutoModelForSpeechSeq2Seq": ("ForConditionalGeneration",),
    "AutoModelForImageClassification": ("ForImageClassification",),
    "AutoModelForPreTraining": ("ForPreTraining", "ForMaskedLM", "LMHeadModel", "ForConditionalGeneration"),
    "AutoModelWithLMHead": ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration"),
}


@lru_cache(maxsize=1)
def _lowercase_names() -> dict[str, str]:
    table = _table()
    names = {name.lower(): name for name in table.CHECKPOINTS}
    names.update(table.ALIASES)
    return names


def _checkpoint_entry(name: str) -> tuple[str, Mapping[str, object]] | None:
    table = _table()
    key = name.strip().rstrip("/")
    entry = table.CHECKPOINTS.get(key)
    if entry is None:
        alias = _lowercase_names().get(key.lower())
        if alias is None:
            # The Hub's names are case-insensitive; organisations get renamed
            # ("bert-base-uncased" is now "google-bert/bert-base-uncased").
            alias = _lowercase_names().get(key.rsplit("/", 1)[-1].lower())
        if alias is None:
            return None
        key, entry = alias, table.CHECKPOINTS[alias]
    return key, entry


def pretrained(name: str, class_name: str | None) -> KnownModel | None:
    """A Hugging Face checkpoint loaded by `class_name.from_pretrained(name)`."""
    found = _checkpoint_entry(name)
    if found is None:
        return None
    key, entry = found
    architecture = str(entry["architecture"])
    last = (class_name or "AutoModel").rpartition(".")[2]
    exact = True
    if last == architecture or any(architecture.endswith(s) for s in _HEAD_TASKS.get(last, ())):
        count = int(entry["parameters"])  # type: ignore[arg-type]
    elif _BASE_CLASSES.match(last):
        count = int(entry["base_parameters"])  # type: ignore[arg-type]
    else:
        # Another head (sequence classification, ...): the backbone, and at least that.
        count, exact = int(entry["base_parameters"]), False  # type: ignore[arg-type]
    return KnownModel(
        parameters=count,
        name=key,
        family=str(entry["model_type"]),
        layers=entry.get("layers"),  # type: ignore[arg-type]
        hidden=entry.get("hidden"),  # type: ignore[arg-type]
        heads=entry.get("heads"),  # type: ignore[arg-type]
        vocab=entry.get("vocab"),  # type: ignore[arg-type]
        exact=exact,
    )


def checkpoint_config(name: str) -> Mapping[str, object] | None:
    """The config values a checkpoint was measured with (`AutoConfig.from_pretrained`)."""
    found = _checkpoint_entry(name)
    if found is None:
        return None
    return found[1]["config"]  # type: ignore[return-value]


def diffusers_part(name: str, class_name: str, subfolder: str | None) -> KnownModel | None:
    """`UNet2DConditionModel.from_pretrained(name, subfolder="unet")`,
    `AutoencoderKL.from_pretrained(name, subfolder="vae")`, or a whole pipeline."""
    table = _table()
    key = name.strip().rstrip("/")
    entry = table.DIFFUSERS.get(key) or table.DIFFUSERS.get(table.DIFFUSERS_ALIASES.get(key.lower(), ""))
    if entry is None:
        return None
    last = class_name.rpartition(".")[2]
    part = {"UNet2DConditionModel": "unet", "AutoencoderKL": "vae", "CLIPTextModel": "text_encoder"}.get(last)
    if part is None and last.endswith("Pipeline"):
        return KnownModel(parameters=sum(entry.values()), name=key, family="stable-diffusion")
    if part is None or (subfolder is not None and subfolder != part and not subfolder.startswith(part)):
        return None
    count = entry.get(part)
    return KnownModel(parameters=count, name=f"{key}/{part}", family="stable-diffusion") if count else None


# --- torchvision and timm ---------------------------------------------------------------


def _vision(entries: Mapping[str, Mapping[str, int]], name: str, num_classes: int | None, family: str) -> KnownModel | None:
    entry = entries.get(name)
    if entry is None:
        return None
    count = entry["parameters"]
    exact = True
    if num_classes is not None and num_classes != entry["num_classes"]:
        per_class = entry.get("per_class")
        if per_class is None:
            exact = False
        else:
            count += (num_classes - entry["num_classes"]) * per_class
    return KnownModel(parameters=count, name=name, family=family, exact=exact)


def torchvision_model(name: str, num_classes: int | None = None) -> KnownModel | None:
    return _vision(_table().TORCHVISION, name, num_classes, "torchvision")


def timm_model(name: str, num_classes: int | None = None) -> KnownModel | None:
    """`timm.create_model(name)`; a pretrained tag (`vit_base_patch16_224.augreg_in21k`)
    is the same architecture (its head may have another number of classes)."""
    table = _table()
    architecture, _, tag = name.partition(".")
    architecture = architecture.removeprefix("timm/").removeprefix("hf-hub:timm/")
    found = _vision(table.TIMM, architecture, num_classes, "timm")
    if found is not None and tag and num_classes is None and ("21k" in tag or "22k" in tag):
        return KnownModel(parameters=found.parameters, name=name, family="timm", exact=False)
    return found


# --- configs built in code -----------------------------------------------------------------


def config_family(class_name: str) -> str | None:
    """`GPT2Config` -> "gpt2"."""
    entry = _table().CONFIG_CLASSES.get(class_name.rpartition(".")[2])
    return entry["model_type"] if entry else None  # type: ignore[index,return-value]


def model_class(class_name: str) -> tuple[str, str] | None:
    """`GPT2LMHeadModel` -> ("gpt2", "lm"); `BertModel` -> ("bert", "base")."""
    found = _table().MODEL_CLASSES.get(class_name.rpartition(".")[2])
    return (found[0], found[1]) if found else None


def from_config(
    model_type: str, head: str, fields: Mapping[str, object], checkpoint: str | None = None
) -> KnownModel | None:
    """The parameters of a model of `model_type` with `head` ("base", "lm")
    built from a config: the values written in code over the checkpoint's
    (`AutoConfig.from_pretrained`) or the config class's defaults."""
    table = _table()
    values: dict[str, object] = {}
    defaults = next((entry["defaults"] for entry in table.CONFIG_CLASSES.values() if entry["model_type"] == model_type), None)
    if defaults is None:
        return None
    values.update(defaults)  # type: ignore[arg-type]
    if checkpoint is not None:
        config = checkpoint_config(checkpoint)
        if config is None:
            return None
        values.update(config)
    values.update(fields)
    formula = FORMULAS.get(model_type)
    if formula is None:
        return None
    try:
        result = formula(values, head)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if result is None:
        return None
    count, shape = result
    return KnownModel(parameters=count, name=checkpoint or model_type, family=model_type, **shape)


# Each formula: (config values, head) -> (parameters, {layers, hidden, heads, vocab}).
# They follow the modules of transformers 5.24's modeling files; every one is
# checked against instantiation by bench/known_models_table.py.
Formula = Callable[[Mapping[str, object], str], tuple[int, dict[str, int]] | None]


def _int(values: Mapping[str, object], *keys: str) -> int:
    for key in keys:
        value = values.get(key)
        if value is not None:
            return int(value)  # type: ignore[arg-type]
    raise KeyError(keys[0])


def _gpt2(values: Mapping[str, object], head: str) -> tuple[int, dict[str, int]]:
    """GPT2Model: wte, wpe, per block ln_1, c_attn, c_proj, ln_2, c_fc, c_proj; ln_f.
    GPT2LMHeadModel ties lm_head to wte."""
    h, layers, vocab = _int(values, "n_embd"), _int(values, "n_layer"), _int(values, "vocab_size")
    positions = _int(values, "n_positions")
    inner = _int(values, "n_inner") if values.get("n_inner") else 4 * h
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * inner + inner) + (inner * h + h)
    count = vocab * h + positions * h + layers * block + 2 * h
    return count, {"layers": layers, "hidden": h, "heads": _int(values, "n_head"), "vocab": vocab}


def _bert(values: Mapping[str, object], head: str) -> tuple[int, dict[str, int]]:
    """BertModel / RobertaModel: embeddings (word, position, token type, LayerNorm),
    per layer Q, K, V, output dense + LayerNorm, intermediate, output + LayerNorm;
    the pooler. The masked-LM head (transform dense + LayerNorm, decoder tied to
    the word embeddings, its bias) replaces the pooler."""
    h, layers, vocab = _int(values, "hidden_size"), _int(values, "num_hidden_layers"), _int(values, "vocab_size")
    inner = _int(values, "intermediate_size")
    embeddings = vocab * h + _int(values, "max_position_embeddings") * h + _int(values, "type_vocab_size") * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * inner + inner) + (inner * h + h) + 2 * h
    count = embeddings + layers * layer
    if head == "lm":
        count += h * h + h + 2 * h + vocab
    else:
        count += h * h + h
    return count, {"layers": layers, "hidden": h, "heads": _int(values, "num_attention_heads"), "vocab": vocab}


def _llama(values: Mapping[str, object], head: str) -> tuple[int, dict[str, int]]:
    """LlamaModel (and Mistral, Qwen2, Mixtral): embed_tokens, per layer q/k/v/o
    projections (biases on q/k/v for Qwen2, on all four with `attention_bias`),
    the gated MLP (or `num_local_experts` of them and a router), two RMSNorms;
    the final norm. CausalLM adds lm_head unless tied."""
    h, layers, vocab = _int(values, "hidden_size"), _int(values, "num_hidden_layers"), _int(values, "vocab_size")
    heads = _int(values, "num_attention_heads")
    kv_heads = _int(values, "num_key_value_heads", "num_attention_heads")
    head_dim = _int(values, "head_dim") if values.get("head_dim") else h // heads
    inner = _int(values, "intermediate_size")
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = h * q + 2 * h * kv + q * h
    model_type = values.get("model_type")
    if model_type == "qwen2":
        attention += q + 2 * kv
    elif values.get("attention_bias"):
        attention += q + 2 * kv + h
    experts = values.get("num_local_experts")
    mlp = 3 * h * inner
    if experts:
        mlp = int(experts) * 3 * h * inner + h * int(experts)  # type: ignore[call-overload]
    elif values.get("mlp_bias"):
        mlp += 2 * inner + h
    count = vocab * h + layers * (attention + mlp + 2 * h) + h
    if head == "lm" and not values.get("tie_word_embeddings"):
        count += h * vocab
    return count, {"layers": layers, "hidden": h, "heads": heads, "vocab": vocab}


def _t5(values: Mapping[str, object], head: str) -> tuple[int, dict[str, int]]:
    """T5: shared embeddings; encoder blocks of self-attention and feed-forward
    (gated: two input projections), decoder blocks with cross-attention too, a
    relative position bias in each stack's first block, an RMS LayerNorm per
    sublayer and per stack. T5ForConditionalGeneration adds lm_head unless tied."""
    d, vocab = _int(values, "d_model"), _int(values, "vocab_size")
    inner = _int(values, "num_heads") * _int(values, "d_kv")
    ff = _int(values, "d_ff")
    layers = _int(values, "num_layers")
    decoder_layers = _int(values, "num_decoder_layers", "num_layers")
    gated = str(values.get("feed_forward_proj", "relu")).startswith("gated")
    attention = 4 * d * inner
    feed_forward = (3 if gated else 2) * d * ff
    bias = _int(values, "relative_attention_num_buckets") * _int(values, "num_heads")
    encoder = layers * (attention + d + feed_forward + d) + bias + d
    decoder = decoder_layers * (2 * attention + 2 * d + feed_forward + d) + bias + d
    count = vocab * d + encoder
    if head != "encoder":
        count += decoder
    if head == "lm" and not values.get("tie_word_embeddings", True):
        count += d * vocab
    return count, {"layers": layers, "hidden": d, "heads": _int(values, "num_heads"), "vocab": vocab}


FORMULAS: dict[str, Formula] = {
    "gpt2": _gpt2,
    "bert": _bert,
    "roberta": _bert,
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "mixtral": _llama,
    "t5": _t5,
}
