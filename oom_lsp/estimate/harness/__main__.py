"""Starts the estimate harness in the user's interpreter: run by path,

    <python> .../oom_lsp/estimate/harness/__main__.py --request request.json [--progress-fd N]

never with `-m`, which would import oom_lsp (the user's interpreter need not have it). Python put
this folder first on sys.path; it is taken off, and the folder is loaded as a package under a
private name, so that its modules neither shadow nor are shadowed by the user's (a `tracker.py`
next to train.py). Standard library only until torch is known to import.
"""

import importlib.util
import os
import sys
import warnings

PACKAGE = "_oom_lsp_estimate_harness"
NO_TORCH_EXIT = 3  # what oom_lsp.profiling.runner reads as "this interpreter has no torch"


def _load_package(folder: str):
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return package


def _launch() -> int:
    folder = os.path.dirname(os.path.realpath(__file__))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == folder:
        del sys.path[0]
    # torch warns at import when NumPy is not installed; that is the environment, not the script.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write(f"oom-lsp estimate: {sys.executable} cannot import torch\n")
        return NO_TORCH_EXIT
    _load_package(folder)
    runner = importlib.import_module(f"{PACKAGE}.runner")
    return runner.main()


if __name__ == "__main__":
    sys.exit(_launch())
