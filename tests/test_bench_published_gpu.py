"""bench/published_gpu.py: the lit-gpt rows' script, scaled down, is estimated end to end (no crash, a
verdict), and every published OOM row is judged by the verdict."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("published_gpu", ROOT / "bench" / "published_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_litgpt_rows_name_their_source_and_oom_rows():
    bench = _bench()
    rows = [row for row in bench.rows() if row["name"].startswith("litgpt_")]
    assert len(rows) == 12
    oom = {row["name"] for row in rows if row["published_bytes"] is None}
    assert oom == {"litgpt_llama2_7b_mb4", "litgpt_llama2_13b_mb2", "litgpt_llama2_13b_mb4"}
    assert all(row["metric"] == "max_memory_allocated" and row["gpu"] == "A100 40GB" for row in rows)
    # a published OOM passes only on the OOM verdict
    assert bench.compare(rows[8], {"peak_bytes": 1, "reserved_bytes": 1, "context_bytes": 0, "verdict": "fits"})[
        "ok"
    ] is False


def test_litgpt_script_scaled_down_is_estimated(tmp_path):
    bench = _bench()
    config = dict(bench.LITGPT_MODELS["llama-2-7b"][0], n_layer=2, n_embd=64, n_head=4, intermediate_size=128,
                  vocab_size=256, padded_vocab_size=256, block_size=64)
    script = tmp_path / "train.py"
    script.write_text(bench.LITGPT_SCRIPT.format(config=config, micro_batch_size=2, seq_len=32), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "oom_lsp", "estimate", str(script), "--gpu", "A100 40GB", "--format", "json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
    result = json.loads(done.stdout)
    # two bf16 copies' worth at least: the weights (all frozen but LoRA) are in the peak
    parameters = 2 * (256 * 64 * 2 + 2 * (64 * 192 + 64 * 64 + 3 * 64 * 128 + 16 * 64 + 128 * 8 + 2 * 64) + 64)
    assert result["peak_bytes"] > parameters
    assert result["verdict"] == "fits"


def test_torchtune_packed_row_scaled_down_is_estimated_with_flex_attention(tmp_path):
    """torchtune's packed row takes FlexAttention with a document mask on the A100 it is told of; the
    trace runs it as the CUDA kernels allocate (the CPU has no FlexAttention backward) and gives a number."""
    bench = _bench()
    (row,) = [row for row in bench.rows() if row["name"].startswith("torchtune_")]
    assert row["metric"] == "peak active" and row["published_bytes"] == int(60.0 * 2**30)
    script_text = (
        row["script"]
        .replace("128256, 3072, 28, 24, 8, 8192", "512, 64, 2, 4, 2, 128")
        .replace("batch_size, max_seq_len = 2, 4096", "batch_size, max_seq_len = 2, 256")
        .replace("[1500, 1200, 900, 496]", "[100, 80, 76]")
    )
    assert script_text.count("512, 64, 2, 4, 2, 128") == 1 and "[100, 80, 76]" in script_text
    script = tmp_path / "train.py"
    script.write_text(script_text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "oom_lsp", "estimate", str(script), "--gpu", row["gpu"], "--format", "json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "flex-attention-cuda" in {correction["name"] for correction in result["corrections"]}
    # bf16 weights, gradients and two AdamW states at least, and fp32 logits of 2 x 256 tokens
    parameters = 512 * 64 + 2 * (2 * 64 + 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128) + 64
    assert result["peak_bytes"] > 4 * 2 * parameters + 2 * 256 * 512 * 4
    assert result["verdict"] == "fits"
