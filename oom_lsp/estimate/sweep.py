"""`oom-lsp estimate train.py --world-size 1,2,4,8`: rank 0's peak at each world size, the
fewest GPUs that fit, and with --find-max-batch the largest batch per rank at each size.

Without --find-max-batch every world size is one run of the script in the same child
interpreter (the harness runs them in turn, each with its own fake process group); with it,
each world size gets its own search (estimator.find_max_batch). No torch import here.
"""

from __future__ import annotations

from typing import Any

from oom_lsp.estimate import distributed
from oom_lsp.estimate.estimator import (
    EstimateOptions,
    Progress,
    find_max_batch,
    prediction_from,
    run_harness,
)


def sweep(
    options: EstimateOptions, world_sizes: list[int], search: bool, progress: Progress | None = None
) -> dict[str, Any]:
    """{"world_sizes", "fewest_gpus", "runs": [{"world_size", "estimate", "max_batch"}]}."""
    rows: list[dict[str, Any]] = []
    if search:
        for size in world_sizes:
            if progress:
                progress(f"world size {size}: the largest batch per rank")
            outcome = find_max_batch(distributed.with_world_size(options, size), progress)
            rows.append(
                {"world_size": size, "estimate": outcome["estimate"], "max_batch": outcome["max_batch"]}
            )
    else:
        runs = [
            {
                "batch_size": options.batch_size,
                "distributed": distributed.launch(size, options.nproc_per_node),
            }
            for size in world_sizes
        ]
        for size, trace in zip(world_sizes, run_harness(options, runs)):
            sized = distributed.with_world_size(options, size)
            rows.append(
                {"world_size": size, "estimate": prediction_from(trace, sized, progress), "max_batch": None}
            )
    return {"world_sizes": world_sizes, "fewest_gpus": distributed.fewest_fitting(rows), "runs": rows}
