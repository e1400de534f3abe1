"""The table of known models: lookups, configs built in code, and (with the
bench extra installed) the table against real instantiation."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts import known_models
from oom_lsp.analysis.facts.known_models_table import CHECKPOINTS, TIMM, TORCHVISION
from oom_lsp.analysis.facts.sizes import model_size, sizes_for
from oom_lsp.analysis.settings import default_settings


def _model(source: str):
    source = textwrap.dedent(source)
    context = FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="train.py")
    facts = sizes_for(context)
    for statement, scope in facts.index.scope_of.items():
        if type(statement) is cst.SimpleStatementLine and type(statement.body[0]) is cst.Assign:
            target = statement.body[0].targets[0].target
            if type(target) is cst.Name and target.value == "probe":
                return model_size(context, statement.body[0].value, scope)
    raise AssertionError("no probe")


def test_pretrained_names_and_their_aliases() -> None:
    found = _model('from transformers import AutoModelForCausalLM\nprobe = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")\n')
    assert (found.parameters, found.exact, found.family, found.layers, found.hidden, found.heads, found.vocab) == (
        6_738_415_616, True, "llama", 32, 4096, 32, 32000)
    assert found.name == "meta-llama/Llama-2-7b-hf" and "known model" in found.evidence
    # A renamed organisation, another case, the bare model class (no LM head).
    assert known_models.pretrained("google-bert/bert-base-uncased", "BertModel").parameters == 109_482_240
    assert known_models.pretrained("Bert-Base-Uncased", "AutoModel").parameters == 109_482_240
    assert known_models.pretrained("meta-llama/Llama-2-7b-chat-hf", "LlamaModel").parameters == 6_607_343_616
    # Another head than the table's: the backbone, as a lower bound.
    classifier = known_models.pretrained("gpt2", "AutoModelForSequenceClassification")
    assert (classifier.parameters, classifier.exact) == (124_439_808, False)
    assert known_models.pretrained("my-org/my-private-model", "AutoModel") is None


def test_a_model_name_read_from_argparse() -> None:
    found = _model(
        """
        import argparse
        from transformers import AutoModel
        parser = argparse.ArgumentParser()
        parser.add_argument("--model_name_or_path", default="roberta-large")
        args = parser.parse_args()
        probe = AutoModel.from_pretrained(args.model_name_or_path)
        """
    )
    assert (found.parameters, found.from_default) == (355_359_744, True)


def test_configs_built_in_code() -> None:
    source = """
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_layer=6, n_embd=512, n_head=8)
        probe = GPT2LMHeadModel(config)
        """
    found = _model(source)
    h, layers, vocab, positions = 512, 6, 50257, 1024
    assert found.parameters == vocab * h + positions * h + layers * (12 * h * h + 13 * h) + 2 * h
    assert (found.layers, found.hidden, found.family) == (6, 512, "gpt2")
    # The defaults of the config class are gpt2's own.
    assert _model(source.replace("GPT2Config(n_layer=6, n_embd=512, n_head=8)", "GPT2Config()")).parameters == 124_439_808
    # A field set after the config was built.
    assert _model(source.replace("probe =", "config.n_layer = 12\n        probe =")).layers == 12
    # From a checkpoint's config, with an override.
    found = _model(
        """
        from transformers import AutoConfig, AutoModelForCausalLM
        config = AutoConfig.from_pretrained("meta-llama/Llama-2-7b-hf", num_hidden_layers=2)
        probe = AutoModelForCausalLM.from_config(config)
        """
    )
    assert found.parameters == 32000 * 4096 * 2 + 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) + 4096


def test_vision_models() -> None:
    assert _model("import torchvision\nprobe = torchvision.models.resnet50()\n").parameters == 25_557_032
    assert _model("from torchvision import models\nprobe = models.resnet50(num_classes=10)\n").parameters == 25_557_032 - 990 * 2049
    assert _model('from torchvision.models import get_model\nprobe = get_model("vit_b_16")\n').parameters == TORCHVISION["vit_b_16"]["parameters"]
    assert _model('import timm\nprobe = timm.create_model("convnext_tiny", pretrained=True)\n').parameters == TIMM["convnext_tiny"]["parameters"]
    tagged = known_models.timm_model("vit_base_patch16_224.augreg_in21k")
    assert tagged is not None and not tagged.exact  # its head has 21k classes, not the table's 1000
    assert _model('import timm\nprobe = timm.create_model("my_own_net")\n') is None


def test_stable_diffusion_parts() -> None:
    unet = _model('from diffusers import UNet2DConditionModel\nprobe = UNet2DConditionModel.from_pretrained("runwayml/stable-diffusion-v1-5", subfolder="unet")\n')
    assert unet is not None and unet.parameters == 859_520_964
    vae = known_models.diffusers_part("stabilityai/stable-diffusion-xl-base-1.0", "AutoencoderKL", "vae")
    assert vae is not None and vae.parameters == 83_653_863


# --- the table against real instantiation (bench extra only) ---------------------------------


def _meta_count(build) -> int:
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


@pytest.mark.parametrize("name", ["gpt2", "bert-base-uncased", "EleutherAI/pythia-160m", "Qwen/Qwen2-0.5B", "t5-small"])
def test_table_matches_transformers(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    entry = CHECKPOINTS[name]
    values = dict(entry["config"])
    model_type = values.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **values)
    assert _meta_count(lambda: getattr(transformers, entry["architecture"])(config)) == entry["parameters"]
    assert _meta_count(lambda: transformers.AutoModel.from_config(config)) == entry["base_parameters"]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "vit_b_32"])
def test_table_matches_torchvision(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    assert _meta_count(lambda: torchvision.models.get_model(name)) == TORCHVISION[name]["parameters"]


@pytest.mark.parametrize("name", ["resnet18", "efficientnet_b0", "deit_tiny_patch16_224"])
def test_table_matches_timm(name: str) -> None:
    timm = pytest.importorskip("timm")
    assert _meta_count(lambda: timm.create_model(name, pretrained=False)) == TIMM[name]["parameters"]


@pytest.mark.parametrize("model_type", sorted(known_models.FORMULAS))
def test_formulas_match_transformers_on_a_small_config(model_type: str) -> None:
    transformers = pytest.importorskip("transformers")
    narrow = {"gpt2": dict(n_layer=3, n_embd=48, n_head=4, vocab_size=500, n_inner=100),
              "t5": dict(num_layers=2, num_decoder_layers=3, d_model=32, d_ff=64, d_kv=8, num_heads=4, vocab_size=300,
                         feed_forward_proj="gated-gelu", tie_word_embeddings=False)}.get(
        model_type, dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=4, intermediate_size=96, vocab_size=500))
    config = transformers.AutoConfig.for_model(model_type, **narrow)
    for class_name, (family, head) in sorted(known_models._table().MODEL_CLASSES.items()):
        if family != model_type:
            continue
        measured = _meta_count(lambda: getattr(transformers, class_name)(config))
        assert known_models.FORMULAS[model_type](config.to_dict(), head)[0] == measured, class_name
