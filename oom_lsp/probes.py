"""Questions asked of the user's interpreter (`python -c CODE`): its torch, CUDA and GPU
for a prompt, accelerate's launch variables for a distributed estimate.

`python -c` puts the current folder first on `sys.path`, so a `json.py`, `platform.py` or
`torch.py` of the project opened (a cloned repository) would be imported by the probe, and
a `sitecustomize.py` there by some setups: code nobody asked to run. A probe therefore runs
from an empty folder of its own. It keeps the environment (PYTHONPATH, the user's site
packages), where the user's torch may be found; `-I` would drop them.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence


def run_probe(
    python: str, code: str, args: Sequence[str] = (), *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python -c code args` from an empty folder; raises OSError or TimeoutExpired as
    subprocess.run does. File arguments must be absolute; an interpreter given by a
    relative path (`./venv/bin/python`) is found from the current folder, as typed."""
    if os.sep in python and not os.path.isabs(python):
        python = os.path.abspath(python)
    with tempfile.TemporaryDirectory(prefix="oom-lsp-probe-") as neutral:
        return subprocess.run(
            [python, "-c", code, *args],
            cwd=neutral,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
