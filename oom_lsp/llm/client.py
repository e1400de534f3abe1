"""One OpenAI-compatible chat call: the openai SDK's AsyncOpenAI against any base URL.

Chat Completions only: the one surface OpenAI, Azure (v1 API), Ollama, vLLM, llama.cpp
and LM Studio all serve. The SDK retries connection errors, timeouts, 429 and 5xx with
exponential backoff and honours `retry-after`; `max_retries` and `timeout` come from the
settings so a hung server cannot block an editor for the SDK's default half hour.
Every SDK error becomes a `ModelError` whose message tells the user what to do.

Imported only when a fix is requested: the openai SDK is not loaded by the CLI parser.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
from pydantic import ValidationError

from oom_lsp.llm.response import FixProposal, ParseError, from_validation_error
from oom_lsp.llm.settings import LlmSettings

TextProgress = Callable[[int], None]  # characters received so far
PROGRESS_EVERY = 200  # characters between two progress reports of a streamed answer
# Far above max_output_tokens (1,500 tokens are ~6,000 characters): a server that sends more
# ignores the limit, and its answer is refused rather than kept in memory and in the fix log.
MAX_ANSWER_CHARS = 100_000


class ModelError(Exception):
    """The request failed; `kind` is stable (for the server), the message is for the user."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class FormatRejected(Exception):
    """The server does not accept `response_format: json_schema`: fall back to text."""


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    parsed: FixProposal | None = None  # json_schema mode


def _uses_openai_token_field(base_url: str) -> bool:
    # OpenAI's reasoning models reject `max_tokens`; most local servers know only `max_tokens`.
    return "api.openai.com" in base_url or ".openai.azure.com" in base_url


class ChatClient:
    def __init__(self, settings: LlmSettings, api_key: str, *, http_client: Any = None) -> None:
        assert settings.base_url and settings.model, "check_ready() first"
        self.settings = settings
        self._client = openai.AsyncOpenAI(
            api_key=api_key,
            base_url=settings.base_url,
            timeout=settings.timeout,
            max_retries=settings.max_retries,
            http_client=http_client,
        )

    async def close(self) -> None:
        await self._client.close()

    def _arguments(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        token_field = (
            "max_completion_tokens"
            if _uses_openai_token_field(self.settings.base_url or "")
            else "max_tokens"
        )
        return {
            "model": self.settings.model,
            "messages": messages,
            token_field: self.settings.max_output_tokens,
        }

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        json_schema: bool = False,
        stream: bool = False,
        on_text: TextProgress | None = None,
    ) -> Completion:
        """One answer. Raises ModelError, FormatRejected (json_schema only) or ParseError
        (a truncated answer, or JSON that does not fit the schema)."""
        try:
            if json_schema:
                return await self._parse(messages)
            if stream:
                return await self._stream(messages, on_text)
            response = await self._create(messages)
        except openai.APIError as error:
            raise self._model_error(error, json_schema) from None
        text, finish_reason = self._choice(getattr(response, "choices", None), "message")
        usage = getattr(response, "usage", None)
        completion = Completion(
            text,
            finish_reason,
            _count(getattr(usage, "prompt_tokens", None)),
            _count(getattr(usage, "completion_tokens", None)),
        )
        _check_finish(completion)
        return completion

    async def _create(self, messages: list[dict[str, str]]) -> Any:
        try:
            return await self._client.chat.completions.create(**self._arguments(messages))
        except ValueError as error:  # a 200 whose body is not JSON
            raise self._unusable(f"its body is not JSON ({error})") from None

    def _unusable(self, why: str) -> ModelError:
        return ModelError("server", f"the server at {self.settings.host} gave an unusable answer: {why}")

    def _choice(self, choices: Any, field: str) -> tuple[str, str | None]:
        """The text and finish reason of the first choice; the SDK builds its objects from
        the JSON without validating it, so an OpenAI-compatible server that is not has to
        be caught here: no choices, a choice without a message, content that is no string."""
        if not isinstance(choices, list) or not choices:
            raise self._unusable("no choices in it")
        message = getattr(choices[0], field, None)
        content = getattr(message, "content", None) if message is not None else None
        if content is not None and not isinstance(content, str):
            raise self._unusable(f"the {field} content is {type(content).__name__}, not text")
        finish_reason = getattr(choices[0], "finish_reason", None)
        if message is None and finish_reason is None:
            raise self._unusable(f"the first choice has no {field}")
        if len(content or "") > MAX_ANSWER_CHARS:
            raise self._too_long()
        return content or "", finish_reason if isinstance(finish_reason, str) else None

    def _too_long(self) -> ModelError:
        return ModelError(
            "too-long",
            f"the answer from {self.settings.host} is longer than {MAX_ANSWER_CHARS:,} characters "
            f"(it ignored the {self.settings.max_output_tokens}-token limit); nothing was changed",
        )

    async def _stream(self, messages: list[dict[str, str]], on_text: TextProgress | None) -> Completion:
        pieces: list[str] = []
        received = reported = 0
        finish_reason = None
        chunks = 0
        try:
            stream = await self._client.chat.completions.create(**self._arguments(messages), stream=True)
            async with stream:
                async for chunk in stream:
                    chunks += 1
                    choices = getattr(chunk, "choices", None)
                    if not choices:
                        continue
                    text, reason = self._choice(choices, "delta")
                    if text:
                        pieces.append(text)
                        received += len(text)
                        if received > MAX_ANSWER_CHARS:
                            raise self._too_long()
                        if on_text and received - reported >= PROGRESS_EVERY:
                            on_text(received)
                            reported = received
                    finish_reason = reason or finish_reason
        except ValueError as error:  # an event whose data is not JSON
            raise self._unusable(f"an event of the stream is not JSON ({error})") from None
        if not pieces and finish_reason is None:
            raise self._unusable(
                "the event stream held no answer"
                if chunks
                else "no answer in it (an empty event stream, or none at all: is it an OpenAI-compatible server?)"
            )
        completion = Completion("".join(pieces), finish_reason)
        _check_finish(completion)
        return completion

    async def _parse(self, messages: list[dict[str, str]]) -> Completion:
        try:
            response = await self._client.chat.completions.parse(
                **self._arguments(messages), response_format=FixProposal
            )
        except openai.LengthFinishReasonError:
            raise ParseError("the answer was cut off (the output token limit): answer more briefly") from None
        except ValidationError as error:  # the SDK validates the JSON it receives with the model
            raise from_validation_error(error) from None
        choices = getattr(response, "choices", None)
        text, finish_reason = self._choice(choices, "message")
        parsed = getattr(choices[0].message, "parsed", None)
        usage = getattr(response, "usage", None)
        return Completion(
            text,
            finish_reason,
            _count(getattr(usage, "prompt_tokens", None)),
            _count(getattr(usage, "completion_tokens", None)),
            parsed=parsed if isinstance(parsed, FixProposal) else None,
        )

    def _model_error(self, error: openai.APIError, json_schema: bool) -> Exception:
        host, settings = self.settings.host, self.settings
        if isinstance(error, openai.ContentFilterFinishReasonError):
            return ModelError("refused", f"the model at {host} refused to answer (content filter)")
        if isinstance(error, openai.APITimeoutError):
            return ModelError(
                "timeout",
                f"no answer from {host} within {settings.timeout:g} s (timeout in [tool.oom-lsp.llm])",
            )
        if isinstance(error, openai.APIConnectionError):
            return ModelError("connection", f"cannot reach {settings.base_url}: is the server running?")
        if not isinstance(error, openai.APIStatusError):
            return ModelError("server", f"the server at {host} gave an unusable answer: {error.message}")
        status = error.status_code
        detail = _detail(error)
        if json_schema and (status in (400, 422) or (status >= 500 and "response_format" in detail)):
            return FormatRejected(detail)
        if status in (401, 403):
            return ModelError(
                "auth",
                f"the server at {host} refused the API key (HTTP {status}): check the environment "
                f"variable {settings.api_key_env}",
            )
        if status == 404:
            return ModelError(
                "not-found", f"model {settings.model!r} not found at {host} (HTTP 404): {detail}"
            )
        if status == 429:
            return ModelError(
                "busy",
                f"the server at {host} is busy (HTTP 429, still after {settings.max_retries} retries); try again later",
            )
        if status >= 500:
            return ModelError(
                "server",
                f"the server at {host} failed (HTTP {status}, still after {settings.max_retries} retries): {detail}",
            )
        return ModelError(
            "bad-request", f"the server at {host} rejected the request (HTTP {status}): {detail}"
        )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _detail(error: openai.APIStatusError) -> str:
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error")
        message = inner.get("message") if isinstance(inner, dict) else body.get("message")
        if message:
            return str(message)[:300]
    return (error.message or "")[:300]


def _check_finish(completion: Completion) -> None:
    if completion.finish_reason == "length":
        raise ParseError("the answer was cut off (the output token limit): answer more briefly")
    if completion.finish_reason == "content_filter":
        raise ModelError("refused", "the model refused to answer (content filter)")
