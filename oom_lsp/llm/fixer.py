"""The fix loop behind "Ask AI to fix" and `oom-lsp fix --ai`: build the prompt, ask the
model, parse the answer, check the edits; one retry with the reason when the answer is
malformed or its edit does not apply; then a typed `Proposal` or a `FixError`.

Nothing here touches a file or an editor: the caller shows the proposal, applies
`proposal.edit.edits` to the document version it asked about, and writes the fix log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from oom_lsp.llm.edits import EditRefused, EditResult, Region, apply_blocks
from oom_lsp.llm.fixlog import FixLogEntry, new_entry_id
from oom_lsp.llm.prompt import FixRequest, Prompt, PromptError, build_prompt
from oom_lsp.llm.response import FixProposal, ParseError, parse_answer
from oom_lsp.llm.secrets import redact
from oom_lsp.llm.settings import LlmSettings, NotReady

Progress = Callable[[str], None]
MAX_ATTEMPTS = 2  # the first answer and one retry that says what was wrong
# (base_url, model) pairs whose server rejected json_schema: asked in the text format from then on.
_TEXT_ONLY: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Exchange:
    """One round trip, for the fix log."""

    messages: list[dict[str, str]]
    answer: str


@dataclass(frozen=True)
class Proposal:
    request: FixRequest
    prompt: Prompt
    fix: FixProposal  # causes, edits, validation, changelog
    edit: EditResult | None  # None: diagnosis only (no edit, or none that applies)
    problem: str | None  # why there is no edit
    exchanges: tuple[Exchange, ...]
    model: str
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def answer(self) -> str:
        return self.exchanges[-1].answer

    @property
    def changelog(self) -> str:
        return self.fix.changelog

    def diagnosis(self) -> str:
        """The causes as numbered lines, for a message or a hover."""
        return "\n".join(
            f"{number}. {cause.title} ({cause.likelihood.value}): {cause.evidence}"
            for number, cause in enumerate(self.fix.causes, 1)
        )

    def log_entry(self, file: str, host: str, when: datetime | None = None) -> FixLogEntry:
        """The fix log's entry for this proposal once its edit is applied."""
        if self.edit is None:
            raise ValueError("a fix log entry records an applied edit; this proposal has none")
        fix = self.fix
        return FixLogEntry(
            subject=self.prompt.subject,
            file=file,
            changelog=fix.changelog,
            causes=tuple(
                f"{cause.title} ({cause.likelihood.value}): {cause.evidence}" for cause in fix.causes
            ),
            model=self.model,
            host=host,
            prompt=self.prompt.markdown(include_system=True),
            answer=self.answer,
            # The mapping of the prompt first: the same secret gets the same placeholder.
            diff=redact(self.edit.diff(file), self.prompt.secrets).text,
            when=when or datetime.now(timezone.utc),
            entry_id=new_entry_id(),
        )


@dataclass(frozen=True)
class FixError:
    """No proposal. kind: disabled, not-configured, no-key, prompt, connection, timeout, auth,
    not-found, busy, server, bad-request, refused, unparsable, cancelled."""

    kind: str
    message: str
    answer: str | None = None


def apply_proposal(text: str, proposal: Proposal, region: Region | None = None) -> EditResult:
    """The proposal's blocks applied to `text` (raises EditRefused): for a caller that
    re-checks against the text it is about to change."""
    prompt = proposal.prompt
    return apply_blocks(
        text, proposal.fix.blocks, region or prompt.region, prompt.secrets, prompt.import_lines
    )


async def propose_fix(
    request: FixRequest,
    settings: LlmSettings,
    *,
    on_progress: Progress | None = None,
    cancel: asyncio.Event | None = None,
    stream: bool = False,
    environ: Mapping[str, str] | None = None,
    http_client: Any = None,
) -> Proposal | FixError:
    """Ask the configured model for a fix of `request`. Never raises for a user-facing
    problem; cancelling the task (or setting `cancel`) stops the request at once."""
    progress = on_progress or (lambda message: None)
    try:
        settings.check_ready()
        api_key = settings.api_key(environ)
    except NotReady as problem:
        kind = (
            "disabled"
            if not settings.enabled
            else ("no-key" if "API key" in str(problem) else "not-configured")
        )
        return FixError(kind, str(problem))
    progress("building the prompt")
    try:
        prompt = await asyncio.to_thread(build_prompt, request, settings.response_format)
    except PromptError as error:
        return FixError("prompt", str(error))
    work = asyncio.ensure_future(_converse(request, prompt, settings, api_key, progress, stream, http_client))
    if cancel is None:
        return await work
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        done, _ = await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if work in done:
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return FixError("cancelled", "cancelled: nothing was changed")


async def _converse(
    request: FixRequest,
    prompt: Prompt,
    settings: LlmSettings,
    api_key: str,
    progress: Progress,
    stream: bool,
    http_client: Any,
) -> Proposal | FixError:
    from oom_lsp.llm.client import ChatClient, FormatRejected, ModelError

    client = ChatClient(settings, api_key, http_client=http_client)
    messages = prompt.messages()
    exchanges: list[Exchange] = []
    usage: dict[str, int] = {}
    server = (settings.base_url or "", settings.model or "")
    json_schema = settings.response_format == "json_schema" and server not in _TEXT_ONLY
    if settings.response_format == "json_schema" and not json_schema:
        prompt = await asyncio.to_thread(build_prompt, request, "text")
        messages = prompt.messages()
    last_problem = ""
    try:
        attempt = 0
        while attempt < MAX_ATTEMPTS:
            attempt += 1
            progress(f"asking {settings.model} at {settings.host}" + (" again" if attempt > 1 else ""))
            answer = ""
            try:
                completion = await client.complete(
                    messages,
                    json_schema=json_schema,
                    stream=stream and not json_schema,
                    on_text=lambda count: progress(f"receiving the answer ({count} characters)"),
                )
                answer = completion.text
                for name, value in (
                    ("prompt_tokens", completion.prompt_tokens),
                    ("completion_tokens", completion.completion_tokens),
                ):
                    if value is not None:
                        usage[name] = usage.get(name, 0) + value
                fix = completion.parsed or parse_answer(answer, "json_schema" if json_schema else "text")
            except FormatRejected:
                # The server does not take json_schema: ask again once in the text format.
                progress("the server does not accept json_schema; asking for the text format")
                _TEXT_ONLY.add(server)
                json_schema, attempt = False, attempt - 1
                prompt = await asyncio.to_thread(build_prompt, request, "text")
                messages = prompt.messages()
                continue
            except ParseError as error:
                exchanges.append(Exchange(list(messages), answer))
                last_problem = str(error)
                messages = [
                    *messages,
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": _retry_note(str(error))},
                ]
                continue
            exchanges.append(Exchange(list(messages), answer))
            if not fix.edits:
                return Proposal(
                    request,
                    prompt,
                    fix,
                    None,
                    "the model proposed no edit",
                    tuple(exchanges),
                    settings.model or "",
                    usage,
                )
            progress("checking the proposed edit")
            try:
                edit = apply_blocks(
                    request.text, fix.blocks, prompt.region, prompt.secrets, prompt.import_lines
                )
            except EditRefused as refusal:
                if attempt < MAX_ATTEMPTS:
                    messages = [
                        *messages,
                        {"role": "assistant", "content": answer},
                        # The closest lines come from the file itself: redacted like the prompt.
                        {"role": "user", "content": _retry_note(redact(refusal.feedback(), prompt.secrets).text)},
                    ]
                    continue
                problem = f"could not apply the proposed change: {refusal.reason}"
                return Proposal(
                    request, prompt, fix, None, problem, tuple(exchanges), settings.model or "", usage
                )
            return Proposal(request, prompt, fix, edit, None, tuple(exchanges), settings.model or "", usage)
    except ModelError as error:
        return FixError(error.kind, error.message)
    finally:
        await client.close()
    return FixError(
        "unparsable",
        f"the model's answer could not be read, twice (last problem: {last_problem}); nothing was changed",
        exchanges[-1].answer if exchanges else None,
    )


def _retry_note(problem: str) -> str:
    return (
        f"Your answer could not be used: {problem}\n"
        "Answer again, complete, in the same format. Copy SEARCH lines exactly from the code shown."
    )
