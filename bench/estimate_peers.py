"""`oom-lsp estimate` against what a user would pick instead, side by side on the same scripts (issue 31).

Four training scripts of our own (an MLP, a GPT with causal SDPA, a CNN, an LSTM language model), each
two AdamW steps on the CPU, run unchanged by every tool. The truth is the real CPU peak of the same two
steps (the profiler's allocation events replayed in time order, as bench/estimate_accuracy.py measures
it). The tools:

* `oom-lsp estimate --device cpu` (a fake-tensor trace of the script as it is);
* PyTorch's `MemTracker` (`torch.distributed._tools.mem_tracker`) under `FakeTensorMode`, wrapped around
  the unchanged script (`runpy`): the peak of its "Total" over the run, or the error it stops with;
* the same, with the wrapper calling `tracker.reset_mod_stats()` after each `optimizer.zero_grad()` (what
  MemTracker's error asks for, without editing the script);
* `accelerate estimate-memory`'s formula (`calculate_maximum_sizes` then `estimate_training_usage`,
  "Training using Adam" = the largest of its terms) on the script's model: it needs the Hub for a
  model name, so the model object is handed to its functions (no activations in it);
* `vram-check inspect case:build_model --batch-size N --dtype fp32 --optimizer adamw --json` (`pip install
  vram-check==0.1.1`; the row says so when it is missing): its total (it takes no input shape: its
  activations are a guess from the layers).

    .venv/bin/python bench/estimate_peers.py [--cases mlp,gpt] [--json out.json]

`gpt_typical` is the GPT written as training scripts usually are (a device, a DataLoader, the loss
printed with `.item()`). Each case writes `case.py` (`build_model`, `batch`, `loss`; what accelerate and
vram-check need) and
`train.py` (the training loop every other tool runs) into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oom_lsp.estimate.estimator import EstimateOptions, run_harness

MIB = 2**20

CASES = {
    "mlp": (
        """
import torch
from torch import nn
def build_model():
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))
def batch(n):
    return torch.randn(n, 1024), torch.randint(0, 10, (n,))
def input_shape():
    return (1024,)
loss = nn.functional.cross_entropy
""",
        256,
    ),
    "gpt": (
        """
import torch
from torch import nn
V, D, T, L, H = 8192, 384, 256, 6, 6
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))
class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(*[Block() for _ in range(L)])
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)
    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))
def build_model():
    return GPT()
def batch(n):
    return torch.randint(0, V, (n, T)), torch.randint(0, V, (n, T))
def input_shape():
    return (T,)
def loss(logits, targets):
    return nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1))
""",
        8,
    ),
    "cnn": (
        """
import torch
from torch import nn
def block(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))
def build_model():
    return nn.Sequential(block(3, 32), block(32, 64), block(64, 128), nn.Flatten(), nn.Linear(128 * 8 * 8, 10))
def batch(n):
    return torch.randn(n, 3, 64, 64), torch.randint(0, 10, (n,))
def input_shape():
    return (3, 64, 64)
loss = nn.functional.cross_entropy
""",
        32,
    ),
    "lstm": (
        """
import torch
from torch import nn
V, E, T = 5000, 256, 64
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(V, E), nn.Linear(512, V)
        self.rnn = nn.LSTM(E, 512, num_layers=2, batch_first=True)
    def forward(self, idx):
        return self.out(self.rnn(self.emb(idx))[0])
def build_model():
    return LM()
def batch(n):
    return torch.randint(0, V, (n, T)), torch.randint(0, V, (n, T))
def input_shape():
    return (T,)
def loss(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
""",
        16,
    ),
}

TRAIN = """
import torch
from case import batch, build_model, loss

BATCH_SIZE = {batch_size}
model = build_model()
optimizer = torch.optim.AdamW(model.parameters())
for step in range(2):
    x, y = batch(BATCH_SIZE)
    loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# The same GPT as a training script is usually written: a device, a DataLoader, the loss logged.
TRAIN_TYPICAL = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from case import batch, build_model, loss

BATCH_SIZE = {batch_size}
device = "cuda" if torch.cuda.is_available() else "cpu"
model = build_model().to(device)
optimizer = torch.optim.AdamW(model.parameters())
loader = DataLoader(TensorDataset(*batch(4 * BATCH_SIZE)), batch_size=BATCH_SIZE, shuffle=True)
for step, (x, y) in enumerate(loader):
    x, y = x.to(device), y.to(device)
    value = loss(model(x), y)
    value.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {{step}} loss {{value.item():.3f}}")
    if step == 1:
        break
"""

# What a user writes around an unchanged script to get MemTracker's number on it.
MEMTRACKER = """
import json, runpy, sys
sys.path.insert(0, ".")
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
RESET = {reset}
try:
    with FakeTensorMode():
        tracker = MemTracker()
        if RESET:  # MemTracker refuses a module's second forward unless its stats are reset in between
            import torch
            zero_grad = torch.optim.Optimizer.zero_grad
            def zero_grad_and_reset(self, *args, **kwargs):
                zero_grad(self, *args, **kwargs)
                tracker.reset_mod_stats()
            torch.optim.Optimizer.zero_grad = zero_grad_and_reset
        with tracker:
            runpy.run_path("train.py", run_name="__main__")
        peak = tracker.get_tracker_snapshot("peak")
        total = max(by_kind.get("Total", 0) for by_kind in peak.values())
    print(json.dumps({{"bytes": total}}))
except Exception as error:
    first_line = str(error).splitlines()[0][:160] if str(error) else ""
    print(json.dumps({{"error": f"{{type(error).__name__}}: {{first_line}}"}}))
"""

ACCELERATE = """
import json, sys
sys.path.insert(0, ".")
from accelerate.commands.estimate import calculate_maximum_sizes, estimate_training_usage
from case import build_model
total_size, _ = calculate_maximum_sizes(build_model())
print(json.dumps({"bytes": max(estimate_training_usage(total_size, "float32").values())}))
"""

def python_json(code: str, folder: Path, timeout: float) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=timeout, check=False)
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:160]}


def vram_check(folder: Path, batch_size: int, timeout: float) -> dict:
    executable = shutil.which("vram-check") or str(Path(sys.executable).parent / "vram-check")
    if not Path(executable).exists():
        return {"error": "not installed (pip install vram-check==0.1.1)"}
    command = [executable, "inspect", "case:build_model", "--batch-size", str(batch_size), "--dtype", "fp32",
               "--optimizer", "adamw", "--json"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "PYTHONPATH": str(folder)})
    try:
        # its "gb" are GiB: 21,020,682 fp32 parameters print as 0.078
        return {"bytes": json.loads(done.stdout)["total_gb"] * 2**30}
    except (json.JSONDecodeError, KeyError):
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:160]}


def run_case(name: str, work: Path, timeout: float) -> dict:
    source, batch_size = CASES[name.removesuffix("_typical")]
    train = TRAIN_TYPICAL if name.endswith("_typical") else TRAIN
    folder = work / name
    folder.mkdir(parents=True)
    (folder / "case.py").write_text(source, encoding="utf-8")
    script = folder / "train.py"
    script.write_text(train.format(batch_size=batch_size), encoding="utf-8")
    row = {"case": name, "batch": batch_size}
    options = EstimateOptions(script=script, device="cpu", timeout=timeout, cwd=folder)
    (real,) = run_harness(options, [{"mode": "real", "profile_replay": True}])
    row["real"] = real["profile_replay_peak"] if real["status"] != "failed" else None
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "oom_lsp", "estimate", str(script), "--device", "cpu",
                           "--format", "json"], cwd=folder, capture_output=True, text=True, timeout=timeout + 60,
                          check=False)
    try:
        row["oom-lsp"] = {"bytes": json.loads(done.stdout)["peak_bytes"], "seconds": time.perf_counter() - started}
    except (json.JSONDecodeError, KeyError):
        row["oom-lsp"] = {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:160]}
    row["MemTracker"] = python_json(MEMTRACKER.format(reset=False), folder, timeout)
    row["MemTracker, reset per step"] = python_json(MEMTRACKER.format(reset=True), folder, timeout)
    row["accelerate"] = python_json(ACCELERATE, folder, timeout)
    row["vram-check"] = vram_check(folder, batch_size, timeout)
    return row


TOOLS = ("oom-lsp", "MemTracker", "MemTracker, reset per step", "accelerate", "vram-check")


def cell(row: dict, tool: str) -> str:
    found = row[tool]
    if "error" in found:
        return f"no number: {found['error']}"
    error = (found["bytes"] - row["real"]) / row["real"]
    return f"{found['bytes'] / MIB:.1f} ({100 * error:+.1f} %)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join([*CASES, "gpt_typical"]))
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="oom-lsp-peers-") as tmp:
        for name in options.cases.split(","):
            started = time.perf_counter()
            rows.append(run_case(name, Path(tmp), options.timeout))
            print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print("| script | batch | real CPU peak MiB | " + " | ".join(f"{tool} MiB (error)" for tool in TOOLS) + " |")
    print("|---|---|---|" + "---|" * len(TOOLS))
    for row in rows:
        print(f"| {row['case']} | {row['batch']} | {row['real'] / MIB:.1f} | "
              + " | ".join(cell(row, tool) for tool in TOOLS) + " |")
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
