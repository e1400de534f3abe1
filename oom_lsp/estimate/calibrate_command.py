"""`oom-lsp calibrate`: measure this machine's CUDA terms once and keep them for its estimates.

    oom-lsp calibrate [--python PATH] [--dry-run] [--show] [--format text|json]

Exit codes: 0 measured and stored (or shown, or a dry run), 2 no CUDA device in that interpreter
(CPU-only machines keep the built-in tables), no torch there, or the measuring script failed.
No torch import here: the measuring script runs under --python (calibration.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

EXIT_DONE, EXIT_ERROR = 0, 2


def add_parsers(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine's GPU (CUDA context, cuBLAS workspace, allocator) for later estimates",
        description="Run a tiny training step on this machine's GPU and store what the estimate would otherwise "
        "take from tables: the CUDA context, the cuBLAS workspace and the caching allocator's segments. "
        "Estimates whose target is this GPU use them.",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch and GPU to measure")
    parser.add_argument(
        "--dry-run", action="store_true", help="run the measuring script on the CPU: measures nothing, stores nothing"
    )
    parser.add_argument("--show", action="store_true", help="print the stored calibrations and stop")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(handler=run_calibrate)


def run_calibrate(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from oom_lsp.estimate.calibration import CalibrationError, calibration_file, describe, load, run_probe, store

    out = out or sys.stdout
    err = err or sys.stderr
    path = calibration_file()
    if args.show:
        try:
            entries = load(path)
        except CalibrationError as error:
            err.write(f"oom-lsp calibrate: {error}\n")
            return EXIT_ERROR
        if args.format == "json":
            out.write(json.dumps({"file": str(path), "gpus": entries}, indent=1) + "\n")
        elif not entries:
            out.write(f"no calibration stored ({path} does not exist); estimates use the built-in tables\n")
        else:
            out.write(f"{path}:\n")
            for entry in entries:
                out.write("\n".join("  " + line for line in describe(entry)) + "\n\n")
        return EXIT_DONE
    try:
        entry = run_probe(args.python, args.dry_run)
    except CalibrationError as error:
        if args.format == "json":
            out.write(json.dumps({"error": str(error)}) + "\n")
        err.write(f"oom-lsp calibrate: {error}\n")
        return EXIT_ERROR
    stored = None if args.dry_run else store(entry, path)
    if args.format == "json":
        out.write(json.dumps({"calibration": entry, "stored": str(stored) if stored else None}, indent=1) + "\n")
        return EXIT_DONE
    for line in describe(entry):
        out.write(line + "\n")
    if stored is None:
        out.write("dry run on the CPU: every step of the measuring script ran; nothing measured, nothing stored\n")
    else:
        out.write(f"stored in {stored}; estimates whose target is this GPU use it (oom-lsp calibrate --show)\n")
    return EXIT_DONE
