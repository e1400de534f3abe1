"""The parent side of the distributed estimate (`--world-size`): what the harness is asked
(harness/distributed.py traces the script as rank 0 of N on the fake process group), the
distributed terms of a prediction, what the sweep (sweep.py) reads of each size, the scripts out of reach.

No torch import here: this runs in the CLI and the editor.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

from oom_lsp.estimate.results import Breakdown, Category, Correction, Launch, SweepRow, Trace, Verdict
from oom_lsp.units import format_bytes

MIB = 2**20
# NCCL's communicator buffers, outside PyTorch's allocator (in nvidia-smi, not in
# memory_allocated/reserved): per communicator, linear in its channels; measured by a user on
# 4 x A100 with NVLink (NVIDIA/nccl#964): 544 MB for a group of 2 GPUs, 688 MB for more.
NCCL_PAIR = 544 * MIB
NCCL_GROUP = 688 * MIB
DDP_DEFAULT_BUCKET_MB = 25
class WorldSizeError(ValueError):
    pass


def parse_world_sizes(text: str) -> list[int]:
    """ "8" -> [8]; "1,2,4,8" -> [1, 2, 4, 8] (sorted, without repeats)."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise WorldSizeError(
                f"--world-size: expected a number of GPUs or a list such as 1,2,4,8, got {text!r}"
            )
        sizes.append(int(part))
    return sorted(set(sizes))


def launch(world_size: int, nproc_per_node: int | None, environment: dict[str, str] | None = None) -> dict:
    """What the harness sets up: rank 0 of `world_size`, `nproc_per_node` GPUs on its node
    (torchrun's --nproc_per_node; at most the world size), and the variables a launcher
    exports besides torchrun's (accelerate's, from its config file)."""
    per_node = min(nproc_per_node or world_size, world_size)
    return {"world_size": world_size, "nproc_per_node": per_node, "environment": environment or {}}


# Run in the user's interpreter (which has accelerate, when the script uses it): the variables
# `accelerate launch --config_file CONFIG` exports for the script, by accelerate's own launcher code.
_ACCELERATE_ENVIRONMENT = r"""
import json, sys
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_multi_gpu_env
config, world, per_node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
args = launch_command_parser().parse_args(["--config_file", config, "--num_processes", str(world),
    "--num_machines", str(max(1, world // per_node)), "--machine_rank", "0", "train.py"])
args, _, _ = _validate_launch_command(args)
if args.use_deepspeed or args.use_megatron_lm:
    print(json.dumps({"error": "DeepSpeed" if args.use_deepspeed else "Megatron-LM"}))
    sys.exit(0)
environment = prepare_multi_gpu_env(args)
print(json.dumps({"environment": {name: value for name, value in environment.items()
                                  if name.startswith(("ACCELERATE_", "FSDP_"))}}))
"""


def accelerate_environment(python: str, config: Path, world_size: int, nproc_per_node: int | None) -> dict:
    """accelerate's variables for `config` (its YAML or JSON config file), or WorldSizeError."""
    import json
    import os
    import subprocess

    from oom_lsp.probes import run_probe

    per_node = min(nproc_per_node or world_size, world_size)
    try:
        done = run_probe(  # from an empty folder: no module of the project is imported
            python,
            _ACCELERATE_ENVIRONMENT,
            [os.path.abspath(config), str(world_size), str(per_node)],
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise WorldSizeError(f"--accelerate-config: cannot run {python}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "No module named 'accelerate'" in done.stderr:
            last = f"accelerate is not installed in {python}"
        raise WorldSizeError(f"--accelerate-config {config}: {last}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    if "error" in answer:
        raise WorldSizeError(
            f"--accelerate-config {config}: {answer['error']} is out of reach of the fake process group; "
            "the distributed estimate covers DDP and FSDP2"
        )
    return answer["environment"]


def _place(where: list | None) -> str:
    if not where:
        return "?"
    file, line = where
    try:
        shown = str(Path(file).resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = file
    return f"{shown}:{line}"


def _note(name: str, detail: str, size: int | None = None) -> Correction:
    return Correction(name, detail, size)


def terms(trace: Trace, cuda: bool, script: Path | None = None) -> tuple[list[Correction], int, int]:
    """The distributed corrections of one traced run: each engine's terms, stated (their
    bytes are in the trace), and on CUDA what the trace cannot see: NCCL's buffers (outside
    the allocator: with the CUDA context) and FSDP2's per-stream pools (reserved).
    Returns (corrections, extra reserved bytes, extra bytes outside the allocator)."""
    info = trace.distributed or {}
    breakdown = trace.breakdown
    world, per_node = info["world_size"], info["nproc_per_node"]
    notes = []
    how = (
        f"mp.spawn(nprocs={info['spawned']}): rank 0's function run in this process; "
        if info.get("spawned")
        else ""
    )
    backend = (
        f'init_process_group("{info["backend"]}") at {_place(info["init_line"])}'
        if info.get("init_line")
        else "no init_process_group call"
    )
    launcher = info.get("launcher_environment") or {}
    if launcher:
        shown = ", ".join(
            f"{name}={launcher[name]}"
            for name in (
                "ACCELERATE_USE_FSDP",
                "FSDP_VERSION",
                "FSDP_AUTO_WRAP_POLICY",
                "ACCELERATE_MIXED_PRECISION",
            )
            if name in launcher
        )
        notes.append(
            _note("accelerate-config", f"accelerate's launch variables from --accelerate-config: {shown}")
        )
    if info.get("detected"):
        notes.append(
            _note(
                "process-group-detected",
                f"{backend} without --world-size: traced as rank 0 of {world}, the world size the script "
                f"asks for, on PyTorch's fake process group; pass --world-size N to trace a job of N GPUs",
            )
        )
    else:
        notes.append(
            _note(
                "fake-process-group",
                f"traced as rank 0 of {world} ({per_node} GPU{'s' if per_node > 1 else ''} per node) on "
                f"PyTorch's fake process group: {how}{backend}; collectives complete at once and move no data, "
                "their buffers counted as rank 0 allocates them",
            )
        )
    for ddp in info.get("ddp", []):
        options = ", ".join(
            f"{name}={ddp[name]!r}"
            if ddp[name] is not None
            else f"{name}={DDP_DEFAULT_BUCKET_MB} (the default)"
            for name in ("gradient_as_bucket_view", "bucket_cap_mb", "find_unused_parameters", "static_graph")
        )
        notes.append(_note("ddp", f"DistributedDataParallel at {_place(ddp['line'])}: {options}"))
        buckets = breakdown[Category.DDP_BUCKETS]
        if ddp["gradient_as_bucket_view"]:
            detail = (
                "DDP's gradient buckets hold the gradients themselves (gradient_as_bucket_view=True): "
                "no second copy"
            )
        else:
            detail = (
                "DDP's gradient buckets are a second copy of the gradients, kept between steps "
                "(gradient_as_bucket_view=False); gradient_as_bucket_view=True makes the gradients views "
                "of them and saves that copy"
            )
        notes.append(_note("ddp-buckets", detail, buckets))
        if ddp.get("rebuilt_at_step"):
            at_peak = ddp.get("peak_at_rebuild") == trace.peak_bytes
            notes.append(
                _note(
                    "ddp-bucket-rebuild",
                    f"DDP rebuilt its buckets at the start of step {ddp['rebuilt_at_step']}, in the order the "
                    "gradients became ready in step 1"
                    + (
                        ": the old buckets, still holding the gradients, and the new ones coexist there, "
                        "which is this trace's peak (it happens once)"
                        if at_peak
                        else ""
                    ),
                )
            )
        if ddp.get("hook"):
            notes.append(_note("ddp-comm-hook", f"the script's DDP communication hook: {ddp['hook']}"))
    if info.get("fsdp_units"):
        precision = (
            f"; parameters all-gathered in {info['fsdp_mixed_precision']} (MixedPrecisionPolicy)"
            if info.get("fsdp_mixed_precision")
            else ""
        )
        at_peak = [
            f"{category.label} {format_bytes(breakdown[category])}"
            for category in (
                Category.UNSHARDED_PARAMETERS,
                Category.ALL_GATHER_BUFFERS,
                Category.REDUCE_SCATTER_BUFFERS,
            )
            if breakdown[category]
        ]
        notes.append(
            _note(
                "fsdp2",
                f"FSDP2: {info['fsdp_units']} fully_shard unit{'s' if info['fsdp_units'] > 1 else ''} over "
                f"{world} rank{'s' if world > 1 else ''}: parameters, gradients and optimizer state are 1/{world} "
                f"of the model's{precision}; the root unit's parameters stay unsharded from its forward to its "
                "backward" + (f"; at the peak: {', '.join(at_peak)}" if at_peak else ""),
                breakdown[Category.UNSHARDED_PARAMETERS],
            )
        )
    for asymmetry in info.get("rank_zero_only", []):
        notes.append(
            _note(
                "rank-asymmetry",
                f"{asymmetry['what']} at {_place(asymmetry['line'])}: only rank 0 holds it, "
                "so rank 0's peak is the largest",
                asymmetry.get("bytes"),
            )
        )
    if script is not None:
        notes += _rank_zero_notes(script, info, breakdown)
    reserved_extra = outside = 0
    if cuda:
        groups = [size for size in info.get("process_groups", []) if size > 1]
        if groups:
            outside = sum(NCCL_PAIR if size == 2 else NCCL_GROUP for size in groups)
            notes.append(
                _note(
                    "nccl-buffers",
                    f"NCCL's buffers for {len(groups)} communicator(s) of "
                    + ", ".join(str(size) for size in groups)
                    + " GPUs, outside PyTorch's allocator (counted with the CUDA context): "
                    f"{format_bytes(NCCL_PAIR)} for 2 GPUs, {format_bytes(NCCL_GROUP)} for more, as measured on "
                    "A100s with NVLink (NVIDIA/nccl#964); linear in NCCL's channels, so it varies by "
                    "topology and NCCL_BUFFSIZE (not calibrated on a GPU)",
                    outside,
                )
            )
        pools = []
        if info.get("largest_all_gather"):
            pools.append(
                f"two all-gather outputs ({format_bytes(info['largest_all_gather'])} each: the current unit's "
                "and the next's)"
            )
        if info.get("largest_reduce_scatter"):
            pools.append(f"one reduce-scatter input ({format_bytes(info['largest_reduce_scatter'])})")
        if pools:
            reserved_extra = 2 * info.get("largest_all_gather", 0) + info.get("largest_reduce_scatter", 0)
            notes.append(
                _note(
                    "fsdp2-stream-pools",
                    "FSDP2 all-gathers and reduce-scatters on streams of their own, and the caching allocator "
                    f"keeps a pool per stream: up to {' and '.join(pools)} stay reserved for those streams "
                    "(not calibrated on a GPU)",
                    reserved_extra,
                )
            )
    return notes, reserved_extra, outside


def describe(trace: Trace) -> Launch:
    """What the JSON output says of the launch and the engines."""
    info = trace.distributed or {}
    engines = [f"DDP at {_place(ddp['line'])}" for ddp in info.get("ddp", [])]
    if info.get("fsdp_units"):
        engines.append(f"FSDP2 ({info['fsdp_units']} units)")
    return Launch(
        world_size=info["world_size"],
        nproc_per_node=info["nproc_per_node"],
        rank=0,
        backend=info.get("backend"),
        engines=engines,
        ddp=info.get("ddp", []),
        fsdp_units=info.get("fsdp_units", 0),
        device_meshes=info.get("device_meshes", []),
        process_groups=info.get("process_groups", []),
    )


def with_world_size(options: Any, world_size: int) -> Any:
    return dataclasses.replace(options, world_size=world_size)


def fewest_fitting(rows: list[SweepRow]) -> int | None:
    """The smallest world size whose rank 0 fits its GPU (with the margin)."""
    for row in rows:
        if row.estimate.verdict is Verdict.FITS:
            return row.world_size
    return None


def deepspeed_call(script: Path) -> tuple[int, str] | None:
    """A DeepSpeed engine in the script (`deepspeed.initialize`, `deepspeed.init_distributed`,
    `deepspeed.zero.Init`): (line, call), or None. ZeRO partitions through DeepSpeed's own
    communication layer and CUDA kernels, out of reach of the fake process group."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {
                alias.asname or alias.name for alias in node.names if alias.name.split(".")[0] == "deepspeed"
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deepspeed":
            for alias in node.names:
                if alias.name in ("initialize", "init_distributed", "zero"):
                    aliases.add(alias.asname or alias.name)
    if not aliases:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.split(".")[0] in aliases and name.split(".")[-1] in (
                "initialize",
                "init_distributed",
                "Init",
            ):
                return node.lineno, name
    return None


# What a rank-0-only block may hold that the other ranks do not.
_RANK_NAMES = {
    "rank",
    "global_rank",
    "local_rank",
    "ddp_rank",
    "ddp_local_rank",
    "process_rank",
    "RANK",
    "LOCAL_RANK",
}
_MAIN_FLAGS = {
    "master_process",
    "is_master",
    "is_main_process",
    "is_local_main_process",
    "main_process",
    "is_rank_zero",
    "is_world_process_zero",
}
_STATE_DICT_CALLS = {
    "state_dict",
    "get_model_state_dict",
    "get_state_dict",
    "get_optimizer_state_dict",
    "full_tensor",
}
_WORK_CALLS = _STATE_DICT_CALLS | {
    "save",
    "save_checkpoint",
    "save_pretrained",
    "gather",
    "gather_object",
    "evaluate",
    "validate",
    "estimate_loss",
    "generate",
    "sample",
}


def _is_rank_expression(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _RANK_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in _RANK_NAMES
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        if name.endswith(("get_rank", "get_local_rank")):
            return True
        if name == "int" and node.args:  # int(os.environ["RANK"])
            return _is_rank_expression(node.args[0]) or "RANK" in ast.unparse(node.args[0])
    if isinstance(node, ast.Subscript):  # os.environ["RANK"]
        return "RANK" in ast.unparse(node.slice)
    return False


def _is_rank_zero_test(test: ast.AST) -> bool:
    if isinstance(test, ast.BoolOp):
        return any(_is_rank_zero_test(value) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _is_rank_expression(test.operand)
    if isinstance(test, (ast.Name, ast.Attribute)):
        return (test.id if isinstance(test, ast.Name) else test.attr) in _MAIN_FLAGS
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = test.left, test.comparators[0]
        zero = [side for side in (left, right) if isinstance(side, ast.Constant) and side.value == 0]
        if isinstance(test.ops[0], (ast.Eq, ast.Is)) and zero:
            other = right if zero[0] is left else left
            return _is_rank_expression(other)
        if isinstance(test.ops[0], ast.In) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return _is_rank_expression(left) and any(
                isinstance(item, ast.Constant) and item.value == 0 for item in right.elts
            )
    return False


def rank_zero_blocks(script: Path) -> list[dict[str, Any]]:
    """`if rank == 0:` blocks (and `if master_process:`, `if dist.get_rank() == 0:`...) whose
    body saves, gathers or evaluates: work, and memory, that only rank 0 has."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    blocks = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or not _is_rank_zero_test(node.test):
            continue
        calls = []
        for statement in node.body:
            for inner in ast.walk(statement):
                if isinstance(inner, ast.Call):
                    name = ast.unparse(inner.func)
                    if name.split(".")[-1] in _WORK_CALLS and name not in calls:
                        calls.append(name)
        if calls:
            blocks.append({"line": node.lineno, "test": ast.unparse(node.test), "calls": calls})
    return blocks


def _rank_zero_notes(script: Path, info: dict[str, Any], breakdown: Breakdown) -> list[Correction]:
    notes = []
    for block in rank_zero_blocks(script)[:3]:
        detail = (
            f"rank 0 alone runs {script.name}:{block['line']} (if {block['test']}): "
            + ", ".join(f"{call}()" for call in block["calls"][:4])
            + "; what it allocates there is rank 0's alone (in this trace only if it runs within the first "
            "two steps)"
        )
        if info.get("fsdp_units") and any(
            call.split(".")[-1] in _STATE_DICT_CALLS for call in block["calls"]
        ):
            full = breakdown[Category.PARAMETERS] * info["world_size"]
            detail += (
                f"; a full state dict of an FSDP2 model gathers the unsharded parameters, about "
                f"{format_bytes(full)} (the sharded parameters x {info['world_size']}), unless offloaded to the CPU"
            )
        notes.append(_note("rank-asymmetry", detail))
    return notes
