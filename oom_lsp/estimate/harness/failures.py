"""How a failed run is explained: the user's frames of the traceback, and
whether the failure is the script's or something fake tensors cannot run."""

from __future__ import annotations

import os
import traceback

from .common import is_harness_file


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


def classify_failure(error: BaseException) -> str:
    """ "data-dependent" and "unsupported-operator" are what fake tensors cannot
    run (the estimate falls back to real CPU steps); anything else is the script's."""
    from torch._subclasses import fake_tensor

    if isinstance(error, (fake_tensor.DynamicOutputShapeException, fake_tensor.DataDependentOutputException)):
        return "data-dependent"
    if isinstance(error, fake_tensor.UnsupportedOperatorException):
        return "unsupported-operator"
    if isinstance(error, (RuntimeError, NotImplementedError)) and any(
        marker.lower() in str(error).lower() for marker in _NO_FAKE_KERNEL
    ):
        return "unsupported-operator"
    return "script-error"
