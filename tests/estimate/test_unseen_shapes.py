"""Shapes of real training scripts that the fake run used to crash on (issue 31), each in a small
script run twice: traced (fake tensors) and for real on the CPU under the profiler (allocation
events replayed in time order); the two peaks must agree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, estimate, run_harness

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = {
    # An EMA made by deepcopy (DDP's fake data pointers made torch copy the storage below the
    # dispatcher, uncounted: -15 %).
    "ema_deepcopy": """
import copy, torch
from torch._subclasses.fake_tensor import FakeTensor
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
ema = copy.deepcopy(model)
for p in ema.parameters():
    p.requires_grad_(False)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    loss = model(torch.randn(64, 512)).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.999).add_(p, alpha=0.001)
""",
    # DETR's sanity checks on boxes (data-dependent booleans) and its SciPy Hungarian matcher
    # (.numpy() of a step's tensors).
    "assert_and_scipy": """
import torch
from torch import nn
from scipy.optimize import linear_sum_assignment

def to_xyxy(x):
    cx, cy, w, h = x.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)

def box_iou(a, b):
    assert (a[:, 2:] >= a[:, :2]).all()
    if not (b[:, 2:] >= b[:, :2]).all():
        raise ValueError("degenerate boxes")
    lt = torch.max(a[:, None, :2], b[:, :2]); rb = torch.min(a[:, None, 2:], b[:, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]); area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b - inter)

head = nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 25))
opt = torch.optim.AdamW(head.parameters(), lr=1e-4)
for step in range(2):
    out = head(torch.randn(4, 50, 512))
    logits, boxes = out[..., :21], out[..., 21:].sigmoid()
    targets = [torch.rand(n, 4) * 0.5 + 0.25 for n in (3, 5, 2, 4)]
    with torch.no_grad():
        cost = torch.cdist(boxes.flatten(0, 1), torch.cat(targets), p=1) - box_iou(
            to_xyxy(boxes.flatten(0, 1)), to_xyxy(torch.cat(targets)))
        pieces = cost.view(4, 50, -1).cpu().split([len(t) for t in targets], -1)
        pairs = [linear_sum_assignment(c[i]) for i, c in enumerate(pieces)]
    rows = torch.cat([torch.as_tensor(i, dtype=torch.int64) for i, _ in pairs])
    batch = torch.cat([torch.full((len(i),), k) for k, (i, _) in enumerate(pairs)])
    matched = torch.cat([t[torch.as_tensor(j, dtype=torch.int64)] for t, (_, j) in zip(targets, pairs)])
    loss = (boxes[batch, rows] - matched).abs().mean() + logits.logsumexp(-1).mean()
    opt.zero_grad(); loss.backward(); opt.step()
""",
    # Sampling before training, on values the fake run does not know (replayed on zeros before:
    # "invalid multinomial distribution").
    "multinomial": """
import torch
counts = torch.rand(1000) * 10
subset = torch.multinomial(counts / counts.sum(), 256, replacement=False)
keep = torch.bernoulli(torch.full((1000,), 0.5)).bool()
data = torch.randn(1000, 128)[subset]
model = torch.nn.Linear(128, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(2):
    loss = model(data[i * 64:(i + 1) * 64]).square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
""",
    # A buffer sliced inside torch.inference_mode() ("Cannot set version_counter for inference tensor").
    "inference_mode_slice": """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.randn(512, 64), persistent=False)
        self.lin = torch.nn.Linear(64, 64)
    def forward(self, x):
        return self.lin(x + self.cache[: x.shape[1]])
model = M()
with torch.inference_mode():
    warm = model(torch.randn(2, 128, 64))
    warm = model(torch.randn(2, 128, 64))
opt = torch.optim.AdamW(model.parameters())
for i in range(2):
    loss = model(torch.randn(8, 256, 64)).mean()
    loss.backward(); opt.step(); opt.zero_grad()
""",
    # A data set's own mean and std (0-dim tensors computed before the loop) given to
    # torchvision's Normalize, which calls torch.as_tensor([mean]) on each item ("data is not
    # allocated yet": the fake run fell back to a real step, 10.7 % under the real peak).
    "normalize_by_dataset_statistics": """
import torch
from torch import nn
images = torch.rand(512, 1, 28, 28)
mean, std = images.mean(), images.std()
def normalize(x, mean, std):
    mean = torch.as_tensor([mean], dtype=x.dtype, device=x.device).view(-1, 1, 1)
    std = torch.as_tensor([std], dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return (x - mean) / std
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 10))
opt = torch.optim.Adam(model.parameters())
for i in range(2):
    x = torch.stack([normalize(images[j], mean, std) for j in range(64 * i, 64 * (i + 1))])
    loss = model(x).logsumexp(-1).mean()
    opt.zero_grad(); loss.backward(); opt.step()
""",
    # A Dataset whose labels are a tensor the script made (torchvision's MNIST reads them from
    # its files): `int(self.targets[i])` in __getitem__, fetched by the harness outside fake mode
    # (a DataDependentOutputException sent the run to the real-step fallback).
    "dataset_reads_its_labels": """
import copy, torch
from torch import nn
targets = torch.frombuffer(bytearray(range(200)), dtype=torch.uint8).long()
class Labelled(torch.utils.data.Dataset):
    def __init__(self):
        self.targets, self.data = targets, torch.rand(200, 8)
    def __len__(self):
        return 200
    def __getitem__(self, i):
        return self.data[i], int(self.targets[i])
train, valid = torch.utils.data.random_split(Labelled(), [150, 50])
valid = copy.deepcopy(valid)
model = nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.utils.data.DataLoader(train, batch_size=16):
    loss = nn.functional.cross_entropy(model(x), y % 4)
    opt.zero_grad(); loss.backward(); opt.step()
""",
    # A GNN's step: self-loops removed from a known edge index (`edge_index[:, mask]`, a shape
    # only the values decide), then a loss over the training nodes (`out[train_mask]`). Fake
    # mode cannot shape either; the indices' values are known, so the trace can (PyG's GAT
    # tutorial went to the real-step fallback, 24 % under).
    "known_indices_shape_the_step": """
import torch
from torch import nn
g = torch.Generator().manual_seed(0)
edge_index = torch.randint(0, 500, (2, 4000), generator=g)
train_mask = torch.randint(0, 10, (500,), generator=g) < 3
y = torch.randint(0, 7, (500,), generator=g)
x = torch.randn(500, 64)
lin = nn.Linear(64, 7)
opt = torch.optim.Adam(lin.parameters())
for step in range(2):
    keep = edge_index[0] != edge_index[1]
    edges = torch.cat([edge_index[:, keep], torch.arange(500).repeat(2, 1)], dim=1)
    h = lin(x)
    messages = h[edges[0]] * torch.sigmoid(h[edges[1]])
    out = torch.zeros(500, 7).index_add(0, edges[1], messages)
    loss = nn.functional.cross_entropy(out[train_mask], y[train_mask])
    opt.zero_grad(); loss.backward(); opt.step()
""",
    # A map-style data set whose samples are tensors of their own (torchvision's ToTensor): the
    # collate stacks them while the loop still holds the previous batch, so the samples, the new
    # batch and the old one are alive at once (mrd's FashionMNIST notebook, 21 % under).
    "samples_alive_while_collated": """
import torch
from torch import nn
class Images(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        return torch.rand(1, 28, 28), i % 10
loader = torch.utils.data.DataLoader(Images(), batch_size=32)
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
""",
    # A policy's actions drawn with Categorical(...).sample().item() decide how long an episode
    # runs, so how large the update's batch is (minimalRL): the draw is replayed for real and its
    # values read, not a stubbed 0 (always the same action: minimalRL's PPO batch was half the
    # real one, -40 %). A policy of zero weights is uniform, as the replay's ones are.
    "sampled_actions_decide_the_batch": """
import torch
from torch import nn
from torch.distributions import Categorical
policy = nn.Linear(4, 2)
nn.init.zeros_(policy.weight); nn.init.zeros_(policy.bias)
value = nn.Sequential(nn.Linear(4, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.Adam(list(policy.parameters()) + list(value.parameters()))
for update in range(2):
    states = []
    for t in range(400):
        state = [0.1 * t, 0.0, 1.0, -1.0]
        states.append(state)
        action = Categorical(torch.softmax(policy(torch.tensor(state)), -1)).sample().item()
        if action == 1 and t > 3:
            break
    batch = torch.tensor(states * 64)
    loss = value(batch).square().mean() + policy(batch).logsumexp(-1).mean()
    opt.zero_grad(); loss.backward(); opt.step()
""",
    # torchtune's Llama 3.x RoPE scaling: frequencies scaled one by one in Python, then
    # torch.tensor(list of 0-dim tensors) ("data is not allocated yet").
    "llama3_rope_scaling": """
import math, torch
from torch import nn
def scaled(freqs, scale=8, low=1, high=4, old=8192):
    low_wavelen, high_wavelen = old / low, old / high
    new = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            new.append(freq)
        elif wavelen > low_wavelen:
            new.append(freq / scale)
        else:
            smooth = (old / wavelen - low) / (high - low)
            new.append((1 - smooth) * freq / scale + smooth * freq)
    return torch.tensor(new, dtype=freqs.dtype, device=freqs.device)
dim, seq = 64, 256
theta = scaled(1.0 / (500000.0 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim)))
angles = torch.einsum("i, j -> ij", torch.arange(seq, dtype=theta.dtype), theta).float()
cache = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)
proj = nn.Linear(512, 512)
opt = torch.optim.AdamW(proj.parameters())
for i in range(2):
    x = proj(torch.randn(4, seq, 512)).view(4, seq, 8, dim // 2, 2)
    rope = cache.view(1, seq, 1, dim // 2, 2)
    out = torch.stack([x[..., 0] * rope[..., 0] - x[..., 1] * rope[..., 1],
                       x[..., 1] * rope[..., 0] + x[..., 0] * rope[..., 1]], -1)
    loss = out.square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
""",
    # safetensors' savers on fake tensors (every fake storage answered data pointer 0: "shared
    # tensors"; the real savers read the data).
    "safetensors_save": """
import os, tempfile, torch
import safetensors.torch
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 256))
folder = tempfile.mkdtemp()
safetensors.torch.save_model(model, os.path.join(folder, "model.safetensors"))
safetensors.torch.save_file({"x": torch.randn(16, 16)}, os.path.join(folder, "x.safetensors"))
blob = safetensors.torch.save({"x": torch.randn(16, 16)})
opt = torch.optim.AdamW(model.parameters())
for i in range(2):
    loss = model(torch.randn(32, 256)).square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
""",
    # A sparse adjacency (a GNN's): sparse tensors have no storage of their own ("Cannot access
    # storage of SparseTensorImpl"); fake `_coalesce` answered 0 entries; BLAS copies were charged
    # for the sparse operand of mm's backward.
    "sparse_spmm": """
import torch
n = 500
flat = torch.randperm(n * n)[:4000]
idx = torch.stack([flat // n, flat % n])
adj = torch.sparse_coo_tensor(idx, torch.ones(4000), (n, n)).coalesce()
x = torch.randn(n, 64)
lin = torch.nn.Linear(64, 64)
opt = torch.optim.AdamW(lin.parameters())
for step in range(2):
    h = torch.sparse.mm(adj, lin(x))
    h2 = adj @ h
    loss = h2.square().mean(); loss.backward(); opt.step(); opt.zero_grad()
""",
    # torch.tensor(list) before the step (lift_fresh says it aliases: it was left out, -94 %).
    "tensor_from_list": """
import torch
table = torch.tensor([[float(i * j) for j in range(256)] for i in range(1024)])
labels = torch.tensor(list(range(1024)))
model = torch.nn.Linear(256, 10)
opt = torch.optim.AdamW(model.parameters())
for step in range(2):
    x = table[step * 64:(step + 1) * 64]
    loss = torch.nn.functional.cross_entropy(model(x), labels[step*64:(step+1)*64] % 10)
    loss.backward(); opt.step(); opt.zero_grad()
""",
    # `.numpy()` on a dataset's items outside the step (statistics before training).
    "numpy_outside_step": """
import torch, numpy as np
class DS(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(256, 64)
    def __len__(self): return 256
    def __getitem__(self, i):
        return torch.from_numpy(self.x[i].numpy() * 2.0)
ds = DS()
stats = np.stack([ds[i].numpy() for i in range(8)]).mean(0)
loader = torch.utils.data.DataLoader(ds, batch_size=32)
model = torch.nn.Linear(64, 64)
opt = torch.optim.AdamW(model.parameters())
for step, x in enumerate(loader):
    loss = model(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad()
    if step == 1: break
""",
    # torch.distributions' argument validation and sampling on values made before the step.
    "distributions": """
import torch
from torch import distributions as D
w = torch.rand(1000) * 5
prior = D.Categorical(probs=w / w.sum())
picks = prior.sample((512,))
beta = D.Beta(torch.rand(8) + 0.5, torch.rand(8) + 0.5)
mix = beta.sample((64,))
dir_ = D.Dirichlet(torch.rand(16) + 0.1).sample((32,))
emb = torch.nn.Embedding(1000, 64)
opt = torch.optim.AdamW(emb.parameters())
for step in range(2):
    out = emb(picks[step * 64:(step + 1) * 64])
    d = D.Normal(out, out.exp())
    loss = -d.log_prob(torch.randn(64, 64)).mean() + mix.sum() + dir_.sum()
    loss.backward(); opt.step(); opt.zero_grad()
""",
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    pytest.importorskip("scipy")
    pytest.importorskip("safetensors")
    folder = tmp_path_factory.mktemp("unseen")
    runs = []
    for name, text in SCRIPTS.items():
        (folder / f"{name}.py").write_text(text)
        runs.append({"script": str(folder / f"{name}.py"), "mode": "fake"})
        runs.append({"script": str(folder / f"{name}.py"), "mode": "real", "profile_replay": True})
    results = run_harness(EstimateOptions(script=folder / "ema_deepcopy.py", device="cpu", timeout=300), runs)
    return {name: (results[2 * index], results[2 * index + 1]) for index, name in enumerate(SCRIPTS)}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_shape_is_traced_and_matches_the_real_run(traces, name):
    fake, real = traces[name]
    assert fake["status"] == "stopped", fake["failure"]
    assert real["status"] == "stopped", real["failure"]
    truth = real["profile_replay_peak"]
    assert abs(fake["peak_bytes"] - truth) <= max(256, 1e-4 * truth), (fake["peak_bytes"], truth)


def test_sanity_checks_on_unknown_values_pass_and_numpy_reads_are_counted(traces):
    fake, _ = traces["assert_and_scipy"]
    # an assert and an `if not ...: raise` per box_iou call, one call per step
    assert fake["checks_passed"] == 4
    assert fake["stubbed_scalars"] == 0
    assert fake["value_arrays"] == 2 * 4  # one cost matrix per image and step


def test_ddp_without_world_size_is_traced_as_rank_0_of_1_and_counts_the_ema(tmp_path):
    """A single-process DDP script (gloo, world of 1, an EMA deep-copied before DDP) estimated
    without --world-size, against the script run for real with its real gloo group."""
    script = tmp_path / "ddp_ema.py"
    script.write_text(
        "import os\nos.environ.setdefault('MASTER_ADDR', '127.0.0.1')\nos.environ.setdefault('MASTER_PORT', '29633')\n"
        "import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n" + SCRIPTS["ema_deepcopy"].replace(
            "opt = torch.optim", "model = DDP(model)\nopt = torch.optim"
        ).replace("model.parameters()):", "model.module.parameters()):")
    )
    prediction = estimate(EstimateOptions(script=script, device="cpu", timeout=300, cwd=tmp_path))
    # The real run's peak: the least of up to three runs. gloo reduces a bucket on a thread of its own,
    # and on a loaded machine that thread can still hold step 1's bucket when DDP rebuilds its buckets
    # at the start of step 2 (one bucket more, 8 MiB here, seen once under pytest-xdist).
    peaks = []
    for attempt in range(3):
        out = tmp_path / f"real{attempt}.json"
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "real_steps.py"), "--profile", "--out", str(out), "--", str(script)],
            cwd=tmp_path, check=True, capture_output=True, timeout=300,
        )
        truth = json.loads(out.read_text())
        assert truth["status"] == "stopped"
        peaks.append(truth["peak_bytes"])
        if abs(prediction.peak_bytes - truth["peak_bytes"]) <= 256:
            break
    assert abs(prediction.peak_bytes - min(peaks)) <= 256, peaks
    assert prediction.distributed is not None and prediction.distributed.world_size == 1
    detected = [note for note in prediction.corrections if note.name == "process-group-detected"]
    assert detected and "without --world-size" in detected[0].detail


FLEX = """
import torch
from torch import nn
USE_FLEX = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 5) and {flex}
if USE_FLEX:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
class Attention(nn.Module):
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if USE_FLEX:
            y = flex_attention(q, k, v, block_mask=mask)
        else:
            y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, d))
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(*[Attention() for _ in range(2)]).to(device)
mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 512, 512, device=device) if USE_FLEX else None
opt = torch.optim.AdamW(model.parameters())
for i in range(2):
    x = torch.randn(4, 512, 256, device=device)
    h = x
    for layer in model:
        h = layer(h, mask)
    loss = h.square().mean()
    loss.backward(); opt.step(); opt.zero_grad()
"""


def test_flex_attention_on_the_target_gpu_is_traced_as_its_cuda_kernels_allocate(tmp_path):
    """torchtune takes FlexAttention when the GPU it is told of is sm >= 7.5; the CPU the trace
    runs on has no FlexAttention backward. Traced as the CUDA kernels allocate (output and an
    fp32 logsumexp kept per call), it costs what CUDA's memory-efficient SDPA costs on the same
    model, whose logsumexp is padded to a multiple of 32 rows."""
    flex, sdpa = tmp_path / "flex.py", tmp_path / "sdpa.py"
    flex.write_text(FLEX.format(flex=True))
    sdpa.write_text(FLEX.format(flex=False))
    options = EstimateOptions(script=flex, device="cuda", timeout=300, cwd=tmp_path)
    with_flex, with_sdpa = run_harness(options, [{"script": str(flex)}, {"script": str(sdpa)}])
    assert with_flex["status"] == with_sdpa["status"] == "stopped", with_flex["failure"]
    assert with_flex["sdpa"].get("flex_attention") == 4
    assert with_sdpa["sdpa"].get("sdpa_mem_efficient") == 4
    assert abs(with_flex["peak_bytes"] - with_sdpa["peak_bytes"]) <= 0.01 * with_sdpa["peak_bytes"]


def test_cuda_autocast_runs_softmax_and_layer_norm_in_float32_as_cuda_does(tmp_path):
    """`autocast("cuda", float16)` is traced as CPU autocast, whose op lists leave softmax and
    layer_norm in fp16; CUDA's runs them in fp32 (an fp16 BERT keeps fp32 attention probabilities:
    Hugging Face's fp16 row of bench/published_gpu.py was -25 % without this)."""
    script = tmp_path / "autocast.py"
    script.write_text(
        "import torch\n"
        "lin = torch.nn.Linear(64, 64).cuda()\n"
        "opt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"
        "for i in range(2):\n"
        "    with torch.autocast('cuda', dtype=torch.float16):\n"
        "        h = lin(torch.randn(4, 8, 64, 64, device='cuda'))\n"
        "        p = torch.softmax(h, -1)\n"
        "        print('dtypes', h.dtype, p.dtype, torch.nn.functional.layer_norm(h, (64,)).dtype)\n"
        "        loss = (p @ h).float().mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n"
    )
    (trace,) = run_harness(EstimateOptions(script=script, device="cuda", timeout=300, cwd=tmp_path), [{}])
    assert trace["status"] == "stopped", trace["failure"]
    assert "dtypes torch.float16 torch.float32 torch.float32" in trace["output_tail"]


LOW_PRECISION = """
import torch
w = torch.nn.Parameter(torch.randn(2048, 2048, device="cuda"))
norm = torch.nn.Parameter(torch.ones(2048, device="cuda"))
opt = torch.optim.SGD([w, norm], lr=0.1)
for i in range(2):
    x = torch.randn(2048, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ys = [torch.mv(w, x + k) for k in range({uses})]
        scaled = torch.einsum("d,d->d", norm, x)
        print("dtypes", ys[0].dtype, scaled.dtype)
    loss = sum(y.float().sum() for y in ys) + scaled.float().sum()
    loss.backward(); opt.step(); opt.zero_grad()
"""


def test_cuda_autocast_runs_einsum_and_mv_in_the_low_precision_as_cuda_does(tmp_path):
    """CUDA's autocast casts einsum, mv, addmv, addr and the RNN cells to the low precision; CPU's
    has no kernel for them, so the trace kept them in float32 (an RMSNorm written as an elementwise
    einsum kept fp32 tensors for backward: the real cs336 bf16 snapshots, bench/README.md). A weight
    is cast once per autocast region, as CUDA's cached_cast does: using it twice costs no second
    copy (an 8 MiB bf16 copy of the 16 MiB weight)."""
    once, twice = tmp_path / "once.py", tmp_path / "twice.py"
    once.write_text(LOW_PRECISION.format(uses=1))
    twice.write_text(LOW_PRECISION.format(uses=2))
    options = EstimateOptions(script=once, device="cuda", timeout=300, cwd=tmp_path)
    one, two = run_harness(options, [{"script": str(once)}, {"script": str(twice)}])
    assert one["status"] == two["status"] == "stopped", one["failure"]
    assert "dtypes torch.bfloat16 torch.bfloat16" in one["output_tail"]
    assert 0 < two["peak_bytes"] - one["peak_bytes"] < 2**20


LOADS_ITS_DATA = """
import io, os, torch
from torch import nn
here = os.path.dirname(os.path.abspath(__file__))
d = torch.load(os.path.join(here, "graph.pt"))
x, y = d["x"], d["y"]
classes = int(y.max()) + 1
model = nn.Linear(x.shape[1], classes)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_a_small_file_is_loaded_with_its_values_as_a_real_run_reads_them(tmp_path):
    """A processed data set (PyG's `data.pt`) read by `torch.load` in the fake run: its labels'
    values decide the model (`int(y.max()) + 1` classes); meta storages crashed ("Tensor.item()
    cannot be called on meta tensors")."""
    torch = pytest.importorskip("torch")
    torch.save({"x": torch.randn(300, 50), "y": torch.randint(0, 7, (300,))}, tmp_path / "graph.pt")
    script = tmp_path / "loads.py"
    script.write_text(LOADS_ITS_DATA)
    prediction = estimate(EstimateOptions(script=script, device="cpu", timeout=300, cwd=tmp_path))
    truth = real_run(script, tmp_path)
    assert prediction.method.startswith("fake-tensor trace"), prediction.method
    assert abs(prediction.peak_bytes - truth["peak_bytes"]) <= 256, (prediction.peak_bytes, truth["peak_bytes"])


SAVES_THROUGH_A_BUFFER = """
import io, os, torch
from torch import nn
here = os.path.dirname(os.path.abspath(__file__))
target = os.path.join(here, "processed.pt")
if not os.path.exists(target):
    features = torch.randn(256, 32) * 2
    buffer = io.BytesIO()
    torch.save({"x": features}, buffer)
    with open(target, "wb") as handle:
        handle.write(buffer.getvalue())
x = torch.load(target)["x"]
model = nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(x).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_bytes_of_fake_tensors_are_never_written_for_the_script(tmp_path):
    """PyG saves its processed data set into a BytesIO and writes the bytes itself: a fake run
    cannot make them (the empty buffer left a broken `data.pt` that made every later run fail
    with EOFError). The run goes to real CPU steps instead, and the file is whole."""
    torch = pytest.importorskip("torch")
    script = tmp_path / "processes.py"
    script.write_text(SAVES_THROUGH_A_BUFFER)
    prediction = estimate(EstimateOptions(script=script, device="cpu", timeout=300, cwd=tmp_path))
    assert "real CPU step" in prediction.method, prediction.method
    assert torch.load(tmp_path / "processed.pt")["x"].shape == (256, 32)


LSTM_TRAINING = """
import torch
from torch import nn
torch.manual_seed(0)
emb = nn.Embedding(500, 64)
lstm = nn.LSTM(64, 128, 2, dropout=0.5, batch_first=True)
fc = nn.Linear(128, 1)
params = list(emb.parameters()) + list(lstm.parameters()) + list(fc.parameters())
opt = torch.optim.Adam(params, lr=1e-3)
h = (torch.zeros(2, 16, 128), torch.zeros(2, 16, 128))
for step in range(3):
    x = torch.randint(0, 500, (16, 60))
    h = tuple(t.data for t in h)
    out, h = lstm(emb(x), h)
    loss = torch.sigmoid(fc(out[:, -1, :])).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_the_lstm_backward_scratch_is_measured_on_the_real_kernel(tmp_path):
    """oneDNN's LSTM backward allocates its gates' gradients inside the kernel: the udacity
    sentiment RNN's estimate was 10.8 % under the real run without them. One tensor of the
    layer's output size is still missing (-2 % here, -1.7 % on the notebook)."""
    script = tmp_path / "lstm.py"
    script.write_text(LSTM_TRAINING)
    prediction = estimate(EstimateOptions(script=script, device="cpu", timeout=300, cwd=tmp_path))
    truth = real_run(script, tmp_path)["peak_bytes"]
    assert abs(prediction.peak_bytes - truth) <= 0.025 * truth, (prediction.peak_bytes, truth)
    assert any(note.name == "onednn-rnn-backward-scratch" and note.bytes > 0 for note in prediction.corrections)


def test_the_convolution_scratch_is_measured_at_the_scripts_own_batch():
    """oneDNN's convolution backward scratch is not linear in the batch (minDiffusion's 512->256
    7x7 convolution keeps 24.5 MiB at batch 2 to 8 and 36.75 MiB at 16): extrapolated from batch
    2 and 4 it was 12.25 MiB short (superminddpm.py -2.8 %). At batch 16 the model now measures
    what the kernel keeps at batch 16."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from oom_lsp.estimate.harness.cpu_kernels import make_conv_scratch, replay_allocations

    aten = torch.ops.aten
    torch.set_num_threads(1)

    def arguments(make):
        return (make(16, 256, 28, 28), make(16, 512, 28, 28), make(256, 512, 7, 7), [256], [1, 1], [3, 3],
                [1, 1], False, [0, 0], 1, [True, True, True])

    real = arguments(torch.zeros)
    aten.convolution_backward.default(*real)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        out = aten.convolution_backward.default(*real)
    del out
    peak, current = replay_allocations(prof)
    truth = peak - max(current, 0)

    class Tracker:
        paused = 0

    with FakeTensorMode():
        fake = arguments(torch.empty)
    notes: dict = {}
    measured = make_conv_scratch(notes)(Tracker(), aten.convolution_backward.default, fake)
    assert measured == truth, (measured, truth)


COLLATED_ON_THE_HOST = """
import torch
from torch import nn
class Images(torch.utils.data.Dataset):
    def __init__(self):
        self.data = torch.rand(64, 3, 64, 64)
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return {sample}, i % 10
loader = torch.utils.data.DataLoader(Images(), batch_size=16)
model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_samples_collated_on_the_host_are_not_gpu_memory(tmp_path):
    """The samples a batch is stacked from are host memory: counted in a CPU estimate (see
    `samples_alive_while_collated`), never in a GPU one, where per-sample tensors and views of
    one data set tensor give the same peak."""
    peaks = []
    for name, sample in (("owned", "torch.rand(3, 64, 64)"), ("views", "self.data[i]")):
        script = tmp_path / f"{name}.py"
        script.write_text(COLLATED_ON_THE_HOST.replace("{sample}", sample))
        peaks.append(estimate(EstimateOptions(script=script, timeout=300, cwd=tmp_path)).peak_bytes)
    assert peaks[0] == peaks[1], peaks


def real_run(script: Path, cwd: Path) -> dict:
    """`script` run for real until its second optimizer step, under the profiler (bench/real_steps.py)."""
    out = cwd / "real.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "real_steps.py"), "--profile", "--out", str(out), "--", str(script)],
        cwd=cwd, check=True, capture_output=True, timeout=300,
    )
    return json.loads(out.read_text())
