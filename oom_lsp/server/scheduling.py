"""Bounded work while the user types: one pending analysis per document, and requests about a
document that changed under them answered at once with ContentModified.

An editor sends a `didChange` per keystroke and, between them, code-action, hover, code-lens,
inlay-hint and diagnostic requests. Before this, each request analysed the version it saw, in
turn on the one analysis worker: a burst of edits queued one analysis per request, each for a
text already gone, the answers came seconds after the typing stopped (or never: the pull
handler analysed again whenever the text had changed meanwhile), and the server's memory held
every queued text.

- `AnalysisQueue`: per document, at most one analysis waiting for the worker besides the one
  running. Asking for a newer version replaces the one still waiting (it is never computed;
  who waited on it gets `Superseded`); asking for the same text again shares its result.
- `StaleRequests`: the requests in progress per document. When the document changes (or
  closes), each is answered at once with the LSP's ContentModified (-32801) and its handler
  cancelled, as rust-analyzer does: the client asks again for the text it has now, and no
  request is left waiting for work on a text that no longer exists.

A notebook is one document for the queue (its cells are analysed as one program, keyed by
the notebook's URI); its cells are the documents of `StaleRequests`.

Both are per server (`OomLanguageServer.scheduling`): nothing here is a module global.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pygls.exceptions import JsonRpcContentModified as ContentModified

logger = logging.getLogger(__name__)

Result = TypeVar("Result")
MsgId = int | str
__all__ = ("AnalysisQueue", "ContentModified", "Scheduling", "StaleRequests", "Superseded")


class Superseded(Exception):
    """The analysis of a version replaced by a newer one before it started."""


@dataclass
class _Job(Generic[Result]):
    key: Hashable
    result: asyncio.Future[Result]  # on the event loop
    work: concurrent.futures.Future[Result]  # on the executor


@dataclass
class AnalysisQueue:
    """At most one pending analysis per document (see the module docstring)."""

    _jobs: dict[str, _Job[Any]] = field(default_factory=dict)
    computed: int = 0  # analyses that ran
    superseded: int = 0  # analyses replaced before they ran

    def submit(
        self,
        uri: str,
        key: Hashable,
        executor: concurrent.futures.Executor,
        compute: Callable[[], Result],
    ) -> asyncio.Future[Result]:
        """The future result of `compute` for the document's text `key`: the pending one when it
        is for the same text, else a new one, which replaces a pending one that has not started.
        Await it through `asyncio.shield`: a caller cancelled must not cancel the others' result."""
        job = self._jobs.get(uri)
        if job is not None and not job.result.done():
            if job.key == key:
                return job.result
            if job.work.cancel():  # still waiting for the worker: never computed
                self.superseded += 1
                job.result.set_exception(Superseded())
            # else it runs: it finishes (a parse cannot be interrupted), the new one queues behind
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Result] = loop.create_future()
        result.add_done_callback(_retrieve)  # no "exception never retrieved" when no one waits
        work = executor.submit(compute)
        new = _Job(key, result, work)
        self._jobs[uri] = new
        work.add_done_callback(lambda done: _call_soon(loop, self._finished, uri, new))
        return result

    def _finished(self, uri: str, job: _Job[Any]) -> None:
        if self._jobs.get(uri) is job:
            del self._jobs[uri]
        if job.work.cancelled():
            return
        self.computed += 1
        if job.result.done():
            return
        error = job.work.exception()
        if error is not None:
            job.result.set_exception(error)
        else:
            job.result.set_result(job.work.result())

    def forget(self, uri: str) -> None:
        """The document closed: its waiting analysis is not computed."""
        job = self._jobs.pop(uri, None)
        if job is not None and job.work.cancel() and not job.result.done():
            job.result.set_exception(Superseded())

    def pending(self) -> int:
        return len(self._jobs)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass  # the loop closed (the server is exiting) while the analysis ran


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass
class StaleRequests:
    """The client's requests in progress, by the document they are about."""

    _by_uri: dict[str, set[MsgId]] = field(default_factory=dict)
    # Requests answered here whose handler may still finish: its answer is not sent.
    _answered: set[MsgId] = field(default_factory=set)
    content_modified: int = 0  # requests answered ContentModified

    def track(self, msg_id: MsgId, uri: str, future: Any) -> None:
        """A request about `uri` whose handler runs on (`future`: its task or future)."""
        self._by_uri.setdefault(uri, set()).add(msg_id)
        future.add_done_callback(lambda _: self._untrack(msg_id, uri))

    def _untrack(self, msg_id: MsgId, uri: str) -> None:
        ids = self._by_uri.get(uri)
        if ids is not None:
            ids.discard(msg_id)
            if not ids:
                del self._by_uri[uri]

    def changed(self, uris: Iterable[str]) -> list[MsgId]:
        """The documents changed: the requests about them to answer with ContentModified now."""
        stale: list[MsgId] = []
        for uri in uris:
            stale.extend(self._by_uri.pop(uri, ()))
        self._answered.update(stale)
        self.content_modified += len(stale)
        return stale

    def already_answered(self, msg_id: MsgId) -> bool:
        """Whether the request was answered here (called once, when its handler ends)."""
        if msg_id in self._answered:
            self._answered.discard(msg_id)
            return True
        return False

    def in_progress(self) -> int:
        return sum(len(ids) for ids in self._by_uri.values())


@dataclass
class Scheduling:
    """A server's scheduling state."""

    analyses: AnalysisQueue = field(default_factory=AnalysisQueue)
    requests: StaleRequests = field(default_factory=StaleRequests)


def document_uri(params: Any) -> str | None:
    """The document a request is about (`params.textDocument.uri`), if any."""
    text_document = getattr(params, "text_document", None)
    uri = getattr(text_document, "uri", None)
    return uri if isinstance(uri, str) else None


def changed_documents(method: str, params: Any) -> list[str]:
    """The documents a notification changes or closes (none for other notifications)."""
    if method in ("textDocument/didChange", "textDocument/didClose"):
        uri = document_uri(params)
        return [uri] if uri else []
    if method in ("notebookDocument/didChange", "notebookDocument/didClose"):
        # The cells edited or closed (a request about another cell of the notebook keeps its
        # answer: it is for that cell's text, which is unchanged).
        cells = getattr(params, "cell_text_documents", None) or []
        change = getattr(getattr(params, "change", None), "cells", None)
        cells = [*cells, *(getattr(change, "text_content", None) or [])]
        return [
            uri for uri in (getattr(getattr(cell, "document", cell), "uri", None) for cell in cells) if uri
        ]
    return []
