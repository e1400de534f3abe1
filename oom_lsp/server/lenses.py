"""Code lenses and inlay hints.

Lenses "Estimate peak memory", "What if…" (server/what_if.py) and "Profile memory" sit above
`if __name__ == "__main__":` and above the outermost training loops (loops
that call `.backward()`, and the epoch loops around them:
`oom_lsp.fixes.instrument.find_training_loops`); each runs the server
command of that name on the file.

The estimate lens names the target it will judge by, "Estimate peak memory (24 GiB RTX 3090)"
(the `oomLsp.gpu` setting, else the project's `gpu-memory`: the command's own resolution), and
while an estimate holds for the text its title is the result, "Estimated ≈ 91 MiB allocated,
506 MiB process total / 24 GiB RTX 3090: fits"; running it again re-estimates.

The inlay hint is the last estimate's, after the batch-size literal it
varied: "≈ 91 MiB allocated, 506 MiB process total at 64 / 24 GiB RTX 3090: fits". It goes with
the first edit of the file (profiling.current_results). A profile's per-line figures
are Information diagnostics, not hints (they carry the allocation count and
stay readable in the Problems panel).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import to_fs_path

from oom_lsp.server.estimate import ESTIMATE_COMMAND, EstimateArgs, literal_range, target_gpu
from oom_lsp.server.jobs import current_results
from oom_lsp.server.positions import split_lines
from oom_lsp.server.profiling import PROFILE_COMMAND
from oom_lsp.server.server import OomLanguageServer
from oom_lsp.server.what_if import WHAT_IF_COMMAND

_MAIN_GUARD = re.compile(r"""^if\s+(__name__\s*==\s*(['"])__main__\2|(['"])__main__\3\s*==\s*__name__)\s*:""")
LENS_TITLES = {
    ESTIMATE_COMMAND: "Estimate peak memory",
    WHAT_IF_COMMAND: "What if…",
    PROFILE_COMMAND: "Profile memory",
}


def lens_lines(source: str) -> list[int]:
    """0-based lines that get the lenses: the main guard (at module level)
    and the outermost training loops."""
    from oom_lsp.fixes.instrument import find_training_loops  # libcst, loaded by the analysis worker at start

    lines = {index for index, text in enumerate(split_lines(source)) if _MAIN_GUARD.match(text)}
    loops = find_training_loops(source)
    for loop in loops:
        inside_another = any(
            other.line < loop.line and loop.end_line <= other.end_line for other in loops if other is not loop
        )
        if not inside_another:
            lines.add(loop.line - 1)
    return sorted(lines)


async def on_code_lens(ls: OomLanguageServer, params: types.CodeLensParams) -> list[types.CodeLens] | None:
    document = ls.open_document(params.text_document.uri)
    if document is None or not document.uri.startswith("file:"):
        return None  # the commands run a file on disk
    if not ls.editor.workspace_trusted:
        return []  # every lens runs the workspace's code (profiling.require_trusted_workspace)
    source = document.source
    lines = await asyncio.get_running_loop().run_in_executor(ls.analysis_executor, lens_lines, source)
    if not lines:
        return []
    titles = {**LENS_TITLES, ESTIMATE_COMMAND: _estimate_title(ls, document.uri)}
    lenses = []
    for line in lines:
        place = types.Range(
            start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)
        )
        for command, title in titles.items():
            lenses.append(
                types.CodeLens(
                    range=place,
                    command=types.Command(title=title, command=command, arguments=[{"uri": document.uri}]),
                )
            )
    return lenses


def _estimate_title(ls: OomLanguageServer, uri: str) -> str:
    """The last estimate's result while it holds, else the target the lens's estimate will use."""
    result = current_results(ls, uri).get("estimate")
    if result is not None and result.details.get("lens"):
        return str(result.details["lens"])
    from oom_lsp.estimate.results import GpuTarget
    from oom_lsp.estimate.wording import gpu_words

    title = LENS_TITLES[ESTIMATE_COMMAND]
    path = to_fs_path(uri)
    if path is None:
        return title
    try:
        gpu = target_gpu(ls, EstimateArgs(uri=uri), Path(path))
    except JsonRpcInvalidParams as error:  # an unknown GPU in the settings: the command says more
        return f"{title} ({str(error).split(' (')[0].split(', did you mean')[0]})"
    return f"{title} ({gpu_words(GpuTarget(gpu.name, gpu.memory)) if gpu is not None else 'no target GPU'})"


def on_inlay_hint(ls: OomLanguageServer, params: types.InlayHintParams) -> list[types.InlayHint] | None:
    document = ls.open_document(params.text_document.uri)
    if document is None:
        return None
    result = current_results(ls, document.uri).get("estimate")
    if result is None or not result.details.get("literal"):
        return []
    from oom_lsp.estimate.wording import PEAKS_NAMED

    place = literal_range(ls, document.source, result.details["literal"])
    wanted = params.range
    if place.end.line < wanted.start.line or place.end.line > wanted.end.line:
        return []
    return [
        types.InlayHint(
            position=place.end,
            label=result.details["label"],
            kind=types.InlayHintKind.Type,
            padding_left=True,
            tooltip=f"oom-lsp estimate ({PEAKS_NAMED}); report: {result.report_path}",
        )
    ]


def register(server: OomLanguageServer) -> None:
    server.feature(types.TEXT_DOCUMENT_CODE_LENS)(on_code_lens)
    server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions())(on_inlay_hint)
