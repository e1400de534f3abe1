"""The GPU the script believes it has, or does not.

`--device cuda`: `torch.cuda` and `torch.accelerator` answer as the target GPU would,
`device="cuda"`, `.cuda()`, `.to("cuda")` go to the CPU (the tracker learns that the result lives
on the GPU), `autocast("cuda")` and `GradScaler("cuda")` become their CPU counterparts.

`--device cpu` measures what a real CPU run holds, so the script sees a machine without a GPU, as
a CPU-only build of torch answers: `torch.cuda.is_available()` False, no device, no accelerator;
`autocast("cuda")` and `GradScaler("cuda")` then disable themselves, as torch does there (Accelerate's
`mixed_precision="fp16"` and pytorch/examples' DataParallel take their CPU paths). What the script
puts on the GPU without asking (`.cuda()`, `device="cuda"`) still runs, on the CPU, and the run
reports where (`cuda_kept_on_cpu`), as a CPU-only run would fail there instead.

A distributed request (`--world-size`, rank 0 of N) models a job of N GPUs under either device:
its script sees one GPU per rank, as that job's would (Accelerate sets up DDP or FSDP2 only
for GPUs; on CPUs it trains each process alone)."""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .common import is_cuda, tensors_in

# What CudaRedirect rewrites, besides any call with a `device` argument. A
# tuple: `in` compares by identity first, and needs no hashable `func`.
_REDIRECTED = (
    torch.Tensor.cuda,
    torch.Tensor.to,
    torch.Tensor.pin_memory,
    torch.Tensor.is_pinned,
)


DEFAULT_CAPABILITY = (9, 0)
_CUDA_DTYPES = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


class CudaRedirect(TorchFunctionMode):
    """The script asks for `cuda`; it gets the CPU, and the tracker learns that
    the result lives on the GPU."""

    def __init__(self, tracker, gpu_visible: bool = True):
        super().__init__()
        self.tracker = tracker
        self.gpu_visible = gpu_visible
        # Without a GPU to show (--device cpu): the user's lines that put something on "cuda".
        self.kept_on_cpu: dict[tuple[str, int] | None, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in _REDIRECTED and not (kwargs and "device" in kwargs):
            # Every torch call and tensor attribute read comes through here.
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        wants_device = False
        if "device" in kwargs and is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
            wants_device = True
        if func is torch.Tensor.cuda:
            func, args, kwargs = (
                torch.Tensor.to,
                (args[0], "cpu"),
                {"non_blocking": kwargs.get("non_blocking", False)},
            )
            wants_device = True
        elif (
            func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], (torch.Tensor, torch.dtype))
        ):
            if is_cuda(args[1]):
                args = (args[0], "cpu", *args[2:])
                wants_device = True
        elif func is torch.Tensor.pin_memory:
            return args[0]
        elif func is torch.Tensor.is_pinned:
            return False
        if not wants_device:
            return func(*args, **kwargs)
        if not self.gpu_visible:
            where = self.tracker.context.user_line()
            self.kept_on_cpu[where] = self.kept_on_cpu.get(where, 0) + 1
        self.tracker.device_scope += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.tracker.device_scope -= 1
        for tensor in tensors_in(out):
            self.tracker.mark_device(tensor, f"{getattr(func, '__name__', 'to')}(cuda)")
        return out


class CudaEvent:
    """torch.cuda.Event for timing code: records nothing, measures 0 ms."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class CudaStream:
    """torch.cuda.Stream (timm's prefetching loader copies batches on a side stream): the trace
    runs in program order, so waiting and recording do nothing. What a real side stream adds,
    memory freed only once the other stream's work is done (`record_stream`), is not modelled."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device("cuda", 0)
        self.priority = priority
        self.cuda_stream = 0

    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        event = event if event is not None else CudaEvent()
        event.record(self)
        return event

    def query(self):
        return True

    def synchronize(self):
        pass

    def is_capturing(self):
        # What optimizers ask before a step (CUDA graph capture): no graph is ever captured.
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class StreamContext:
    """`with torch.cuda.stream(s):` (and `torch.cuda.StreamContext(s)`)."""

    def __init__(self, stream=None):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False


class FakeCudaProperties:
    def __init__(self, name, total_memory, capability):
        self.name = name
        self.total_memory = total_memory
        self.major, self.minor = capability
        self.multi_processor_count = 132


def fake_apply(self, fn, recurse=True):
    """nn.Module._apply for modules built under fake mode: torch's version
    fails to swap fake parameters ("Couldn't swap Linear.weight")."""
    if recurse:
        for module in self.children():
            module._apply(fn)
    for key, param in self._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        if applied is not param:
            new = nn.Parameter(applied, param.requires_grad)
            if param.grad is not None:
                new.grad = fn(param.grad)
            self._parameters[key] = new
    for key, buffer in self._buffers.items():
        if buffer is not None:
            self._buffers[key] = fn(buffer)
    return self


def install_accelerator(shims, gpu_memory: int, default_stream: CudaStream) -> None:
    """torch.accelerator (torch 2.6+), which pytorch/examples ask for their device: CUDA, as
    torch.cuda says."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return
    answers = {
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device_index": lambda: 0,
        "current_device_idx": lambda: 0,
        "set_device_index": lambda device: None,
        "set_device_idx": lambda device: None,
        "device_index": StreamContext,
        "current_stream": lambda device=None: default_stream,
        "set_stream": lambda stream: None,
        "synchronize": lambda device=None: None,
        "get_device_capability": lambda device=None: {"supported_dtypes": _CUDA_DTYPES},
        "empty_cache": lambda: None,
        "empty_host_cache": lambda: None,
        "memory_stats": lambda device_index=None: {},
        "memory_allocated": lambda device_index=None: 0,
        "max_memory_allocated": lambda device_index=None: 0,
        "memory_reserved": lambda device_index=None: 0,
        "max_memory_reserved": lambda device_index=None: 0,
        "reset_accumulated_memory_stats": lambda device_index=None: None,
        "reset_peak_memory_stats": lambda device_index=None: None,
        "get_memory_info": lambda device_index=None: (gpu_memory, gpu_memory),
    }
    for name, answer in answers.items():
        if hasattr(accelerator, name):
            shims.patch(accelerator, name, answer)


def gpu_visible(request: dict) -> bool:
    """Whether the script is shown a GPU (see the module's docstring)."""
    return request.get("device", "cuda") == "cuda" or bool(request.get("distributed"))


def install(shims, request: dict, state: dict) -> None:
    """torch.cuda: the script takes its GPU path under `--device cuda`, its CPU path under
    `--device cpu`; in both, what it does to a GPU it never asked about runs on the CPU."""
    gpu_memory = request.get("gpu_memory") or 80 * 2**30
    cuda = torch.cuda
    # What a script that hard-codes its GPU calls whatever it was told: harmless on the CPU.
    shims.patch(cuda, "set_device", lambda device: None)
    shims.patch(cuda, "synchronize", lambda device=None: None)
    shims.patch(cuda, "empty_cache", lambda: None)
    shims.patch(cuda, "manual_seed", lambda seed: None)
    shims.patch(cuda, "manual_seed_all", lambda seed: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        shims.patch(cuda, name, lambda device=None: 0)
    for name in ("reset_peak_memory_stats", "reset_max_memory_allocated"):
        shims.patch(cuda, name, lambda device=None: None)
    shims.patch(cuda, "set_per_process_memory_fraction", lambda fraction, device=None: None)
    shims.patch(cuda, "memory_summary", lambda *a, **k: "")
    shims.patch(cuda, "Event", CudaEvent)
    default_stream = CudaStream()
    shims.patch(cuda, "Stream", CudaStream)
    shims.patch(cuda, "StreamContext", StreamContext)
    shims.patch(cuda, "stream", StreamContext)
    shims.patch(cuda, "current_stream", lambda device=None: default_stream)
    shims.patch(cuda, "default_stream", lambda device=None: default_stream)
    shims.patch(cuda, "set_stream", lambda stream: None)
    shims.patch(torch.Tensor, "record_stream", lambda self, stream: None)
    # Module.cuda()/to("cuda") reach Tensor.to through CudaRedirect; under
    # fake mode parameters must be re-registered rather than swapped.
    if state.get("fake_mode") is not None:
        shims.patch(nn.Module, "_apply", fake_apply)
    if gpu_visible(request):
        _install_visible_gpu(shims, request, state, gpu_memory, default_stream)
    else:
        _install_no_gpu(shims)


def _install_no_gpu(shims) -> None:
    """What a CPU-only build of torch answers, on any build: autocast("cuda") and
    GradScaler("cuda") ask torch.cuda.is_available() and disable themselves."""
    shims.patch(torch.cuda, "is_available", lambda: False)
    shims.patch(torch.cuda, "device_count", lambda: 0)
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        shims.patch(accelerator, "current_accelerator", lambda check_available=False: None)
        shims.patch(accelerator, "is_available", lambda: False)
        shims.patch(accelerator, "device_count", lambda: 0)


def _install_visible_gpu(shims, request: dict, state: dict, gpu_memory: int, default_stream) -> None:
    """torch.cuda and torch.accelerator answer as the target GPU would."""
    gpu_name = request.get("gpu_name") or "oom-lsp estimated GPU"
    # The target's compute capability (the GPU catalogue's); a target without one (a size, not
    # a model) answers as a current datacenter GPU.
    capability = tuple(request.get("gpu_capability") or DEFAULT_CAPABILITY)

    def is_bf16_supported(including_emulation=True):
        # As torch answers on that GPU: natively from sm 8.0 on; below, True through emulation
        # (torch creates a bf16 tensor to check) unless the script asks without emulation.
        if capability >= (8, 0):
            return True
        if including_emulation:
            state["bf16_emulated"] = True
        return bool(including_emulation)

    cuda = torch.cuda
    shims.patch(cuda, "is_available", lambda: True)
    shims.patch(cuda, "device_count", lambda: 1)
    shims.patch(cuda, "current_device", lambda: 0)
    shims.patch(cuda, "get_device_name", lambda device=None: gpu_name)
    shims.patch(cuda, "get_device_capability", lambda device=None: capability)
    shims.patch(
        cuda,
        "get_device_properties",
        lambda device=None: FakeCudaProperties(gpu_name, gpu_memory, capability),
    )
    shims.patch(cuda, "is_bf16_supported", is_bf16_supported)
    shims.patch(cuda, "mem_get_info", lambda device=None: (gpu_memory, gpu_memory))
    # What a CUDA build has and libraries read once torch.cuda.is_available() is True
    # (bitsandbytes' CUDA backend, which `import peft` loads, reads the raw stream at import).
    shims.patch(torch._C, "_cuda_getCurrentRawStream", lambda device=None: 0)
    install_accelerator(shims, gpu_memory, default_stream)

    # autocast("cuda", dtype) -> autocast("cpu", same dtype); CUDA's default is fp16.
    autocast_cls = torch.amp.autocast_mode.autocast
    original_autocast_init = autocast_cls.__init__

    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            dtype = dtype or torch.float16
            device_type = "cpu"
            if enabled:
                state["autocast_regions"] = state.get("autocast_regions", 0) + 1
                state.setdefault("autocast_dtypes", set()).add(str(dtype).replace("torch.", ""))
        original_autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    shims.patch(autocast_cls, "__init__", autocast_init)
    _install_cuda_autocast_policy(shims, state)
    scaler_cls = torch.amp.GradScaler
    original_scaler_init = scaler_cls.__init__

    def scaler_init(self, device="cuda", *args, **kwargs):
        original_scaler_init(self, "cpu" if is_cuda(device) else device, *args, **kwargs)

    shims.patch(scaler_cls, "__init__", scaler_init)
    if hasattr(torch.cuda.amp, "GradScaler"):
        shims.patch(
            torch.cuda.amp.GradScaler, "__init__", lambda self, *a, **k: scaler_init(self, "cpu", *a, **k)
        )


# CUDA's autocast runs these in float32 (autocast_mode.cpp: the fp32 list, and the ops that take a
# dtype, run with dtype=float32), CPU's autocast leaves them in the low precision: a softmax of fp16
# attention scores keeps fp32 probabilities on a GPU, twice what the CPU trace would keep.
_CUDA_AUTOCAST_FP32 = (
    "layer_norm", "native_layer_norm", "group_norm", "exp", "log", "log10", "log2", "log1p", "expm1",
    "rsqrt", "reciprocal", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "logsumexp", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "cosine_similarity", "dist", "pdist",
    "renorm", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d",
    "upsample_linear1d", "upsample_trilinear3d", "upsample_bicubic2d",
)
_CUDA_AUTOCAST_FP32_DTYPE = ("softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "cumprod", "prod")
# And these in the low precision (autocast_mode.cpp's lower_precision_fp list for CUDA) where CPU's
# autocast has no kernel, so the trace ran them in float32: an elementwise `einsum` (an RMSNorm's
# weight times x, which decomposes to no matmul) keeps fp32 tensors for backward where the GPU keeps
# bf16 ones; `mv`, `addmv`, `addr`, the RNN cells.
_CUDA_AUTOCAST_LOW = (
    "einsum", "mv", "addmv", "addr", "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
)
_LOW = (torch.float16, torch.bfloat16)


def _install_cuda_autocast_policy(shims, state: dict) -> None:
    """The CPU autocast that stands for CUDA's (`autocast("cuda")` traced as `autocast("cpu")`) runs
    the ops above as CUDA's does: Python kernels at the AutocastCPU key, for the ops that have a CUDA
    autocast kernel and no CPU one; removed after the run."""
    library = torch.library.Library("aten", "IMPL")
    autocast_cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    # CUDA autocast casts a leaf that requires grad (a weight) once per autocast region and reuses
    # the copy (cached_cast); so does this, until autocast's exit clears its own cache.
    casts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    clear_autocast_cache = torch.clear_autocast_cache

    def clear_both() -> None:
        casts.clear()
        clear_autocast_cache()

    shims.patch(torch, "clear_autocast_cache", clear_both)

    def to_low(value, dtype):
        if isinstance(value, (list, tuple)):
            return type(value)(to_low(item, dtype) for item in value)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        if value.dtype in (dtype, torch.float64):
            return value
        if value.is_leaf and value.requires_grad and torch.is_autocast_cache_enabled():
            cached = casts.get(id(value))
            if cached is not None and cached[0] is value:
                return cached[1]
            cast = value.to(dtype)
            casts[id(value)] = (value, cast)
            return cast
        return value.to(dtype)

    def register_low(name: str) -> None:
        op = _autocast_op(name)
        if op is None:
            return

        def kernel(*args, **kwargs):
            dtype = torch.get_autocast_dtype("cpu")
            with torch._C._ExcludeDispatchKeyGuard(autocast_cpu):
                state["cuda_autocast_low"] = state.get("cuda_autocast_low", 0) + 1
                return op(*to_low(args, dtype), **{key: to_low(value, dtype) for key, value in kwargs.items()})

        library.impl(name, kernel, "AutocastCPU")

    def register(name: str, set_dtype: bool) -> None:
        op = _autocast_op(name)
        if op is None:
            return

        def kernel(*args, **kwargs):
            low = any(isinstance(a, torch.Tensor) and a.dtype in _LOW for a in args)
            with torch._C._ExcludeDispatchKeyGuard(autocast_cpu):
                if not low:
                    return op(*args, **kwargs)
                state["cuda_autocast_fp32"] = state.get("cuda_autocast_fp32", 0) + 1
                if set_dtype:
                    if kwargs.get("dtype") is None and not (len(args) > 2 and args[-1] is not None and
                                                            isinstance(args[-1], torch.dtype)):
                        kwargs["dtype"] = torch.float32
                    return op(*args, **kwargs)
                cast = tuple(
                    a.float() if isinstance(a, torch.Tensor) and a.dtype in _LOW else a for a in args
                )
                return op(*cast, **kwargs)

        library.impl(name, kernel, "AutocastCPU")

    for name in _CUDA_AUTOCAST_FP32:
        register(name, set_dtype=False)
    for name in _CUDA_AUTOCAST_FP32_DTYPE:
        register(name, set_dtype=True)
    for name in _CUDA_AUTOCAST_LOW:
        register_low(name)
    shims.at_undo(library._destroy)


def _autocast_op(name: str):
    """The aten op `name` when CUDA's autocast has a kernel for it and CPU's has none; else None."""
    qualified = "aten::" + name
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "AutocastCUDA"):
        return None
    if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "AutocastCPU"):
        return None
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")
