"""The largest batch that fits the target with a margin (`--find-max-batch`, the editor's
findMaxBatch): two fake traces give peak(bs) = a + b*bs, solved for the budget, then checked,
and refined where the line does not hold, by fake runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from oom_lsp.estimate.estimator import (
    _NO_KNOB,
    DATA_DRAWS,
    EstimateError,
    EstimateOptions,
    Progress,
    _failure_error,
    _require_two_steps,
    _short_loaders,
    traces,
)
from oom_lsp.estimate.prediction import predict
from oom_lsp.estimate.results import (
    Accumulation,
    EstimateResult,
    LinearFit,
    MaxBatchSearch,
    Prediction,
    Trace,
)
from oom_lsp.units import format_bytes


def accumulation_steps(batch: int, largest: int) -> int:
    """Steps of gradient accumulation so that micro-batches fit: the fewest
    that divide `batch` exactly (same effective batch) if one is within twice
    the minimum, else the minimum (effective batch rounded up)."""
    minimum = math.ceil(batch / largest)
    for steps in range(minimum, 2 * minimum + 1):
        if batch % steps == 0:
            return steps
    return minimum


_MAX_CHECKS = 8
# The largest batch --find-max-batch tries. On a small model the memory line alone answers
# tens of thousands, and a fake run at such a batch still builds and collates every sample
# (over ten minutes for one check): past this the answer is "this many fit, the search stops
# here" (docs/estimate.md). Per-GPU batches of training recipes stay well below it.
MAX_SEARCHED_BATCH = 8192


@dataclass
class _Search:
    """What the checks of a batch-size search found: the largest batch that
    fits the budget, the smallest that does not, the smallest at which the
    script did not reach two optimizer steps (each: batch, prediction or trace)."""

    budget: int
    fitting: tuple[int, Prediction] | None = None
    over: list[tuple[int, Prediction]] = field(default_factory=list)  # the checks over the budget
    no_steps: tuple[int, Trace] | None = None
    checks: int = 0

    @property
    def too_large(self) -> tuple[int, Prediction] | None:
        return min(self.over, key=lambda check: check[0]) if self.over else None

    def upper(self) -> tuple[str, int] | None:
        bounds = [("memory", self.too_large[0])] if self.too_large else []
        if self.no_steps:
            bounds.append(("data", self.no_steps[0]))
        return min(bounds, key=lambda bound: bound[1]) if bounds else None

    def next_candidate(self) -> int | None:
        """The next batch to check, or None when the search is done."""
        upper = self.upper()
        if upper is None:
            return None  # the line's answer fits, and nothing above it was asked
        kind, high_batch = upper
        low_batch = self.fitting[0] if self.fitting else 0
        if high_batch <= low_batch + 1:
            return None
        if kind == "data":
            assert self.no_steps is not None
            bound = _fewer_batches_above(self.no_steps[1])
            if bound is None:
                return (low_batch + high_batch) // 2 or None
            # Every batch above `bound` gives the loader as few batches per pass as the failed check.
            return bound if low_batch < bound < high_batch else None
        if self.fitting is None:
            return high_batch // 2 or None
        # Slopes of the allocated peak (the reserved memory grows in whole segments). With two
        # checks over the budget, the line through them (the regime of large batches: the peak
        # may have moved to another phase there, where it grows faster) is followed down from
        # the lower one; with one, the secant from the largest batch that fits is followed up.
        if high_batch - low_batch <= low_batch // 200:
            return None  # within 0.5 %: the reserved memory moves in whole segments anyway
        if len(self.over) >= 2:
            (below, lower), (above, upper_check) = sorted(self.over, key=lambda check: check[0])[:2]
            slope = (upper_check.peak_bytes - lower.peak_bytes) / (above - below)
            if slope > 0:
                candidate = below - math.ceil((lower.needed_bytes - self.budget) / slope)
                if low_batch < candidate < high_batch:
                    return candidate
        low, high = self.fitting[1], self.over_at(high_batch)
        slope = (high.peak_bytes - low.peak_bytes) / (high_batch - low_batch)
        room = self.budget - low.needed_bytes
        step = math.floor(room / slope) if slope > 0 else 0
        candidate = min(high_batch - 1, low_batch + max(1, step))
        return candidate if candidate > low_batch else None

    def over_at(self, batch: int) -> Prediction:
        return next(prediction for checked, prediction in self.over if checked == batch)


def _fewer_batches_above(trace: Trace) -> int | None:
    """For a run whose loaders gave too few batches: the largest batch at which
    each of them gives one batch more per pass (all samples in one batch when
    it gave none; two batches when it gave one)."""
    bounds = []
    for loader in trace.loaders:
        batches, samples = loader.batches, loader.samples
        if batches is None or batches >= 2 or not samples:
            continue
        if batches == 0:
            bounds.append(samples)
        else:
            bounds.append(samples // 2 if loader.drop_last else samples - 1)
    return min(bounds) if bounds else None


def _search_largest_fitting(
    options: EstimateOptions,
    base: Prediction,
    base_batch: int,
    candidate: int,
    budget: int,
    progress: Progress | None,
) -> _Search:
    """Check the line's answer with fake runs and refine it.

    The peak is affine in the batch size only while it happens at the same
    place: a small batch can peak in the optimizer step and a large one in
    the backward pass, with a much steeper slope. So each check that does not
    fit becomes a new point of a secant through the largest batch known to
    fit, and the search stays between the two bounds. A check at which the
    script does not reach two optimizer steps (a batch larger than its data)
    is no evidence either way: it bounds the search from above too.
    """
    search = _Search(budget)
    if base.needed_bytes <= budget:
        search.fitting = (base_batch, base)
    next_batch: int | None = candidate
    if progress:
        progress(
            f"searching for the largest batch that fits, up to {MAX_SEARCHED_BATCH:,} "
            f"(at most {_MAX_CHECKS} fake runs)"
        )
    while next_batch is not None and search.checks < _MAX_CHECKS:
        if options.on_event:  # the progress line (not one line per candidate)
            options.on_event(
                {"event": "search-check", "batch_size": next_batch, "check": search.checks + 1, "of": _MAX_CHECKS}
            )
        (trace,) = traces(options, [{"batch_size": next_batch}])
        search.checks += 1
        if trace.failed:
            raise _failure_error(trace)
        if not trace.reached_two_steps:
            search.no_steps = (next_batch, trace)
        else:
            checked = predict(trace, options)
            if checked.needed_bytes <= budget:
                search.fitting = (next_batch, checked)
            else:
                search.over.append((next_batch, checked))
        next_batch = search.next_candidate()
    return search


def _budget_text(options: EstimateOptions, budget: int) -> str:
    assert options.gpu is not None
    held = "reserved memory + CUDA context" if options.device == "cuda" else "allocated memory"
    return (
        f"{held} within {budget_share(options.margin)} of {format_bytes(options.gpu.memory)} "
        f"({format_bytes(budget)}, a {100 * options.margin:g}% margin)"
    )


def budget_share(margin: float) -> str:
    return f"{100 * (1 - margin):g}%"


_PHASES = {"forward": "forward pass", "backward": "backward pass"}


def _why_not_the_line(
    search: _Search, answer: int, line_answer: int, base_batches: list[int], first: Prediction
) -> str | None:
    """Why the checked answer is not the line's, when they differ by more than a tenth."""
    upper = search.upper()
    if upper is None or abs(line_answer - answer) <= 0.1 * max(answer, 1):
        return None
    kind, high_batch = upper
    if kind == "data":
        assert search.no_steps is not None
        trace = search.no_steps[1]
        loaders = _short_loaders(trace)
        steps = trace.steps
        return (
            f"the memory line alone gives {line_answer:,}, but at batch {high_batch:,} the script reached "
            f"{steps} optimizer step{'' if steps == 1 else 's'}"
            + (f" ({loaders[0]})" if loaders else "")
            + f": {answer:,} is the largest batch checked with two"
        )
    assert search.too_large is not None and search.fitting is not None
    low_batch, low = search.fitting
    high = search.too_large[1]
    slope = (high.peak_bytes - low.peak_bytes) / max(high_batch - low_batch, 1)
    phases = [_PHASES.get(p, p) for p in (first.peak_at.phase, high.peak_at.phase)]
    moved = (
        f"the peak moves from the {phases[0]} (at batch {base_batches[0]:,}) to the {phases[1]} (at batch "
        f"{high_batch:,}), where it grows faster"
        if phases[0] and phases[1] and phases[0] != phases[1]
        else "the peak grows faster at large batches than between the two traces"
    )
    return (
        f"the line through batches {base_batches[0]:,} and {base_batches[1]:,} gives {line_answer:,}; "
        f"{moved}: {format_bytes(int(slope))} per sample between batches {low_batch:,} and {high_batch:,}, "
        f"so the checked answer is {answer:,}"
    )


def find_max_batch(options: EstimateOptions, progress: Progress | None = None) -> EstimateResult:
    """The largest batch that fits the target with a margin: two fake traces
    give peak(bs) = a + b*bs, solved for the budget, then checked (and refined
    where the line does not hold) by fake runs. The result's prediction is the first trace's."""
    if options.gpu is None:
        raise EstimateError("--find-max-batch needs a target: --gpu NAME or --gpu-memory SIZE")
    found = traces(
        options, [{"batch_size": options.batch_size, "draws": DATA_DRAWS}, {"batch_size": "double"}]
    )
    base = found[0]
    _require_two_steps(base, base.batch_size)
    if not base.batch_knobs or not base.batch_size:
        raise EstimateError(_NO_KNOB)
    if len(found) < 2 or not found[1].override_applied:
        raise EstimateError("the second trace (at twice the batch size) could not change the batch size")
    _require_two_steps(found[1], found[1].batch_size)
    first, second = predict(found[0], options), predict(found[1], options)
    if options.timeline and not base.failed and base.timeline is not None:
        # The editor's page: the script's own batch, as a plain estimate draws it.
        from .timeline import Timeline

        first.timeline = Timeline.from_trace(base, first)
    batches = [found[0].batch_size, found[1].batch_size]
    slope = (second.peak_bytes - first.peak_bytes) / (batches[1] - batches[0])
    intercept = first.peak_bytes - slope * batches[0]
    budget = int(options.gpu.memory * (1 - options.margin))
    result = MaxBatchSearch(
        fit=LinearFit(int(intercept), int(slope), batches),
        margin=options.margin,
        budget_bytes=budget,
        limit=_budget_text(options, budget),
        script_batch_size=base.batch_size,
    )
    if slope <= 0:
        result.max_batch, result.reason = None, "the peak does not grow with the batch size"
        return EstimateResult(first, result)
    # The line is the allocated peak's; what the budget holds above it (reserved segments, the
    # context) is taken as at the first trace, and every answer is checked by a fake run.
    overhead = first.needed_bytes - first.peak_bytes
    line_answer = math.floor((budget - overhead - intercept) / slope)
    result.line_max_batch = line_answer
    if line_answer < 1:
        result.max_batch = 0
        result.reason = f"even batch size 1 does not keep {result.limit}: the model states alone need more"
        return EstimateResult(first, result)
    result.search_limit = MAX_SEARCHED_BATCH
    search = _search_largest_fitting(
        dataclasses.replace(options, timeline=False), first, batches[0], min(line_answer, MAX_SEARCHED_BATCH), budget, progress
    )
    if search.fitting is None:
        reason = f"no batch size checked by a fake run keeps {result.limit}"
        if search.no_steps is not None and search.too_large is None:
            reason = (
                f"no batch size checked by a fake run reached two optimizer steps ({search.no_steps[0]:,})"
            )
        result.max_batch, result.reason = 0, reason
        return EstimateResult(first, result)
    largest, verified = search.fitting
    upper = search.upper()
    result.max_batch = largest
    result.verified = verified
    at_limit = upper is None and largest == MAX_SEARCHED_BATCH < line_answer
    result.bound = upper[0] if upper else ("search limit" if at_limit else "memory")
    result.next_checked = upper[1] if upper else None
    result.checks = search.checks
    result.explanation = _why_not_the_line(search, largest, line_answer, batches, first)
    script_batch = base.batch_size
    if script_batch and script_batch > largest:
        steps = accumulation_steps(script_batch, largest)
        micro = math.ceil(script_batch / steps)
        result.gradient_accumulation = Accumulation(micro, steps, micro * steps)
    return EstimateResult(first, result)
