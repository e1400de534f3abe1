"""JSON-RPC as the server speaks it: every request answered, a clean shutdown and exit.

pygls 2.1.1 drops what it cannot read without a word: a request whose params do not fit
the schema (a negative line, `params: "x"`, a code action without `context`) is logged
and never answered, nor is malformed JSON, a batch, or a request after `shutdown`; the
client waits forever. `OomProtocol.receive` is the entry point of every message read
(framing.py) and answers each of those with the JSON-RPC 2.0 error that fits, then hands
the rest to pygls' dispatch. The LSP methods overridden here:

- `shutdown`: pygls cancels the pending requests while iterating over the dict their
  callbacks remove them from ("dictionary changed size during iteration": the shutdown
  itself failed, the jobs ran on).
- `exit`: pygls raises SystemExit from inside the handler, with code 0 even without a
  shutdown first; here the code is 1 then, as the spec says, and the read loop ends.
- `workspace/executeCommand`: pygls calls a command given no `arguments` with none, so a
  missing argument was an internal error (a TypeError) instead of InvalidParams; and
  `$/cancelRequest` cancelled the request but not the command's own task.

Two hooks for server/scheduling.py: a request about a document that changes (or closes)
before it is answered is answered ContentModified (-32801) at once and its handler cancelled;
and the futures pygls keeps for notification handlers are dropped when they are done (it kept
one per edit, forever).

`make_converter` makes cattrs strict about JSON types: by default it structures
`"--epochs 1"` into `list[str]` as single characters, `"false"` into True and 2.7 into 2.
"""

from __future__ import annotations

import asyncio
import collections.abc
import json
import logging
import math
import typing
from collections.abc import Callable, Generator
from concurrent.futures import Future
from typing import Any

import attrs
import cattrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    JsonRPCResponseMessage,
    LanguageServerProtocol,
    default_converter,
    lsp_method,
)
from pygls.protocol.language_server import _prepare_command_arguments

from oom_lsp.server import scheduling

logger = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class RequestFailed(JsonRpcException):
    """LSP's RequestFailed: valid request, the work failed; the message says why, for the
    user, without the server's traceback (which InternalError carries)."""

    CODE = -32803


def _is_valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _reason(error: BaseException) -> str:
    """A cattrs structuring error in one line: what was wrong, where."""
    if isinstance(error, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(error))
    return str(error) or type(error).__name__


class OomProtocol(LanguageServerProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exit_code: int | None = None  # set by `exit`: the read loop stops

    # --- receiving ----------------------------------------------------------------

    def receive_unreadable(self, reason: str) -> None:
        self._send_error(None, PARSE_ERROR, f"Parse error: {reason}")

    def receive(self, value: Any) -> None:
        """One JSON value read from the client."""
        if isinstance(value, list):
            # The LSP has no batches; answer each request in it, so no client waits.
            ids = [
                item.get("id") for item in value if isinstance(item, dict) and _is_valid_id(item.get("id"))
            ]
            for msg_id in ids or [None]:
                self._send_error(msg_id, INVALID_REQUEST, "Invalid Request: batches are not supported")
            return
        if not isinstance(value, dict):
            self._send_error(None, INVALID_REQUEST, "Invalid Request: a message is a JSON object")
            return
        msg_id = value.get("id")
        method = value.get("method")
        answerable = _is_valid_id(msg_id)
        if value.get("jsonrpc") != self.VERSION:
            self._reject(value, answerable, 'Invalid Request: "jsonrpc" must be "2.0"')
            return
        if "method" in value:
            if not isinstance(method, str):
                self._reject(value, answerable, 'Invalid Request: "method" must be a string')
                return
            if "id" in value and not answerable:
                self._send_error(
                    None, INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer'
                )
                return
        elif not answerable or not ("result" in value or "error" in value):
            self._reject(value, False, "Invalid Request: neither a request, a notification nor a response")
            return
        is_request = "method" in value and "id" in value
        if is_request and self._shutdown and method != types.EXIT:
            self._send_error(msg_id, INVALID_REQUEST, f"Invalid Request: {method} after shutdown")
            return
        try:
            message = self.structure_message(value)
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError, AttributeError) as error:
            if is_request:
                self._send_error(msg_id, INVALID_PARAMS, f"Invalid params for {method}: {_reason(error)}")
            elif "method" in value:
                logger.warning("Ignoring %s: it does not fit the schema (%s)", method, _reason(error))
            else:
                self._fail_pending(msg_id, f"the client's answer does not fit the schema: {_reason(error)}")
            return
        if self._shutdown and "method" not in value:
            # Answers to the server's own requests still count after shutdown (pygls
            # drops them, and whatever waited on them waits forever).
            self._handle_response(msg_id, getattr(message, "result", None), getattr(message, "error", None))
            return
        if "method" in value and not is_request:
            self._answer_stale(scheduling.changed_documents(method, getattr(message, "params", None)))
        self.handle_message(message)
        if is_request:
            self._track(msg_id, getattr(message, "params", None))

    def structure_message(self, data: dict[str, Any]) -> Any:
        """pygls' choice of type for a message, without its logging of a traceback for
        each one that does not fit (the caller answers or logs it in one line)."""
        if "id" in data:
            if "error" in data:
                return self._converter.structure(data, types.ResponseErrorMessage)
            if "method" in data:
                kind = self.get_message_type(data["method"])
                # A method no type is known for (answered MethodNotFound): params are optional.
                return (
                    self._converter.structure(data, kind)
                    if kind
                    else self._generic(data, JsonRPCRequestMessage)
                )
            kind = self._result_types.pop(data["id"], None) or JsonRPCResponseMessage
            return self._converter.structure(data, kind)
        kind = self.get_message_type(data.get("method", ""))
        return self._converter.structure(data, kind) if kind else self._generic(data, JsonRPCNotification)

    def _generic(self, data: dict[str, Any], kind: type) -> Any:
        return self._converter.structure({"params": None, **data}, kind)

    def _fail_pending(self, msg_id: Any, reason: str) -> None:
        """The server's request `msg_id` fails: its caller must not wait forever."""
        logger.warning("Answer to request %r: %s", msg_id, reason)
        future = self._request_futures.pop(msg_id, None)
        if future is not None and not future.done():
            future.set_exception(JsonRpcException(reason))

    def _reject(self, value: dict[str, Any], answerable: bool, message: str) -> None:
        if answerable and "method" in value:
            self._send_error(value["id"], INVALID_REQUEST, message)
        elif "method" in value or not answerable:
            self._send_error(None, INVALID_REQUEST, message)

    # --- requests whose document changed (server/scheduling.py) ----------------------

    def _track(self, msg_id: Any, params: Any) -> None:
        """A request about a document, still in progress: answered ContentModified if the
        document changes first."""
        future = self._request_futures.get(msg_id)
        uri = scheduling.document_uri(params)
        requests = getattr(self._server, "scheduling", None)
        if future is not None and not future.done() and uri is not None and requests is not None:
            requests.requests.track(msg_id, uri, future)

    def _answer_stale(self, uris: list[str]) -> None:
        requests = getattr(self._server, "scheduling", None)
        if not uris or requests is None:
            return
        for msg_id in requests.requests.changed(uris):
            future = self._request_futures.pop(msg_id, None)
            logger.debug("Request %r: its document changed, answered ContentModified", msg_id)
            super()._send_response(
                msg_id,
                error=types.ResponseError(
                    code=scheduling.ContentModified.CODE, message="the document changed; ask again"
                ),
            )
            if future is not None:
                future.cancel()

    def _send_handler_result(self, future: Future[Any], *, msg_id: Any) -> None:
        requests = getattr(self._server, "scheduling", None)
        if requests is not None and requests.requests.already_answered(msg_id):
            return  # answered ContentModified when its document changed
        error = None if future.cancelled() else future.exception()
        if isinstance(error, scheduling.ContentModified):
            # Not a failure: answered without pygls' logged traceback.
            self._request_futures.pop(msg_id, None)
            self._send_response(msg_id, error=error.to_response_error())
            return
        super()._send_handler_result(future, msg_id=msg_id)

    def _execute_handler(self, msg_id: Any, handler: Any, callback: Any, *args: Any, **kwargs: Any) -> None:
        """pygls' execution, without its leak: the future of a notification's handler (and of
        the handler a built-in one chains to, such as the user's didChange) stays in
        `_request_futures` forever, since only a request's answer removes it: a future with its
        lock and condition per edit, ~0.5 KB, 10 MB over 20,000 edits. Here it is removed
        when it is done (a request's own entry is still removed by its answer)."""
        super()._execute_handler(msg_id, handler, callback, *args, **kwargs)
        if getattr(callback, "func", None) == self._send_handler_result:
            return  # a request: its answer removes it
        future = self._request_futures.get(msg_id)
        if future is not None:
            future.add_done_callback(lambda done: self._forget_future(msg_id, done))

    def _forget_future(self, msg_id: Any, future: Any) -> None:
        if self._request_futures.get(msg_id) is future:
            del self._request_futures[msg_id]

    def _send_response(
        self, msg_id: Any, result: Any = None, error: types.ResponseError | None = None
    ) -> None:
        """pygls' response, but a result that cannot be encoded becomes an InternalError
        answer: pygls logs the failure and sends nothing, and the client waits forever."""
        if error is None:
            try:
                json.dumps(result, default=self._serialize_message)
            except Exception as failure:
                logger.exception("The answer to request %r cannot be encoded", msg_id)
                result, error = (
                    None,
                    types.ResponseError(
                        code=INTERNAL_ERROR, message=f"the server could not encode its answer: {failure}"
                    ),
                )
        super()._send_response(msg_id, result, error)

    def _send_error(self, msg_id: Any, code: int, message: str) -> None:
        logger.warning(
            "Answering %s: %s", f"request {msg_id!r}" if msg_id is not None else "a message", message
        )
        if msg_id is None:
            # JSON-RPC 2.0: an error whose request's id could not be read has `"id": null`;
            # pygls' converter leaves out a None id, and vscode-jsonrpc then takes the
            # answer for neither a response nor a notification.
            error = {"code": code, "message": message}
            self._send_data({"jsonrpc": self.VERSION, "id": None, "error": error})
            return
        self._send_response(msg_id, error=types.ResponseError(code=code, message=message))

    # --- LSP methods --------------------------------------------------------------

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args: Any) -> Generator[Any, Any, None]:
        if (user_handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield user_handler, args, None
        current = self.msg_id
        # A copy: a cancelled future's callback removes it from the dict at once.
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current and not future.done():
                future.cancel()
        self._shutdown = True
        return None

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args: Any) -> Generator[Any, Any, None]:
        if (user_handler := self.fm.features.get(types.EXIT)) is not None:
            yield user_handler, args, None
        self.exit_code = 0 if self._shutdown else 1

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams) -> Generator[Any, Any, Any]:
        handler = self.fm.commands.get(params.command)
        if handler is None:
            raise JsonRpcInvalidParams(f"no command {params.command!r}")
        given = params if params.arguments is not None else attrs.evolve(params, arguments=[])
        try:
            args, kwargs = _prepare_command_arguments(handler, given, self._converter)
        except Exception as error:
            raise JsonRpcInvalidParams(f"{params.command}: {_reason(error)}") from None
        if asyncio.iscoroutinefunction(handler):
            handler = _cancelled_with(self._request_futures.get(self.msg_id), handler)
        return (yield handler, args, kwargs)


def _cancelled_with(request: Future[Any] | None, handler: Callable[..., Any]) -> Callable[..., Any]:
    """`handler`, run as a task that is cancelled when `request` is. pygls runs a command
    as a second task behind the executeCommand request, and `$/cancelRequest` cancels
    only the request's future: the command ran on (a validateFix re-run kept its script
    running for its whole timeout; an AI fix asked for through the command could still
    be applied after the cancel)."""

    async def command(*args: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        if request is not None and task is not None:
            loop = asyncio.get_running_loop()
            request.add_done_callback(
                lambda done: loop.call_soon_threadsafe(task.cancel) if done.cancelled() else None
            )
        return await handler(*args, **kwargs)

    return command


# --- a strict converter -------------------------------------------------------------------

_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.MutableSequence)


def _strict_scalar(kind: type) -> Any:
    def structure(value: Any, target: Any) -> Any:
        if target is not kind:  # a subclass: one of lsprotocol's enums, built from its value
            return target(value)
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"expected a finite number, got {value!r}")
            return float(value)
        if kind is int:
            if isinstance(value, float) and value.is_integer():
                return int(value)  # 3.0 from a client whose numbers are all floats
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"expected an integer, got {value!r}")
            return value
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise TypeError(f"expected {'a boolean' if kind is bool else 'a string'}, got {value!r}")
        return value

    return structure


def make_converter() -> cattrs.Converter:
    """pygls' converter, strict about JSON types (see the module docstring)."""
    converter = default_converter()
    for kind in (str, int, float, bool):
        converter.register_structure_hook(kind, _strict_scalar(kind))

    def sequence_hook(sequence_type: Any) -> Any:
        origin = typing.get_origin(sequence_type)
        arguments = typing.get_args(sequence_type)

        def structure(value: Any, _: Any) -> Any:
            if isinstance(value, (str, bytes, dict)) or not isinstance(value, collections.abc.Iterable):
                raise TypeError(f"expected an array, got {value!r}")
            items = list(value)
            if origin is tuple and arguments and arguments[-1] is not Ellipsis:
                if len(items) != len(arguments):
                    raise TypeError(f"expected {len(arguments)} items, got {len(items)}")
                return tuple(converter.structure(item, kind) for item, kind in zip(items, arguments))
            element = arguments[0] if arguments else Any
            structured = [item if element is Any else converter.structure(item, element) for item in items]
            return origin(structured) if origin in (tuple, set, frozenset) else structured

        return structure

    converter.register_structure_hook_factory(
        lambda kind: typing.get_origin(kind) in _SEQUENCES, sequence_hook
    )
    return converter
