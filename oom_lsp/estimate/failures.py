"""Values only a real run knows, and how a failed fake run is told to the user (parent side, no
torch): what the trace answered in their place (the `data-dependent-values` note), the library
line that failed beside the script's own, and, when such values may have caused the failure,
what the estimate does about it (real CPU steps). The harness's `branches.py`, `values.py` and
`failures.py` gather the facts."""

from __future__ import annotations

from typing import Any

# Failures the estimate answers with real CPU steps instead of a fake run.
REAL_STEP_KINDS = ("data-dependent", "unsupported-operator", "after-data-dependent-reads")


def library_line(failure: dict[str, Any]) -> str | None:
    """`raised in transformers/modeling_utils.py:507, in remove_tied_weights_from_state_dict`."""
    library = failure.get("library")
    if not library:
        return None
    return f"raised in {library['file']}:{library['line']}, in {library['function']}"


def data_dependent_hint(failure: dict[str, Any], place) -> str | None:
    """For a failure that values only a real run knows decided: why, and the fallback."""
    kind = failure.get("kind")
    if kind == "after-data-dependent-reads":
        last = failure.get("last_data_dependent_read")
        where = f" (the last at {place(last[0], last[1])})" if last else ""
        return (
            f"the fake run had answered {failure.get('data_dependent_reads')} value read(s) only a real run "
            f"knows with 0/False or zeros{where}, which may have caused this; a plain `oom-lsp estimate` "
            "measures real CPU steps instead"
        )
    if kind == "data-dependent":
        return (
            "a shape or value only a real run knows decided this; a plain `oom-lsp estimate` measures "
            "real CPU steps instead"
        )
    return None


def fallback_reason(failure: dict[str, Any], place) -> str:
    """Why the estimate measured real CPU steps, in one line."""
    where = failure.get("where") or {}
    what = (
        f"{failure.get('type')} at {place(where.get('file'), where.get('line'))} ({where.get('code', '')}): "
        f"{failure.get('message')}"
        if where
        else f"{failure.get('type')}: {failure.get('message')}"
    )
    library = library_line(failure)
    if library:
        what += f" ({library})"
    if failure.get("kind") == "after-data-dependent-reads":
        last = failure.get("last_data_dependent_read")
        at = f", the last at {place(last[0], last[1])}" if last else ""
        return (
            f"the fake run failed after answering {failure.get('data_dependent_reads')} value read(s) only a "
            f"real run knows with 0/False or zeros{at}: {what}"
        )
    return what


def value_notes(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The `data-dependent-values` correction: what the fake run answered for values it has not."""
    parts = []
    if trace.get("checks_passed"):
        parts.append(
            f"{trace['checks_passed']} truth test(s) one of whose outcomes raises at once (assert, "
            "if ...: raise) took the other, as a run that reaches its second step does"
        )
    if trace.get("stubbed_scalars"):
        parts.append(
            f"{trace['stubbed_scalars']} read(s) of a value only a real run knows (.item(), if tensor:) "
            "were answered 0/False"
        )
    if trace.get("value_arrays"):
        parts.append(
            f"{trace['value_arrays']} array(s) read by .numpy() were zeros of the tensor's shape and dtype "
            "(the NumPy/SciPy code after them ran on those)"
        )
    if not parts:
        return []
    return [{"name": "data-dependent-values", "detail": "; ".join(parts)}]
