"""The editor's features, listed and registered in one place."""

from __future__ import annotations

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

    server = OomLanguageServer(log_file)
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
    )
    for module in (*features, notebooks):
        module.register(server)
    return server
