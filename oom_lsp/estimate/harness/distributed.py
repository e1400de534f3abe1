"""Distributed training, traced as rank 0 of N in one process.

`torchrun --nproc_per_node M train.py` starts N processes that find each other
through RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT and talk through NCCL.
Here the script runs once, as rank 0, with those variables set as torchrun
sets them, and every process group is PyTorch's fake one
(`torch.testing._internal.distributed.fake_pg`): collectives complete at once
and move no data, which is what rank 0 holds in memory, since a collective's
buffers are allocated by the caller whatever the network does. What makes the
engines run on fake tensors (and on real CPU tensors, the ground truth):

- `init_process_group("nccl", ...)` (any backend, any init method) becomes the
  fake backend with rank 0 of N; `torch.multiprocessing.spawn(fn, nprocs=N)`
  calls `fn(0, ...)` in this process.
- A `DeviceMesh` (`init_device_mesh("cuda", ...)`, FSDP2's default mesh) is
  built on the CPU, outside fake mode (its rank map is read as numbers).
- DDP: its C++ reducer makes and reads small integer tensors (parameter shapes
  to verify, bucket indices to broadcast when it rebuilds its buckets at the
  start of step 2) with raw data pointers, which fake tensors do not have;
  those run on real tensors (`RealIntegerOps`), everything else on fake ones.
  The fake group's allreduce future carries no tensor, so a DDP without a
  communication hook gets one that does what DDP's default does to the bucket
  in place (divide by the world size) and returns it; the built-in hooks and
  `dist.all_reduce(..., async_op=True)` futures return their tensor, as NCCL's do.
- FSDP2 (`fully_shard`): its unsharded parameters are allocated and freed by
  resizing their storage in place (`untyped_storage().resize_`), below the
  dispatcher: the tracker follows those resizes. DTensor parameters, gradients
  and optimizer state are counted by their local shard.
- What each storage is: DDP buckets, FSDP2 unsharded parameters, all-gather
  and reduce-scatter buffers, gradients, by the engine function that made it.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .common import has_exact_values, op_tensors

# Breakdown categories this module adds (common.CATEGORIES holds the others).
CATEGORIES = ("unsharded_parameters", "ddp_buckets", "all_gather_buffers", "reduce_scatter_buffers")
MASTER_PORT = "29500"


def install(shims, request: dict, tracker, context, state: dict) -> None:
    config = request.get("distributed")
    if not config:
        _install_detection(shims, request, tracker, context, state)
        return
    _install_launch(shims, request, config, tracker, context, state)


def _install_detection(shims, request: dict, tracker, context, state: dict) -> None:
    """A script that sets up its own process group without a launcher (`--world-size` not given):
    `init_process_group("gloo", rank=0, world_size=1)`, or torchrun's variables left unset. Its
    group is traced on the fake backend as rank 0 of the world size it asks for (its
    `world_size` argument, else WORLD_SIZE, else 1), as `--world-size` would, from that call on."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except ImportError:
        return
    if not dist.is_available():
        return
    original = distributed_c10d.init_process_group

    def init_process_group(*args, **kwargs):
        world_size = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
        if world_size in (None, -1):
            world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        config = {"world_size": int(world_size), "nproc_per_node": int(world_size), "detected": True}
        request["distributed"] = config
        for owner in (dist, distributed_c10d):
            shims.patch(owner, "init_process_group", original)  # what the launch's own shim wraps
        _install_launch(shims, request, config, tracker, context, state)
        return dist.init_process_group(*args, **kwargs)

    for owner in (dist, distributed_c10d):
        if getattr(owner, "init_process_group", None) is original:
            shims.patch(owner, "init_process_group", init_process_group)


def _install_launch(shims, request: dict, config: dict, tracker, context, state: dict) -> None:
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # registers the "fake" backend

    from .cuda import gpu_visible

    world_size = int(config["world_size"])
    per_node = int(config.get("nproc_per_node") or world_size)
    info = state["distributed"] = {
        "world_size": world_size,
        "nproc_per_node": per_node,
        "launcher_environment": config.get("environment") or {},
        "backend": None,
        "init_line": None,
        "ddp": [],
        "fsdp_units": 0,
        "fsdp_mixed_precision": None,
        "device_meshes": [],
        "spawned": None,
        "rank_zero_only": [],
        "largest_all_gather": 0,
        "largest_reduce_scatter": 0,
        "process_groups": [],
        # Set up by the script's own init_process_group, without --world-size.
        "detected": bool(config.get("detected")),
    }
    _set_environment(shims, world_size, per_node, config.get("environment") or {})
    if gpu_visible(request):
        shims.patch(torch.cuda, "device_count", lambda: per_node)
    shims.patch(dist, "is_nccl_available", lambda: True)
    fake_mode = state.get("fake_mode")
    tracker.unwrap = _local_tensor
    _install_process_group(shims, dist, world_size, context, info)
    _install_spawn(shims, info)
    _install_module_to_rank(shims)
    _install_device_mesh(shims, tracker, fake_mode, info)
    _install_async_futures(shims, dist)
    _install_rank_zero_collectives(shims, dist, tracker, context, info)
    _install_ddp(shims, dist, tracker, context, fake_mode, state)
    _install_fsdp2(shims, tracker, context, info)
    shims.at_undo(lambda: _destroy_process_groups(dist, info))


def _set_environment(shims, world_size: int, per_node: int, launcher: dict) -> None:
    """The variables torchrun sets for rank 0 (local rank 0 of the first node), and those a
    launcher adds (`accelerate launch --config_file`: ACCELERATE_*, FSDP_*)."""
    values = {
        **launcher,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "ROLE_RANK": "0",
        "NODE_RANK": "0",
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(per_node),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": MASTER_PORT,
        "TORCHELASTIC_RUN_ID": "oom-lsp-estimate",
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)

    def restore():
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    shims.at_undo(restore)


def _destroy_process_groups(dist, info: dict) -> None:
    """After the run: the sizes of the process groups rank 0 belonged to (each is an NCCL
    communicator on a GPU), then the groups are gone for the next run."""
    if not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d

    info["process_groups"] = sorted(len(ranks) for ranks in distributed_c10d._world.pg_group_ranks.values())
    dist.destroy_process_group()
    # accelerate keeps its process state in class-level singletons: the next run (a sweep, a
    # batch search) must start it afresh, as a new process would.
    accelerate_state = sys.modules.get("accelerate.state")
    if accelerate_state is not None:
        accelerate_state.AcceleratorState._reset_state(reset_partial_state=True)
        accelerate_state.GradientState._reset_state()


def _local_tensor(tensor):
    """A DTensor's storage is its local shard's."""
    local = getattr(tensor, "_local_tensor", None)
    return local if local is not None else tensor


def _user_place(context) -> list | None:
    where = context.user_line()
    return [where[0], where[1]] if where else None


# -- process groups -----------------------------------------------------------


def _install_process_group(shims, dist, world_size: int, context, info: dict) -> None:
    from torch.distributed import distributed_c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore

    original = distributed_c10d.init_process_group

    def init_process_group(backend=None, init_method=None, timeout=None, *args, **kwargs):
        # The script's backend, init method, store, rank and device_id are those of a real
        # launch; rank 0 of N on the fake backend replaces them all.
        info["backend"] = str(backend) if backend is not None else "default"
        info["init_line"] = _user_place(context)
        options = {"timeout": timeout} if timeout is not None else {}
        if kwargs.get("group_name"):
            options["group_name"] = kwargs["group_name"]
        return original("fake", rank=0, world_size=world_size, store=FakeStore(), **options)

    for owner in (dist, distributed_c10d):
        shims.patch(owner, "init_process_group", init_process_group)


def _install_spawn(shims, info: dict) -> None:
    """mp.spawn(fn, args, nprocs=N): rank 0 is `fn(0, *args)`, here."""
    import torch.multiprocessing as mp

    def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
        info["spawned"] = nprocs
        fn(0, *args)

    shims.patch(mp, "spawn", spawn)
    if hasattr(mp, "start_processes"):

        def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
            return spawn(fn, args, nprocs)

        shims.patch(mp, "start_processes", start_processes)


def _install_module_to_rank(shims) -> None:
    """`model.to(rank)`: a bare integer is a CUDA ordinal (the DDP tutorials' idiom), which
    nn.Module.to parses through the current accelerator, absent here; as "cuda:N" it reaches
    the CUDA redirect like any other."""
    from torch import nn

    original_to = nn.Module.to

    def module_to(self, *args, **kwargs):
        if args and _is_ordinal(args[0]):
            args = (f"cuda:{args[0]}", *args[1:])
        if _is_ordinal(kwargs.get("device")):
            kwargs["device"] = f"cuda:{kwargs['device']}"
        return original_to(self, *args, **kwargs)

    shims.patch(nn.Module, "to", module_to)


def _is_ordinal(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- device meshes ------------------------------------------------------------


def _install_device_mesh(shims, tracker, fake_mode, info: dict) -> None:
    """Meshes on the CPU, built on real tensors (a mesh reads its rank map as numbers)."""
    from torch.distributed import device_mesh as mesh_module

    mesh_class = mesh_module.DeviceMesh
    original_init = mesh_class.__init__

    def real_rank_map(value):
        if fake_mode is None or _is_real(value):
            return value
        twin = tracker.shadows.get(value) if tracker.shadows is not None else None
        if twin is None:
            raise RuntimeError("oom-lsp estimate: a DeviceMesh built from a tensor whose values are unknown")
        return twin

    def mesh_init(self, device_type, mesh=None, *args, **kwargs):
        device_type = "cpu" if device_type in ("cuda", "xpu", "hpu") else device_type
        if "_rank_map" in kwargs:
            kwargs["_rank_map"] = real_rank_map(kwargs["_rank_map"])
        mesh = real_rank_map(mesh)
        with _outside_fake(tracker, fake_mode):
            original_init(self, device_type, mesh, *args, **kwargs)
        info["device_meshes"].append(list(self.shape))

    shims.patch(mesh_class, "__init__", mesh_init)
    original_init_device_mesh = mesh_module.init_device_mesh

    def init_device_mesh(device_type, mesh_shape, **kwargs):
        device_type = "cpu" if device_type in ("cuda", "xpu", "hpu") else device_type
        with _outside_fake(tracker, fake_mode):
            return original_init_device_mesh(device_type, tuple(mesh_shape), **kwargs)

    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    for owner in (mesh_module, dist, _fsdp_init):
        if hasattr(owner, "init_device_mesh"):
            shims.patch(owner, "init_device_mesh", init_device_mesh)


@contextlib.contextmanager
def _outside_fake(tracker, fake_mode):
    """Real tensors, not counted: the library's own bookkeeping."""
    tracker.paused += 1
    try:
        if fake_mode is None:
            yield
        else:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                yield
    finally:
        tracker.paused -= 1


# -- collectives --------------------------------------------------------------


def _install_async_futures(shims, dist) -> None:
    """`dist.all_reduce(t, async_op=True).get_future()` gives `[t]` on NCCL and
    gloo; the fake group's future gives None. DDP's hooks read it."""
    from torch.distributed import distributed_c10d

    original = distributed_c10d.all_reduce
    make_work = torch._C._distributed_c10d._create_work_from_future

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        work = original(tensor, op=op, group=group, async_op=async_op)
        if not async_op or work is None:
            return work
        future = torch.futures.Future()
        future.set_result([tensor])
        return make_work(future)

    for owner in (dist, distributed_c10d):
        shims.patch(owner, "all_reduce", all_reduce)


def _install_rank_zero_collectives(shims, dist, tracker, context, info: dict) -> None:
    """Collectives whose buffers only the root holds: `gather` into `gather_list`, `scatter`
    from `scatter_list` (rank 0 allocates those lists, the other ranks pass None), and the
    object variants (pickled to tensors on the root)."""
    from torch.distributed import distributed_c10d

    def recorder(name: str, list_argument: str, position: int):
        original = getattr(distributed_c10d, name)

        def collective(*args, **kwargs):
            tensors = kwargs.get(list_argument, args[position] if len(args) > position else None)
            if tensors:
                # Entries may be views of one tensor (chunks of it): each storage once.
                storages = {
                    id(_local_tensor(tensor).untyped_storage()): tensor
                    for tensor in tensors
                    if isinstance(tensor, torch.Tensor)
                }
                size = sum(tracker.record_bytes(tensor) for tensor in storages.values())
                line = _user_place(context)
                seen = next((entry for entry in info["rank_zero_only"] if entry["line"] == line), None)
                if seen is None:
                    what = f"dist.{name} with {len(tensors)} entries on the root"
                    info["rank_zero_only"].append({"what": what, "line": line, "bytes": size or None})
                elif size > (seen["bytes"] or 0):
                    seen["bytes"] = size
            return original(*args, **kwargs)

        for owner in (dist, distributed_c10d):
            shims.patch(owner, name, collective)

    recorder("gather", "gather_list", 1)
    recorder("scatter", "scatter_list", 1)
    recorder("gather_object", "object_gather_list", 1)


class RealIntegerOps(TorchDispatchMode):
    """Under fake mode, inside DDP's C++ bookkeeping: integer tensors made from
    nothing or from real integer tensors (shapes to verify, bucket indices to
    broadcast) are made, written and read for real (the reducer reads them
    through raw pointers), uncounted; float tensors (the buckets) stay fake."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = op_tensors(kwargs.values(), op_tensors(args, []))
        if tensors:
            real = all(_is_real(t) and has_exact_values(t) for t in tensors)
        else:
            dtype = kwargs.get("dtype")
            real = dtype is not None and not (dtype.is_floating_point or dtype.is_complex)
        if not real:
            return func(*args, **kwargs)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        self.tracker.paused += 1
        try:
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        finally:
            self.tracker.paused -= 1


def _is_real(value) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(value, FakeTensor)


# -- DDP ----------------------------------------------------------------------

_DDP_OPTIONS = {
    "bucket_cap_mb": None,
    "find_unused_parameters": False,
    "gradient_as_bucket_view": False,
    "static_graph": False,
    "broadcast_buffers": True,
}


def _install_ddp(shims, dist, tracker, context, fake_mode, state: dict) -> None:
    import torch.nn.parallel.distributed as ddp_module
    from torch._C._distributed_c10d import Reducer

    info = state["distributed"]
    ddp_class = ddp_module.DistributedDataParallel
    original_init = ddp_class.__init__
    records_by_reducer: dict[int, dict] = {}

    def ddp_init(self, module, *args, **kwargs):
        options = {name: kwargs.get(name, default) for name, default in _DDP_OPTIONS.items()}
        # hook: the script's own communication hook, by name, when it registers one.
        record = {"line": _user_place(context), **options, "hook": None, "rebuilt_at_step": None}
        info["ddp"].append(record)
        # The module is on the CPU here: device_ids (a GPU module's) would be refused.
        if args:
            args = (None, None, *args[2:])
        kwargs.pop("device_ids", None)
        kwargs.pop("output_device", None)
        original_init(self, module, *args, **kwargs)
        self._oom_lsp_record = record
        records_by_reducer[id(self.reducer)] = record

    shims.patch(ddp_class, "__init__", ddp_init)

    # What DDP's reducer allocates: its gradient buckets, at construction and when it rebuilds them.
    original_helper = ddp_class._ddp_init_helper

    def ddp_init_helper(self, *args, **kwargs):
        with _category(context, "ddp_buckets"):
            return original_helper(self, *args, **kwargs)

    shims.patch(ddp_class, "_ddp_init_helper", ddp_init_helper)
    original_rebuild = Reducer._rebuild_buckets

    def rebuild_buckets(reducer):
        peak = tracker.peak
        with _category(context, "ddp_buckets"), _real_integer_ops(tracker, fake_mode):
            rebuilt = original_rebuild(reducer)
        record = records_by_reducer.get(id(reducer))
        if rebuilt and record is not None:
            record["rebuilt_at_step"] = state["steps"] + 1
            if tracker.peak > peak:
                record["peak_at_rebuild"] = tracker.peak
        return rebuilt

    shims.patch(Reducer, "_rebuild_buckets", rebuild_buckets)
    if fake_mode is not None:
        original_verify = ddp_module._verify_param_shape_across_processes

        def verify(process_group, tensors, logger=None):
            with _real_integer_ops(tracker, fake_mode):
                return original_verify(process_group, tensors, logger)

        shims.patch(ddp_module, "_verify_param_shape_across_processes", verify)

    # A DDP without a communication hook reduces through the group's future.
    original_pre_forward = ddp_class._pre_forward
    hooks_checked: set[int] = set()

    def pre_forward(self, *inputs, **kwargs):
        record = getattr(self, "_oom_lsp_record", None)
        if record is not None and id(self) not in hooks_checked:
            hooks_checked.add(id(self))
            if not self._comm_hooks:
                world = self.process_group.size()

                def allreduce_average(state, bucket):
                    # What DDP's default does to the bucket: divide in place, reduce in place.
                    bucket.buffer().div_(world)
                    future = torch.futures.Future()
                    future.set_result(bucket.buffer())
                    return future

                dist._register_comm_hook(self.reducer, None, allreduce_average)
            else:
                record["hook"] = getattr(self._comm_hooks[0][0], "__qualname__", "a hook")
        return original_pre_forward(self, *inputs, **kwargs)

    shims.patch(ddp_class, "_pre_forward", pre_forward)

    original_builtin = ddp_class._register_builtin_comm_hook

    def register_builtin_comm_hook(self, comm_hook_type):
        # The C++ built-in hooks read the group's future; their Python twins do the same work.
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = {
            dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
            dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook,
        }
        if comm_hook_type in hooks:
            return self.register_comm_hook(None, hooks[comm_hook_type])
        return original_builtin(self, comm_hook_type)

    shims.patch(ddp_class, "_register_builtin_comm_hook", register_builtin_comm_hook)


@contextlib.contextmanager
def _real_integer_ops(tracker, fake_mode):
    if fake_mode is None:
        yield
        return
    with RealIntegerOps(tracker):
        yield


@contextlib.contextmanager
def _category(context, category: str):
    context.category_scope.append(category)
    try:
        yield
    finally:
        context.category_scope.pop()


# -- FSDP2 --------------------------------------------------------------------


def _install_fsdp2(shims, tracker, context, info: dict) -> None:
    import functools

    import torch.distributed.fsdp as fsdp_package
    from torch.distributed.fsdp import _fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    # The unsharded parameters: allocated and freed by resizing their storage in place.
    original_alloc = _fsdp_param.alloc_storage
    original_free = _fsdp_param.free_storage

    def alloc_storage(tensor):
        original_alloc(tensor)
        tracker.storage_resized(tensor, "fsdp.alloc_storage", "unsharded_parameters")

    def free_storage(tensor):
        original_free(tensor)
        tracker.storage_resized(tensor, "fsdp.free_storage")

    for owner in (_fsdp_param, _fsdp_param_group):
        shims.patch(owner, "alloc_storage", alloc_storage)
    shims.patch(_fsdp_param, "free_storage", free_storage)

    for owner, name, category in (
        (_fsdp_param.FSDPParam, "init_all_gather_outputs", "unsharded_parameters"),
        (_fsdp_param.FSDPParam, "init_unsharded_param", "unsharded_parameters"),
    ):
        shims.patch(owner, name, _categorised(getattr(owner, name), context, category))

    original_all_gather = _fsdp_param_group.foreach_all_gather

    def foreach_all_gather(*args, **kwargs):
        with _category(context, "all_gather_buffers"):
            result = original_all_gather(*args, **kwargs)
        if result is not None:
            size = _storage_bytes(result.all_gather_output)
            info["largest_all_gather"] = max(info["largest_all_gather"], size)
        return result

    shims.patch(_fsdp_param_group, "foreach_all_gather", foreach_all_gather)
    original_reduce = _fsdp_param_group.foreach_reduce

    def foreach_reduce(fsdp_params, *args, **kwargs):
        with _category(context, "reduce_scatter_buffers"):
            out = original_reduce(fsdp_params, *args, **kwargs)
        info["largest_reduce_scatter"] = max(info["largest_reduce_scatter"], _storage_bytes(out[0]))
        for fsdp_param in fsdp_params:
            grad = fsdp_param.sharded_param.grad
            if grad is not None:
                tracker.set_category(grad, "gradients")
        return out

    shims.patch(_fsdp_param_group, "foreach_reduce", foreach_reduce)

    # fully_shard: what it makes (the sharded parameters) lives on the GPU, wherever the
    # module was (the mesh is on the CPU here, so it moves nothing).
    original_fully_shard = fsdp_package.fully_shard

    @functools.wraps(original_fully_shard)  # and its `state`, which FSDP2 reads off the function
    def fully_shard(module, *args, **kwargs):
        info["fsdp_units"] += 1
        policy = kwargs.get("mp_policy")
        if policy is not None and getattr(policy, "param_dtype", None) is not None:
            info["fsdp_mixed_precision"] = str(policy.param_dtype).replace("torch.", "")
        tracker.device_scope += 1
        try:
            sharded = original_fully_shard(module, *args, **kwargs)
        finally:
            tracker.device_scope -= 1
        # The sharded parameters replace the module's without register_parameter (and
        # accelerate hands them to the optimizer without add_param_group).
        for parameter in sharded.parameters():
            tracker.set_category(parameter, "parameters")
        return sharded

    # The names scripts import it by (not the defining module's own, which FSDP2 calls itself).
    import torch.distributed._composable.fsdp as composable_fsdp

    for owner in (fsdp_package, _fully_shard, composable_fsdp):
        if getattr(owner, "fully_shard", None) is original_fully_shard:
            shims.patch(owner, "fully_shard", fully_shard)


def _storage_bytes(tensor) -> int:
    return tensor.untyped_storage().nbytes() if isinstance(tensor, torch.Tensor) else 0


def _categorised(function, context, category: str):
    def wrapper(*args, **kwargs):
        with _category(context, category):
            return function(*args, **kwargs)

    return wrapper
