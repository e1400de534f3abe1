"""`oom-lsp estimate --what-if`: the step traced as it is, then once per change a user could make,
each change's predicted peak and saving.

The changes: each quick fix of the findings in the script (the codemod applied to a copy of the
script next to it, a hidden file removed afterwards), and the knobs the harness applies from
outside (harness/changes.py): bf16 autocast, activation checkpointing per block, half the
micro-batch with two accumulation steps, a fused optimizer, Adafactor. All traces run in one
child interpreter, one after the other, with the estimate's own settings (the same data draws
and worst case), so the rows differ only by the change. No torch import here."""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.analysis.findings import Applicability, Finding
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.edits import apply_edits
from oom_lsp.estimate.estimator import (
    DATA_DRAWS,
    EstimateError,
    EstimateOptions,
    prediction_from,
    traces,
)
from oom_lsp.estimate.prediction import verdict
from oom_lsp.estimate.results import NotApplicable, Prediction, Trace, WhatIfBaseline, WhatIfRow, WhatIfTable
from oom_lsp.estimate.whatif_record import source_digest

SAFE, UNSAFE, NUMERICS = "safe", "unsafe", "changes numerics"
# Fixes that keep the program's meaning but not its floating-point results.
_NUMERICS_CODES = {"OOM201", "OOM202"}
_FUSABLE = {"Adam", "AdamW", "SGD"}
_ADAFACTOR_REPLACES = {"Adam", "AdamW"}
# Below this, what the second step keeps on top of the first is noise (a batch of another shape).
GROWTH_FLOOR = 2**20


@dataclass(frozen=True)
class Change:
    """One row of the table. `run`: what the harness run changes (harness/changes.py keys,
    "autocast_dtype", "batch_size"); `source`: the edited script, for a fix."""

    key: str
    title: str
    safety: str
    how: str
    run: dict[str, Any] = field(default_factory=dict)
    code: str | None = None
    line: int | None = None
    source: str | None = None
    # A fix `oom-lsp check --fix` applies only with --unsafe-fixes.
    unsafe_fix: bool = False


def fix_key(finding: Finding) -> str:
    """The row key of a finding's fix: its code and where its range starts (1-based line and column)."""
    return f"fix:{finding.code}:{finding.line}:{finding.column + 1}"


def fix_changes(source: str, findings: list[Finding]) -> list[Change]:
    """A change per finding with a fix: its codemod alone, applied to the script. Memory rules only:
    removing an unused suppression (OOM900) changes no memory."""
    from oom_lsp.analysis.registry import all_rules

    rules = all_rules()
    changes = []
    for finding in findings:
        if finding.fix is None or finding.cell is not None or finding.code not in rules:
            continue
        edited = apply_edits(source, finding.fix.edits)
        if edited == source:
            continue
        if finding.code in _NUMERICS_CODES:
            safety = NUMERICS
        else:
            safety = SAFE if finding.fix.applicability is Applicability.SAFE else UNSAFE
        changes.append(
            Change(
                key=fix_key(finding),
                title=f"{finding.code} line {finding.line}: {finding.fix.title}",
                safety=safety,
                how=finding.fix.title,
                code=finding.code,
                line=finding.line,
                source=edited,
                unsafe_fix=finding.fix.applicability is not Applicability.SAFE,
            )
        )
    return changes


def _worst(safeties: list[str]) -> str:
    return UNSAFE if UNSAFE in safeties else NUMERICS if NUMERICS in safeties else SAFE


def fixes_together(source: str, single: list[Change], settings: LintSettings, path: str) -> list[Change]:
    """All safe fixes at once, and all fixes with the unsafe ones, as `oom-lsp check --fix
    [--unsafe-fixes]` would leave the script: where fixes overlap in what they free (a graph kept
    by two names), only together do they show it."""
    from oom_lsp.analysis.autofix import fix_source

    safe = [change for change in single if not change.unsafe_fix]
    groups = [(False, "fixes:safe", "all safe fixes (check --fix)", safe)]
    if len(single) > len(safe):
        groups.append((True, "fixes:all", "all fixes (check --fix --unsafe-fixes)", single))
    together = []
    for unsafe, key, title, members in groups:
        if len(members) < 2:
            continue
        fixed = fix_source(source, settings, unsafe=unsafe, path=path).source
        if fixed != source:
            codes = sorted({member.code or "" for member in members})
            together.append(
                Change(
                    key=key,
                    title=title,
                    safety=_worst([member.safety for member in members]),
                    how="the fixes of " + ", ".join(codes),
                    source=fixed,
                )
            )
    return together


def knob_changes(trace: Trace, options: EstimateOptions) -> tuple[list[Change], list[NotApplicable]]:
    """The knobs that apply to the traced step, and why the others do not."""
    changes: list[Change] = []
    skipped: list[NotApplicable] = []

    def skip(title: str, why: str) -> None:
        skipped.append(NotApplicable(title, why))

    if options.autocast_dtype not in (None, "fp32"):
        skip("bf16 autocast", f"already traced with --dtype {options.autocast_dtype}")
    elif trace.autocast_regions:
        skip("bf16 autocast", "the script already runs under torch.autocast")
    else:
        changes.append(
            Change(
                key="knob:bf16",
                title="bf16 autocast (--dtype bf16)",
                safety=NUMERICS,
                how='with torch.autocast("cuda", dtype=torch.bfloat16): around the forward pass and the loss, '
                "backward outside (what --dtype bf16 traces)",
                run={"autocast_dtype": "bf16"},
            )
        )
    changes.append(
        Change(
            key="knob:checkpoint-blocks",
            title="activation checkpointing per block",
            safety=SAFE,
            how="torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False) for each repeated "
            "block (one more forward pass of compute)",
            run={"checkpoint_blocks": True},
        )
    )
    batch = options.batch_size or trace.batch_size
    if not trace.batch_knobs:
        skip("half the micro-batch, 2 accumulation steps", "the trace found no batch-size knob to halve")
    elif not isinstance(batch, int) or batch < 2:
        skip("half the micro-batch, 2 accumulation steps", f"the batch size is {batch}")
    else:
        changes.append(
            Change(
                key="knob:micro-batch",
                title=f"micro-batch {batch // 2} with 2 accumulation steps",
                safety=NUMERICS,
                how=f"batch size {batch // 2}; optimizer.step() and zero_grad() every 2nd batch, the loss "
                "divided by 2 (BatchNorm sees half the batch)",
                run={"batch_size": batch // 2, "accumulation": 2},
            )
        )
    optimizers = trace.optimizers
    unfused = sorted({o.name for o in optimizers if o.name in _FUSABLE and not o.fused})
    if unfused:
        changes.append(
            Change(
                key="knob:fused-optimizer",
                title=f"fused {'/'.join(unfused)}",
                safety=SAFE,
                how=f"{unfused[0]}(..., fused=True): one kernel, no foreach temporaries",
                run={"optimizer": "fused"},
            )
        )
    elif optimizers:
        skip("fused optimizer", "no unfused Adam, AdamW or SGD is stepped")
    adams = sorted({o.name for o in optimizers if o.name in _ADAFACTOR_REPLACES})
    if adams:
        changes.append(
            Change(
                key="knob:adafactor",
                title=f"Adafactor instead of {'/'.join(adams)}",
                safety=NUMERICS,
                how=f"torch.optim.Adafactor(params, lr=..., weight_decay=...) instead of {adams[0]}: "
                "factored second moments, no first moment",
                run={"optimizer": "adafactor"},
            )
        )
    return changes, skipped


@contextmanager
def edited_copies(script: Path, changes: list[Change], encoding: str = "utf-8") -> Iterator[dict[str, Path]]:
    """Each fix's edited script, written next to the script (its imports, data paths and
    `__file__` folder stay the same) as a hidden file removed on exit."""
    written: dict[str, Path] = {}
    try:
        for change in changes:
            if change.source is None:
                continue
            try:
                handle, name = tempfile.mkstemp(
                    prefix=f".{script.stem}.oom-lsp-what-if-", suffix=".py", dir=script.parent
                )
            except OSError as error:
                raise EstimateError(
                    f"cannot write the edited copies next to the script in {script.parent}: "
                    f"{error.strerror or error}"
                ) from None
            with os.fdopen(handle, "w", encoding=encoding) as stream:
                stream.write(change.source)
            written[change.key] = Path(name)
        yield written
    finally:
        for path in written.values():
            path.unlink(missing_ok=True)


def _run_for(change: Change | None, options: EstimateOptions, copies: dict[str, Path]) -> dict[str, Any]:
    run: dict[str, Any] = {"batch_size": options.batch_size, "draws": DATA_DRAWS, "worst_case": True}
    if change is not None:
        run.update(change.run)
        if change.key in copies:
            run["script"] = str(copies[change.key].resolve())
    return run


def _options_for(change: Change, options: EstimateOptions, copies: dict[str, Path]) -> EstimateOptions:
    updates: dict[str, Any] = {}
    if change.key in copies:
        updates["script"] = copies[change.key]
    if "batch_size" in change.run:
        updates["batch_size"] = change.run["batch_size"]
    if "autocast_dtype" in change.run:
        updates["autocast_dtype"] = change.run["autocast_dtype"]
    return dataclasses.replace(options, **updates)


def _not_applied(change: Change, trace: Trace) -> str | None:
    """Why a knob changed nothing in the run (then it has no row)."""
    if trace.failed:
        return None  # the row says how it failed
    if change.run.get("checkpoint_blocks") and not trace.checkpointed_blocks:
        return "no repeated blocks (a ModuleList or Sequential of two or more alike modules) run in training"
    if change.run.get("optimizer") and not trace.optimizer_change:
        return "the script builds no Adam, AdamW or SGD while it runs"
    accumulation = trace.accumulation
    if change.run.get("accumulation") and not (accumulation or {}).get("skipped_steps"):
        return "no optimizer step was skipped (the script steps no torch.optim optimizer)"
    return None


def what_if(
    options: EstimateOptions,
    source: str,
    findings: list[Finding],
    settings: LintSettings,
    progress: Callable[[str], None] | None = None,
    encoding: str = "utf-8",
) -> WhatIfTable:
    """The baseline prediction and a row per change: those that stop a growth first, then by saving."""
    say = progress or (lambda text: None)
    say("tracing the script as it is")
    base_run = _run_for(None, options, {})
    # A third step, to tell what every step keeps from what only the second allocates once (DDP
    # rebuilds its buckets there).
    base_trace, three_steps = traces(options, [base_run, {**base_run, "steps": 3, "worst_case": False}])
    base = prediction_from(base_trace, options, progress)
    base_needed = base.needed_bytes
    base_growth = growth_per_step(three_steps, base)
    knobs, skipped = knob_changes(base_trace, options)
    single = fix_changes(source, findings)
    changes = single + fixes_together(source, single, settings, str(options.script)) + knobs
    rows: list[WhatIfRow] = []
    if changes:
        say(
            f"tracing {len(changes)} change{'s' if len(changes) != 1 else ''}: "
            + ", ".join(c.title for c in changes)
        )
        with edited_copies(options.script, changes, encoding) as copies:
            runs = [_run_for(change, options, copies) for change in changes]
            # One child interpreter runs every change in turn: the time limit is per trace.
            together = dataclasses.replace(options, timeout=options.timeout * len(runs))
            # Inside: a trace that falls back to real CPU steps runs its edited copy again.
            for change, trace in zip(changes, traces(together, runs)):
                why_not = _not_applied(change, trace)
                if why_not:
                    skipped.append(NotApplicable(change.title, why_not))
                    continue
                row = _row(
                    change, trace, _options_for(change, options, copies), base_needed, base_growth, progress
                )
                if row.error is not None:
                    # One line, the edited copy named as what it is.
                    first = row.error.splitlines()[0]
                    copy = copies.get(change.key)
                    row.error = (
                        first.replace(copy.name, f"{options.script.name} (changed)") if copy else first
                    )
                rows.append(row)
    rows.sort(key=_rank)
    capacity = options.gpu.memory if options.gpu else None
    return WhatIfTable(
        script=str(options.script),
        device=options.device,
        gpu=options.gpu.name if options.gpu else None,
        gpu_memory=capacity,
        batch_size=base.batch_size,
        source_digest=source_digest(source),
        # The estimate options the what-if ran with: a later estimate matches a row only with the same.
        batch_option=options.batch_size,
        autocast_option=options.autocast_dtype,
        world_size_option=options.world_size,
        baseline=WhatIfBaseline(
            needed_bytes=base_needed,
            peak_bytes=base.peak_bytes,
            verdict=base.verdict,
            fits=None if capacity is None else base_needed <= capacity * (1 - options.margin),
            growth_per_step=base_growth,
            steps_to_oom=capacity and base_growth and max(0, (capacity - base_needed) // base_growth),
        ),
        changes=rows,
        not_applicable=skipped,
    )


def growth_per_step(trace: Trace, prediction: Prediction) -> int | None:
    """What every step keeps on top of the one before (live bytes as each step ends: the least of
    the differences), when it is above the noise; None for real CPU steps scaled to the batch."""
    live = trace.live_after_steps
    if prediction.fallback is not None or trace.failed or len(live) < 2:
        return None
    growth = min(after - before for before, after in itertools.pairwise(live))
    return growth if growth >= GROWTH_FLOOR else 0


def _rank(row: WhatIfRow) -> tuple:
    """Changes that stop the memory growing at each step first (without them the script runs out
    sooner or later, whatever its peak), then by saving."""
    if not row.measured:
        return (2, 0)
    return (0 if row.stops_growth else 1, -(row.saving_bytes or 0))


def _row(
    change: Change,
    trace: Trace,
    options: EstimateOptions,
    base_needed: int,
    base_growth: int | None,
    progress: Callable[[str], None] | None,
) -> WhatIfRow:
    row = WhatIfRow(
        key=change.key,
        title=change.title,
        how=change.how,
        safety=change.safety,
        code=change.code,
        line=change.line,
        source_digest=source_digest(change.source) if change.source is not None else None,
        autocast_dtype=change.run.get("autocast_dtype"),
        batch_size=change.run.get("batch_size"),
    )
    try:
        prediction = prediction_from(trace, options, progress)
    except EstimateError as error:
        row.error = str(error)
        return row
    needed = prediction.needed_bytes
    capacity = options.gpu.memory if options.gpu else None
    # Two steps: only the growth of a script that grows at every step is a row's to stop.
    growth = growth_per_step(trace, prediction) if base_growth else None
    row.growth_per_step = growth
    row.stops_growth = bool(base_growth and growth is not None and growth <= base_growth // 2)
    row.fallback = prediction.fallback is not None
    if options.timeline and not trace.failed and trace.timeline is not None:  # --html asked for it
        from .timeline import Timeline

        row.timeline = Timeline.from_trace(trace, prediction)
    row.needed_bytes = needed
    row.peak_bytes = prediction.peak_bytes
    row.saving_bytes = base_needed - needed
    row.saving_percent = round(100 * (base_needed - needed) / base_needed, 1) if base_needed else 0.0
    row.verdict = verdict(needed, capacity, options.margin) if capacity else None
    row.fits = None if capacity is None else needed <= capacity * (1 - options.margin)
    return row
