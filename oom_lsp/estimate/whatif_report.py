"""The faces of the what-if (oom_lsp.estimate.whatif): its table for the terminal, and its record.

The record (`.oom_lsp_cache/what-if/<script>.json` in the project) keeps each change's
prediction, keyed by the script's text after the change: when a later estimate runs on exactly
that text (the user applied the fix, nothing else), it is compared with the prediction, and a
difference above 5 % is reported as a bug in the prediction."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any, TextIO

from oom_lsp.estimate.commands import EXIT_ERROR, EXIT_FITS, EXIT_OOM, failed
from oom_lsp.estimate.gpus import format_bytes

RECORD_FOLDER = Path(".oom_lsp_cache") / "what-if"
# Above this difference between a change's prediction and the estimate after the change, the
# prediction is wrong (the what-if and the estimate trace the same way: they should agree).
AGREEMENT = 0.05


def run_what_if(args: argparse.Namespace, options: Any, display: Any, out: TextIO, err: TextIO) -> int:
    from oom_lsp.checker import analyze_text, decode_source
    from oom_lsp.config import ConfigError, ConfigResolver
    from oom_lsp.estimate.estimator import EstimateError
    from oom_lsp.estimate.whatif import what_if

    script: Path = options.script
    decoded = decode_source(script.read_bytes())
    if decoded.text is None:
        line, column, message = decoded.problem
        err.write(f"oom-lsp estimate: {script}:{line}:{column + 1}: {message}\n")
        return EXIT_ERROR
    try:
        config = ConfigResolver().resolve(script)
        settings = config.settings_for(script)
    except ConfigError as error:
        err.write(f"oom-lsp estimate: {error}\n")
        return EXIT_ERROR
    findings = analyze_text(decoded.text, settings, str(script))
    try:
        with display:
            table = what_if(options, decoded.text, findings, settings, display.message, decoded.encoding)
    except EstimateError as error:
        return failed(args, str(error), out, err)
    save_record(config.root, table)
    if args.format == "json":
        out.write(json.dumps(table, indent=2) + "\n")
    else:
        write_table(table, out)
    return EXIT_OOM if table["baseline"]["verdict"] == "will run out of memory" else EXIT_FITS


def _signed(change: float, text: str) -> str:
    """A change with its sign: −38.0 % (a typographic minus, as the editor's titles show it)."""
    return ("−" if change < 0 else "+") + text if change else text


def percent_words(row: dict[str, Any]) -> str:
    return (
        _signed(-row["saving_bytes"], f"{abs(row['saving_percent']):.1f} %") if row["saving_bytes"] else "0 %"
    )


def delta_words(row: dict[str, Any]) -> str:
    return (
        _signed(-row["saving_bytes"], format_bytes(abs(row["saving_bytes"])))
        if row["saving_bytes"]
        else "0 B"
    )


def saving_words(row: dict[str, Any]) -> str:
    """What a code action's title carries: "−38.0 % peak (1.19 GiB → 642.00 MiB)"."""
    if row.get("error"):
        return "not measured"
    return f"{percent_words(row)} peak ({format_bytes(row['needed_bytes'] + row['saving_bytes'])} → " + (
        f"{format_bytes(row['needed_bytes'])})"
    )


def growth_words(base: dict[str, Any]) -> str | None:
    """ "grows 322.39 MiB at every step: out of memory after about 70 steps", for a baseline that grows."""
    if not base.get("growth_per_step"):
        return None
    after = f": out of memory after about {base['steps_to_oom']:,} steps" if base.get("steps_to_oom") else ""
    return f"grows {format_bytes(base['growth_per_step'])} at every step{after}"


def write_table(table: dict[str, Any], out: TextIO) -> None:
    base = table["baseline"]
    target = ""
    if table.get("gpu"):
        size = format_bytes(table["gpu_memory"])
        target = f", target {table['gpu']}" + ("" if size in table["gpu"] else f" ({size})")
    batch = table.get("batch_size")
    out.write(
        f"{_rel(table['script'])}: what if (batch size {batch if batch else 'as in the script'}, device "
        f"{table['device']}{target})\n"
    )
    verdict = f"   {base['verdict']}" if base.get("verdict") else ""
    out.write(f"  as it is: {format_bytes(base['needed_bytes'])}{verdict}\n")
    growth = growth_words(base)
    if growth:
        out.write(f"  and it {growth}\n")
    out.write("\n")
    rows = table["changes"]
    measured = [row for row in rows if not row.get("error")]
    if measured:
        width = min(_TITLE_WIDTH, max(len("change"), *(len(row["title"]) for row in measured)))
        fits = table.get("gpu_memory") is not None
        growth = bool(base.get("growth_per_step"))
        out.write(
            f"  {'change':<{width}}  {'peak':>11}  {'change in peak':>21}  "
            + (f"{'growth/step':>11}  " if growth else "")
            + (f"{'fits':<10}  " if fits else "")
            + "safety\n"
        )
        for row in measured:
            step = row.get("growth_per_step")
            out.write(
                f"  {_cut(row['title'], width):<{width}}  {format_bytes(row['needed_bytes']):>11}  "
                f"{delta_words(row) + ' ' + f'{percent_words(row):>8}':>21}  "
                + (f"{format_bytes(step) if step is not None else '?':>11}  " if growth else "")
                + (f"{fits_words(row, table):<10}  " if fits else "")
                + row["safety"]
                + (" (real CPU steps)" if row.get("fallback") else "")
                + "\n"
            )
    for row in rows:
        if row.get("error"):
            out.write(f"  {row['title']}: not measured: {row['error']}\n")
    knobs = [row for row in measured if row.get("code") is None]
    if knobs:
        out.write("\n  how:\n")
        for row in knobs:
            out.write(f"    {row['title']}: {row['how']}\n")
    if not rows:
        out.write("  no change applies to this script\n")
    out.writelines(
        f"  not applicable: {skipped['title']}: {skipped['why']}\n" for skipped in table["not_applicable"]
    )
    out.write(
        "  peak: what the estimate's verdict uses (reserved memory and the CUDA context on cuda), each change "
        "traced alone; changes that stop a growth at every step come first\n"
    )


_TITLE_WIDTH = 64


def _cut(title: str, width: int) -> str:
    return title if len(title) <= width else title[: width - 3] + "..."


def fits_words(row: dict[str, Any], table: dict[str, Any]) -> str:
    """yes, no, or for how many steps (a fit that still grows at every step runs out later)."""
    if not row["fits"]:
        return "no"
    growth = row.get("growth_per_step")
    if growth:
        steps = max(0, (table["gpu_memory"] - row["needed_bytes"]) // growth)
        return f"~{steps:,} step{'s' if steps != 1 else ''}"
    return "yes"


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def _record_path(root: Path, script: str) -> Path:
    name = hashlib.sha256(os.path.realpath(script).encode("utf-8")).hexdigest()[:16]
    return root / RECORD_FOLDER / f"{name}.json"


def save_record(root: Path, table: dict[str, Any]) -> None:
    """Kept for the next estimate's comparison; a read-only project only loses that."""
    from oom_lsp import safe_files

    path = _record_path(root, table["script"])
    try:  # nothing through a link out of the project (oom_lsp.safe_files)
        safe_files.make_folder(path.parent, root)
        safe_files.create_new(
            root / RECORD_FOLDER.parent / ".gitignore", "# Created by oom-lsp automatically.\n*\n", root=root
        )
        safe_files.write_file(path, json.dumps(table), root=root)
    except OSError:
        return


def load_record(root: Path, script: str) -> dict[str, Any] | None:
    try:
        record = json.loads(_record_path(root, script).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("changes"), list) else None


def compare_with_record(
    record: dict[str, Any],
    digest: str,
    batch_size: int | None,
    autocast_dtype: str | None,
    world_size: int | None,
    needed: int,
) -> dict[str, Any] | None:
    """The change the script now is (its text after the fix, or the --dtype of a knob, on the
    what-if's own text), and how the estimate compares with its prediction; None when the
    script is none of the record's changes."""
    base_batch = record.get("batch_option")
    base_dtype = record.get("autocast_option")
    if world_size != record.get("world_size_option"):
        return None
    for row in record["changes"]:
        if row.get("error") or "needed_bytes" not in row:
            continue
        if row.get("source_digest") is not None:
            matches = (
                row["source_digest"] == digest and batch_size == base_batch and autocast_dtype == base_dtype
            )
        elif row.get("autocast_dtype") and not row.get("batch_size"):
            matches = (
                record.get("source_digest") == digest
                and autocast_dtype == row["autocast_dtype"]
                and batch_size == base_batch
            )
        else:
            continue
        if not matches:
            continue
        predicted = row["needed_bytes"]
        difference = (needed - predicted) / predicted if predicted else 0.0
        return {
            "change": row["title"],
            "predicted_bytes": predicted,
            "estimated_bytes": needed,
            "difference_percent": round(100 * difference, 1),
            "agrees": abs(difference) <= AGREEMENT,
        }
    return None


def comparison_words(check: dict[str, Any]) -> str:
    predicted, estimated = format_bytes(check["predicted_bytes"]), format_bytes(check["estimated_bytes"])
    if check["agrees"]:
        return (
            f"what-if check: {check['change']}: predicted {predicted}, estimated now {estimated} "
            f"({check['difference_percent']:+.1f} %, within {AGREEMENT:.0%})"
        )
    return (
        f"what-if check: {check['change']}: predicted {predicted}, estimated now {estimated} "
        f"({check['difference_percent']:+.1f} %): the what-if's prediction is off by more than {AGREEMENT:.0%}, "
        "a bug in oom-lsp; please report it with this output"
    )
