"""The editor's features, listed and registered in one place.

Each feature module has `register(server)`: it adds its handlers (`server.feature`,
`server.command`) and what it offers the others (`server.hooks`). The server core
(server.py, hooks.py, jobs.py, protocol.py, ...) imports none of them; a feature imports the
core and the use-case layer (oom_lsp.usecases), and another feature only for its command name
or a helper it shows (the lenses name the estimate's and the what-if's commands).

    lifecycle      initialize, shutdown, settings and config files changed
    diagnostics    pull or push, debounced; the other features' diagnostics with the analysis's
    code_actions   quick fixes, "Ignore ... for this line", fix-all (on save too)
    hover          a rule's summary on its diagnostic or in a suppression comment
    ai             "Ask AI to fix", oom-lsp.askAi, oom-lsp.logAiFix, oom-lsp.validateFix
    oom_reports    the runtime guard's OOM reports as diagnostics; "Insert memory monitoring"
    profiling      oom-lsp.profile, oom-lsp.explainOom, oom-lsp.showReport
    estimate       oom-lsp.estimate: the hint, OOM100 and its actions, memoryStatus
    what_if        oom-lsp.whatIf: the table, the savings in the quick fixes' titles
    lenses         the lenses that run those commands, and the estimate's inlay hint
    notebooks      notebook documents: the cells through the same handlers (one adapter)
"""

from __future__ import annotations

from oom_lsp.server import jobs
from oom_lsp.server.server import OomLanguageServer


def create_server(log_file: str | None = None) -> OomLanguageServer:
    from oom_lsp.server import (
        ai,
        code_actions,
        diagnostics,
        estimate,
        hover,
        lenses,
        lifecycle,
        notebooks,
        oom_reports,
        profiling,
        what_if,
    )

    server = OomLanguageServer(log_file, notebook_sync=notebooks.SYNC_OPTIONS)
    features = (
        lifecycle,
        diagnostics,
        code_actions,
        hover,
        ai,
        oom_reports,
        profiling,
        estimate,
        what_if,
        lenses,
        notebooks,
    )
    for module in features:
        module.register(server)
    # The results of the long commands (estimate, profile, explained OOMs) are diagnostics too.
    server.hooks.extra_diagnostics.append(jobs.result_diagnostics)
    return server
