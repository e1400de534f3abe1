"""`oom-lsp.whatIf` in the editor: the what-if of a file (oom_lsp.estimate.whatif: the step traced
as it is, then once per quick fix of its findings and per knob), run from the "What if…" lens
next to "Estimate peak memory".

The table is written as Markdown to `.oom_lsp/what-if/<script>.md` and shown with
`window/showDocument` beside the file, without taking the focus (`takeFocus: false`): Neovim
opens it in a new split and keeps the cursor in the file (a window already showing the table is
reused), the VS Code extension opens it as a Markdown preview to the side. The user's buffer is
never replaced. Its record is saved where `oom-lsp estimate --what-if` saves it, so the next estimate,
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
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import from_fs_path
from pygls.workspace import TextDocument

from oom_lsp.analysis import Finding, default_settings
from oom_lsp.checker import analyze_text
from oom_lsp.server.estimate import EstimateArgs, check_trace_args, estimate_request, job_listener, target_gpu
from oom_lsp.server.jobs import (
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
from oom_lsp.units import format_bytes

if TYPE_CHECKING:
    from oom_lsp.estimate.results import WhatIfTable

# The what-if's modules are imported by the functions that use them: not at the server's start.

logger = logging.getLogger(__name__)

WHAT_IF_COMMAND = "oom-lsp.whatIf"
KIND = "what-if"
SHOW_TIMEOUT_S = 10.0
# The fix-all applies the safe fixes, as `oom-lsp check --fix`: the what-if's row of those.
FIX_ALL_ROW = "fixes:safe"


async def what_if_command(ls: OomLanguageServer, args: EstimateArgs) -> dict[str, Any]:
    from oom_lsp.estimate.estimator import EstimateError
    from oom_lsp.usecases.estimate import EstimateInputError
    from oom_lsp.usecases.what_if import UnreadableScript, read_script, run_what_if

    require_trusted_workspace(ls, "the what-if")
    check_trace_args(args)
    if args.find_max_batch:
        raise JsonRpcInvalidParams(
            "findMaxBatch is the estimate's: the what-if traces the batch size as it is"
        )
    script = script_of(args.uri)
    if script.suffix != ".py":
        raise JsonRpcInvalidParams(f"{script.name}: the what-if runs Python scripts (.py)")
    try:
        text, encoding = read_script(script)
    except UnreadableScript as error:
        raise RequestFailed(f"{script.name}:{error.line}:{error.column}: {error.problem}") from None
    except EstimateInputError as error:
        raise RequestFailed(str(error)) from None
    document = ls.open_document(args.uri)
    if document is not None and document.source != text:
        raise RequestFailed(f"{script.name} has unsaved changes: save it first (the what-if runs the file)")
    version = document_version(ls, args.uri)
    gpu = target_gpu(ls, args, script)
    request = estimate_request(ls, args, script, gpu)
    # Before the first await: the job watches the request being answered for its cancellation.
    job = Job(ls, f"What if: {script.name}", KIND, script)
    listener = job_listener(job)
    listener.on_message = job.report
    findings = await _findings(ls, args.uri, document, text, script)
    # An excluded file has no findings; the knobs are still measured.
    settings = ls.settings_for_uri(args.uri) or default_settings()

    def work() -> WhatIfTable:
        return run_what_if(request, text, encoding, findings, settings, listener)

    try:
        table = await job.run(work)
    except EstimateInputError as error:
        raise RequestFailed(str(error)) from None
    except EstimateError as error:
        raise RequestFailed(f"the what-if failed: {error}") from None
    markdown_path = write_result(ls, script, KIND, f"{script.stem}.md", table_markdown(table, script.name))
    store_result(
        ls,
        args.uri,
        FileResult(kind=KIND, report_path=str(markdown_path), version=version, details={"table": table}),
    )
    shown = await _show(ls, markdown_path)
    return {
        "markdownPath": str(markdown_path),
        "shown": shown,
        # neededBytes: the process total the verdict and the table hold; peakBytes: allocated.
        "neededBytes": table.baseline.needed_bytes,
        "peakBytes": table.baseline.peak_bytes,
        "gpuName": table.gpu,
        "gpuMemoryBytes": table.gpu_memory,
        "changes": [
            {
                "key": row.key,
                "title": row.title,
                "neededBytes": row.needed_bytes,
                "savingPercent": row.saving_percent,
                "error": row.error,
            }
            for row in table.changes
        ],
        "notApplicable": [skipped.to_json() for skipped in table.not_applicable],
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
        # takeFocus false: Neovim shows it in a new split instead of the file's window.
        params = types.ShowDocumentParams(uri=from_fs_path(str(markdown_path)), take_focus=False)
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


# --- the titles ------------------------------------------------------------------------


def saving_note(ls: OomLanguageServer, document: TextDocument, finding: Finding | None) -> str | None:
    """The measured saving a fix's title carries, while the table holds for this text."""
    result = current_results(ls, document.uri).get(KIND)
    if result is None:
        return None
    from oom_lsp.estimate.whatif import fix_key
    from oom_lsp.estimate.whatif_record import source_digest
    from oom_lsp.estimate.wording import saving_words

    table: WhatIfTable = result.details["table"]
    if table.source_digest != source_digest(document.source):
        return None  # measured on the file, which the open document no longer is
    row = table.row(FIX_ALL_ROW if finding is None else fix_key(finding))
    if row is None or not row.measured:
        return None
    return saving_words(row)


# --- the markdown ------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: WhatIfTable, name: str) -> str:
    """The what-if as a Markdown page: the baseline, a row per change, what was not measured or
    does not apply, and how each change is made."""
    from oom_lsp.estimate.wording import (
        NEEDED_PEAK,
        allocated_words,
        delta_words,
        fits_words,
        growth_words,
        percent_words,
    )

    base = table.baseline
    batch = table.batch_size
    target = ""
    if table.gpu and table.gpu_memory is not None:
        target = f", target {table.gpu} ({format_bytes(table.gpu_memory)})"
    lines = [
        f"# What if: {name}",
        "",
        (
            f"Batch size {batch if batch else 'as in the script'}, device {table.device}{target}. "
            "Each change traced alone on fake tensors (no GPU), with the estimate's settings."
        ),
        "",
        # Named as the estimate's hint names it: the process total (reserved + CUDA context) beside
        # the allocated peak; on the CPU they are one, the peak.
        f"**As it is: {format_bytes(base.needed_bytes)} "
        f"{'process total' if base.needed_bytes != base.peak_bytes else 'peak'}**{allocated_words(base)}"
        + (f", {base.verdict.value}" if base.verdict else "")
        + ".",
    ]
    growth = growth_words(base)
    if growth:
        lines.append(f"It {growth}.")
    lines.append("")
    rows = table.changes
    measured = [row for row in rows if row.measured]
    fits = table.gpu_memory is not None
    if measured:
        lines += [
            "| change | peak | change in peak | growth/step | fits | safety |",
            "| --- | ---: | ---: | ---: | :---: | --- |",
        ]
        for row in measured:
            step = row.growth_per_step
            growth = "—" if step is None else format_bytes(step)
            if row.stops_growth:
                growth += " (stops the growth)"
            fit = fits_words(row, table) if fits else "—"
            safety = row.safety + (" (real CPU steps)" if row.fallback else "")
            lines.append(
                f"| {_cell(row.title)} | {format_bytes(row.needed_bytes)} | "
                f"{delta_words(row)} ({percent_words(row)}) | {growth} | {fit} | {safety} |"
            )
        lines.append("")
    elif not rows:
        lines += ["No change applies to this script.", ""]
    failed = [row for row in rows if not row.measured]
    if failed:
        lines += ["## Not measured", ""]
        lines += [f"- {row.title}: {row.error}" for row in failed]
        lines.append("")
    if table.not_applicable:
        lines += ["## Not applicable", ""]
        lines += [f"- {skipped.title}: {skipped.why}" for skipped in table.not_applicable]
        lines.append("")
    # A fix's "how" is its title; the knobs and the fixes together are said here.
    explained = [row for row in measured if row.code is None]
    if explained:
        lines += ["## How", ""]
        lines += [f"- **{row.title}**: {row.how}" for row in explained]
        lines.append("")
    lines += [
        (
            f"Peak: {NEEDED_PEAK}. "
            "Changes that stop a growth at every step come first, then the largest savings. Apply a "
            "quick fix and estimate again: the estimate compares itself with this prediction."
        ),
        "",
    ]
    return "\n".join(lines)


def register(server: OomLanguageServer) -> None:
    server.command(WHAT_IF_COMMAND)(what_if_command)
    server.hooks.title_notes.append(saving_note)
