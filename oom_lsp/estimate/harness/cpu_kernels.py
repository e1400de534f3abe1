"""What CPU kernels allocate and free inside themselves, below the dispatcher,
where no tracker sees it: measured on the real kernel (run on zeros under the
profiler) and added to the fake trace."""

from __future__ import annotations

import math

import torch

from .common import aten

CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)

# Probes of real kernels, kept for the interpreter's life: a kernel's scratch
# or workspace depends on its configuration (and thread count), not on the run,
# and a batch-size search traces the same script several times.
_CONV_SCRATCH_PROBES: dict[tuple, tuple[int, ...]] = {}  # (at 2, at 4), or (at the real batch,)
_RNN_WORKSPACE_PROBES: dict[tuple, int] = {}
_RNN_BACKWARD_PROBES: dict[tuple, int] = {}


def make_conv_scratch(notes: dict):
    """oneDNN's convolution scratch (reordered copies of the input, output,
    gradients), allocated and freed inside the kernel, so no dispatcher-level
    tracker sees it. Measured on the real kernel: each distinct convolution is
    run on zeros at batch sizes 2 and 4 under the profiler (after a warm-up
    call: the first call caches weight layouts), and the transient bytes above
    the outputs are extrapolated linearly in the batch size; at the script's own
    batch instead when that probe is small (REAL_BATCH_PROBE_LIMIT)."""
    cache = _CONV_SCRATCH_PROBES
    used: set[tuple] = set()

    def zeros_like_args(args, batch, batch_positions):
        return [
            torch.zeros(_probe_shape(a, index, batch, batch_positions), dtype=a.dtype)
            if isinstance(a, torch.Tensor)
            else a
            for index, a in enumerate(args)
        ]

    def measure(func, args, batch, batch_positions):
        from torch.profiler import ProfilerActivity, profile

        real_args = zeros_like_args(args, batch, batch_positions)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            outputs = func(*real_args)
        del outputs
        peak, current = replay_allocations(prof)
        return peak - max(current, 0)

    def probe(tracker, func, args, batches, batch_positions) -> tuple[int, ...]:
        """The scratch at each of `batches`, after a warm-up call at the first."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        tracker.paused += 1
        try:
            with unset_fake_temporarily(), torch.no_grad():
                func(*zeros_like_args(args, batches[0], batch_positions))
                return tuple(measure(func, args, batch, batch_positions) for batch in batches)
        finally:
            tracker.paused -= 1

    def scratch(tracker, func, args):
        batch_positions = (0,) if func is aten.convolution.default else (0, 1)
        batch = args[0].shape[0]
        key = (
            func,
            tuple(tuple(a.shape[1:]) if isinstance(a, torch.Tensor) else a for a in args[:2]),
            tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else str(a) for a in args[2:]),
            args[0].dtype,
            torch.get_num_threads(),
        )
        if batch > 4 and _probe_bytes(args, batch, batch_positions) <= REAL_BATCH_PROBE_LIMIT:
            # oneDNN picks its algorithm by the batch too (a 512->256 7x7 convolution's backward
            # keeps 24.5 MiB of scratch at batch 2 to 8 and 36.75 MiB at 16): at the real batch
            # when the probe is small enough, the extrapolation only above that.
            exact = (*key, batch)
            if exact not in cache:
                cache[exact] = probe(tracker, func, args, (batch,), batch_positions)
            (size,) = cache[exact]
        else:
            if key not in cache:
                cache[key] = probe(tracker, func, args, (2, 4), batch_positions)
            at_2, at_4 = cache[key]
            size = max(0, int(at_2 + (at_4 - at_2) / 2 * (batch - 2)))
        used.add(key)
        notes["probes"] = len(used)
        notes["bytes"] = max(notes.get("bytes", 0), size)
        return size

    return scratch


# A convolution is probed at the script's own batch when its tensors at that batch (input, output
# or its gradient, weight) take at most this much; above, its scratch is extrapolated from 2 and 4.
REAL_BATCH_PROBE_LIMIT = 128 << 20


def _probe_shape(tensor: torch.Tensor, index: int, batch: int, batch_positions: tuple[int, ...]) -> tuple:
    """A convolution argument's shape in a probe at `batch` (the batch dimension of the input
    and, for the backward, of the output gradient)."""
    return (batch, *tensor.shape[1:]) if index in batch_positions else tuple(tensor.shape)


def _probe_bytes(args, batch: int, batch_positions: tuple[int, ...]) -> int:
    return sum(
        math.prod(_probe_shape(a, index, batch, batch_positions)) * a.element_size()
        for index, a in enumerate(args)
        if isinstance(a, torch.Tensor)
    )


def _probed_along_the_sequence(tracker, cache: dict, key: tuple, notes: dict, probe, args, seq_dim: int,
                               seq: int) -> int:
    """An LSTM kernel's memory, probed once per configuration on real zeros (with autograd on:
    the workspace exists only when it will be needed) at the real sequence length up to 32
    steps, else at 16 and 32 steps and extrapolated (it grows by a page-rounded size per step,
    so shorter probes under-estimate the slope); noted as the largest and the calls."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if key not in cache:
        tracker.paused += 1  # the probe's real tensors are not the script's
        try:
            with unset_fake_temporarily(), torch.enable_grad():
                if seq <= 32:
                    cache[key] = probe(args, seq_dim, seq)
                else:
                    at_16, at_32 = probe(args, seq_dim, 16), probe(args, seq_dim, 32)
                    cache[key] = max(0, at_32 + (at_32 - at_16) * (seq - 32) // 16)
        finally:
            tracker.paused -= 1
    notes["bytes"] = max(notes.get("bytes", 0), cache[key])
    notes["calls"] = notes.get("calls", 0) + 1
    return cache[key]


def make_onednn_rnn_workspace(notes: dict):
    """oneDNN's LSTM workspace, which the meta kernel reports as 0 bytes: the
    real oneDNN LSTM layer is run on zeros, at the real sequence length up to
    32 steps, else at 16 and 32 steps and extrapolated (the workspace grows by
    a page-rounded size per step, so short probes under-estimate the slope)."""
    cache = _RNN_WORKSPACE_PROBES

    def probe(args, seq_dim, length):
        shape = list(args[0].shape)
        shape[seq_dim] = length
        real_args = [
            torch.zeros(shape, dtype=a.dtype, requires_grad=True)
            if index == 0
            else torch.zeros(a.shape, dtype=a.dtype, requires_grad=a.dtype.is_floating_point)
            if isinstance(a, torch.Tensor)
            else a
            for index, a in enumerate(args)
        ]
        return aten.mkldnn_rnn_layer.default(*real_args)[3].untyped_storage().nbytes()

    def onednn(tracker, args, outputs):
        seq_dim = 1 if args[14] else 0  # batch_first
        seq = args[0].shape[seq_dim]
        key = (
            tuple(args[0].shape),
            tuple(outputs[1].shape),
            args[0].dtype,
            tuple(str(a) for a in args[7:]),
            torch.get_num_threads(),
        )
        return _probed_along_the_sequence(tracker, cache, key, notes, probe, args, seq_dim, seq)

    return onednn


def make_onednn_rnn_backward_scratch(notes: dict):
    """oneDNN's LSTM backward scratch (the gates' gradients and reordered weights, allocated and
    freed inside `mkldnn_rnn_layer_backward`, 44 MiB for a 2x256 LSTM at batch 50 x 200 steps),
    which no dispatcher-level tracker sees. Measured as the workspace is: the real layer run
    forward and backward on zeros, at the real sequence length up to 32 steps, else at 16 and 32
    steps and extrapolated (the scratch grows linearly with the steps); the transient bytes
    above the backward's outputs, under the profiler."""
    cache = _RNN_BACKWARD_PROBES

    def probe(args, seq_dim, length):
        from torch.profiler import ProfilerActivity, profile

        source, weights, hx, cx = args[0], args[1:5], args[5], args[6]
        reverse, mode, hidden, layers, biases, train, bidirectional, batch_sizes, batch_first = args[13:22]
        shape = list(source.shape)
        shape[seq_dim] = length
        x = torch.zeros(shape, dtype=source.dtype, requires_grad=True)
        real_weights = [torch.zeros(w.shape, dtype=w.dtype, requires_grad=True) for w in weights]
        h0, c0 = torch.zeros(hx.shape, dtype=hx.dtype), torch.zeros(cx.shape, dtype=cx.dtype)
        out, hy, cy, workspace = aten.mkldnn_rnn_layer.default(
            x, *real_weights, h0, c0, reverse, batch_sizes, mode, hidden, layers, biases, bidirectional,
            batch_first, train,
        )
        grads = [None if given is None else torch.zeros_like(made) for given, made in zip(args[10:13], (out, hy, cy))]
        call = (x, *real_weights, h0, c0, out, hy, cy, *grads, reverse, mode, hidden, layers, biases, train,
                bidirectional, batch_sizes, batch_first, workspace)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = aten.mkldnn_rnn_layer_backward.default(*call)
        kept = sum(t.untyped_storage().nbytes() for t in result if isinstance(t, torch.Tensor))
        del result
        peak, _ = replay_allocations(prof)
        return max(0, peak - kept)

    def scratch(tracker, args):
        seq_dim = 1 if args[21] else 0  # batch_first
        seq = args[0].shape[seq_dim]
        key = (
            tuple(args[0].shape),
            tuple(tuple(w.shape) for w in args[1:5]),
            args[0].dtype,
            tuple(given is None for given in args[10:13]),
            tuple(str(a) for a in args[13:22]),
            torch.get_num_threads(),
        )
        return _probed_along_the_sequence(tracker, cache, key, notes, probe, args, seq_dim, seq)

    return scratch


MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
# Below this many multiply-adds per matrix, the CPU's bmm loops in place (no BLAS, no copy).
_BMM_NAIVE_SIZE = 400


def _blas_readable(size: tuple, stride: tuple) -> bool:
    """Whether BLAS reads a matrix in place: row-major or column-major, its leading dimension no
    shorter than a row (a column). Anything else (a stride-0 broadcast, a column slice) is
    copied to a contiguous matrix inside the kernel (addmm_impl_cpu_, and cuBLAS's
    prepare_matrix_for_cublas alike)."""
    rows, cols = size
    return (stride[1] == 1 and stride[0] >= max(1, cols)) or (stride[0] == 1 and stride[1] >= max(1, rows))


def make_matmul_copies(notes: dict, add: bool):
    """The copies a matrix product makes of operands BLAS cannot read in place: `mm`/`addmm` copy
    the whole operand (the expanded gradient of `(x @ w).sum()`, 8 MiB in a case measured at
    19 % of the peak), `bmm`/`baddbmm` one matrix of the batch at a time, each freed before the
    kernel returns. Measured on the CPU kernels (tests/estimate/test_kernel_internals.py) for
    float32 and float64 at "highest" matmul precision; other dtypes go through oneDNN, whose own
    scratch this does not model. The same copies are in cuBLAS's path, but unmeasured on a GPU:
    with `add` false they are counted in `notes` and not added."""

    def copies(func, args) -> int:
        operands = args[1:3] if func in (aten.addmm.default, aten.baddbmm.default) else args[:2]
        dtype = operands[0].dtype
        if dtype not in (torch.float32, torch.float64) or (
            dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest"
        ):
            return 0
        batched = func in (aten.bmm.default, aten.baddbmm.default)
        if batched:
            rows, inner, cols = operands[0].shape[1], operands[0].shape[2], operands[1].shape[2]
            if rows * inner * cols < _BMM_NAIVE_SIZE:
                return 0
        size = 0
        for operand in operands:
            if operand.layout != torch.strided:
                continue  # a sparse operand goes to the sparse kernels, not to BLAS
            matrix_size, matrix_stride = tuple(operand.shape[-2:]), operand.stride()[-2:]
            if operand.numel() and not _blas_readable(matrix_size, matrix_stride):
                size += matrix_size[0] * matrix_size[1] * operand.element_size()
        if size:
            notes["calls"] = notes.get("calls", 0) + 1
            notes["bytes"] = max(notes.get("bytes", 0), size)
        return size if add else 0

    return copies


def make_cublas_copies(notes: dict):
    """The copies cuBLAS's callers make (PyTorch's Blas.cpp, `prepare_matrix_for_cublas` and
    `prepare_batch_matrix_for_cublas`): an operand that is neither row- nor column-major (the
    stride-0 gradient of `.sum()`, a column slice, a broadcast row) is made contiguous through the
    caching allocator before the call, whatever its dtype, and a batched operand as a whole (not
    one matrix at a time, as the CPU kernel does), and freed after it: a transient at that op,
    counted by `max_memory_allocated`. Read from PyTorch's source, not measured on a GPU."""

    def copies(func, args) -> int:
        operands = args[1:3] if func in (aten.addmm.default, aten.baddbmm.default) else args[:2]
        if not operands[0].dtype.is_floating_point:
            return 0
        size = 0
        for operand in operands:
            if operand.layout != torch.strided:
                continue  # a sparse operand goes to cuSPARSE, not through these copies
            if operand.numel() and not _blas_readable(tuple(operand.shape[-2:]), operand.stride()[-2:]):
                size += operand.numel() * operand.element_size()
        if size:
            notes["calls"] = notes.get("calls", 0) + 1
            notes["bytes"] = max(notes.get("bytes", 0), size)
        return size

    return copies


# Losses whose kernel computes the elementwise loss at the inputs' broadcast shape and reduces it
# into that buffer (Loss.cpp): the 0-dim loss keeps the whole buffer as its storage, alive as long
# as the loss is (a loss kept for logging, Lightning's closure result, a `loss` bound until the next
# step's replaces it), and some allocate a second such buffer while they run. l1, huber, BCE with
# logits, KL and cross entropy reduce into a fresh 0-dim tensor (or decompose above the dispatcher).
LOSS_BUFFERS = (
    aten.mse_loss.default,
    aten.smooth_l1_loss.default,
    aten.soft_margin_loss.default,
    aten.binary_cross_entropy.default,
)
_LOSS_PROBE_ELEMENTS = 4096
_LOSS_PROBES: dict[tuple, tuple[float, float]] = {}


def make_loss_buffers(notes: dict, add: bool):
    """What a reduced loss holds beyond its one element, and what it allocates and frees while it
    runs, per element of the inputs' broadcast shape: measured once per loss, dtype and reduction
    on the real CPU kernel (on 4096 and 8192 zeros under the profiler) and scaled. The CUDA kernels share
    Loss.cpp, unmeasured on a GPU: with `add` false they are counted in `notes` and not added.
    Returns (bytes kept with the loss's storage, bytes transient inside the kernel)."""

    def measure(func, dtype, reduction, elements) -> tuple[int, int]:
        from torch.profiler import ProfilerActivity, profile

        inputs, targets = torch.zeros(elements, dtype=dtype), torch.zeros(elements, dtype=dtype)
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = func(inputs, targets, reduction=reduction)
        # What is kept is the loss's storage: the whole buffer, or its one element.
        peak, kept = replay_allocations(prof)
        del loss
        return kept, peak - kept

    def probe(func, dtype, reduction) -> tuple[float, float]:
        """Bytes per element, kept and transient: the slope between two sizes (a kernel's
        few bytes of bookkeeping do not scale with the input)."""
        key = (func, dtype, reduction, torch.get_num_threads())
        if key not in _LOSS_PROBES:
            small = measure(func, dtype, reduction, _LOSS_PROBE_ELEMENTS)
            large = measure(func, dtype, reduction, 2 * _LOSS_PROBE_ELEMENTS)
            _LOSS_PROBES[key] = tuple((b - a) / _LOSS_PROBE_ELEMENTS for a, b in zip(small, large))
        return _LOSS_PROBES[key]

    def buffers(tracker, func, args, kwargs, out) -> tuple[int, int]:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        names = [argument.name for argument in func._schema.arguments]
        position = names.index("reduction")
        reduction = args[position] if len(args) > position else kwargs.get("reduction", 1)
        if reduction == 0 or out.dim() != 0:  # Reduction::None: the elementwise loss is the output
            return 0, 0
        tracker.paused += 1
        try:
            with unset_fake_temporarily():
                kept_per_element, transient_per_element = probe(func, out.dtype, reduction)
        finally:
            tracker.paused -= 1
        elements = torch.broadcast_shapes(args[0].shape, args[1].shape).numel()
        kept = max(0, int(kept_per_element * elements) - out.untyped_storage().nbytes())
        transient = int(transient_per_element * elements)
        if kept or transient:
            notes["calls"] = notes.get("calls", 0) + 1
            notes["bytes"] = max(notes.get("bytes", 0), kept)
            notes["transient"] = max(notes.get("transient", 0), transient)
        return (kept, transient) if add else (0, 0)

    return buffers


def replay_allocations(prof) -> tuple[int, int]:
    """(peak, final) of the running sum of the profiler's allocation events
    in time order: every c10 CPU allocation, kernel scratch included."""
    events = sorted(
        (event.start_ns(), index, event.nbytes())
        for index, event in enumerate(prof.profiler.kineto_results.events())
        if event.name() == "[memory]"
    )
    current = peak = 0
    for _, _, size in events:
        current += size
        peak = max(peak, current)
    return peak, current


def profile_replay_peak(prof) -> int:
    """Peak of the running sum of the profiler's allocation events."""
    return replay_allocations(prof)[0]
