"""Pretrained checkpoints read by their headers alone (harness/pretrained.py).

Every safetensors checkpoint here is cut right after its header: its tensor data is not in the file
at all, so a load that read a byte of it would fail (the `.bin` one is whole: a zip cut short does not
open). The estimate still runs, and counts what the real model holds. All scripts run in one child
interpreter (one `import transformers`), each as a run of its own. Without Transformers (CI installs
the test extra only) the plain-torch cases run alone; Transformers and PEFT are in the bench extra."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file

from oom_lsp.estimate.estimator import EstimateError, EstimateOptions, prediction_from, run_harness
from oom_lsp.estimate.results import Trace

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_PEFT = HAS_TRANSFORMERS and importlib.util.find_spec("peft") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers (the bench extra)")
needs_peft = pytest.mark.skipif(not HAS_PEFT, reason="needs peft (the bench extra)")


def cut_after_header(path: Path) -> int:
    """Truncates a safetensors file to its header; returns the bytes of tensor data it had."""
    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
    data = path.stat().st_size - 8 - size
    os.truncate(path, 8 + size)
    return data


def held_bytes(module) -> int:
    """Bytes of a real module's parameters and buffers, each storage once (tied weights share one)."""
    storages = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


# Plain torch: a model built on the meta device, its weights assigned from safetensors' load_file.
PLAIN = """
from pathlib import Path
import torch
from safetensors.torch import load_file

with torch.device("meta"):
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16))
model.load_state_dict(load_file(Path(__file__).parent / "plain.safetensors"), assign=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(8, 512, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# The same file read in a worker thread, where none of the run's modes is active.
THREADED = PLAIN.replace(
    'model.load_state_dict(load_file(Path(__file__).parent / "plain.safetensors"), assign=True)',
    "from concurrent.futures import ThreadPoolExecutor\n"
    "with ThreadPoolExecutor(2) as pool:\n"
    '    state = pool.submit(load_file, Path(__file__).parent / "plain.safetensors").result()\n'
    "model.load_state_dict(state, assign=True)",
)

# Transformers: a model from a local folder, two AdamW steps. {load} is the from_pretrained call.
TRAIN = """from pathlib import Path
import torch
import transformers

here = Path(__file__).parent
model = {load}
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(2):
    ids = torch.randint(0, 512, (2, 12))
    {loss}.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def llama_config(**overrides):
    from transformers import LlamaConfig

    settings = {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
    settings.update(overrides)
    return LlamaConfig(**settings)


def _script(
    folder: Path, load: str, loss: str = "model(input_ids=ids, labels=ids).loss", name: str = "train.py"
) -> Path:
    script = folder / name
    script.write_text(TRAIN.format(load=load, loss=loss))
    return script


def _checkpoints(root: Path) -> tuple[list[dict], dict]:
    """The runs (one script each) and what each must count as parameters."""
    runs, expected = [], {}

    plain = root / "plain"
    plain.mkdir()
    weights = {
        "0.weight": torch.randn(1024, 512, dtype=torch.bfloat16),
        "0.bias": torch.randn(1024, dtype=torch.bfloat16),
        "2.weight": torch.randn(16, 1024, dtype=torch.bfloat16),
        "2.bias": torch.randn(16, dtype=torch.bfloat16),
    }
    save_file(weights, plain / "plain.safetensors")
    expected["plain"] = cut_after_header(plain / "plain.safetensors")
    (plain / "train.py").write_text(PLAIN)
    runs.append({"case": "plain", "script": str(plain / "train.py")})
    (plain / "threaded.py").write_text(THREADED)
    expected["threaded"] = expected["plain"]
    runs.append({"case": "threaded", "script": str(plain / "threaded.py")})

    if not HAS_TRANSFORMERS:
        return runs, expected
    import transformers

    torch.manual_seed(0)

    # One file, float32, every weight in the checkpoint.
    single = root / "single"
    model = transformers.LlamaForCausalLM(llama_config())
    model.save_pretrained(single / "ckpt")
    expected["single"] = held_bytes(transformers.AutoModelForCausalLM.from_pretrained(single / "ckpt"))
    # The same file cast on load, by the older keyword (Transformers maps torch_dtype to dtype).
    cast = transformers.AutoModelForCausalLM.from_pretrained(single / "ckpt", torch_dtype=torch.bfloat16)
    expected["cast"] = held_bytes(cast)
    cut_after_header(single / "ckpt" / "model.safetensors")
    load = 'transformers.AutoModelForCausalLM.from_pretrained(here / "ckpt")'
    runs.append({"case": "single", "script": str(_script(single, load))})
    load = 'transformers.AutoModelForCausalLM.from_pretrained(here / "ckpt", torch_dtype=torch.bfloat16)'
    runs.append({"case": "cast", "script": str(_script(single, load, name="train_cast.py"))})

    # Sharded (model.safetensors.index.json), saved in bfloat16 with no dtype in its config:
    # dtype="auto" can only come from the shards' headers.
    sharded = root / "sharded"
    model = transformers.LlamaForCausalLM(llama_config()).to(torch.bfloat16)
    model.save_pretrained(sharded / "ckpt", max_shard_size="40KB")
    shards = sorted((sharded / "ckpt").glob("model-*.safetensors"))
    assert len(shards) > 2 and (sharded / "ckpt" / "model.safetensors.index.json").exists()
    config = json.loads((sharded / "ckpt" / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (sharded / "ckpt" / "config.json").write_text(json.dumps(config))
    index = json.loads((sharded / "ckpt" / "model.safetensors.index.json").read_text())
    index.get("metadata", {}).pop("dtype", None)
    (sharded / "ckpt" / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(sharded / "ckpt", dtype="auto")
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    expected["sharded"] = held_bytes(loaded)
    for shard in shards:
        cut_after_header(shard)
    load = 'transformers.AutoModelForCausalLM.from_pretrained(here / "ckpt", dtype="auto")'
    runs.append({"case": "sharded", "script": str(_script(sharded, load))})

    # Tied embeddings: the checkpoint has no lm_head.weight, the model holds the embedding once.
    tied = root / "tied"
    model = transformers.LlamaForCausalLM(llama_config(tie_word_embeddings=True))
    model.save_pretrained(tied / "ckpt")
    expected["tied"] = held_bytes(transformers.AutoModelForCausalLM.from_pretrained(tied / "ckpt"))
    cut_after_header(tied / "ckpt" / "model.safetensors")
    load = 'transformers.AutoModelForCausalLM.from_pretrained(here / "ckpt")'
    runs.append({"case": "tied", "script": str(_script(tied, load))})

    # A base model's checkpoint, plus a key no model has, loaded with a head: the head is missing
    # (initialised), the extra key unexpected (dropped).
    keys = root / "keys"
    base = transformers.LlamaModel(llama_config(pad_token_id=0))
    base.config.save_pretrained(keys / "ckpt")
    state = {name: tensor.contiguous() for name, tensor in base.state_dict().items()}
    state["unused_probe.weight"] = torch.zeros(4096, 64)
    save_file(state, keys / "ckpt" / "model.safetensors", metadata={"format": "pt"})
    expected["keys"] = held_bytes(transformers.LlamaForSequenceClassification.from_pretrained(keys / "ckpt"))
    cut_after_header(keys / "ckpt" / "model.safetensors")
    load = 'transformers.LlamaForSequenceClassification.from_pretrained(here / "ckpt")'
    runs.append({"case": "keys", "script": str(_script(keys, load, "model(input_ids=ids).logits.sum()"))})

    # A pickle checkpoint (pytorch_model.bin): torch.load under fake mode reads no tensor data.
    pickled = root / "pickled"
    model = transformers.LlamaForCausalLM(llama_config())
    model.config.save_pretrained(pickled / "ckpt")
    torch.save(model.state_dict(), pickled / "ckpt" / "pytorch_model.bin")
    expected["pickled"] = held_bytes(transformers.AutoModelForCausalLM.from_pretrained(pickled / "ckpt"))
    # Loaded four times: Transformers' threaded load under fake mode crashed in some runs, not all.
    load = "[transformers.AutoModelForCausalLM.from_pretrained(here / 'ckpt') for _ in range(4)][-1]"
    runs.append({"case": "pickled", "script": str(_script(pickled, load))})

    # A PEFT LoRA adapter (adapter_model.safetensors, read by safetensors.torch.load_file) on a base model.
    if HAS_PEFT:
        import peft

        adapter = root / "adapter"
        model = transformers.LlamaForCausalLM(llama_config())
        model.save_pretrained(adapter / "base")
        lora = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        lora.save_pretrained(adapter / "lora")
        base = transformers.AutoModelForCausalLM.from_pretrained(adapter / "base")
        expected["adapter"] = held_bytes(
            peft.PeftModel.from_pretrained(base, adapter / "lora", is_trainable=True)
        )
        cut_after_header(adapter / "base" / "model.safetensors")
        cut_after_header(adapter / "lora" / "adapter_model.safetensors")
        load = (
            'peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(here / "base"), '
            'here / "lora", is_trainable=True)'
        )
        script = _script(adapter, load)
        script.write_text("import peft\n" + script.read_text())
        runs.append({"case": "adapter", "script": str(script)})

    # A Hub name with no local copy (the Hugging Face cache is empty).
    hub = root / "hub"
    hub.mkdir()
    load = 'transformers.AutoModelForCausalLM.from_pretrained("oom-lsp-tests/no-such-model")'
    runs.append({"case": "hub", "script": str(_script(hub, load))})
    return runs, expected


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    runs, expected = _checkpoints(root)
    # No copy of anything in the Hugging Face cache the child sees.
    saved = os.environ.get("HF_HOME")
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("empty-hf-home"))
    try:
        options = EstimateOptions(script=Path(runs[0]["script"]), device="cpu", timeout=300)
        results = run_harness(options, runs)
    finally:
        if saved is None:
            os.environ.pop("HF_HOME", None)
        else:
            os.environ["HF_HOME"] = saved
    return {run["case"]: result for run, result in zip(runs, results)}, expected


def _parameters(traces, case: str) -> tuple[int, int]:
    results, expected = traces
    trace = results[case]
    assert trace["status"] == "stopped", trace.get("failure")
    return trace["breakdown"]["parameters"], expected[case]


def test_safetensors_load_file_reads_the_header_only(traces):
    counted, expected = _parameters(traces, "plain")
    assert counted == expected == (1024 * 512 + 1024 + 16 * 1024 + 16) * 2


def test_a_checkpoint_read_in_another_thread_is_read_by_its_header_too(traces):
    assert "ThreadPoolExecutor" in THREADED
    counted, expected = _parameters(traces, "threaded")
    assert counted == expected


@needs_transformers
@pytest.mark.parametrize(
    "case", ["single", "tied", "keys", "pickled", pytest.param("adapter", marks=needs_peft)]
)
def test_from_pretrained_counts_what_the_real_model_holds(traces, case):
    counted, expected = _parameters(traces, case)
    assert counted == expected


@needs_transformers
def test_sharded_checkpoint_with_dtype_auto_takes_the_headers_dtype(traces):
    counted, expected = _parameters(traces, "sharded")
    assert counted == expected < traces[1]["single"] * 0.51  # bfloat16: half of float32's


@needs_transformers
def test_a_cast_on_load_by_torch_dtype_holds_the_cast_weights(traces):
    counted, expected = _parameters(traces, "cast")
    assert counted == expected < traces[1]["single"] * 0.51  # bfloat16 from a float32 file


@needs_transformers
def test_tied_weights_are_counted_once(traces):
    counted, expected = _parameters(traces, "tied")
    # The untied model's, less one 512 x 64 float32 matrix.
    assert counted == expected == traces[1]["single"] - 512 * 64 * 4


@needs_transformers
def test_a_hub_name_without_a_local_copy_is_one_line_saying_what_is_needed(traces):
    results, _ = traces
    trace = results["hub"]
    assert trace["status"] == "failed"
    assert trace["failure"]["kind"] == "needs-download"
    with pytest.raises(EstimateError) as raised:
        prediction_from(Trace.from_harness(trace), EstimateOptions(script=Path("train.py"), device="cpu"))
    message = str(raised.value)
    assert "\n" not in message
    assert "'oom-lsp-tests/no-such-model'" in message
    assert "`hf download oom-lsp-tests/no-such-model`" in message
    assert "local folder" in message
    assert "train.py:6" in message  # the script's from_pretrained line
