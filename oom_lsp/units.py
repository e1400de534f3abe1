"""Sizes and percentages as every face prints them: the CLI, the editor and the runtime guard.

One formatter, so that one number reads the same wherever it is shown. Binary units, as
PyTorch and nvidia-smi print them:

- `format_bytes(1610612736)` -> "1.50 GiB": two decimals, for reports and tables (PyTorch's
  own OOM messages print sizes this way);
- `format_bytes(1610612736, short=True)` (or `short_bytes`) -> "1.5 GiB", "24 GiB": one decimal,
  none when it is .0, where a line must stay short (an inlay hint, a diagnostic's message, a title);
- sizes under 1 KiB in bytes: "512 bytes".

Percentages: `format_percent(38.04)` -> "38.0 %"; `signed=True` gives every change its sign
("−38.0 %", "+2.5 %", with a typographic minus as the editor's titles show it).

Pure Python: the harness-free parts of every package import it, and so does the runtime
guard inside the user's training process.
"""

from __future__ import annotations

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
MINUS = "−"  # U+2212: a change's sign, as the editor's titles show it


def format_bytes(size: float | None, *, short: bool = False) -> str:
    """A size in binary units: "1.50 GiB" (short: "1.5 GiB"), "512 bytes"; "?" for an unknown one."""
    if size is None:
        return "?"
    sign = "-" if size < 0 else ""
    value = abs(size)
    for unit, scale in _UNITS:
        if value >= scale:
            number = f"{value / scale:.1f}".removesuffix(".0") if short else f"{value / scale:.2f}"
            return f"{sign}{number} {unit}"
    return f"{sign}{int(value)} bytes"


def short_bytes(size: float | None) -> str:
    """`format_bytes(size, short=True)`: "1.5 GiB", "24 GiB"."""
    return format_bytes(size, short=True)


def format_percent(percent: float, *, signed: bool = False, digits: int = 1) -> str:
    """`percent` (38.04 for 38 %) as "38.0 %"; signed: "−38.0 %", "+38.0 %", "0 %" for no change."""
    text = f"{abs(percent) if signed else percent:.{digits}f} %"
    if not signed:
        return text
    if round(percent, digits) == 0:
        return "0 %"
    return (MINUS if percent < 0 else "+") + text


def signed_bytes(change: int, *, short: bool = False) -> str:
    """A change of size with its sign: "−1.19 GiB", "+20.00 MiB", "0 bytes"."""
    if not change:
        return format_bytes(0)
    return (MINUS if change < 0 else "+") + format_bytes(abs(change), short=short)


def share(part: float, whole: float) -> float:
    """`part` as a percentage of `whole` (0 when there is no whole)."""
    return 100 * part / whole if whole else 0.0
