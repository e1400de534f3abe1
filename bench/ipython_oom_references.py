"""What keeps a failed training step's tensors alive in a Jupyter kernel, and
which cleanup frees them: measured in real IPython kernels (jupyter_client +
ipykernel), one fresh kernel per scenario. Prints a table; asserts nothing.

The failing step dies the way a CUDA OOM does, inside an operator's allocation
(here the CPU allocator, asked for 2**50 floats; the references involved are the
same on any device: a tensor's memory returns to the caching allocator when its
last reference goes). Each tensor the forward pass makes is tagged by step in a
WeakValueDictionary; after the failure the next cell collects garbage and lists
the tags still alive.

    pip install ipykernel jupyter_client   # into the interpreter that runs this
    python bench/ipython_oom_references.py
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from jupyter_client.manager import start_new_kernel

from oom_lsp.fixes.notebook import FREE_FAILED_CELL

SETUP = textwrap.dedent(
    """
    import gc, sys, traceback, weakref
    import torch
    alive = weakref.WeakValueDictionary()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(256, 256)

        def forward(self, x, step):
            hidden = self.layer(x)
            alive[f"step{step}.hidden"] = hidden
            if x.shape[0] > 100:
                torch.empty(2**50)  # the allocation that fails, as a CUDA OOM does
            return torch.relu(hidden)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    """
)

# A notebook's training cell: a module-level loop; the third batch is too big.
TRAIN_CELL = textwrap.dedent(
    """
    for step in range(3):
        x = torch.randn(64 if step < 2 else 128, 256)
        out = model(x, step)
        loss = out.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
)

# The same loop in a function, as in notebooks that define `train()`.
TRAIN_FUNCTION = textwrap.dedent(
    """
    def train():
        for step in range(3):
            x = torch.randn(64 if step < 2 else 128, 256)
            out = model(x, step)
            loss = out.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    train()
    """
)

FREE_FAILED = textwrap.dedent(
    """
    def free_failed_frames(error):
        # The frames of a failed step hold its tensors in their locals; IPython keeps
        # the traceback (sys.last_traceback, the cell's result) and, having shown it,
        # each frame's locals as a dict that frame.clear() leaves alive (CPython < 3.13).
        while error is not None:
            tb = error.__traceback__
            while tb is not None:
                if tb.tb_frame.f_locals is not tb.tb_frame.f_globals:  # never the notebook's namespace
                    tb.tb_frame.f_locals.clear()
                tb = tb.tb_next
            traceback.clear_frames(error.__traceback__)
            error = error.__cause__ or error.__context__
        gc.collect()
    """
)

HOOK = FREE_FAILED + textwrap.dedent(
    """
    get_ipython().events.register("post_run_cell", lambda result: free_failed_frames(result.error_in_exec))
    """
)

CLEAR_FRAMES_ONLY = "traceback.clear_frames(sys.last_traceback)\ngc.collect()"
CLEAR_AT_START = FREE_FAILED + "free_failed_frames(getattr(sys, 'last_value', None))\n"
# OOM701's fix, as it inserts it at the top of the training cell.
OOM701_FIX = "\n".join(FREE_FAILED_CELL) + "\n"

REPORT = "gc.collect(); print(sorted(k for k in alive if k.startswith('step2')))"

SCENARIOS: list[tuple[str, list[str]]] = [
    ("nothing (the loop at module level)", [SETUP, TRAIN_CELL]),
    ("nothing (the loop in a function)", [SETUP, TRAIN_FUNCTION]),
    ("%xmode Minimal before training", [SETUP, "%xmode Minimal", TRAIN_FUNCTION]),
    ("gc.collect() after the failure", [SETUP, TRAIN_FUNCTION, "gc.collect()"]),
    ("torch.cuda.empty_cache() after the failure", [SETUP, TRAIN_FUNCTION, "torch.cuda.empty_cache()"]),
    (
        "sys.last_type/value/traceback = None + gc.collect()",
        [SETUP, TRAIN_FUNCTION, "sys.last_type = sys.last_value = sys.last_traceback = None\ngc.collect()"],
    ),
    ("traceback.clear_frames(sys.last_traceback) + gc.collect()", [SETUP, TRAIN_FUNCTION, CLEAR_FRAMES_ONLY]),
    ("free_failed_frames(sys.last_value): locals cleared too", [SETUP, TRAIN_FUNCTION, CLEAR_AT_START]),
    ("post_run_cell hook clearing the failed cell's frames", [SETUP, HOOK, TRAIN_FUNCTION]),
    ("post_run_cell hook, loop at module level", [SETUP, HOOK, TRAIN_CELL]),
    ("OOM701's fix at the top of the training cell, as it re-runs", [SETUP, OOM701_FIX + TRAIN_FUNCTION, OOM701_FIX]),
    ("OOM701's fix, loop at module level", [SETUP, OOM701_FIX + TRAIN_CELL, OOM701_FIX]),
]

# OOM703: the model cell run again while the optimizer of a later cell holds the old parameters.
MODEL_SETUP = "import gc, weakref\nimport torch\nparameters = weakref.WeakSet()\n"
MODEL_CELL = "model = torch.nn.Linear(1024, 1024)\nparameters.update(model.parameters())\n"
OPTIMIZER_CELL = "optimizer = torch.optim.Adam(model.parameters())\n"
MODEL_REPORT = "gc.collect(); print(len(parameters))"
MODEL_SCENARIOS: list[tuple[str, list[str]]] = [
    ("model cell run again", [MODEL_SETUP, MODEL_CELL, OPTIMIZER_CELL, MODEL_CELL]),
    (
        "model cell run again with OOM703's fix",
        [MODEL_SETUP, "model = optimizer = None\n" + MODEL_CELL, OPTIMIZER_CELL, "model = optimizer = None\n" + MODEL_CELL],
    ),
]

# Out[n]: a graph-carrying tensor as a cell's last expression.
OUT_SETUP = SETUP + "\nkept = weakref.WeakValueDictionary()\n"
OUT_CELL = "result = model(torch.randn(64, 256), 0)\nkept['result'] = result\nresult"
OUT_REPORT = "del result\ngc.collect(); print(sorted(kept))"
OUT_SCENARIOS: list[tuple[str, list[str]]] = [
    ("last expression displayed, then `del result`", [OUT_SETUP, OUT_CELL]),
    ("last expression with a trailing `;`", [OUT_SETUP, OUT_CELL + ";"]),
    ("last expression `.detach()`ed", [OUT_SETUP, OUT_CELL + ".detach()"]),
    ("displayed, then `%reset -f out`", [OUT_SETUP, OUT_CELL, "%reset -f out"]),
]


def run(cells: list[str], report: str) -> tuple[str, list[str]]:
    manager, client = start_new_kernel(kernel_name="python3", stderr=subprocess.DEVNULL)
    errors: list[str] = []
    printed: list[str] = []

    def hook(message: dict) -> None:
        content = message["content"]
        if message["msg_type"] == "error":
            errors.append(f"{content['ename']}: {content['evalue'][:60]}")
        elif message["msg_type"] == "stream":
            printed.append(content["text"].strip())

    try:
        for cell in cells:
            client.execute_interactive(cell, output_hook=hook, timeout=120)
        printed.clear()
        client.execute_interactive(report, output_hook=hook, timeout=120)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    return (printed[-1] if printed else "?"), errors


def main() -> int:
    import IPython
    import ipykernel

    print(f"Python {sys.version.split()[0]}, IPython {IPython.__version__}, ipykernel {ipykernel.__version__}")
    print("\nTensors of the failed step (step 2) still alive in the next cell:")
    for name, cells in SCENARIOS:
        alive, errors = run(cells, REPORT)
        print(f"  {name:60} {alive:22} ({errors[0] if errors else 'no error'})")
    print("\nParameters alive after the model cell ran twice (one model: 2):")
    for name, cells in MODEL_SCENARIOS:
        alive, _ = run(cells, MODEL_REPORT)
        print(f"  {name:60} {alive}")
    print("\nA forward pass's output shown by a cell, after `del result` and gc.collect():")
    for name, cells in OUT_SCENARIOS:
        alive, _ = run(cells, OUT_REPORT)
        print(f"  {name:60} {alive}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
