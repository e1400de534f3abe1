"""`oom-lsp estimate --world-size` through the installed console script: torchrun-style DDP
and FSDP2 scripts traced as rank 0 of N on the fake process group, against the same script
run for real on CPU tensors as rank 0 of N (bench/distributed_truth.py, no oom-lsp code in it),
and the facts a per-rank prediction must reproduce."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import console

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "estimate" / "distributed"
TRUTH = ROOT / "bench" / "distributed_truth.py"
SMALL_DDP = ["--width", "256", "--depth", "2"]
SMALL_FSDP_MLP = ["--width", "256", "--depth", "3"]
SMALL_GPT = ["--dim", "256", "--vocab", "2048", "--block", "64", "--layers", "2"]


def estimate_json(tmp_path: Path, script: str, *options: str, script_args: list[str] = ()) -> dict:
    shutil.copy(FIXTURES / script, tmp_path)
    result = console.run(["estimate", script, "--format", "json", *options, "--", *script_args], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def truth(tmp_path: Path, script: str, world_size: int, script_args: list[str]) -> int:
    """Rank 0's peak, real CPU tensors, fake process group, no oom-lsp code in the process."""
    out = tmp_path / f"truth-{world_size}.json"
    subprocess.run(
        [sys.executable, str(TRUTH), "--world-size", str(world_size), "--profile", "--out", str(out), "--"]
        + [str(FIXTURES / script), *script_args],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = json.loads(out.read_text())
    assert result["status"] == "stopped", result
    return result["peak_bytes"]


def close(estimate: int, real: int) -> bool:
    """Within 0.5 %: the real run's DataLoader workers (num_workers=2) keep a prefetched batch
    in the process (33 KB for SMALL_DDP's batch, 0.13 %); the estimate runs the loader
    in-process, as what a GPU holds does not include the host's prefetch queue."""
    return abs(estimate - real) / real < 0.005


def note(prediction: dict, name: str) -> dict:
    (found,) = [note for note in prediction["corrections"] if note["name"] == name]
    return found


def test_ddp_rank_zero_matches_the_real_run_and_does_not_move_with_the_world_size(tmp_path):
    sweep = estimate_json(
        tmp_path, "ddp_mlp.py", "--device", "cpu", "--world-size", "2,8", script_args=SMALL_DDP
    )
    at_2, at_8 = (row["estimate"] for row in sweep["runs"])
    assert sweep["world_sizes"] == [2, 8]
    # Every rank of DDP holds the whole model, its gradients, buckets and optimizer state.
    assert at_2["peak_bytes"] == at_8["peak_bytes"]
    real = truth(tmp_path, "ddp_mlp.py", 2, SMALL_DDP)
    assert close(at_2["peak_bytes"], real), (at_2["peak_bytes"], real)
    # The default buckets are a second copy of the gradients.
    assert at_2["breakdown"]["ddp_buckets"] == at_2["breakdown"]["gradients"] > 0
    (ddp,) = at_2["distributed"]["ddp"]
    assert ddp["line"][1] == 67 and ddp["rebuilt_at_step"] == 2
    assert (ddp["gradient_as_bucket_view"], ddp["bucket_cap_mb"], ddp["find_unused_parameters"]) == (
        False,
        25,
        False,
    )
    assert "gradient_as_bucket_view=True makes the gradients views" in note(at_2, "ddp-buckets")["detail"]
    assert note(at_2, "fake-process-group")["detail"].startswith("traced as rank 0 of 2 (2 GPUs per node)")


def test_bucket_view_keeps_the_gradients_in_the_buckets_and_the_rebuild_is_the_peak(tmp_path):
    prediction = estimate_json(
        tmp_path,
        "ddp_mlp.py",
        "--device",
        "cpu",
        "--world-size",
        "4",
        script_args=[*SMALL_DDP, "--bucket-view"],
    )
    assert prediction["breakdown"]["gradients"] == 0
    assert "hold the gradients themselves" in note(prediction, "ddp-buckets")["detail"]
    # zero_grad comes after the forward: step 1's gradients still live in the old buckets
    # when DDP rebuilds them at the start of step 2, so old and new buckets coexist once.
    assert "which is this trace's peak" in note(prediction, "ddp-bucket-rebuild")["detail"]
    assert prediction["peak_at"]["phase"] == "forward"
    real = truth(tmp_path, "ddp_mlp.py", 4, [*SMALL_DDP, "--bucket-view"])
    assert close(prediction["peak_bytes"], real), (prediction["peak_bytes"], real)


def test_fsdp2_peak_falls_by_the_sharded_parameters_and_two_adam_states(tmp_path):
    sweep = estimate_json(
        tmp_path, "fsdp2_gpt.py", "--device", "cpu", "--world-size", "2,4,8", script_args=SMALL_GPT
    )
    rows = [row["estimate"] for row in sweep["runs"]]
    for bigger, smaller in itertools.pairwise(rows):
        # At a peak before any gradient is reduced (the loss's backward): sharded parameters
        # and AdamW's two states, 3 x parameter bytes / N, to the byte.
        assert (
            bigger["peak_at"]["op"] == smaller["peak_at"]["op"] == "aten._log_softmax_backward_data.default"
        )
        shards = bigger["breakdown"]["parameters"] - smaller["breakdown"]["parameters"]
        assert bigger["peak_bytes"] - smaller["peak_bytes"] == 3 * shards > 0
        assert bigger["breakdown"]["optimizer_state"] - smaller["breakdown"]["optimizer_state"] == 2 * shards


def test_fsdp2_buffers_are_in_the_breakdown_and_match_the_real_run(tmp_path):
    prediction = estimate_json(
        tmp_path, "fsdp2_mlp.py", "--device", "cpu", "--world-size", "4", script_args=SMALL_FSDP_MLP
    )
    # The peak is in a block's backward: its parameters all-gathered, the blocks after it
    # already reduce-scattered into sharded gradients.
    for category in ("unsharded_parameters", "all_gather_buffers", "reduce_scatter_buffers", "gradients"):
        assert prediction["breakdown"][category] > 0, category
    assert prediction["distributed"]["fsdp_units"] == 4
    real = truth(tmp_path, "fsdp2_mlp.py", 4, SMALL_FSDP_MLP)
    assert close(prediction["peak_bytes"], real), (prediction["peak_bytes"], real)


def test_fsdp2_root_stays_unsharded_from_its_forward_to_its_backward(tmp_path):
    # The peak is in the loss's backward, before the root's own backward hooks run: the root's
    # parameters (embeddings, final norm, head) are still all-gathered from its forward.
    root_parameters = 2048 * 256 * 4 * 2 + 64 * 256 * 4 + 2 * 256 * 4
    plain = estimate_json(
        tmp_path, "fsdp2_gpt.py", "--device", "cpu", "--world-size", "4", script_args=SMALL_GPT
    )
    assert plain["peak_at"]["op"] == "aten._log_softmax_backward_data.default"
    assert plain["breakdown"]["unsharded_parameters"] == root_parameters
    mixed = estimate_json(
        tmp_path,
        "fsdp2_gpt.py",
        "--device",
        "cpu",
        "--world-size",
        "4",
        script_args=[*SMALL_GPT, "--mixed-precision"],
    )
    assert mixed["breakdown"]["unsharded_parameters"] == root_parameters // 2  # gathered in bf16
    assert "parameters all-gathered in bfloat16" in note(mixed, "fsdp2")["detail"]
    real = truth(tmp_path, "fsdp2_gpt.py", 4, [*SMALL_GPT, "--mixed-precision"])
    assert close(mixed["peak_bytes"], real), (mixed["peak_bytes"], real)


def test_cuda_terms_nccl_and_the_stream_pools_are_stated(tmp_path):
    prediction = estimate_json(
        tmp_path, "fsdp2_gpt.py", "--world-size", "4", "--gpu", "A100 40GB", script_args=SMALL_GPT
    )
    nccl = note(prediction, "nccl-buffers")
    assert nccl["bytes"] == 688 * 2**20 and "not calibrated" in nccl["detail"]
    pools = note(prediction, "fsdp2-stream-pools")
    assert "not calibrated" in pools["detail"]
    assert prediction["context_bytes"] == note(prediction, "cuda-context")["bytes"] + 688 * 2**20
    assert prediction["process_bytes"] == prediction["reserved_bytes"] + prediction["context_bytes"]
    assert prediction["verdict"] == "fits"


def test_a_sweep_names_the_fewest_gpus_that_fit(tmp_path):
    shutil.copy(FIXTURES / "fsdp2_mlp.py", tmp_path)
    common = ["estimate", "fsdp2_mlp.py", "--device", "cpu", "--world-size", "1,2,4,8"]
    # Rank 0's peak at 1, 2, 4, 8 ranks with the default width: 1.1 GiB, 357, 244, 188 MiB.
    result = console.run([*common, "--gpu-memory", "300MiB"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("fsdp2_mlp.py: batch size 64 per rank, device cpu") and lines[0].endswith(
        "world sizes 1, 2, 4, 8"
    )
    table = [line.split() for line in lines[3:7]]
    assert [row[0] for row in table] == ["1", "2", "4", "8"]
    assert [row[-1] for row in table] == ["memory", "memory", "fits", "fits"]  # "will run out of memory"
    assert "  fewest GPUs that fit: 4 x GPU with 300.00 MiB" in lines
    assert "details at 4 GPUs:" in lines
    too_small = console.run([*common, "--gpu-memory", "100MiB"], tmp_path)
    assert too_small.returncode == 1
    assert "  fewest GPUs that fit: none of 1, 2, 4, 8 x GPU with 100.00 MiB fits with the margin" in (
        too_small.stdout.splitlines()
    )


@pytest.mark.slow
def test_the_largest_batch_per_rank_at_each_world_size(tmp_path):
    sweep = estimate_json(
        tmp_path,
        "fsdp2_mlp.py",
        "--device",
        "cpu",
        "--world-size",
        "1,4",
        "--gpu-memory",
        "64MiB",
        "--find-max-batch",
        script_args=SMALL_FSDP_MLP,
    )
    at_1, at_4 = (row["max_batch"] for row in sweep["runs"])
    # Sharding frees 3/4 of the model states for activations.
    assert 0 < at_1["max_batch"] < at_4["max_batch"]
    assert at_4["verified"]["peak_bytes"] <= at_4["budget_bytes"]


PROBE = """
import json, os, sys
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
dist.init_process_group("nccl", init_method="env://")
data = TensorDataset(torch.randn(1000, 8))
sampler = DistributedSampler(data)
seen = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")}
seen.update(backend=dist.get_backend(), world=dist.get_world_size(), rank=dist.get_rank(),
            gpus=torch.cuda.device_count(), samples=len(sampler))
with open(sys.argv[1], "w") as out:
    json.dump(seen, out)
model = torch.nn.Linear(8, 8).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for (x,) in DataLoader(data, batch_size=10, sampler=sampler):
    model(x.cuda()).sum().backward()
    optimizer.step()
"""


def test_the_script_sees_what_torchrun_gives_rank_0(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    seen_file = tmp_path / "seen.json"
    result = console.run(
        ["estimate", "probe.py", "--world-size", "8", "--nproc-per-node", "4", "--", str(seen_file)], tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(seen_file.read_text()) == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "backend": "fake",
        "world": 8,
        "rank": 0,
        "gpus": 4,
        "samples": 125,  # DistributedSampler: 1000 samples over 8 ranks
    }
    assert result.stdout.splitlines()[0].endswith("rank 0 of 8 (4 per node)")
    assert "verdict" not in result.stdout  # no target given


def test_an_mp_spawn_script_runs_rank_0_in_process(tmp_path):
    prediction = estimate_json(tmp_path, "spawn_ddp.py", "--device", "cpu", "--world-size", "4")
    detail = note(prediction, "fake-process-group")["detail"]
    assert "mp.spawn(nprocs=4): rank 0's function run in this process" in detail
    assert 'init_process_group("nccl") at spawn_ddp.py:19' in detail
    assert prediction["distributed"]["engines"][0].startswith("DDP at ")


def test_a_communication_hook_of_the_script_is_traced(tmp_path):
    args = [*SMALL_DDP, "--comm-hook", "fp16"]
    prediction = estimate_json(
        tmp_path, "ddp_mlp.py", "--device", "cpu", "--world-size", "4", script_args=args
    )
    assert note(prediction, "ddp-comm-hook")["detail"].endswith("fp16_compress_hook")
    real = truth(tmp_path, "ddp_mlp.py", 4, args)
    assert close(prediction["peak_bytes"], real), (prediction["peak_bytes"], real)


RANK_ZERO = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.Linear(1024, 1024).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    out = model(torch.randn(256, 1024, device="cuda"))
    out.sum().backward()
    optimizer.step()
    gathered = [torch.empty_like(out) for _ in range(world)] if rank == 0 else None
    dist.gather(out.detach(), gathered, dst=0)
    if rank == 0 and step % 50 == 49:
        torch.save(model.state_dict(), "checkpoint.pt")
"""


def test_rank_asymmetry_is_stated(tmp_path):
    (tmp_path / "train.py").write_text(RANK_ZERO)
    result = console.run(
        ["estimate", "train.py", "--device", "cpu", "--world-size", "4", "--format", "json"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    notes = [note for note in json.loads(result.stdout)["corrections"] if note["name"] == "rank-asymmetry"]
    gather, save = notes
    assert gather["detail"].startswith("dist.gather with 4 entries on the root at train.py:12")
    assert gather["bytes"] == 4 * 256 * 1024 * 4
    assert save["detail"].startswith(
        "rank 0 alone runs train.py:13 (if rank == 0 and step % 50 == 49): torch.save(), model.state_dict()"
    )


DATA_DEPENDENT = """
import argparse
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()
dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(64, 64).cuda())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    out = model(torch.randn(args.batch_size, 64, device="cuda"))
    out[out > 0].sum().backward()  # a data-dependent shape: fake tensors cannot know it
    optimizer.step()
"""


def test_a_script_fake_tensors_cannot_run_falls_back_to_real_steps_as_rank_0(tmp_path):
    (tmp_path / "train.py").write_text(DATA_DEPENDENT)
    result = console.run(["estimate", "train.py", "--device", "cpu", "--world-size", "4"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        "  method: real CPU steps at batch 16 and 32, scaled linearly to 64 as rank 0 of 4 (fake process group)"
        in (lines)
    )
    assert any(line.startswith("  why: ") and "train.py:13" in line for line in lines)


DEEPSPEED = """
import deepspeed
model_engine, optimizer, _, _ = deepspeed.initialize(model=model, config="ds_config.json")
"""


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--world-size", "0"], "--world-size: expected a number of GPUs or a list such as 1,2,4,8, got '0'"),
        (
            ["--world-size", "4,x"],
            "--world-size: expected a number of GPUs or a list such as 1,2,4,8, got '4,x'",
        ),
        (["--nproc-per-node", "4"], "--nproc-per-node needs --world-size, and at least 1 GPU per node"),
        (
            ["--world-size", "8"],
            (
                "no estimate: train.py:3 calls deepspeed.initialize: DeepSpeed (ZeRO) partitions through its "
                "own communication layer and CUDA kernels, out of reach of the fake process group; the "
                "distributed estimate covers DDP and FSDP2"
            ),
        ),
    ],
)
def test_bad_distributed_options_and_deepspeed_are_one_line_errors(tmp_path, arguments, message):
    (tmp_path / "train.py").write_text(DEEPSPEED)
    result = console.run(["estimate", "train.py", *arguments], tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    # An option error comes before anything runs; DeepSpeed is found once the script is named as running.
    lines = [line for line in result.stderr.splitlines(keepends=True) if not line.startswith("oom-lsp estimate: running ")]
    assert "".join(lines) == f"oom-lsp estimate: {message}\n"


def test_accelerate_ddp_and_its_fsdp2_config(tmp_path):
    pytest.importorskip("accelerate")
    shutil.copy(FIXTURES / "accelerate_fsdp2.yaml", tmp_path)
    ddp = estimate_json(tmp_path, "accelerate_mlp.py", "--device", "cpu", "--world-size", "4")
    assert ddp["distributed"]["engines"][0].startswith("DDP at ")
    fsdp2 = estimate_json(
        tmp_path,
        "accelerate_mlp.py",
        "--device",
        "cpu",
        "--world-size",
        "4",
        "--accelerate-config",
        "accelerate_fsdp2.yaml",
    )
    assert note(fsdp2, "accelerate-config")["detail"].startswith(
        "accelerate's launch variables from --accelerate-config: ACCELERATE_USE_FSDP=true, FSDP_VERSION=2"
    )
    assert fsdp2["distributed"]["fsdp_units"] == 3  # size-based wrapping: the two large Linears and the root
    # accelerate keys parameters by data pointer to move the optimizer onto the shards: it must
    # find them all, or the optimizer state would be missing (two moments per shard, and a step count).
    shards = fsdp2["breakdown"]["parameters"]
    assert shards > 0 and 0 <= fsdp2["breakdown"]["optimizer_state"] - 2 * shards < 1024
    # Loading the full weights on rank 0 and scattering them is rank 0's alone.
    (scatter,) = [note for note in fsdp2["corrections"] if note["name"] == "rank-asymmetry"]
    assert scatter["detail"].startswith("dist.scatter with 4 entries on the root")
    assert fsdp2["peak_bytes"] < ddp["peak_bytes"]
