"""The estimate's typed results: what a trace says, the prediction made from it, the search for
the largest batch, the world-size sweep and the what-if, with the categories of memory as an enum.

Every face reads these types (the CLI's text and JSON, the editor's hints, diagnostics and
tables, the budget gate); none reads a key of a dict. `to_json()` writes exactly the JSON
`oom-lsp estimate --format json` prints (its keys and their order are a public interface:
tests/estimate/test_schema.py fails when one changes), and `from_json()` reads it back (the
what-if's record, `oom-lsp validate --before`, a notebook's report named by cells).

`Trace.from_harness` is the one place where the harness's result (JSON written by the
user's interpreter, harness/runner.py) becomes a type. No torch import here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class Category(str, enum.Enum):
    """What holds the bytes: the breakdown's categories (the trace's, and on CUDA the cuBLAS
    workspaces), and what a process holds beyond them (the allocator's cache, the context)."""

    PARAMETERS = "parameters"
    UNSHARDED_PARAMETERS = "unsharded_parameters"  # FSDP2: all-gathered for a unit's forward/backward
    GRADIENTS = "gradients"
    DDP_BUCKETS = "ddp_buckets"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    ALL_GATHER_BUFFERS = "all_gather_buffers"
    REDUCE_SCATTER_BUFFERS = "reduce_scatter_buffers"
    INPUTS = "inputs"
    OTHER = "other"
    WORKSPACES = "workspaces"  # cuBLAS/cuBLASLt, kept from the first matmul
    RESERVED = "reserved"  # the caching allocator's segments beyond the allocated bytes
    CONTEXT = "context"  # the CUDA context (and NCCL's buffers): outside PyTorch's counters

    @property
    def label(self) -> str:
        """As the text output prints it: "optimizer state", "DDP buckets"."""
        return _LABELS.get(self, self.value.replace("_", " "))

    @property
    def rank(self) -> int:
        """Where it is printed: the model's states first, then the step's."""
        return list(Category).index(self)


_LABELS = {
    Category.UNSHARDED_PARAMETERS: "unsharded parameters",
    Category.DDP_BUCKETS: "DDP buckets",
    Category.ALL_GATHER_BUFFERS: "all-gather buffers",
    Category.REDUCE_SCATTER_BUFFERS: "reduce-scatter buffers",
}


class Verdict(str, enum.Enum):
    FITS = "fits"
    TIGHT = "tight"
    OOM = "will run out of memory"

    @property
    def short(self) -> str:
        """The editor's word: fits, tight, oom."""
        return "oom" if self is Verdict.OOM else self.value


def _verdict(value: str | None) -> Verdict | None:
    return Verdict(value) if value is not None else None


def _value(verdict: Verdict | None) -> str | None:
    return verdict.value if verdict is not None else None


@dataclass
class Breakdown:
    """Bytes live at the peak by category, in the order the trace reported them."""

    sizes: dict[Category, int] = field(default_factory=dict)

    def __getitem__(self, category: Category) -> int:
        return self.sizes.get(category, 0)

    def __setitem__(self, category: Category, size: int) -> None:
        self.sizes[category] = size

    def items(self) -> Iterator[tuple[Category, int]]:
        return iter(self.sizes.items())

    def total(self) -> int:
        return sum(self.sizes.values())

    def printed(self) -> list[tuple[Category, int]]:
        """The categories holding bytes, in the printed order."""
        return sorted(
            ((c, size) for c, size in self.sizes.items() if size > 0), key=lambda item: item[0].rank
        )

    def to_json(self) -> dict[str, int]:
        return {category.value: size for category, size in self.sizes.items()}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> Breakdown:
        return cls({Category(name): int(size) for name, size in data.items()})


@dataclass(frozen=True)
class Correction:
    """A term the prediction applied or states beside the trace: its name, what it is in words,
    and its bytes when they are counted."""

    name: str
    detail: str
    bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        note: dict[str, Any] = {"name": self.name, "detail": self.detail}
        if self.bytes is not None:
            note["bytes"] = self.bytes
        return note

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Correction:
        return cls(data["name"], data["detail"], data.get("bytes"))


@dataclass
class PeakAt:
    """Where the peak happened: the op, the module, the phase and the user's line (a notebook's
    report adds the cell, the line then being the cell's)."""

    op: str | None = None
    module: str | None = None
    phase: str | None = None
    file: str | None = None
    line: int | None = None
    cell: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "op": self.op,
            "module": self.module,
            "phase": self.phase,
            "file": self.file,
            "line": self.line,
        }
        if self.cell is not None:
            data["cell"] = self.cell
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PeakAt:
        return cls(
            data.get("op"),
            data.get("module"),
            data.get("phase"),
            data.get("file"),
            data.get("line"),
            data.get("cell"),
        )


@dataclass(frozen=True)
class GpuTarget:
    name: str
    memory: int

    @property
    def named(self) -> bool:
        """False for a target given by its memory alone ("GPU with 24.00 GiB")."""
        return not self.name.startswith("GPU with ")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "memory": self.memory}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> GpuTarget | None:
        return cls(data["name"], int(data["memory"])) if data else None


@dataclass
class Place:
    """A user's file and line (a loader, a batch-size knob); `cell` in a notebook's report."""

    file: str | None
    line: int | None
    cell: int | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"file": self.file, "line": self.line}
        if self.cell is not None:
            data["cell"] = self.cell
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Place:
        return cls(data.get("file"), data.get("line"), data.get("cell"))


@dataclass
class BatchKnob:
    """Where the script sets its batch size: what the editor decorates."""

    kind: str
    place: Place

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.place.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchKnob:
        return cls(data.get("kind", ""), Place.from_json(data))


@dataclass
class PeakBatch:
    """The batch the peak happened with: its step and micro-batch, the shapes of its tensors,
    its index in its loader."""

    step: int | None
    micro_batch: int | None
    index: int
    shapes: dict[str, list[int]]
    loader: Place
    worst: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "micro_batch": self.micro_batch,
            "index": self.index,
            "shapes": self.shapes,
            "loader": self.loader.to_json(),
            "worst": self.worst,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> PeakBatch | None:
        if data is None:
            return None
        return cls(
            data.get("step"),
            data.get("micro_batch"),
            data["index"],
            data["shapes"],
            Place.from_json(data["loader"]),
            bool(data.get("worst")),
        )


@dataclass
class LongestBatch:
    """The longest batch a loader whose batches differ in shape can produce (the worst case)."""

    loader: Place
    shapes: dict[str, list[int]]
    samples: int
    scanned: int
    batch_size: int
    drop_last: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "loader": self.loader.to_json(),
            "shapes": self.shapes,
            "samples": self.samples,
            "scanned": self.scanned,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LongestBatch:
        return cls(
            Place.from_json(data["loader"]),
            data["shapes"],
            data["samples"],
            data["scanned"],
            data["batch_size"],
            data["drop_last"],
        )


@dataclass
class DataSpread:
    """The peaks of the data draws the harness traced (seeds 0, 1, 2), when the draw decides it."""

    seeds: list[int]
    peak_bytes: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "peak_bytes": self.peak_bytes}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> DataSpread | None:
        return cls(list(data["seeds"]), list(data["peak_bytes"])) if data else None


@dataclass
class WorstCase:
    """The step with the longest batch each varying loader can produce, at every batch."""

    peak_bytes: int
    reserved_bytes: int | None
    context_bytes: int | None
    process_bytes: int | None
    verdict: Verdict | None
    peak_at: PeakAt
    batches: list[LongestBatch]

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "reserved_bytes": self.reserved_bytes,
            "context_bytes": self.context_bytes,
            "process_bytes": self.process_bytes,
            "verdict": _value(self.verdict),
            "peak_at": self.peak_at.to_json(),
            "batches": [batch.to_json() for batch in self.batches],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> WorstCase | None:
        if data is None:
            return None
        return cls(
            data["peak_bytes"],
            data.get("reserved_bytes"),
            data.get("context_bytes"),
            data.get("process_bytes"),
            _verdict(data.get("verdict")),
            PeakAt.from_json(data["peak_at"]),
            [LongestBatch.from_json(batch) for batch in data.get("batches") or []],
        )


@dataclass
class Launch:
    """A torchrun-style script traced as rank 0: the world, and the engines found (`ddp` holds
    each DistributedDataParallel's options as the harness read them)."""

    world_size: int
    nproc_per_node: int
    rank: int = 0
    backend: str | None = None
    engines: list[str] = field(default_factory=list)
    ddp: list[dict[str, Any]] = field(default_factory=list)
    fsdp_units: int = 0
    device_meshes: list[Any] = field(default_factory=list)
    process_groups: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "nproc_per_node": self.nproc_per_node,
            "rank": self.rank,
            "backend": self.backend,
            "engines": self.engines,
            "ddp": self.ddp,
            "fsdp_units": self.fsdp_units,
            "device_meshes": self.device_meshes,
            "process_groups": self.process_groups,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Launch | None:
        if data is None:
            return None
        return cls(
            data["world_size"],
            data["nproc_per_node"],
            data.get("rank", 0),
            data.get("backend"),
            list(data.get("engines") or []),
            list(data.get("ddp") or []),
            data.get("fsdp_units", 0),
            list(data.get("device_meshes") or []),
            list(data.get("process_groups") or []),
        )


@dataclass
class Fallback:
    """Why the script was measured by real CPU steps (it could not run on fake tensors), and
    what that leaves uncertain."""

    reason: str
    uncertainty: str

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "uncertainty": self.uncertainty}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Fallback | None:
        return cls(data["reason"], data["uncertainty"]) if data else None


@dataclass
class VerdictBasis:
    """The figure the verdict judged by: on CUDA the modelled reserved memory plus the CUDA context
    (what the process holds, as nvidia-smi shows it), on the CPU the allocated peak; beside it the
    capacity and the allocated peak with the context, for comparison (estimate/cuda_terms.py)."""

    figure: str  # "reserved + CUDA context" or "allocated"
    bytes: int
    capacity_bytes: int
    allocated_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "bytes": self.bytes,
            "capacity_bytes": self.capacity_bytes,
            "allocated_bytes": self.allocated_bytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> VerdictBasis | None:
        if data is None:
            return None
        return cls(data["figure"], data["bytes"], data["capacity_bytes"], data["allocated_bytes"])


@dataclass
class Prediction:
    """The peak of one training step on the target, from one trace (docs/estimate.md)."""

    script: str
    args: list[str]
    device: str
    batch_size: int | None
    peak_bytes: int  # allocated: what torch.cuda.max_memory_allocated() would show
    breakdown: Breakdown
    reserved_bytes: int | None  # the caching allocator's segments (modelled), on CUDA
    context_bytes: int | None  # the CUDA context (and NCCL's buffers), on CUDA
    process_bytes: int | None  # reserved + context: what nvidia-smi would show for the process
    peak_at: PeakAt
    top_modules: list[tuple[str, int]]
    top_lines: list[tuple[str, int]]  # ("file:line", bytes); "nb.ipynb:cell 4:3" in a notebook's
    gpu: GpuTarget | None
    verdict: Verdict | None
    corrections: list[Correction]
    steps_traced: int | None
    seconds: float | None
    method: str
    torch: str | None
    batch_knobs: list[BatchKnob]
    data_spread: DataSpread | None
    peak_batch: PeakBatch | None
    batches_traced: int | None
    distributed: Launch | None = None
    worst_case: WorstCase | None = None
    breakdown_batch_size: int | None = None  # real CPU steps: the batch the breakdown was measured at
    fallback: Fallback | None = None
    verdict_basis: VerdictBasis | None = None  # with a target: the figure the verdict judged by
    # With --snapshot/--html: the traced step's allocations in order (estimate/timeline.py); not
    # in the JSON (it can hold a million events): the snapshot and the page are its outputs.
    timeline: Any = None

    @property
    def needed_bytes(self) -> int:
        """What must stay under the margin: on CUDA the modelled reserved memory (the allocator's
        segments, fragmentation included) plus the context, as nvidia-smi would count the
        process; on the CPU the allocated peak."""
        held = self.reserved_bytes if self.reserved_bytes is not None else self.peak_bytes
        return held + (self.context_bytes or 0)

    def stack(self) -> list[tuple[Category, int]]:
        """What holds the bytes of the process at the peak, in the printed order: the breakdown,
        then the allocator's cache beyond it and the context (on CUDA)."""
        held = self.breakdown.printed()
        if self.reserved_bytes is not None and self.reserved_bytes > self.peak_bytes:
            held.append((Category.RESERVED, self.reserved_bytes - self.peak_bytes))
        if self.context_bytes:
            held.append((Category.CONTEXT, self.context_bytes))
        return held

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "script": self.script,
            "args": list(self.args),
            "device": self.device,
            "batch_size": self.batch_size,
            "peak_bytes": self.peak_bytes,
            "breakdown": self.breakdown.to_json(),
            "reserved_bytes": self.reserved_bytes,
            "context_bytes": self.context_bytes,
            "process_bytes": self.process_bytes,
            "peak_at": self.peak_at.to_json(),
            "top_modules": [[name, size] for name, size in self.top_modules],
            "top_lines": [[place, size] for place, size in self.top_lines],
            "gpu": self.gpu.to_json() if self.gpu else None,
            "verdict": _value(self.verdict),
            "corrections": [note.to_json() for note in self.corrections],
            "steps_traced": self.steps_traced,
            "seconds": self.seconds,
            "method": self.method,
            "torch": self.torch,
            "batch_knobs": [knob.to_json() for knob in self.batch_knobs],
            "data_spread": self.data_spread.to_json() if self.data_spread else None,
            "peak_batch": self.peak_batch.to_json() if self.peak_batch else None,
            "batches_traced": self.batches_traced,
        }
        if self.distributed is not None:
            data["distributed"] = self.distributed.to_json()
        if self.verdict_basis is not None:
            data["verdict_basis"] = self.verdict_basis.to_json()
        if self.worst_case is not None:
            data["worst_case"] = self.worst_case.to_json()
        if self.breakdown_batch_size is not None:
            data["breakdown_batch_size"] = self.breakdown_batch_size
        if self.fallback is not None:
            data["fallback"] = self.fallback.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prediction:
        return cls(
            script=data["script"],
            args=list(data.get("args") or []),
            device=data["device"],
            batch_size=data.get("batch_size"),
            peak_bytes=data["peak_bytes"],
            breakdown=Breakdown.from_json(data.get("breakdown") or {}),
            reserved_bytes=data.get("reserved_bytes"),
            context_bytes=data.get("context_bytes"),
            process_bytes=data.get("process_bytes"),
            peak_at=PeakAt.from_json(data.get("peak_at") or {}),
            top_modules=[(name, size) for name, size in data.get("top_modules") or []],
            top_lines=[(place, size) for place, size in data.get("top_lines") or []],
            gpu=GpuTarget.from_json(data.get("gpu")),
            verdict=_verdict(data.get("verdict")),
            corrections=[Correction.from_json(note) for note in data.get("corrections") or []],
            steps_traced=data.get("steps_traced"),
            seconds=data.get("seconds"),
            method=data.get("method", ""),
            torch=data.get("torch"),
            batch_knobs=[BatchKnob.from_json(knob) for knob in data.get("batch_knobs") or []],
            data_spread=DataSpread.from_json(data.get("data_spread")),
            peak_batch=PeakBatch.from_json(data.get("peak_batch")),
            batches_traced=data.get("batches_traced"),
            distributed=Launch.from_json(data.get("distributed")),
            worst_case=WorstCase.from_json(data.get("worst_case")),
            breakdown_batch_size=data.get("breakdown_batch_size"),
            fallback=Fallback.from_json(data.get("fallback")),
            verdict_basis=VerdictBasis.from_json(data.get("verdict_basis")),
        )


# --- The largest batch that fits ---------------------------------------------------------------


@dataclass
class LinearFit:
    """peak(batch) = intercept + bytes_per_sample x batch, through two traced batch sizes."""

    intercept_bytes: int
    bytes_per_sample: int
    batch_sizes: list[int]

    def to_json(self) -> dict[str, Any]:
        return {
            "intercept_bytes": self.intercept_bytes,
            "bytes_per_sample": self.bytes_per_sample,
            "batch_sizes": list(self.batch_sizes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinearFit:
        return cls(data["intercept_bytes"], data["bytes_per_sample"], list(data["batch_sizes"]))


@dataclass
class Accumulation:
    """The script's batch as micro-batches that fit, with gradient accumulation."""

    micro_batch: int
    steps: int
    effective_batch: int

    def to_json(self) -> dict[str, Any]:
        return {"micro_batch": self.micro_batch, "steps": self.steps, "effective_batch": self.effective_batch}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Accumulation | None:
        return cls(data["micro_batch"], data["steps"], data["effective_batch"]) if data else None


@dataclass
class MaxBatchSearch:
    """The largest batch that fits the target with the margin: the line through two traces,
    checked and refined by fake runs. `max_batch` None: the peak does not grow with the batch;
    0: none fits (`reason` says why); else `verified` is the check's prediction at that batch."""

    fit: LinearFit
    margin: float
    budget_bytes: int
    limit: str  # what the budget holds, in words
    script_batch_size: int | None
    max_batch: int | None = None
    reason: str | None = None
    line_max_batch: int | None = None  # the line's own answer (absent when the peak does not grow)
    search_limit: int | None = None  # the largest batch the search tries (absent when it did not search)
    verified: Prediction | None = None
    bound: str | None = None  # "memory", "data" or "search limit": what stops a larger batch
    next_checked: int | None = None
    checks: int | None = None
    explanation: str | None = None  # why the answer is not the line's
    gradient_accumulation: Accumulation | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "fit": self.fit.to_json(),
            "margin": self.margin,
            "budget_bytes": self.budget_bytes,
            "limit": self.limit,
            "script_batch_size": self.script_batch_size,
            "gradient_accumulation": self.gradient_accumulation.to_json()
            if self.gradient_accumulation
            else None,
        }
        if self.line_max_batch is not None:
            data["line_max_batch"] = self.line_max_batch
        data["max_batch"] = self.max_batch
        if self.search_limit is not None:
            data["search_limit"] = self.search_limit
        if self.verified is None:
            data["reason"] = self.reason
            return data
        data.update(
            verified=self.verified.to_json(),
            bound=self.bound,
            next_checked=self.next_checked,
            checks=self.checks,
            explanation=self.explanation,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> MaxBatchSearch | None:
        if data is None:
            return None
        verified = data.get("verified")
        return cls(
            fit=LinearFit.from_json(data["fit"]),
            margin=data["margin"],
            budget_bytes=data["budget_bytes"],
            limit=data["limit"],
            script_batch_size=data.get("script_batch_size"),
            max_batch=data.get("max_batch"),
            reason=data.get("reason"),
            line_max_batch=data.get("line_max_batch"),
            search_limit=data.get("search_limit"),
            verified=Prediction.from_json(verified) if verified is not None else None,
            bound=data.get("bound"),
            next_checked=data.get("next_checked"),
            checks=data.get("checks"),
            explanation=data.get("explanation"),
            gradient_accumulation=Accumulation.from_json(data.get("gradient_accumulation")),
        )


# --- What an estimate reports ----------------------------------------------------------------------


@dataclass
class WhatIfCheck:
    """How an estimate of a script the what-if predicted (a change applied) compares with that
    prediction: beyond AGREEMENT, the prediction is wrong."""

    change: str
    predicted_bytes: int
    estimated_bytes: int
    difference_percent: float
    agrees: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "predicted_bytes": self.predicted_bytes,
            "estimated_bytes": self.estimated_bytes,
            "difference_percent": self.difference_percent,
            "agrees": self.agrees,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> WhatIfCheck | None:
        if data is None:
            return None
        return cls(
            data["change"],
            data["predicted_bytes"],
            data["estimated_bytes"],
            data["difference_percent"],
            data["agrees"],
        )


@dataclass
class NotebookCells:
    """A notebook's estimate: the code cells run in order, and the lines not run (magics)."""

    cells_run: list[int]
    not_run: list[dict[str, Any]]  # {"cell", "line", "code"}

    def to_json(self) -> dict[str, Any]:
        return {"cells_run": self.cells_run, "not_run": self.not_run}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> NotebookCells | None:
        return cls(list(data["cells_run"]), list(data["not_run"])) if data else None


_UNCHECKED = object()


@dataclass
class EstimateResult:
    """What `oom-lsp estimate` and `oom-lsp.estimate` report for one script (or notebook):
    the prediction, the search's answer when one ran, and the comparison with a what-if's
    prediction for this text. `what_if_checked`: the comparison was made (its key is in the
    JSON, null when the text is none the what-if predicted)."""

    prediction: Prediction
    max_batch: MaxBatchSearch | None = None
    what_if_check: WhatIfCheck | None = None
    what_if_checked: bool = False
    notebook: NotebookCells | None = None

    @property
    def fits_nothing(self) -> bool:
        """The search found that not even batch size 1 fits."""
        return self.max_batch is not None and self.max_batch.max_batch == 0

    def to_json(self) -> dict[str, Any]:
        data = self.prediction.to_json()
        data["max_batch"] = self.max_batch.to_json() if self.max_batch is not None else None
        if self.what_if_checked:
            data["what_if_check"] = self.what_if_check.to_json() if self.what_if_check else None
        if self.notebook is not None:
            data["notebook"] = self.notebook.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EstimateResult:
        return cls(
            prediction=Prediction.from_json(data),
            max_batch=MaxBatchSearch.from_json(data.get("max_batch")),
            what_if_check=WhatIfCheck.from_json(data.get("what_if_check")),
            what_if_checked="what_if_check" in data,
            notebook=NotebookCells.from_json(data.get("notebook")),
        )


@dataclass
class SweepRow:
    world_size: int
    estimate: Prediction
    max_batch: MaxBatchSearch | None

    def to_json(self) -> dict[str, Any]:
        estimate = EstimateResult(self.estimate, self.max_batch).to_json()
        return {
            "world_size": self.world_size,
            "estimate": estimate,
            "max_batch": estimate["max_batch"],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepRow:
        return cls(
            data["world_size"],
            Prediction.from_json(data["estimate"]),
            MaxBatchSearch.from_json(data["max_batch"]),
        )


@dataclass
class Sweep:
    """`--world-size 1,2,4,8`: rank 0's estimate at each size and the fewest GPUs that fit."""

    world_sizes: list[int]
    fewest_gpus: int | None
    runs: list[SweepRow]

    @property
    def all_run_out(self) -> bool:
        return bool(self.runs) and all(row.estimate.verdict is Verdict.OOM for row in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "world_sizes": list(self.world_sizes),
            "fewest_gpus": self.fewest_gpus,
            "runs": [row.to_json() for row in self.runs],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sweep:
        return cls(
            list(data["world_sizes"]),
            data.get("fewest_gpus"),
            [SweepRow.from_json(row) for row in data["runs"]],
        )


# --- The what-if --------------------------------------------------------------------------------------


@dataclass
class WhatIfBaseline:
    """The step as it is."""

    needed_bytes: int  # what the verdict uses: reserved + context on CUDA, allocated on the CPU
    peak_bytes: int  # allocated
    verdict: Verdict | None
    fits: bool | None
    growth_per_step: int | None  # what every step keeps on top of the one before (0: no growth)
    steps_to_oom: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "needed_bytes": self.needed_bytes,
            "peak_bytes": self.peak_bytes,
            "verdict": _value(self.verdict),
            "fits": self.fits,
            "growth_per_step": self.growth_per_step,
            "steps_to_oom": self.steps_to_oom,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WhatIfBaseline:
        return cls(
            data["needed_bytes"],
            data["peak_bytes"],
            _verdict(data.get("verdict")),
            data.get("fits"),
            data.get("growth_per_step"),
            data.get("steps_to_oom"),
        )


@dataclass
class WhatIfRow:
    """One change traced alone: its prediction and saving, or the error that kept it unmeasured."""

    key: str  # "fix:OOM201:12:5", "fixes:safe", "knob:bf16", ...
    title: str
    how: str
    safety: str
    code: str | None
    line: int | None
    source_digest: str | None  # the script's text after the change (a fix)
    autocast_dtype: str | None
    batch_size: int | None
    error: str | None = None
    growth_per_step: int | None = None
    stops_growth: bool = False
    fallback: bool = False
    needed_bytes: int | None = None
    peak_bytes: int | None = None
    saving_bytes: int | None = None
    saving_percent: float | None = None
    verdict: Verdict | None = None
    fits: bool | None = None
    # With --html: the change's traced step in order (estimate/timeline.py), drawn against the
    # script's own; not in the JSON.
    timeline: Any = field(default=None, repr=False, compare=False)

    @property
    def measured(self) -> bool:
        return self.error is None

    @property
    def needed_before(self) -> int:
        """The baseline's needed bytes, from this row's saving."""
        return (self.needed_bytes or 0) + (self.saving_bytes or 0)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "key": self.key,
            "title": self.title,
            "how": self.how,
            "safety": self.safety,
            "code": self.code,
            "line": self.line,
            "source_digest": self.source_digest,
            "autocast_dtype": self.autocast_dtype,
            "batch_size": self.batch_size,
        }
        if self.error is not None:
            data["error"] = self.error
            return data
        data.update(
            growth_per_step=self.growth_per_step,
            stops_growth=self.stops_growth,
            fallback=self.fallback,
            needed_bytes=self.needed_bytes,
            peak_bytes=self.peak_bytes,
            saving_bytes=self.saving_bytes,
            saving_percent=self.saving_percent,
            verdict=_value(self.verdict),
            fits=self.fits,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WhatIfRow:
        return cls(
            key=data["key"],
            title=data["title"],
            how=data.get("how", ""),
            safety=data.get("safety", ""),
            code=data.get("code"),
            line=data.get("line"),
            source_digest=data.get("source_digest"),
            autocast_dtype=data.get("autocast_dtype"),
            batch_size=data.get("batch_size"),
            error=data.get("error"),
            growth_per_step=data.get("growth_per_step"),
            stops_growth=bool(data.get("stops_growth")),
            fallback=bool(data.get("fallback")),
            needed_bytes=data.get("needed_bytes"),
            peak_bytes=data.get("peak_bytes"),
            saving_bytes=data.get("saving_bytes"),
            saving_percent=data.get("saving_percent"),
            verdict=_verdict(data.get("verdict")),
            fits=data.get("fits"),
        )


@dataclass
class NotApplicable:
    title: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"title": self.title, "why": self.why}

    @classmethod
    def from_json(cls, data: dict[str, str]) -> NotApplicable:
        return cls(data["title"], data["why"])


@dataclass
class WhatIfTable:
    """The step as it is and a row per change (those that stop a growth first, then by
    saving), with the options it ran with: a later estimate matches a row only with the same."""

    script: str
    device: str
    gpu: str | None
    gpu_memory: int | None
    batch_size: int | None
    source_digest: str
    batch_option: int | None
    autocast_option: str | None
    world_size_option: int | None
    baseline: WhatIfBaseline
    changes: list[WhatIfRow]
    not_applicable: list[NotApplicable]

    def row(self, key: str) -> WhatIfRow | None:
        return next((row for row in self.changes if row.key == key), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "script": self.script,
            "device": self.device,
            "gpu": self.gpu,
            "gpu_memory": self.gpu_memory,
            "batch_size": self.batch_size,
            "source_digest": self.source_digest,
            "batch_option": self.batch_option,
            "autocast_option": self.autocast_option,
            "world_size_option": self.world_size_option,
            "baseline": self.baseline.to_json(),
            "changes": [row.to_json() for row in self.changes],
            "not_applicable": [skipped.to_json() for skipped in self.not_applicable],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WhatIfTable:
        return cls(
            script=data["script"],
            device=data["device"],
            gpu=data.get("gpu"),
            gpu_memory=data.get("gpu_memory"),
            batch_size=data.get("batch_size"),
            source_digest=data.get("source_digest", ""),
            batch_option=data.get("batch_option"),
            autocast_option=data.get("autocast_option"),
            world_size_option=data.get("world_size_option"),
            baseline=WhatIfBaseline.from_json(data["baseline"]),
            changes=[WhatIfRow.from_json(row) for row in data.get("changes") or []],
            not_applicable=[NotApplicable.from_json(item) for item in data.get("not_applicable") or []],
        )


# --- What the harness traced ------------------------------------------------------------------------


@dataclass
class Failure:
    """How a run that did not reach two optimizer steps ended: a crash, a sys.exit, a fake
    tensor the script could not run on (kind "data-dependent", "unsupported-operator"), a
    failure after the fake run answered values only a real run knows ("after-data-dependent-reads"),
    a download the offline run could not make ("needs-download")."""

    kind: str | None = None
    type: str | None = None
    message: str | None = None
    where: dict[str, Any] | None = None  # {"file", "line", "code", "function"} of the script's frame
    frames: list[dict[str, Any]] = field(default_factory=list)
    traceback: str = ""
    exit_code: Any = None
    # The innermost library line that failed ({"file" under site-packages, "line", "function", "code"}).
    library: dict[str, Any] | None = None
    data_dependent_reads: int = 0  # values only a real run knows the fake run had answered
    last_data_dependent_read: tuple[str, int] | None = None  # the user's line of the last one

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Failure:
        data = data or {}
        return cls(
            data.get("kind"),
            data.get("type"),
            data.get("message"),
            data.get("where"),
            list(data.get("frames") or []),
            data.get("traceback", ""),
            data.get("exit_code"),
            data.get("library"),
            int(data.get("data_dependent_reads") or 0),
            _line(data.get("last_data_dependent_read")),
        )


def _line(place: list[Any] | None) -> tuple[str, int] | None:
    return (place[0], place[1]) if place else None


@dataclass
class Loader:
    """A DataLoader the script built: where, and how many batches it gives per pass."""

    place: Place
    batches: int | None
    samples: int | None
    batch_size: int | None
    drop_last: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Loader:
        return cls(
            Place.from_json(data),
            data.get("batches"),
            data.get("samples"),
            data.get("batch_size"),
            bool(data.get("drop_last")),
        )


@dataclass(frozen=True)
class Optimizer:
    """A torch.optim optimizer the script stepped: its class and whether it is fused."""

    name: str
    fused: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Optimizer:
        return cls(data["class"], bool(data.get("fused")))


@dataclass
class KernelMemory:
    """Memory a kind of kernel holds that the fake trace cannot see, measured or modelled:
    how many calls (or distinct probes) and the most bytes at once."""

    calls: int = 0
    bytes: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, count: str = "calls") -> KernelMemory:
        data = data or {}
        return cls(int(data.get(count) or 0), int(data.get("bytes") or 0))


@dataclass
class Trace:
    """One run of the script by the harness (harness/runner.py): how it ended, the peak of live
    storages over its two optimizer steps with the breakdown and place, the allocation log, and
    what the prediction corrects for (kernel choices, memory the kernels hold, the data)."""

    status: str  # "stopped" (two optimizer steps reached), "failed", "script-exit", "finished"
    failure: Failure
    steps: int
    seconds: float | None
    torch: str
    peak_bytes: int
    breakdown: Breakdown
    peak_op: str | None
    peak_module: str | None
    peak_phase: str | None
    peak_line: tuple[str, int] | None
    top_modules: list[tuple[str, int]]
    top_lines: list[tuple[str, int]]
    events: list[list[int]]  # the allocation log: [id, size] to allocate, [id] to free
    batch_size: int | None
    override_applied: bool
    batch_knobs: list[BatchKnob]
    loaders: list[Loader]
    matmuls: int = 0
    first_matmul_line: str = ""  # "file:line" of the first matrix product: where cuBLAS's workspace is made
    convolutions: int = 0
    sdpa: dict[str, int] = field(default_factory=dict)  # sdpa_flash, sdpa_mem_efficient, sdpa_math_kept
    rnn_workspace: KernelMemory = field(default_factory=KernelMemory)
    rnn_backward_scratch: KernelMemory = field(default_factory=KernelMemory)
    conv_scratch: KernelMemory = field(default_factory=KernelMemory)  # `calls`: the distinct probes
    matmul_copies: KernelMemory = field(default_factory=KernelMemory)
    loss_buffers: KernelMemory = field(default_factory=KernelMemory)
    quantized_layers: dict[str, int] = field(default_factory=dict)
    quantized_failure: str | None = None
    compiled: int = 0
    script_autocast: str | None = None  # --dtype
    autocast_regions: int = 0
    autocast_dtypes: list[str] = field(default_factory=list)
    foreach_pinned: bool = False
    batch_padded: tuple[int, int] | None = None
    bf16_emulated: bool = False
    stubbed_scalars: int = 0  # reads of a value only a real run knows, answered 0/False
    checks_passed: int = 0  # truth tests one of whose outcomes raises at once, answered with the other
    value_arrays: int = 0  # .numpy() of fake tensors, answered with zeros
    draws_not_replayed: int = 0
    cuda_kept_on_cpu: list[dict[str, Any]] = field(default_factory=list)  # {"file", "line", "calls"}
    distributed: dict[str, Any] | None = None  # harness/distributed.py's account (estimate/distributed.py)
    live_after_steps: list[int] = field(default_factory=list)
    optimizers: list[Optimizer] = field(default_factory=list)
    optimizer_change: list[str] = field(default_factory=list)
    accumulation: dict[str, Any] | None = None
    checkpointed_blocks: Any = None
    peak_batch: PeakBatch | None = None
    batches_traced: int | None = None
    data_spread: DataSpread | None = None
    worst_case: Trace | None = None
    longest_batches: list[LongestBatch] = field(default_factory=list)
    output_tail: str = ""  # the script's last lines of output (added by the parent)
    # The CUDA release of the script's torch (None: a CPU build) and CUDA_MODULE_LOADING as the
    # script saw it: the CUDA context's size depends on them (cuda_terms.py).
    torch_cuda: str | None = None
    cuda_module_loading: str | None = None
    # With --snapshot/--html: [serial, size, category, op, phase, "file:line", module] per
    # allocation, [serial, -size] per free, [serial, 0, category] per recategorisation, in order
    # (harness/tracker.py; estimate/timeline.py).
    timeline: list[list[Any]] | None = None

    @property
    def reached_two_steps(self) -> bool:
        """The evidence an estimate needs: the harness stops the script at the end of its second step."""
        return self.status == "stopped"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @classmethod
    def from_harness(cls, data: dict[str, Any]) -> Trace:
        line = data.get("peak_line")
        padded = data.get("batch_padded")
        worst = data.get("worst_case")
        return cls(
            status=data["status"],
            failure=Failure.from_json(data.get("failure")),
            steps=int(data.get("steps") or 0),
            seconds=data.get("seconds"),
            torch=data.get("torch", ""),
            peak_bytes=int(data.get("peak_bytes") or 0),
            breakdown=Breakdown.from_json(data.get("breakdown") or {}),
            peak_op=data.get("peak_op"),
            peak_module=data.get("peak_module"),
            peak_phase=data.get("peak_phase"),
            peak_line=(line[0], line[1]) if line else None,
            top_modules=[(name, size) for name, size in data.get("top_modules") or []],
            top_lines=[(place, size) for place, size in data.get("top_lines") or []],
            events=data.get("events") or [],
            batch_size=data.get("batch_size"),
            override_applied=bool(data.get("override_applied")),
            batch_knobs=[BatchKnob.from_json(knob) for knob in data.get("batch_knobs") or []],
            loaders=[Loader.from_json(loader) for loader in data.get("loaders") or []],
            matmuls=int(data.get("matmuls") or 0),
            first_matmul_line=str(data.get("first_matmul_line") or ""),
            convolutions=int(data.get("convolutions") or 0),
            sdpa=dict(data.get("sdpa") or {}),
            rnn_workspace=KernelMemory.from_json(data.get("rnn_workspace")),
            rnn_backward_scratch=KernelMemory.from_json(data.get("rnn_backward_scratch")),
            conv_scratch=KernelMemory.from_json(data.get("conv_scratch"), count="probes"),
            matmul_copies=KernelMemory.from_json(data.get("matmul_copies")),
            loss_buffers=KernelMemory.from_json(data.get("loss_buffers")),
            quantized_layers=dict(data.get("quantized_layers") or {}),
            quantized_failure=data.get("quantized_failure"),
            compiled=int(data.get("compiled") or 0),
            script_autocast=data.get("script_autocast"),
            autocast_regions=int(data.get("autocast_regions") or 0),
            autocast_dtypes=list(data.get("autocast_dtypes") or []),
            foreach_pinned=bool(data.get("foreach_pinned")),
            batch_padded=(padded[0], padded[1]) if padded else None,
            bf16_emulated=bool(data.get("bf16_emulated")),
            stubbed_scalars=int(data.get("stubbed_scalars") or 0),
            checks_passed=int(data.get("checks_passed") or 0),
            value_arrays=int(data.get("value_arrays") or 0),
            draws_not_replayed=int(data.get("draws_not_replayed") or 0),
            cuda_kept_on_cpu=list(data.get("cuda_kept_on_cpu") or []),
            distributed=data.get("distributed"),
            live_after_steps=list(data.get("live_after_steps") or []),
            optimizers=[Optimizer.from_json(optimizer) for optimizer in data.get("optimizers") or []],
            optimizer_change=list(data.get("optimizer_change") or []),
            accumulation=data.get("accumulation"),
            checkpointed_blocks=data.get("checkpointed_blocks"),
            peak_batch=PeakBatch.from_json(data.get("peak_batch")),
            batches_traced=data.get("batches_traced"),
            data_spread=DataSpread.from_json(data.get("data_spread")),
            worst_case=cls.from_harness(worst) if worst else None,
            longest_batches=[LongestBatch.from_json(batch) for batch in data.get("longest_batches") or []],
            output_tail=data.get("output_tail", ""),
            torch_cuda=data.get("torch_cuda"),
            cuda_module_loading=data.get("cuda_module_loading"),
            timeline=data.get("timeline"),
        )
