"""From a trace to a prediction: what the harness measured, the terms it needs (its own notes;
on CUDA the kernels' choices, the cuBLAS workspaces, the caching allocator's segments and the
context; the distributed engines'), the verdict for the target GPU, and the worst case of the
data. Each part has a name: `trace_notes`, `cuda_terms`, `distributed.terms`, `_assemble`,
`_worst_case`, `_set_verdict`. Pure: no subprocess, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from oom_lsp.estimate import distributed
from oom_lsp.estimate.allocator import simulate
from oom_lsp.estimate.calibration import context_term, workspace_term
from oom_lsp.estimate.cuda_terms import verdict_basis
from oom_lsp.estimate.failures import value_notes
from oom_lsp.estimate.results import (
    Breakdown,
    Category,
    Correction,
    GpuTarget,
    PeakAt,
    Prediction,
    Trace,
    Verdict,
    WorstCase,
)
from oom_lsp.units import format_bytes

if TYPE_CHECKING:
    from oom_lsp.estimate.estimator import EstimateOptions

# The share of the GPU kept free: "tight" above it, and the largest batch stays under it.
DEFAULT_MARGIN = 0.10


def verdict(required: int, capacity: int, margin: float = DEFAULT_MARGIN) -> Verdict:
    if required > capacity:
        return Verdict.OOM
    if required > capacity * (1 - margin):
        return Verdict.TIGHT
    return Verdict.FITS


def needed_bytes(prediction: Prediction) -> int:
    """What must stay under the margin, and what the verdict judges (Prediction.needed_bytes)."""
    return prediction.needed_bytes


def predict(trace: Trace, options: EstimateOptions) -> Prediction:
    """The prediction for one harness run (see docs/estimate.md for the fields): what the trace
    measured, the terms it needs (its own notes; on CUDA the kernels' and the allocator's; the
    distributed engines'), the verdict for the target, and the worst case of the data."""
    cuda = options.device == "cuda"
    breakdown = Breakdown(dict(trace.breakdown.sizes))
    corrections = trace_notes(trace, options)
    allocated, reserved, context = trace.peak_bytes, None, None
    if cuda:
        terms = cuda_terms(trace, options)
        corrections = [TRACED_ON_CPU, *corrections, *terms.notes]
        if terms.workspace_bytes:
            breakdown[Category.WORKSPACES] = terms.workspace_bytes
        allocated += terms.workspace_bytes
        reserved, context = terms.reserved_bytes, terms.context_bytes
    if trace.distributed:
        notes, reserved_extra, outside_allocator = distributed.terms(trace, cuda, options.script)
        corrections += notes
        if reserved is not None:
            reserved += reserved_extra
        if context is not None:
            context += outside_allocator
    prediction = _assemble(trace, options, allocated, breakdown, reserved, context, corrections)
    if options.gpu is not None:
        _set_verdict(prediction, options.gpu.memory, options.margin)
    worst = trace.worst_case
    if worst is not None and worst.reached_two_steps:
        prediction.worst_case = _worst_case(worst, options)
    return prediction


def trace_notes(trace: Trace, options: EstimateOptions) -> list[Correction]:
    """What the trace itself says needs saying: how it was traced (autocast, --dtype, compile),
    memory the kernels hold that it measured or modelled (cuDNN/oneDNN, operand copies, loss
    buffers), and what the data did (padded batches, the draws, values only a real run knows)."""
    cuda = options.device == "cuda"
    notes: list[Correction] = []
    if trace.autocast_regions:
        dtypes = "/".join(trace.autocast_dtypes or ["float16"])
        notes.append(
            Correction(
                "autocast",
                f'autocast("cuda", {dtypes}) traced as autocast("cpu", {dtypes}), whose weight-cast cache '
                "works as CUDA's (one low-precision copy per weight per autocast region)",
            )
        )
    if trace.script_autocast:
        notes.append(
            Correction(
                "dtype", f"--dtype {trace.script_autocast}: the whole script traced under torch.autocast"
            )
        )
    if trace.compiled:
        notes.append(
            Correction(
                "torch-compile",
                "torch.compile traced eagerly: compiled (fused) kernels keep fewer intermediates, "
                "so the real peak may be lower",
            )
        )
    notes += _kernel_notes(trace, cuda)
    if trace.batch_padded:
        got, wanted = trace.batch_padded
        notes.append(
            Correction(
                "batch-shaped",
                f"the dataset gave batches of {got}; the inputs were shaped as batches of {wanted}",
            )
        )
    if trace.bf16_emulated:
        gpu = options.gpu
        arch = gpu.arch if gpu else None
        target = f"{gpu.name} (sm {arch[0]}.{arch[1]})" if gpu and arch else "the target"
        notes.append(
            Correction(
                "bf16-emulated",
                f"{target} has no native bf16: torch.cuda.is_bf16_supported() answered True, as torch does "
                "there (it emulates bf16), so the script's bf16 path was traced",
            )
        )
    notes += _data_notes(trace, cuda)
    return notes


def _kernel_notes(trace: Trace, cuda: bool) -> list[Correction]:
    """Memory kernels hold inside themselves, invisible to a fake trace: measured on the real
    CPU kernels (added on the CPU), modelled or stated on CUDA."""
    notes = []
    rnn = trace.rnn_workspace
    if rnn.calls:
        if cuda:
            notes.append(
                Correction(
                    "cudnn-rnn-reserve",
                    f"cuDNN LSTM reserve space modelled (6 x hidden per element, not calibrated on a GPU; "
                    f"{format_bytes(rnn.bytes)} for the largest layer call); the meta kernel reports 0 bytes",
                    rnn.bytes,
                )
            )
        else:
            notes.append(
                Correction(
                    "onednn-rnn-workspace",
                    f"oneDNN LSTM workspace measured on the real kernel (at the sequence length, or at 16 "
                    f"and 32 steps and extrapolated; {format_bytes(rnn.bytes)} for the largest layer call); "
                    "the meta kernel reports 0 bytes",
                    rnn.bytes,
                )
            )
    backward = trace.rnn_backward_scratch
    if backward.calls and not cuda:
        notes.append(
            Correction(
                "onednn-rnn-backward-scratch",
                f"oneDNN LSTM backward scratch (allocated inside the kernel, invisible to the trace) measured "
                f"on the real kernel the same way (up to {format_bytes(backward.bytes)} at once)",
                backward.bytes,
            )
        )
    conv = trace.conv_scratch
    if conv.calls:
        notes.append(
            Correction(
                "onednn-conv-scratch",
                f"oneDNN convolution scratch (allocated inside the kernel, invisible to the trace) measured on "
                f"the real kernel at batch 2 and 4 for {conv.calls} distinct convolution(s) and extrapolated "
                f"(up to {format_bytes(conv.bytes)} at once)",
                conv.bytes,
            )
        )
    copies = trace.matmul_copies
    if copies.calls:
        what = (
            f"{copies.calls} matrix product(s) read an operand BLAS cannot read in place (a stride-0 "
            f"gradient, a column slice, a broadcast row), which the kernel copies and frees inside itself "
            f"(up to {format_bytes(copies.bytes)} at once)"
        )
        notes.append(
            Correction(
                "matmul-operand-copy",
                what
                + (
                    ": added at that op, as PyTorch's prepare_matrix_for_cublas copies them before cuBLAS "
                    "runs (a batched operand whole); read from PyTorch's source, not measured on a GPU"
                    if cuda
                    else ": added at that op, as measured on the CPU kernels"
                ),
                copies.bytes,
            )
        )
    losses = trace.loss_buffers
    if losses.calls:
        notes.append(
            Correction(
                "loss-buffer",
                f"{losses.calls} reduced loss(es) (MSE, smooth L1, soft margin, BCE) keep their elementwise "
                f"buffer as their storage (up to {format_bytes(losses.bytes)}) for as long as the loss lives"
                + (
                    ": the CUDA kernels share that code, not added: not checked on a GPU"
                    if cuda
                    else ": added to each loss, as measured on the CPU kernels"
                ),
                None if cuda else losses.bytes,
            )
        )
    if cuda and trace.convolutions:
        notes.append(
            Correction(
                "cudnn-conv-workspace",
                "convolutions: cuDNN's workspaces are allocated inside the kernel and not modelled; cuDNN picks "
                "an algorithm whose workspace fits the free memory, so it shrinks rather than fails",
            )
        )
    return notes


def _data_notes(trace: Trace, cuda: bool) -> list[Correction]:
    """What the data did to the trace: its draw deciding the peak, tensors put on "cuda" by a
    script that saw no GPU, random numbers not drawn for real, values only a real run knows."""
    notes = []
    spread = trace.data_spread
    if spread and len(spread.peak_bytes) > 1:
        peaks = spread.peak_bytes
        notes.append(
            Correction(
                "data-draw",
                f"the draw of the data decides the peak: {len(peaks)} draws of what the harness seeds "
                f"(the DataLoader's shuffle, random, NumPy, torch) gave {format_bytes(min(peaks))} to "
                f"{format_bytes(max(peaks))} traced (this estimate: seed {spread.seeds[0]})",
                max(peaks) - min(peaks),
            )
        )
    kept = trace.cuda_kept_on_cpu
    if kept and not cuda:
        places = ", ".join(_place(spot["file"], spot["line"]) for spot in kept[:3] if spot["file"])
        notes.append(
            Correction(
                "cuda-kept-on-cpu",
                'the script saw no GPU (--device cpu) but put tensors on "cuda" without asking'
                + (f" ({places}{', ...' if len(kept) > 3 else ''})" if places else "")
                + ': traced on the CPU, where a CPU-only torch would stop with "Torch not compiled with '
                'CUDA enabled"',
            )
        )
    if trace.draws_not_replayed:
        notes.append(
            Correction(
                "draws-not-replayed",
                f"{trace.draws_not_replayed:,} random numbers drawn before the training step (a large "
                "random initialisation) were not drawn for real: what the script draws after them (a "
                "DataLoader's shuffle) may differ from a real run's",
            )
        )
    notes += value_notes(trace)
    return notes


TRACED_ON_CPU = Correction(
    "traced-on-cpu",
    "traced on the fake CPU device (faking cuda on a CPU-only torch aborts in backward); "
    "CUDA's kernel choices applied below",
)


@dataclass
class CudaTerms:
    """What CUDA adds to a trace made on the CPU: the kernels it picks, its allocations'
    rounding, the cuBLAS workspaces (allocated), the caching allocator's segments (reserved)
    and the context (outside PyTorch's counters), each stated in `notes`."""

    notes: list[Correction]
    workspace_bytes: int
    reserved_bytes: int
    context_bytes: int


def cuda_terms(trace: Trace, options: EstimateOptions) -> CudaTerms:
    notes = []
    sdpa = trace.sdpa
    if sdpa.get("sdpa_flash") or sdpa.get("sdpa_mem_efficient"):
        notes.append(
            Correction(
                "sdpa-cuda-kernels",
                f"scaled_dot_product_attention routed to CUDA's flash ({sdpa.get('sdpa_flash', 0)} calls) / "
                f"memory-efficient ({sdpa.get('sdpa_mem_efficient', 0)} calls) kernels instead of the CPU "
                "math path",
            )
        )
    if sdpa.get("flex_attention"):
        notes.append(
            Correction(
                "flex-attention-cuda",
                f"{sdpa['flex_attention']} FlexAttention call(s) traced as its compiled CUDA kernels allocate "
                "(the output and an fp32 logsumexp kept for backward; delta and the gradients in backward): "
                "the CPU the trace runs on has no FlexAttention backward",
            )
        )
    if sdpa.get("sdpa_math_kept"):
        notes.append(
            Correction(
                "sdpa-math-kept",
                f"{sdpa['sdpa_math_kept']} attention call(s) with grouped-query heads kept on the math path "
                "(an over-estimate if CUDA picks a fused kernel)",
            )
        )
    if trace.foreach_pinned:
        notes.append(
            Correction(
                "foreach-optimizer",
                "optimizers without an explicit foreach/fused use foreach, as CUDA parameters do",
            )
        )
    notes.append(
        Correction("rounding", "every allocation rounded up to 512 B, as the CUDA caching allocator does")
    )
    workspaces = workspace_term(options, trace) if trace.matmuls else []
    events = [[-1 - index, size] for index, (_, size) in enumerate(workspaces)] + trace.events
    model = simulate(events)
    workspace_bytes = sum(size for _, size in workspaces)
    if workspaces:
        notes.append(
            Correction(
                "cublas-workspace",
                " + ".join(f"{name} {format_bytes(size)}" for name, size in workspaces)
                + " of workspace (kept from the first matmul)",
                workspace_bytes,
            )
        )
    allocated = trace.peak_bytes + workspace_bytes
    reserved = max(model.peak_reserved, allocated)
    notes.append(
        Correction(
            "allocator-segments",
            "reserved memory from a model of the caching allocator's segments (2 MiB / 20 MiB / rounded to "
            "2 MiB; not calibrated on a GPU)",
            reserved - allocated,
        )
    )
    context, detail = context_term(options, trace)
    notes.append(Correction("cuda-context", detail, context))
    return CudaTerms(notes, workspace_bytes, reserved, context)


def _with_workspace(trace: Trace, workspace: int) -> list[tuple[str, int]]:
    """The trace's top lines, the cuBLAS workspace counted at the line of the first matrix product,
    where CUDA allocates it (a real snapshot shows it there)."""
    lines = list(trace.top_lines)
    if not workspace or not trace.first_matmul_line:
        return lines
    by_place = dict(lines)
    by_place[trace.first_matmul_line] = by_place.get(trace.first_matmul_line, 0) + workspace
    return sorted(by_place.items(), key=lambda item: -item[1])[: max(len(lines), 1)]


def _assemble(
    trace: Trace,
    options: EstimateOptions,
    allocated: int,
    breakdown: Breakdown,
    reserved: int | None,
    context: int | None,
    corrections: list[Correction],
) -> Prediction:
    line = trace.peak_line
    prediction = Prediction(
        script=str(options.script),
        args=list(options.script_args),
        device=options.device,
        batch_size=trace.batch_size,
        peak_bytes=allocated,
        breakdown=breakdown,
        reserved_bytes=reserved,
        context_bytes=context,
        process_bytes=reserved + context if reserved is not None and context is not None else None,
        peak_at=PeakAt(
            op=trace.peak_op,
            module=trace.peak_module,
            phase=trace.peak_phase,
            file=line[0] if line else None,
            line=line[1] if line else None,
        ),
        top_modules=list(trace.top_modules),
        top_lines=_with_workspace(trace, breakdown[Category.WORKSPACES]),
        gpu=GpuTarget(options.gpu.name, options.gpu.memory) if options.gpu else None,
        verdict=None,
        corrections=corrections,
        steps_traced=trace.steps,
        seconds=trace.seconds,
        method="fake-tensor trace of two optimizer steps",
        torch=trace.torch,
        batch_knobs=list(trace.batch_knobs),
        data_spread=trace.data_spread,
        peak_batch=trace.peak_batch,
        batches_traced=trace.batches_traced,
    )
    if trace.distributed:
        prediction.distributed = distributed.describe(trace)
        prediction.method += f" as rank 0 of {trace.distributed['world_size']} (fake process group)"
    return prediction


def _worst_case(trace: Trace, options: EstimateOptions) -> WorstCase:
    """The run where each loader whose batches differ in shape gave, for every batch, the longest
    batch its data can produce: an upper bound over the draws, stated beside the estimate."""
    bound = predict(dataclasses.replace(trace, worst_case=None), options)
    return WorstCase(
        peak_bytes=bound.peak_bytes,
        reserved_bytes=bound.reserved_bytes,
        context_bytes=bound.context_bytes,
        process_bytes=bound.process_bytes,
        verdict=bound.verdict,
        peak_at=bound.peak_at,
        batches=list(trace.longest_batches),
    )


def _set_verdict(prediction: Prediction, capacity: int, margin: float) -> None:
    """Judged by reserved memory + the CUDA context on CUDA (the allocated peak on the CPU): "will run
    out of memory" above the card, "tight" within the margin of it; `verdict_basis` names the figure."""
    prediction.verdict_basis = verdict_basis(prediction, capacity)
    prediction.verdict = verdict(prediction.verdict_basis.bytes, capacity, margin)


def _place(file: str | None, line: int | None) -> str:
    """file:line, the file relative to the current folder when it is under it."""
    if not file:
        return "?"
    try:
        shown = str(Path(file).resolve().relative_to(Path.cwd()))
    except ValueError:
        shown = file
    return f"{shown}:{line}"
