"""Regenerate `oom_lsp/analysis/facts/known_models_table.py`: parameter counts MEASURED by building
each model from its published config on torch's meta device (no weights, no network).

    .venv/bin/pip install -e '.[bench]' diffusers==0.42.1 && .venv/bin/python bench/torchvision_without_ops.py install
    .venv/bin/python bench/known_models_table.py            # writes the table, prints every count
    .venv/bin/python bench/known_models_table.py --check    # compares with the committed table, writes nothing

The configs below are the checkpoints' published values (their `config.json` on the Hugging Face Hub;
where noted, as copied into another project's source read with the search tool): only the fields that
shape the model are written, the rest are the config class's defaults in transformers 5.24.0. Each
family's source is cited above it. The closed forms of `known_models.FORMULAS` (for configs built in
code) are checked here against the measured count of every checkpoint of their families, and against
each config class's defaults; a mismatch fails the run.

Published totals, where a model card states them (Pythia's card), are compared too.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pprint
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "oom_lsp" / "analysis" / "facts" / "known_models_table.py"
sys.path.insert(0, str(ROOT))

# (hub id, model_type, architecture, config values, aliases)
Checkpoint = tuple[str, str, str, dict[str, Any], tuple[str, ...]]

# --- GPT-2 -------------------------------------------------------------------------------
# gpt2, gpt2-medium: mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py (01ced331, copies of the
# Hub's config.json); gpt2-large, gpt2-xl, distilgpt2: cli99/llm-analysis
# llm_analysis/model_configs/*.json (d841e40).
GPT2: list[Checkpoint] = [
    ("gpt2", "gpt2", "GPT2LMHeadModel", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257), ("openai-community/gpt2",)),
    ("gpt2-medium", "gpt2", "GPT2LMHeadModel", dict(n_embd=1024, n_layer=24, n_head=16, n_positions=1024, vocab_size=50257), ("openai-community/gpt2-medium",)),
    ("gpt2-large", "gpt2", "GPT2LMHeadModel", dict(n_embd=1280, n_layer=36, n_head=20, n_positions=1024, vocab_size=50257), ("openai-community/gpt2-large",)),
    ("gpt2-xl", "gpt2", "GPT2LMHeadModel", dict(n_embd=1600, n_layer=48, n_head=25, n_positions=1024, vocab_size=50257), ("openai-community/gpt2-xl",)),
    ("distilgpt2", "gpt2", "GPT2LMHeadModel", dict(n_embd=768, n_layer=6, n_head=12, n_positions=1024, vocab_size=50257), ("distilbert/distilgpt2",)),
]

# --- BERT family -------------------------------------------------------------------------
# bert-base-uncased/cased, bert-large, bert-base-multilingual-cased: cli99/llm-analysis model_configs
# (d841e40); bert-base also as "snowflake-arctic-embed-m" in mlc-llm's model_preset.py. RoBERTa,
# XLM-R (vocab 250002), DistilBERT, ALBERT and DeBERTa: the checkpoints' config.json on the Hub
# (FacebookAI/roberta-base, distilbert/distilbert-base-uncased, albert/albert-base-v2,
# microsoft/deberta-v3-base, ...), values not re-read from a stored copy here.
_BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)
_BERT_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512, type_vocab_size=2)
_ROBERTA = dict(max_position_embeddings=514, type_vocab_size=1)
_DEBERTA_V3 = dict(relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_biased_input=False, type_vocab_size=0, vocab_size=128100)
BERTS: list[Checkpoint] = [
    ("bert-base-uncased", "bert", "BertForMaskedLM", dict(_BERT_BASE, vocab_size=30522), ("google-bert/bert-base-uncased",)),
    ("bert-base-cased", "bert", "BertForMaskedLM", dict(_BERT_BASE, vocab_size=28996), ("google-bert/bert-base-cased",)),
    ("bert-large-uncased", "bert", "BertForMaskedLM", dict(_BERT_LARGE, vocab_size=30522), ("google-bert/bert-large-uncased", "bert-large")),
    ("bert-large-cased", "bert", "BertForMaskedLM", dict(_BERT_LARGE, vocab_size=28996), ("google-bert/bert-large-cased",)),
    ("bert-base-multilingual-cased", "bert", "BertForMaskedLM", dict(_BERT_BASE, vocab_size=119547), ("google-bert/bert-base-multilingual-cased",)),
    ("roberta-base", "roberta", "RobertaForMaskedLM", dict(_BERT_BASE, **_ROBERTA, vocab_size=50265), ("FacebookAI/roberta-base",)),
    ("roberta-large", "roberta", "RobertaForMaskedLM", dict(_BERT_LARGE, **_ROBERTA, vocab_size=50265), ("FacebookAI/roberta-large",)),
    ("xlm-roberta-base", "xlm-roberta", "XLMRobertaForMaskedLM", dict(_BERT_BASE, **_ROBERTA, vocab_size=250002), ("FacebookAI/xlm-roberta-base",)),
    ("xlm-roberta-large", "xlm-roberta", "XLMRobertaForMaskedLM", dict(_BERT_LARGE, **_ROBERTA, vocab_size=250002), ("FacebookAI/xlm-roberta-large",)),
    ("distilbert-base-uncased", "distilbert", "DistilBertForMaskedLM", dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072, vocab_size=30522, max_position_embeddings=512), ("distilbert/distilbert-base-uncased",)),
    ("distilbert-base-cased", "distilbert", "DistilBertForMaskedLM", dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072, vocab_size=28996, max_position_embeddings=512), ("distilbert/distilbert-base-cased",)),
    ("albert-base-v2", "albert", "AlbertForMaskedLM", dict(embedding_size=128, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=30000), ("albert/albert-base-v2",)),
    ("albert-large-v2", "albert", "AlbertForMaskedLM", dict(embedding_size=128, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, vocab_size=30000), ("albert/albert-large-v2",)),
    ("albert-xlarge-v2", "albert", "AlbertForMaskedLM", dict(embedding_size=128, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, intermediate_size=8192, vocab_size=30000), ("albert/albert-xlarge-v2",)),
    ("albert-xxlarge-v2", "albert", "AlbertForMaskedLM", dict(embedding_size=128, hidden_size=4096, num_hidden_layers=12, num_attention_heads=64, intermediate_size=16384, vocab_size=30000), ("albert/albert-xxlarge-v2",)),
    ("microsoft/deberta-base", "deberta", "DebertaModel", dict(_BERT_BASE, relative_attention=True, max_relative_positions=-1, pos_att_type=["c2p", "p2c"], position_biased_input=False, type_vocab_size=0, vocab_size=50265), ()),
    ("microsoft/deberta-large", "deberta", "DebertaModel", dict(_BERT_LARGE, relative_attention=True, max_relative_positions=-1, pos_att_type=["c2p", "p2c"], position_biased_input=False, type_vocab_size=0, vocab_size=50265), ()),
    ("microsoft/deberta-v3-xsmall", "deberta-v2", "DebertaV2Model", dict(_DEBERTA_V3, hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536, max_position_embeddings=512), ()),
    ("microsoft/deberta-v3-small", "deberta-v2", "DebertaV2Model", dict(_DEBERTA_V3, hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512), ()),
    ("microsoft/deberta-v3-base", "deberta-v2", "DebertaV2Model", dict(_DEBERTA_V3, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512), ()),
    ("microsoft/deberta-v3-large", "deberta-v2", "DebertaV2Model", dict(_DEBERTA_V3, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512), ()),
]

# --- EleutherAI, OPT -----------------------------------------------------------------------
# GPT-Neo, GPT-J, OPT (except opt-350m's projection and post-norm, and opt-2.7b): cli99/llm-analysis
# model_configs (d841e40). opt-350m's word_embed_proj_dim=512 and post-LayerNorm: its module tree
# as printed in if001/alpaca-lora gomi.md (Embedding(50272, 512), project_in/out) and its config.json.
# Pythia: layers, width and heads from the Pythia model card's table (EleutherAI/pythia-410m-v0),
# vocabulary, rotary_pct=0.25 and parallel residuals from the checkpoints' config.json.
_NEO = dict(vocab_size=50257, max_position_embeddings=2048, window_size=256)
_OPT = dict(vocab_size=50272, max_position_embeddings=2048)
_PYTHIA = dict(rotary_pct=0.25, use_parallel_residual=True, max_position_embeddings=2048, tie_word_embeddings=False)
ELEUTHER: list[Checkpoint] = [
    ("EleutherAI/gpt-neo-125m", "gpt_neo", "GPTNeoForCausalLM", dict(_NEO, hidden_size=768, num_layers=12, num_heads=12, attention_types=[[["global", "local"], 6]]), ("EleutherAI/gpt-neo-125M",)),
    ("EleutherAI/gpt-neo-1.3B", "gpt_neo", "GPTNeoForCausalLM", dict(_NEO, hidden_size=2048, num_layers=24, num_heads=16, attention_types=[[["global", "local"], 12]]), ()),
    ("EleutherAI/gpt-neo-2.7B", "gpt_neo", "GPTNeoForCausalLM", dict(_NEO, hidden_size=2560, num_layers=32, num_heads=20, attention_types=[[["global", "local"], 16]]), ()),
    ("EleutherAI/gpt-j-6b", "gptj", "GPTJForCausalLM", dict(n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, vocab_size=50400, n_positions=2048), ("EleutherAI/gpt-j-6B",)),
    ("facebook/opt-125m", "opt", "OPTForCausalLM", dict(_OPT, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, ffn_dim=3072, word_embed_proj_dim=768), ()),
    ("facebook/opt-350m", "opt", "OPTForCausalLM", dict(_OPT, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, ffn_dim=4096, word_embed_proj_dim=512, do_layer_norm_before=False), ()),
    ("facebook/opt-1.3b", "opt", "OPTForCausalLM", dict(_OPT, hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, ffn_dim=8192, word_embed_proj_dim=2048), ()),
    ("facebook/opt-2.7b", "opt", "OPTForCausalLM", dict(_OPT, hidden_size=2560, num_hidden_layers=32, num_attention_heads=32, ffn_dim=10240, word_embed_proj_dim=2560), ()),
    ("facebook/opt-6.7b", "opt", "OPTForCausalLM", dict(_OPT, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, ffn_dim=16384, word_embed_proj_dim=4096), ()),
    ("facebook/opt-13b", "opt", "OPTForCausalLM", dict(_OPT, hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, ffn_dim=20480, word_embed_proj_dim=5120), ()),
    ("EleutherAI/pythia-70m", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=512, num_hidden_layers=6, num_attention_heads=8, intermediate_size=2048, vocab_size=50304), ("EleutherAI/pythia-70m-deduped",)),
    ("EleutherAI/pythia-160m", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=50304), ("EleutherAI/pythia-160m-deduped",)),
    ("EleutherAI/pythia-410m", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, vocab_size=50304), ("EleutherAI/pythia-410m-deduped",)),
    ("EleutherAI/pythia-1b", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=2048, num_hidden_layers=16, num_attention_heads=8, intermediate_size=8192, vocab_size=50304), ("EleutherAI/pythia-1b-deduped",)),
    ("EleutherAI/pythia-1.4b", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, intermediate_size=8192, vocab_size=50304), ("EleutherAI/pythia-1.4b-deduped",)),
    ("EleutherAI/pythia-2.8b", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=2560, num_hidden_layers=32, num_attention_heads=32, intermediate_size=10240, vocab_size=50304), ("EleutherAI/pythia-2.8b-deduped",)),
    ("EleutherAI/pythia-6.9b", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=16384, vocab_size=50432), ("EleutherAI/pythia-6.9b-deduped",)),
    ("EleutherAI/pythia-12b", "gpt_neox", "GPTNeoXForCausalLM", dict(_PYTHIA, hidden_size=5120, num_hidden_layers=36, num_attention_heads=40, intermediate_size=20480, vocab_size=50688), ("EleutherAI/pythia-12b-deduped",)),
]
# The Pythia card's "exact parameter counts" (total, with embeddings), for comparison.
PUBLISHED = {
    "EleutherAI/pythia-70m": 70_426_624,
    "EleutherAI/pythia-160m": 162_322_944,
    "EleutherAI/pythia-410m": 405_334_016,
    "EleutherAI/pythia-1b": 1_011_781_632,
    "EleutherAI/pythia-1.4b": 1_414_647_808,
    "EleutherAI/pythia-2.8b": 2_775_208_960,
    "EleutherAI/pythia-6.9b": 6_857_302_016,
    "EleutherAI/pythia-12b": 11_846_072_320,
}

# --- Llama, Mistral, Qwen, Gemma, Phi -------------------------------------------------------------
# mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py (01ced331): llama2_7b/13b/70b, codellama_7b,
# tinyllama_1b_chat_v1.0, mistral_7b, mistral_7b_v03, Mixtral-8x7B-v0.1, llama3_8b/70b (commented
# there), llama3_1_8b/70b, llama3_2_1b/3b, qwen2_0_5b/1_5b/7b, qwen2.5_3b, gemma_2b, gemma2_2b/9b/27b,
# phi-3 (commented), phi-3_5, phi-2 (its phi-msft field names, renamed to transformers' Phi ones).
# Llama-3.1-405B, Mixtral-8x22B, Qwen2-72B, Qwen2.5-7B/14B/32B/72B, Gemma-7B: the checkpoints'
# config.json on the Hub, values not re-read from a stored copy here.
def _llama(h: int, inner: int, layers: int, heads: int, kv: int, vocab: int, **extra: Any) -> dict[str, Any]:
    return dict(hidden_size=h, intermediate_size=inner, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=False, **extra)


DECODERS: list[Checkpoint] = [
    ("meta-llama/Llama-2-7b-hf", "llama", "LlamaForCausalLM", _llama(4096, 11008, 32, 32, 32, 32000, max_position_embeddings=4096), ("meta-llama/Llama-2-7b-chat-hf", "NousResearch/Llama-2-7b-hf")),
    ("meta-llama/Llama-2-13b-hf", "llama", "LlamaForCausalLM", _llama(5120, 13824, 40, 40, 40, 32000, max_position_embeddings=4096), ("meta-llama/Llama-2-13b-chat-hf",)),
    ("meta-llama/Llama-2-70b-hf", "llama", "LlamaForCausalLM", _llama(8192, 28672, 80, 64, 8, 32000, max_position_embeddings=4096), ("meta-llama/Llama-2-70b-chat-hf",)),
    ("codellama/CodeLlama-7b-hf", "llama", "LlamaForCausalLM", _llama(4096, 11008, 32, 32, 32, 32016, max_position_embeddings=16384), ()),
    ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "llama", "LlamaForCausalLM", _llama(2048, 5632, 22, 32, 4, 32000, max_position_embeddings=2048), ()),
    ("meta-llama/Meta-Llama-3-8B", "llama", "LlamaForCausalLM", _llama(4096, 14336, 32, 32, 8, 128256, max_position_embeddings=8192), ("meta-llama/Meta-Llama-3-8B-Instruct",)),
    ("meta-llama/Meta-Llama-3-70B", "llama", "LlamaForCausalLM", _llama(8192, 28672, 80, 64, 8, 128256, max_position_embeddings=8192), ("meta-llama/Meta-Llama-3-70B-Instruct",)),
    ("meta-llama/Llama-3.1-8B", "llama", "LlamaForCausalLM", _llama(4096, 14336, 32, 32, 8, 128256, max_position_embeddings=131072), ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct")),
    ("meta-llama/Llama-3.1-70B", "llama", "LlamaForCausalLM", _llama(8192, 28672, 80, 64, 8, 128256, max_position_embeddings=131072), ("meta-llama/Meta-Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct")),
    ("meta-llama/Llama-3.1-405B", "llama", "LlamaForCausalLM", _llama(16384, 53248, 126, 128, 8, 128256, max_position_embeddings=131072), ("meta-llama/Meta-Llama-3.1-405B", "meta-llama/Llama-3.1-405B-Instruct")),
    ("meta-llama/Llama-3.2-1B", "llama", "LlamaForCausalLM", dict(_llama(2048, 8192, 16, 32, 8, 128256, max_position_embeddings=131072, head_dim=64), tie_word_embeddings=True), ("meta-llama/Llama-3.2-1B-Instruct",)),
    ("meta-llama/Llama-3.2-3B", "llama", "LlamaForCausalLM", dict(_llama(3072, 8192, 28, 24, 8, 128256, max_position_embeddings=131072, head_dim=128), tie_word_embeddings=True), ("meta-llama/Llama-3.2-3B-Instruct",)),
    ("mistralai/Mistral-7B-v0.1", "mistral", "MistralForCausalLM", _llama(4096, 14336, 32, 32, 8, 32000, max_position_embeddings=32768), ("mistralai/Mistral-7B-Instruct-v0.1", "mistralai/Mistral-7B-Instruct-v0.2")),
    ("mistralai/Mistral-7B-v0.3", "mistral", "MistralForCausalLM", _llama(4096, 14336, 32, 32, 8, 32768, max_position_embeddings=32768), ("mistralai/Mistral-7B-Instruct-v0.3",)),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral", "MixtralForCausalLM", _llama(4096, 14336, 32, 32, 8, 32000, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768), ("mistralai/Mixtral-8x7B-Instruct-v0.1",)),
    ("mistralai/Mixtral-8x22B-v0.1", "mixtral", "MixtralForCausalLM", _llama(6144, 16384, 56, 48, 8, 32768, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=65536), ("mistralai/Mixtral-8x22B-Instruct-v0.1",)),
    ("Qwen/Qwen2-0.5B", "qwen2", "Qwen2ForCausalLM", dict(_llama(896, 4864, 24, 14, 2, 151936), tie_word_embeddings=True), ("Qwen/Qwen2-0.5B-Instruct",)),
    ("Qwen/Qwen2-1.5B", "qwen2", "Qwen2ForCausalLM", dict(_llama(1536, 8960, 28, 12, 2, 151936), tie_word_embeddings=True), ("Qwen/Qwen2-1.5B-Instruct",)),
    ("Qwen/Qwen2-7B", "qwen2", "Qwen2ForCausalLM", _llama(3584, 18944, 28, 28, 4, 152064), ("Qwen/Qwen2-7B-Instruct",)),
    ("Qwen/Qwen2-72B", "qwen2", "Qwen2ForCausalLM", _llama(8192, 29568, 80, 64, 8, 152064), ("Qwen/Qwen2-72B-Instruct",)),
    ("Qwen/Qwen2.5-0.5B", "qwen2", "Qwen2ForCausalLM", dict(_llama(896, 4864, 24, 14, 2, 151936), tie_word_embeddings=True), ("Qwen/Qwen2.5-0.5B-Instruct",)),
    ("Qwen/Qwen2.5-1.5B", "qwen2", "Qwen2ForCausalLM", dict(_llama(1536, 8960, 28, 12, 2, 151936), tie_word_embeddings=True), ("Qwen/Qwen2.5-1.5B-Instruct",)),
    ("Qwen/Qwen2.5-3B", "qwen2", "Qwen2ForCausalLM", dict(_llama(2048, 11008, 36, 16, 2, 151936), tie_word_embeddings=True), ("Qwen/Qwen2.5-3B-Instruct",)),
    ("Qwen/Qwen2.5-7B", "qwen2", "Qwen2ForCausalLM", _llama(3584, 18944, 28, 28, 4, 152064), ("Qwen/Qwen2.5-7B-Instruct",)),
    ("Qwen/Qwen2.5-14B", "qwen2", "Qwen2ForCausalLM", _llama(5120, 13824, 48, 40, 8, 152064), ("Qwen/Qwen2.5-14B-Instruct",)),
    ("Qwen/Qwen2.5-32B", "qwen2", "Qwen2ForCausalLM", _llama(5120, 27648, 64, 40, 8, 152064), ("Qwen/Qwen2.5-32B-Instruct",)),
    ("Qwen/Qwen2.5-72B", "qwen2", "Qwen2ForCausalLM", _llama(8192, 29568, 80, 64, 8, 152064), ("Qwen/Qwen2.5-72B-Instruct",)),
    ("google/gemma-2b", "gemma", "GemmaForCausalLM", dict(_llama(2048, 16384, 18, 8, 1, 256000, head_dim=256, max_position_embeddings=8192), tie_word_embeddings=True), ("google/gemma-2b-it",)),
    ("google/gemma-7b", "gemma", "GemmaForCausalLM", dict(_llama(3072, 24576, 28, 16, 16, 256000, head_dim=256, max_position_embeddings=8192), tie_word_embeddings=True), ("google/gemma-7b-it",)),
    ("google/gemma-2-2b", "gemma2", "Gemma2ForCausalLM", dict(_llama(2304, 9216, 26, 8, 4, 256000, head_dim=256, max_position_embeddings=8192), tie_word_embeddings=True), ("google/gemma-2-2b-it",)),
    ("google/gemma-2-9b", "gemma2", "Gemma2ForCausalLM", dict(_llama(3584, 14336, 42, 16, 8, 256000, head_dim=256, max_position_embeddings=8192), tie_word_embeddings=True), ("google/gemma-2-9b-it",)),
    ("google/gemma-2-27b", "gemma2", "Gemma2ForCausalLM", dict(_llama(4608, 36864, 46, 32, 16, 256000, head_dim=128, max_position_embeddings=8192), tie_word_embeddings=True), ("google/gemma-2-27b-it",)),
    ("microsoft/phi-2", "phi", "PhiForCausalLM", dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=32, num_attention_heads=32, vocab_size=51200, partial_rotary_factor=0.4, max_position_embeddings=2048), ()),
    ("microsoft/Phi-3-mini-4k-instruct", "phi3", "Phi3ForCausalLM", _llama(3072, 8192, 32, 32, 32, 32064, max_position_embeddings=4096), ()),
    ("microsoft/Phi-3.5-mini-instruct", "phi3", "Phi3ForCausalLM", _llama(3072, 8192, 32, 32, 32, 32064, max_position_embeddings=131072), ()),
]

# --- Encoder-decoders, speech, vision ---------------------------------------------------------------
# T5 (relu, tied) and Flan-T5 (gated-gelu, untied): the checkpoints' config.json on the Hub
# (google-t5/t5-small ... t5-11b, google/flan-t5-small ... xxl); flan-t5-xxl's 4096/10240/64 heads/24
# layers also in THUDM's t5-xxl launcher seen with the search tool. BART, Whisper, CLIP, ViT: the
# checkpoints' config.json on the Hub (facebook/bart-base, openai/whisper-*, openai/clip-vit-*,
# google/vit-*), values not re-read from a stored copy here.
def _t5(d: int, ff: int, kv: int, heads: int, layers: int, flan: bool) -> dict[str, Any]:
    return dict(d_model=d, d_ff=ff, d_kv=kv, num_heads=heads, num_layers=layers, num_decoder_layers=layers, vocab_size=32128,
                feed_forward_proj="gated-gelu" if flan else "relu", tie_word_embeddings=not flan)


def _whisper(d: int, layers: int, heads: int, ff: int, mels: int = 80, vocab: int = 51865) -> dict[str, Any]:
    return dict(d_model=d, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                encoder_ffn_dim=ff, decoder_ffn_dim=ff, num_mel_bins=mels, vocab_size=vocab, max_source_positions=1500, max_target_positions=448)


def _clip(text: tuple[int, int, int, int], vision: tuple[int, int, int, int], patch: int, projection: int) -> dict[str, Any]:
    return dict(
        text_config=dict(hidden_size=text[0], intermediate_size=text[1], num_hidden_layers=text[2], num_attention_heads=text[3], vocab_size=49408, max_position_embeddings=77),
        vision_config=dict(hidden_size=vision[0], intermediate_size=vision[1], num_hidden_layers=vision[2], num_attention_heads=vision[3], patch_size=patch, image_size=224),
        projection_dim=projection,
    )


_LABELS_1000 = dict(id2label={i: f"LABEL_{i}" for i in range(1000)})
SEQ2SEQ: list[Checkpoint] = [
    ("t5-small", "t5", "T5ForConditionalGeneration", _t5(512, 2048, 64, 8, 6, False), ("google-t5/t5-small",)),
    ("t5-base", "t5", "T5ForConditionalGeneration", _t5(768, 3072, 64, 12, 12, False), ("google-t5/t5-base",)),
    ("t5-large", "t5", "T5ForConditionalGeneration", _t5(1024, 4096, 64, 16, 24, False), ("google-t5/t5-large",)),
    ("t5-3b", "t5", "T5ForConditionalGeneration", _t5(1024, 16384, 128, 32, 24, False), ("google-t5/t5-3b",)),
    ("t5-11b", "t5", "T5ForConditionalGeneration", _t5(1024, 65536, 128, 128, 24, False), ("google-t5/t5-11b",)),
    ("google/flan-t5-small", "t5", "T5ForConditionalGeneration", _t5(512, 1024, 64, 6, 8, True), ()),
    ("google/flan-t5-base", "t5", "T5ForConditionalGeneration", _t5(768, 2048, 64, 12, 12, True), ()),
    ("google/flan-t5-large", "t5", "T5ForConditionalGeneration", _t5(1024, 2816, 64, 16, 24, True), ()),
    ("google/flan-t5-xl", "t5", "T5ForConditionalGeneration", _t5(2048, 5120, 64, 32, 24, True), ()),
    ("google/flan-t5-xxl", "t5", "T5ForConditionalGeneration", _t5(4096, 10240, 64, 64, 24, True), ()),
    ("facebook/bart-base", "bart", "BartForConditionalGeneration", dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265, max_position_embeddings=1024), ()),
    ("facebook/bart-large", "bart", "BartForConditionalGeneration", dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=50265, max_position_embeddings=1024), ("facebook/bart-large-cnn",)),
    ("openai/whisper-tiny", "whisper", "WhisperForConditionalGeneration", _whisper(384, 4, 6, 1536), ("openai/whisper-tiny.en",)),
    ("openai/whisper-base", "whisper", "WhisperForConditionalGeneration", _whisper(512, 6, 8, 2048), ("openai/whisper-base.en",)),
    ("openai/whisper-small", "whisper", "WhisperForConditionalGeneration", _whisper(768, 12, 12, 3072), ("openai/whisper-small.en",)),
    ("openai/whisper-medium", "whisper", "WhisperForConditionalGeneration", _whisper(1024, 24, 16, 4096), ("openai/whisper-medium.en",)),
    ("openai/whisper-large-v2", "whisper", "WhisperForConditionalGeneration", _whisper(1280, 32, 20, 5120), ("openai/whisper-large",)),
    ("openai/whisper-large-v3", "whisper", "WhisperForConditionalGeneration", _whisper(1280, 32, 20, 5120, mels=128, vocab=51866), ()),
    ("openai/clip-vit-base-patch32", "clip", "CLIPModel", _clip((512, 2048, 12, 8), (768, 3072, 12, 12), 32, 512), ()),
    ("openai/clip-vit-base-patch16", "clip", "CLIPModel", _clip((512, 2048, 12, 8), (768, 3072, 12, 12), 16, 512), ()),
    ("openai/clip-vit-large-patch14", "clip", "CLIPModel", _clip((768, 3072, 12, 12), (1024, 4096, 24, 16), 14, 768), ()),
    ("google/vit-base-patch16-224", "vit", "ViTForImageClassification", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, image_size=224, patch_size=16, **_LABELS_1000), ()),
    ("google/vit-large-patch16-224", "vit", "ViTForImageClassification", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, image_size=224, patch_size=16, **_LABELS_1000), ()),
    ("google/vit-base-patch16-224-in21k", "vit", "ViTModel", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, image_size=224, patch_size=16), ()),
]
CHECKPOINTS = GPT2 + BERTS + ELEUTHER + DECODERS + SEQ2SEQ

# --- Stable Diffusion (diffusers 0.42.1) --------------------------------------------------------------
# unet/config.json, vae/config.json and text_encoder(_2)/config.json of runwayml/stable-diffusion-v1-5,
# stabilityai/stable-diffusion-2-1 and stabilityai/stable-diffusion-xl-base-1.0 on the Hub (values not
# re-read from a stored copy here); SD 1.x's UNet is diffusers' default UNet2DConditionModel config.
_VAE = dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
            block_out_channels=[128, 256, 512, 512], layers_per_block=2, latent_channels=4)
_CLIP_L_TEXT = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, vocab_size=49408, max_position_embeddings=77)
DIFFUSION = {
    "runwayml/stable-diffusion-v1-5": dict(
        unet=dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8),
        vae=_VAE,
        text_encoders=[("CLIPTextModel", _CLIP_L_TEXT)],
        aliases=("stable-diffusion-v1-5/stable-diffusion-v1-5", "CompVis/stable-diffusion-v1-4", "benjamin-paine/stable-diffusion-v1-5"),
    ),
    "stabilityai/stable-diffusion-2-1": dict(
        unet=dict(sample_size=96, cross_attention_dim=1024, attention_head_dim=[5, 10, 20, 20], use_linear_projection=True),
        vae=_VAE,
        text_encoders=[("CLIPTextModel", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16, vocab_size=49408, max_position_embeddings=77, hidden_act="gelu"))],
        aliases=("stabilityai/stable-diffusion-2-1-base", "stabilityai/stable-diffusion-2"),
    ),
    "stabilityai/stable-diffusion-xl-base-1.0": dict(
        unet=dict(
            sample_size=128, block_out_channels=[320, 640, 1280], down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], transformer_layers_per_block=[1, 2, 10],
            attention_head_dim=[5, 10, 20], cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
        ),
        vae=_VAE,
        text_encoders=[("CLIPTextModel", _CLIP_L_TEXT),
                       ("CLIPTextModelWithProjection", dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20, vocab_size=49408, max_position_embeddings=77, hidden_act="gelu", projection_dim=1280))],
        aliases=(),
    ),
}

# --- timm: the architectures people train most (timm 1.0.31 names) ------------------------------------------
TIMM_NAMES = [
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet50d", "resnext50_32x4d", "resnext101_32x8d",
    "wide_resnet50_2", "seresnet50", "resnetv2_50x1_bit", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2",
    "efficientnet_b3", "efficientnet_b4", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7", "tf_efficientnet_b0",
    "tf_efficientnet_b3", "tf_efficientnet_b7", "efficientnetv2_s", "efficientnetv2_m", "efficientnetv2_l", "tf_efficientnetv2_s",
    "tf_efficientnetv2_m", "tf_efficientnetv2_l", "mobilenetv2_100", "mobilenetv3_small_100", "mobilenetv3_large_100",
    "mobilenetv4_conv_small", "convnext_atto", "convnext_nano", "convnext_tiny", "convnext_small", "convnext_base", "convnext_large",
    "convnext_xlarge", "convnextv2_tiny", "convnextv2_base", "convnextv2_large", "vit_tiny_patch16_224", "vit_small_patch16_224",
    "vit_base_patch16_224", "vit_base_patch32_224", "vit_large_patch16_224", "vit_huge_patch14_224", "vit_base_patch16_384",
    "vit_small_patch14_dinov2", "vit_base_patch14_dinov2", "vit_large_patch14_dinov2", "deit_tiny_patch16_224",
    "deit_small_patch16_224", "deit_base_patch16_224", "deit3_base_patch16_224", "swin_tiny_patch4_window7_224",
    "swin_small_patch4_window7_224", "swin_base_patch4_window7_224", "swin_large_patch4_window7_224", "swinv2_tiny_window8_256",
    "swinv2_base_window8_256", "beit_base_patch16_224", "eva02_base_patch14_224", "regnety_008", "regnety_016", "regnety_032",
    "regnety_040", "regnety_080", "regnetx_032", "densenet121", "densenet169", "densenet201", "inception_v3", "inception_v4",
    "xception65", "mixer_b16_224", "levit_128", "maxvit_tiny_tf_224", "coatnet_0_rw_224", "caformer_s18", "poolformer_s12",
    "edgenext_small", "ghostnet_100", "hrnet_w18", "dla34", "vgg16", "vgg19", "mnasnet_100", "rexnet_100", "nfnet_f0",
    "dm_nfnet_f0", "cspresnet50", "repvgg_a2", "efficientvit_b1", "fastvit_t8", "tiny_vit_5m_224",
]  # fmt: skip


def _count(module: Any) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def _shape(config: Any) -> dict[str, int | None]:
    text = getattr(config, "text_config", None)
    source = config if text is None else text
    def read(*names: str) -> int | None:
        for name in names:
            value = getattr(source, name, None)
            if isinstance(value, int):
                return value
        return None
    return {
        "layers": read("num_hidden_layers", "num_layers", "n_layer", "encoder_layers"),
        "hidden": read("hidden_size", "d_model", "n_embd", "dim"),
        "heads": read("num_attention_heads", "num_heads", "n_head", "encoder_attention_heads"),
        "vocab": read("vocab_size"),
        "max_positions": read("max_position_embeddings", "n_positions", "max_target_positions"),
    }


def measure_checkpoints(failures: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    import torch
    import transformers

    from oom_lsp.analysis.facts import known_models

    table: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    for hub_id, model_type, architecture, values, names in CHECKPOINTS:
        started = time.perf_counter()
        config = transformers.AutoConfig.for_model(model_type, **values)
        with torch.device("meta"):
            model = getattr(transformers, architecture)(config)
            base = transformers.AutoModel.from_config(config)
        parameters, base_parameters = _count(model), _count(base)
        del model, base
        entry = {"model_type": model_type, "architecture": architecture, "parameters": parameters, "base_parameters": base_parameters, **_shape(config)}
        entry["config"] = {key: value for key, value in values.items() if not isinstance(value, (dict, list)) or key in ("attention_head_dim",)}
        entry["config"]["model_type"] = model_type
        table[hub_id] = entry
        for alias in (hub_id.lower(), hub_id.rsplit("/", 1)[-1].lower(), *[name.lower() for name in names], *[name.rsplit("/", 1)[-1].lower() for name in names]):
            if alias != hub_id:
                aliases.setdefault(alias, hub_id)
        note = ""
        if hub_id in PUBLISHED:
            note = f"  published {PUBLISHED[hub_id]:,} ({'same' if PUBLISHED[hub_id] == parameters else 'DIFFERS'})"
            if PUBLISHED[hub_id] != parameters:
                failures.append(f"{hub_id}: measured {parameters:,}, the model card says {PUBLISHED[hub_id]:,}")
        print(f"{hub_id:45} {architecture:32} {parameters:>16,} base {base_parameters:>16,}  {time.perf_counter() - started:5.1f}s{note}")
        formula = known_models.FORMULAS.get(model_type)
        if formula is not None:
            full = config.to_dict()
            for head, expected in (("lm", parameters), ("base", base_parameters)):
                computed = formula(full, head)[0]
                if computed != expected:
                    failures.append(f"{hub_id}: the {model_type} formula ({head}) gives {computed:,}, instantiation {expected:,}")
    return table, aliases


def config_classes(failures: list[str]) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """The defaults of the config classes whose families have a formula, the model classes of those
    families, and a check of each formula on each class's default config."""
    import torch
    import transformers
    from transformers.models.auto import modeling_auto

    from oom_lsp.analysis.facts import known_models

    classes: dict[str, Any] = {}
    models: dict[str, tuple[str, str]] = {}
    for model_type, formula in known_models.FORMULAS.items():
        config_class = transformers.AutoConfig.for_model(model_type).__class__
        defaults = {key: value for key, value in config_class().to_dict().items() if isinstance(value, (int, float, str, bool)) or value is None}
        defaults["model_type"] = model_type
        classes[config_class.__name__] = {"model_type": model_type, "defaults": defaults}
        heads = {modeling_auto.MODEL_MAPPING_NAMES.get(model_type): "base"}
        for mapping in (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
                        modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES):
            if mapping.get(model_type):
                heads[mapping[model_type]] = "lm"
        if model_type == "t5":
            heads["T5EncoderModel"] = "encoder"
        for class_name, head in heads.items():
            if class_name is None:
                continue
            models[class_name] = (model_type, head)
            # A small config of the family (its defaults, narrowed), built for real and by the formula.
            small = config_class(**_narrow(model_type))
            with torch.device("meta"):
                measured = _count(getattr(transformers, class_name)(small))
            computed = formula(small.to_dict(), head)[0]
            status = "same" if computed == measured else "DIFFERS"
            print(f"  formula {model_type:8} {class_name:32} {head:8} measured {measured:>12,} formula {computed:>12,} {status}")
            if computed != measured:
                failures.append(f"{class_name}: formula {computed:,}, instantiation {measured:,}")
    return classes, models


def _narrow(model_type: str) -> dict[str, Any]:
    if model_type == "gpt2":
        return dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000)
    if model_type == "t5":
        return dict(num_layers=2, d_model=64, d_ff=128, d_kv=16, num_heads=4, vocab_size=1000)
    narrow = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000)
    if model_type in ("llama", "mistral", "qwen2", "mixtral"):
        narrow["num_key_value_heads"] = 2
    return narrow


def measure_vision(failures: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    import timm
    import torch
    import torchvision

    def entry(build: Any) -> dict[str, int] | None:
        with torch.device("meta"):
            default = _count(build())
            try:
                ten = _count(build(num_classes=10))
            except Exception:
                ten = None
        result = {"parameters": default, "num_classes": 1000}
        if ten is not None and (default - ten) % 990 == 0:
            result["per_class"] = (default - ten) // 990
        return result

    # RegNet computes its block widths with torch ops (`.tolist()`), which the meta device cannot
    # answer: that arithmetic runs on the CPU, the model is still built on meta.
    from torchvision.models import regnet

    block_params = regnet.BlockParams.from_init_params.__func__

    def on_cpu(cls: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.device("cpu"):
            return block_params(cls, *args, **kwargs)

    regnet.BlockParams.from_init_params = classmethod(on_cpu)
    vision: dict[str, Any] = {}
    for name in torchvision.models.list_models(module=torchvision.models):
        try:
            vision[name] = entry(lambda **kw: torchvision.models.get_model(name, **kw))
        except Exception as error:  # noqa: BLE001 - reported, then the table goes on
            failures.append(f"torchvision {name}: {error}")
            continue
        print(f"torchvision {name:40} {vision[name]['parameters']:>14,}  per class {vision[name].get('per_class')}")
    image_models: dict[str, Any] = {}
    for name in TIMM_NAMES:
        try:
            image_models[name] = entry(lambda **kw: timm.create_model(name, pretrained=False, **kw))
        except Exception as error:  # noqa: BLE001
            failures.append(f"timm {name}: {error}")
            continue
        print(f"timm {name:40} {image_models[name]['parameters']:>14,}  per class {image_models[name].get('per_class')}")
    return vision, image_models


def measure_diffusion(failures: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        import diffusers
    except ImportError:
        failures.append("diffusers is not installed (pip install diffusers==0.42.1): Stable Diffusion left out")
        return {}, {}
    import torch
    import transformers

    table: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    for hub_id, parts in DIFFUSION.items():
        with torch.device("meta"):
            unet = _count(diffusers.UNet2DConditionModel(**parts["unet"]))
            vae = _count(diffusers.AutoencoderKL(**parts["vae"]))
            text = 0
            for class_name, values in parts["text_encoders"]:
                config = transformers.CLIPTextConfig(**values)
                text += _count(getattr(transformers, class_name)(config))
        table[hub_id] = {"unet": unet, "vae": vae, "text_encoder": text}
        for alias in (hub_id.lower(), *[name.lower() for name in parts["aliases"]]):
            if alias != hub_id:
                aliases[alias] = hub_id
        print(f"{hub_id:45} unet {unet:>14,} vae {vae:>12,} text {text:>12,}")
    return table, aliases


def render(data: dict[str, Any]) -> str:
    versions = data.pop("VERSIONS")
    lines = [
        '"""Parameter counts measured by bench/known_models_table.py: generated, do not edit.',
        "",
        f"Measured on torch's meta device with {', '.join(f'{k} {v}' for k, v in versions.items())}.",
        '"""',
        "",
        "# fmt: off",
        f"VERSIONS = {versions!r}",
    ]
    for name, value in data.items():
        lines.append(f"{name} = {pprint.pformat(value, width=120, sort_dicts=True)}")
    lines.append("# fmt: on")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed table; write nothing")
    args = parser.parse_args()
    failures: list[str] = []
    started = time.perf_counter()
    checkpoints, aliases = measure_checkpoints(failures)
    classes, models = config_classes(failures)
    vision, image_models = measure_vision(failures)
    diffusion, diffusion_aliases = measure_diffusion(failures)
    versions = {package: importlib.metadata.version(package) for package in ("torch", "transformers", "timm", "torchvision")}
    try:
        versions["diffusers"] = importlib.metadata.version("diffusers")
    except importlib.metadata.PackageNotFoundError:
        pass
    text = render({
        "VERSIONS": versions, "CHECKPOINTS": checkpoints, "ALIASES": aliases, "CONFIG_CLASSES": classes,
        "MODEL_CLASSES": models, "TORCHVISION": vision, "TIMM": image_models, "DIFFUSERS": diffusion,
        "DIFFUSERS_ALIASES": diffusion_aliases,
    })
    print(f"{len(checkpoints)} checkpoints, {len(vision)} torchvision and {len(image_models)} timm architectures, "
          f"{len(diffusion)} diffusion pipelines in {time.perf_counter() - started:.0f}s")
    for failure in failures:
        print("FAIL", failure)
    if args.check:
        same = TABLE.exists() and TABLE.read_text() == text
        print("the committed table matches" if same else "the committed table DIFFERS from this measurement")
        return 0 if same and not failures else 1
    TABLE.write_text(text)
    print(f"wrote {TABLE.relative_to(ROOT)}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
