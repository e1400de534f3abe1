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
