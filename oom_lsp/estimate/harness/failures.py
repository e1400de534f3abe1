"""How a failed run is explained: the user's frames of the traceback, and
whether the failure is the script's or something fake tensors cannot run."""

from __future__ import annotations

import os
import traceback

import torch

from .common import is_harness_file

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# torch's own dispatch machinery: where an op's failure surfaces, not the call that made it.
_MACHINERY = tuple(
    _TORCH_DIR + part
    for part in (
        "_subclasses" + os.sep,
        "_ops.py",
        "_decomp" + os.sep,
        "_refs" + os.sep,
        "_prims" + os.sep,
        "_prims_common" + os.sep,
        "_meta_registrations.py",
        "_library" + os.sep,
        "overrides.py",
        "_compile.py",
        "_dynamo" + os.sep,
        "utils" + os.sep + "_python_dispatch.py",
        "utils" + os.sep + "_stats.py",
        "fx" + os.sep + "experimental" + os.sep,
    )
)


def user_frames(tb, script_dir: str) -> list[dict]:
    """The traceback's frames in the user's files (not runpy's, torch's or
    ours), outermost first."""
    frames = []
    for frame, lineno in traceback.walk_tb(tb):
        filename = frame.f_code.co_filename
        if filename.startswith(script_dir + os.sep) and not is_harness_file(filename):
            frames.append(
                {
                    "file": filename,
                    "line": lineno,
                    "function": frame.f_code.co_name,
                    "code": _source_line(filename, lineno),
                }
            )
    return frames


def library_frame(tb, script_dir: str) -> dict | None:
    """The innermost frame of the traceback outside the user's files, the harness and torch's
    dispatch machinery: the library line that failed (None when the failure is in the user's code).
    Its `file` is shortened to the path under its site-packages (or the standard library)."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        filename = frame.f_code.co_filename
        if is_harness_file(filename) or filename.startswith(_MACHINERY):
            continue
        if filename.startswith(script_dir + os.sep):
            found = None
            continue
        found = {
            "file": _short_path(filename),
            "line": lineno,
            "function": frame.f_code.co_name,
            "code": _source_line(filename, lineno),
        }
    return found


def _short_path(filename: str) -> str:
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _source_line(filename: str, lineno: int) -> str:
    try:
        with open(filename, encoding="utf-8") as handle:
            for number, text in enumerate(handle, 1):
                if number == lineno:
                    return text.strip()
    except OSError:
        return ""
    return ""


_NO_FAKE_KERNEL = (
    "no fake impl",
    "'Meta' backend",
    "meta kernel",
    "meta function",
    "FakeTensor",
    "fake tensor",
)


def classify_failure(error: BaseException, data_dependent_reads: int = 0) -> str:
    """ "data-dependent" and "unsupported-operator" are what fake tensors cannot
    run (the estimate falls back to real CPU steps); "after-data-dependent-reads", a failure
    of a fake run that had answered values only a real run knows (0/False, zero arrays), which
    may have caused it (so real CPU steps too); anything else is the script's."""
    from torch._subclasses import fake_tensor

    if isinstance(error, (fake_tensor.DynamicOutputShapeException, fake_tensor.DataDependentOutputException)):
        return "data-dependent"
    if isinstance(error, fake_tensor.UnsupportedOperatorException):
        return "unsupported-operator"
    if isinstance(error, (RuntimeError, NotImplementedError)) and any(
        marker.lower() in str(error).lower() for marker in _NO_FAKE_KERNEL
    ):
        return "unsupported-operator"
    if data_dependent_reads:
        return "after-data-dependent-reads"
    return "script-error"
