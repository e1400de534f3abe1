"""`oom-lsp.whatIf` in the editor: the what-if of a file (oom_lsp.estimate.whatif: the step traced
as it is, then once per quick fix of its findings and per knob), run from the "What if…" lens
next to "Estimate peak memory".

The table is written as Markdown to `.oom_lsp/what-if/<script>.md` and shown with
`window/showDocument` (the VS Code extension opens it as a Markdown preview; Neovim opens the
buffer). Its record is saved where `oom-lsp estimate --what-if` saves it, so the next estimate,
in the editor or the terminal, compares itself with the prediction (server/estimate.py).

While the table holds for the document's text (until its first edit, like an estimate's
results: profiling.current_results), each quick fix with a measured row carries its saving in
its title, "oom-lsp (OOM201): Wrap … in `torch.autocast` (bfloat16), −19.9 % peak (1.19 GiB →
976.00 MiB)", and the fix-all carries the saving of all safe fixes together. The titles are in
the codeAction answer (VS Code does not redraw a title changed by codeAction/resolve); the
edits stay lazy where they were.

The what-if runs only when asked: it traces the script once per change (half a minute for
the fixtures' five to seventeen changes on a CPU, minutes for a real model), too long to add
to every estimate.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import from_fs_path
from pygls.workspace import TextDocument

from oom_lsp.analysis import Finding, default_settings
from oom_lsp.checker import analyze_text, decode_source
from oom_lsp.estimate.commands import what_if_check
from oom_lsp.estimate.estimator import EstimateError, EstimateOptions, estimate
from oom_lsp.estimate.gpus import format_bytes
from oom_lsp.estimate.whatif import fix_key, source_digest, what_if
from oom_lsp.estimate.whatif_report import (
    comparison_words,
    delta_words,
    fits_words,
    growth_words,
    percent_words,
    save_record,
    saving_words,
)
from oom_lsp.server import code_actions
from oom_lsp.server.estimate import (
    EstimateArgs,
    FollowUp,
    add_follow_up,
    check_trace_args,
    file_options,
    target_gpu,
)
from oom_lsp.server.profiling import (
    FileResult,
    Job,
    current_results,
    document_version,
    require_trusted_workspace,
    script_of,
    store_result,
    write_result,
)
from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer

logger = logging.getLogger(__name__)

WHAT_IF_COMMAND = "oom-lsp.whatIf"
KIND = "what-if"
SHOW_TIMEOUT_S = 10.0
# The fix-all applies the safe fixes, as `oom-lsp check --fix`: the what-if's row of those.
FIX_ALL_ROW = "fixes:safe"


async def what_if_command(ls: OomLanguageServer, args: EstimateArgs) -> dict[str, Any]:
    require_trusted_workspace(ls, "the what-if")
    check_trace_args(args)
    if args.find_max_batch:
        raise JsonRpcInvalidParams(
            "findMaxBatch is the estimate's: the what-if traces the batch size as it is"
        )
    script = script_of(args.uri)
    if script.suffix != ".py":
        raise JsonRpcInvalidParams(f"{script.name}: the what-if runs Python scripts (.py)")
    decoded = decode_source(script.read_bytes())
    if decoded.text is None:
        line, column, message = decoded.problem
        raise RequestFailed(f"{script.name}:{line}:{column + 1}: {message}")
    text = decoded.text
    document = ls.open_document(args.uri)
    if document is not None and document.source != text:
        raise RequestFailed(f"{script.name} has unsaved changes: save it first (the what-if runs the file)")
    version = document_version(ls, args.uri)
    gpu = target_gpu(ls, args, script)
    # Before the first await: the job watches the request being answered for its cancellation.
    job = Job(ls, f"What if: {script.name}", KIND, script)
    options = file_options(ls, args, script, gpu, job)
    findings = await _findings(ls, args.uri, document, text, script)
    # An excluded file has no findings; the knobs are still measured.
    settings = ls.settings_for_uri(args.uri) or default_settings()
    traces = [0]

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "run-start":
            traces[0] += 1
            job.report(f"trace {traces[0]}: running the script")

    options.on_event = on_event

    def work() -> dict[str, Any]:
        return what_if(
            options, text, findings, settings, lambda message: job.report(message), decoded.encoding
        )

    try:
        table = await job.run(work)
    except EstimateError as error:
        raise RequestFailed(f"the what-if failed: {error}") from None
    save_record(ls.lint_settings.project_config(script).root, table)
    markdown_path = write_result(ls, script, KIND, f"{script.stem}.md", table_markdown(table, script.name))
    store_result(
        ls,
        args.uri,
        FileResult(kind=KIND, report_path=str(markdown_path), version=version, details={"table": table}),
    )
    shown = await _show(ls, markdown_path)
    rows = table["changes"]
    return {
        "markdownPath": str(markdown_path),
        "shown": shown,
        "neededBytes": table["baseline"]["needed_bytes"],
        "changes": [
            {
                "key": row["key"],
                "title": row["title"],
                "neededBytes": row.get("needed_bytes"),
                "savingPercent": row.get("saving_percent"),
                "error": row.get("error"),
            }
            for row in rows
        ],
        "notApplicable": table["not_applicable"],
    }


async def _findings(
    ls: OomLanguageServer, uri: str, document: TextDocument | None, text: str, script: Path
) -> list[Finding]:
    """The findings whose fixes the what-if measures: those the diagnostics carry (the open
    document's analysis), so a quick fix finds its row."""
    if document is not None:
        return (await ls.analysis_of(document)).findings
    settings = ls.settings_for_uri(uri)
    if settings is None:
        return []
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(ls.analysis_executor, analyze_text, text, settings, str(script))


async def _show(ls: OomLanguageServer, markdown_path: Path) -> bool:
    """The table in the editor: window/showDocument where the client has it, else a message
    naming the file."""
    if ls.client_supports("window.show_document.support"):
        params = types.ShowDocumentParams(uri=from_fs_path(str(markdown_path)), take_focus=True)
        try:
            answer = await asyncio.wait_for(ls.window_show_document_async(params), SHOW_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning("The client did not answer window/showDocument for %s", markdown_path)
            return False
        if answer is not None and answer.success:
            return True
    ls.window_show_message(
        types.ShowMessageParams(type=types.MessageType.Info, message=f"oom-lsp: what if: {markdown_path}")
    )
    return False


# --- the estimate after a fix ------------------------------------------------------------


def _compare_with_prediction(
    options: EstimateOptions, prediction: dict[str, Any], searched: bool, job: Job
) -> dict[str, Any] | None:
    """The CLI's comparison with a what-if's prediction for exactly this text of the script (the
    user applied one of its changes). The search's first trace is not the estimate's worst case:
    when the text is one the what-if predicted, the plain estimate runs too, like with like."""
    check = what_if_check(options.script, options, prediction)
    if check is not None and searched:
        job.report(f"comparing with the what-if's prediction for {check['change']}", 90)
        check = what_if_check(options.script, options, estimate(options))
    return check


def _report_comparison(ls: OomLanguageServer, check: dict[str, Any]) -> dict[str, Any]:
    """Within 5 %: a line in the log (and the result); beyond: a warning, it is oom-lsp's bug."""
    words = comparison_words(check)
    if check["agrees"]:
        ls.window_log_message(
            types.LogMessageParams(type=types.MessageType.Info, message=f"oom-lsp: {words}")
        )
    else:
        ls.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Warning, message=f"oom-lsp: {words}")
        )
    return {
        "change": check["change"],
        "predictedBytes": check["predicted_bytes"],
        "estimatedBytes": check["estimated_bytes"],
        "differencePercent": check["difference_percent"],
        "agrees": check["agrees"],
        "message": words,
    }


# --- the titles ------------------------------------------------------------------------


def saving_note(ls: OomLanguageServer, document: TextDocument, finding: Finding | None) -> str | None:
    """The measured saving a fix's title carries, while the table holds for this text."""
    result = current_results(ls, document.uri).get(KIND)
    if result is None:
        return None
    table = result.details["table"]
    if table["source_digest"] != source_digest(document.source):
        return None  # measured on the file, which the open document no longer is
    key = FIX_ALL_ROW if finding is None else fix_key(finding)
    row = next((row for row in table["changes"] if row["key"] == key), None)
    if row is None or row.get("error"):
        return None
    return saving_words(row)


# --- the markdown ------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: dict[str, Any], name: str) -> str:
    """The what-if as a Markdown page: the baseline, a row per change, what was not measured or
    does not apply, and how each change is made."""
    base = table["baseline"]
    batch = table.get("batch_size")
    target = ""
    if table.get("gpu"):
        target = f", target {table['gpu']} ({format_bytes(table['gpu_memory'])})"
    lines = [
        f"# What if: {name}",
        "",
        (
            f"Batch size {batch if batch else 'as in the script'}, device {table['device']}{target}. "
            "Each change traced alone on fake tensors (no GPU), with the estimate's settings."
        ),
        "",
        f"**As it is: {format_bytes(base['needed_bytes'])} peak**"
        + (f", {base['verdict']}" if base.get("verdict") else "")
        + ".",
    ]
    growth = growth_words(base)
    if growth:
        lines.append(f"It {growth}.")
    lines.append("")
    rows = table["changes"]
    measured = [row for row in rows if not row.get("error")]
    fits = table.get("gpu_memory") is not None
    if measured:
        lines += [
            "| change | peak | change in peak | growth/step | fits | safety |",
            "| --- | ---: | ---: | ---: | :---: | --- |",
        ]
        for row in measured:
            step = row.get("growth_per_step")
            growth = "—" if step is None else format_bytes(step)
            if row.get("stops_growth"):
                growth += " (stops the growth)"
            fit = fits_words(row, table) if fits else "—"
            safety = row["safety"] + (" (real CPU steps)" if row.get("fallback") else "")
            lines.append(
                f"| {_cell(row['title'])} | {format_bytes(row['needed_bytes'])} | "
                f"{delta_words(row)} ({percent_words(row)}) | {growth} | {fit} | {safety} |"
            )
        lines.append("")
    elif not rows:
        lines += ["No change applies to this script.", ""]
    failed = [row for row in rows if row.get("error")]
    if failed:
        lines += ["## Not measured", ""]
        lines += [f"- {row['title']}: {row['error']}" for row in failed]
        lines.append("")
    if table["not_applicable"]:
        lines += ["## Not applicable", ""]
        lines += [f"- {skipped['title']}: {skipped['why']}" for skipped in table["not_applicable"]]
        lines.append("")
    # A fix's "how" is its title; the knobs and the fixes together are said here.
    explained = [row for row in measured if row.get("code") is None]
    if explained:
        lines += ["## How", ""]
        lines += [f"- **{row['title']}**: {row['how']}" for row in explained]
        lines.append("")
    lines += [
        (
            "Peak: what the estimate's verdict uses (reserved memory and the CUDA context on cuda). "
            "Changes that stop a growth at every step come first, then the largest savings. Apply a "
            "quick fix and estimate again: the estimate compares itself with this prediction."
        ),
        "",
    ]
    return "\n".join(lines)


def register(server: OomLanguageServer) -> None:
    server.command(WHAT_IF_COMMAND)(what_if_command)
    code_actions.add_title_note(saving_note)
    add_follow_up(FollowUp("whatIfCheck", _compare_with_prediction, _report_comparison))
