"""`oom-lsp estimate train.py --world-size 1,2,4,8`: rank 0's peak at each world size, the
fewest GPUs that fit, and with --find-max-batch the largest batch per rank at each size.

Without --find-max-batch every world size is one run of the script in the same child
interpreter (the harness runs them in turn, each with its own fake process group); with it,
each world size gets its own search (estimator.find_max_batch). No torch import here.
"""

from __future__ import annotations

from oom_lsp.estimate import distributed
from oom_lsp.estimate.estimator import EstimateOptions, Progress, prediction_from, traces
from oom_lsp.estimate.results import Sweep, SweepRow
from oom_lsp.estimate.search import find_max_batch


def sweep(
    options: EstimateOptions, world_sizes: list[int], search: bool, progress: Progress | None = None
) -> Sweep:
    """Rank 0's estimate at each world size (and the largest batch per rank when `search`)."""
    rows: list[SweepRow] = []
    if search:
        for size in world_sizes:
            if progress:
                progress(f"world size {size}: the largest batch per rank")
            outcome = find_max_batch(distributed.with_world_size(options, size), progress)
            rows.append(SweepRow(size, outcome.prediction, outcome.max_batch))
    else:
        runs = [
            {
                "batch_size": options.batch_size,
                "distributed": distributed.launch(size, options.nproc_per_node),
            }
            for size in world_sizes
        ]
        for size, trace in zip(world_sizes, traces(options, runs)):
            sized = distributed.with_world_size(options, size)
            rows.append(SweepRow(size, prediction_from(trace, sized, progress), None))
    return Sweep(world_sizes, distributed.fewest_fitting(rows), rows)
