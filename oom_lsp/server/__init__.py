"""The oom-lsp language server (pygls): the LSP face of the use-case layer.

    server.py    the core: settings, the analysis of open documents, per-server state
    hooks.py     what the features offer each other (`ls.hooks`)
    jobs.py      what every long command shares: Job, the results, the interpreter
    features.py  the features, listed and registered in one place (create_server)
    protocol.py, transport.py, framing.py, logs.py, positions.py, settings.py
    the features: lifecycle, diagnostics, code_actions, hover, ai, oom_reports, profiling,
    estimate, what_if, lenses, notebooks (small handlers over oom_lsp.usecases)

Imported lazily by the CLI: importing lsprotocol costs most of a second, which
`oom-lsp --check` must not pay."""

from __future__ import annotations

ANALYSIS_THREAD_STACK = 16 * 2**20  # bytes


def _log_failure(done: object) -> None:
    import logging

    error = done.exception()  # type: ignore[attr-defined]
    if error is not None:
        exc_info = (type(error), error, error.__traceback__)
        logging.getLogger(__name__).error("Loading the analysis failed", exc_info=exc_info)


def start_server(tcp: str | None, log_file: str | None) -> int:
    """Serve on stdio, or on `HOST:PORT` when `tcp` is given, until the client
    exits; then end the process with the exit status (0 after shutdown and exit,
    1 otherwise), whatever threads are still busy: an analysis of a huge file or
    a model request must not keep a process the client has let go."""
    import gc
    import logging
    import os
    import sys

    if tcp is not None:
        host, separator, port = tcp.rpartition(":")
        if not separator or not port.isdigit():
            raise ValueError(f"--tcp expects HOST:PORT, got {tcp!r}")
    # What start-up allocates lives as long as the process: collecting it is wasted (~15% of
    # the imports' CPU). warm_up_analysis turns the collector back on, tuned, once the analysis
    # stack is loaded too.
    gc.disable()
    # The analyses run on worker threads, whose stacks the platform sizes (2 MiB under glibc
    # with an unlimited `ulimit -s`, 128 KiB under musl): libcst's native parser recurses once
    # per level of nesting, within python_ast.MAX_NESTING, so give them room of their own.
    import threading

    try:
        threading.stack_size(ANALYSIS_THREAD_STACK)
    except (ValueError, RuntimeError):
        pass  # a platform that does not let it be set keeps its own
    from oom_lsp.server.features import create_server
    from oom_lsp.server.server import warm_up_analysis

    server = create_server(log_file)
    server.analysis_executor.submit(warm_up_analysis).add_done_callback(_log_failure)
    code = server.start_io() if tcp is None else server.start_tcp(host or "127.0.0.1", int(port))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the client closed its end
    os._exit(code)
