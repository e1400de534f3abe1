"""The oom-lsp language server (pygls). Imported lazily by the CLI: importing
lsprotocol costs most of a second, which `oom-lsp --check` must not pay."""

from __future__ import annotations


def start_server(tcp: str | None, log_file: str | None) -> int:
    """Serve on stdio, or on `HOST:PORT` when `tcp` is given, until the client
    exits; then end the process with the exit status (0 after shutdown and exit,
    1 otherwise), whatever threads are still busy: an analysis of a huge file or
    a model request must not keep a process the client has let go."""
    import logging
    import os
    import sys

    from oom_lsp.gc_tuning import tune_for_analysis
    from oom_lsp.server.server import create_server

    if tcp is not None:
        host, separator, port = tcp.rpartition(":")
        if not separator or not port.isdigit():
            raise ValueError(f"--tcp expects HOST:PORT, got {tcp!r}")
    server = create_server(log_file)
    tune_for_analysis()
    code = server.start_io() if tcp is None else server.start_tcp(host or "127.0.0.1", int(port))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the client closed its end
    os._exit(code)
