"""The oom-lsp language server (pygls). Imported lazily by the CLI: importing
lsprotocol costs most of a second, which `oom-lsp --check` must not pay."""

from __future__ import annotations


def start_server(tcp: str | None, log_file: str | None) -> int:
    """Serve on stdio, or on `HOST:PORT` when `tcp` is given; returns the exit
    status once the client has shut the server down."""
    from oom_lsp.gc_tuning import tune_for_analysis
    from oom_lsp.server.server import create_server

    server = create_server(log_file)
    tune_for_analysis()
    if tcp is None:
        server.start_io()
        return 0
    host, separator, port = tcp.rpartition(":")
    if not separator or not port.isdigit():
        raise ValueError(f"--tcp expects HOST:PORT, got {tcp!r}")
    server.start_tcp(host or "127.0.0.1", int(port))
    return 0
