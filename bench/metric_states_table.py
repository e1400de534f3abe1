"""Regenerate `oom_lsp/analysis/facts/metric_states_table.py`: which torchmetrics classes keep every
update's inputs, MEASURED by building each class and reading its registered states.

A torchmetrics `Metric` declares its states with `add_state(name, default, ...)`. A state whose default
is a list is appended to by every `update()` (the predictions and targets an AUROC, a curve, a rank
correlation or a retrieval metric needs all of at `compute()` time); a tensor state is summed into and
keeps its size. This script imports every module of torchmetrics, builds every public `Metric` class
with the first argument set that works (none; `task="binary"`; `num_classes=3`; `num_labels=3`), and
records the classes with a list state, with the constructor arguments that turn those states into
tensors of a fixed size (`thresholds=` of the curve family, binned), found by building them again with
the argument set.

    python bench/metric_states_table.py [--check]

It needs torchmetrics (and torch) in the interpreter that runs it; the analyzer only reads the table.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import pprint
import sys
import warnings
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "oom_lsp" / "analysis" / "facts" / "metric_states_table.py"
ARGUMENT_SETS = ({}, {"task": "binary"}, {"num_classes": 3}, {"num_labels": 3}, {"task": "multiclass", "num_classes": 3})
# Arguments that may bound a growing metric, tried one at a time with a value that means "bounded".
BOUNDING = {"thresholds": 10}


def measure() -> tuple[str, dict[str, list[str]]]:
    warnings.filterwarnings("ignore")
    import torchmetrics
    from torchmetrics import Metric

    classes: dict[str, type] = {}
    for info in pkgutil.walk_packages(torchmetrics.__path__, "torchmetrics."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional dependency missing: its metrics are not in the table
            continue
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, Metric) and not name.startswith("_")
                    and value.__module__.startswith("torchmetrics.")):
                classes.setdefault(name, value)

    def lists_of(cls: type, extra: dict) -> list[str] | None:
        for arguments in ARGUMENT_SETS:
            try:
                metric = cls(**arguments, **extra)
            except Exception:
                continue
            return sorted(name for name, default in metric._defaults.items() if isinstance(default, list))
        return None

    growing: dict[str, list[str]] = {}
    for name, cls in sorted(classes.items()):
        lists = lists_of(cls, {})
        if not lists:
            continue
        bounded_by = [argument for argument, value in BOUNDING.items() if lists_of(cls, {argument: value}) == []]
        growing[name] = bounded_by
    return torchmetrics.__version__, growing


def render(version: str, growing: dict[str, list[str]]) -> str:
    return (
        '"""torchmetrics classes whose states grow with every update, measured by bench/metric_states_table.py:\n'
        "generated, do not edit.\n\n"
        f"Measured with torchmetrics {version}: class name -> the constructor arguments that bound its states.\n"
        '"""\n\n'
        "# fmt: off\n"
        f"VERSION = {version!r}\n"
        f"GROWING = {pprint.pformat({k: tuple(v) for k, v in growing.items()}, width=110)}\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed table, write nothing")
    options = parser.parse_args()
    version, growing = measure()
    text = render(version, growing)
    print(f"torchmetrics {version}: {len(growing)} classes keep every update's inputs")
    if options.check:
        same = TABLE.exists() and TABLE.read_text(encoding="utf-8") == text
        print("the committed table is up to date" if same else "the committed table differs")
        return 0 if same else 1
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
