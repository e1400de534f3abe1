"""The what-if's table for the terminal (`oom-lsp estimate --what-if`; oom_lsp.usecases.what_if
runs it, oom_lsp.cli.estimate prints this or its JSON; the editor's page says the same in Markdown)."""

from __future__ import annotations

import os
from typing import TextIO

from oom_lsp.estimate.results import WhatIfTable
from oom_lsp.estimate.wording import (
    NEEDED_PEAK,
    allocated_words,
    delta_words,
    fits_words,
    growth_words,
    percent_words,
)
from oom_lsp.units import format_bytes


def write_table(table: WhatIfTable, out: TextIO) -> None:
    base = table.baseline
    target = ""
    if table.gpu and table.gpu_memory is not None:
        size = format_bytes(table.gpu_memory)
        target = f", target {table.gpu}" + ("" if size in table.gpu else f" ({size})")
    batch = table.batch_size
    out.write(
        f"{_rel(table.script)}: what if (batch size {batch if batch else 'as in the script'}, device "
        f"{table.device}{target})\n"
    )
    verdict = f"   {base.verdict.value}" if base.verdict else ""
    out.write(f"  as it is: {format_bytes(base.needed_bytes)}{allocated_words(base)}{verdict}\n")
    growth = growth_words(base)
    if growth:
        out.write(f"  and it {growth}\n")
    out.write("\n")
    rows = table.changes
    measured = [row for row in rows if row.measured]
    if measured:
        width = min(_TITLE_WIDTH, max(len("change"), *(len(row.title) for row in measured)))
        fits = table.gpu_memory is not None
        grows = bool(base.growth_per_step)
        out.write(
            f"  {'change':<{width}}  {'peak':>11}  {'change in peak':>21}  "
            + (f"{'growth/step':>11}  " if grows else "")
            + (f"{'fits':<10}  " if fits else "")
            + "safety\n"
        )
        for row in measured:
            step = row.growth_per_step
            out.write(
                f"  {_cut(row.title, width):<{width}}  {format_bytes(row.needed_bytes):>11}  "
                f"{delta_words(row) + ' ' + f'{percent_words(row):>8}':>21}  "
                + (f"{format_bytes(step) if step is not None else '?':>11}  " if grows else "")
                + (f"{fits_words(row, table):<10}  " if fits else "")
                + row.safety
                + (" (real CPU steps)" if row.fallback else "")
                + "\n"
            )
    for row in rows:
        if not row.measured:
            out.write(f"  {row.title}: not measured: {row.error}\n")
    knobs = [row for row in measured if row.code is None]
    if knobs:
        out.write("\n  how:\n")
        for row in knobs:
            out.write(f"    {row.title}: {row.how}\n")
    if not rows:
        out.write("  no change applies to this script\n")
    out.writelines(f"  not applicable: {skipped.title}: {skipped.why}\n" for skipped in table.not_applicable)
    out.write(
        f"  peak: {NEEDED_PEAK}, each change traced alone; changes that stop a growth at every step "
        "come first\n"
    )


_TITLE_WIDTH = 64


def _cut(title: str, width: int) -> str:
    return title if len(title) <= width else title[: width - 3] + "..."


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path
