"""propose_fix against the loopback server with the real openai client: each scripted
answer ends in the right edit or the right message."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time

import pytest

from oom_lsp.edits import apply_edits
from oom_lsp.llm.fixer import FixError, Proposal, apply_proposal, propose_fix
from oom_lsp.llm.prompt import FixRequest
from oom_lsp.llm.settings import LlmSettings
from tests.llm.conftest import (
    AMBIGUOUS_ANSWER,
    BROKEN_ANSWER,
    FIXED_LINE,
    GARBAGE,
    GOOD_ANSWER,
    NO_MATCH_ANSWER,
    TARGET_LINE,
    TRAIN,
)
from tests.llm.fake_server import FakeModelServer

ENV = {"TEST_LLM_KEY": "test-key-123"}


def settings_for(fake: FakeModelServer, **changes: object) -> LlmSettings:
    base = LlmSettings(
        enabled=True,
        base_url=fake.base_url,
        model="test-model",
        api_key_env="TEST_LLM_KEY",
        timeout=10,
        max_retries=1,
    )
    return dataclasses.replace(base, **changes)


def ask(fake: FakeModelServer, **options: object) -> Proposal | FixError:
    settings = options.pop("settings", None) or settings_for(fake)
    request = FixRequest(path="train.py", text=TRAIN, line=TARGET_LINE)
    return asyncio.run(propose_fix(request, settings, environ=ENV, **options))


def assert_fixed(result: Proposal | FixError) -> Proposal:
    assert isinstance(result, Proposal), result
    assert result.edit is not None, result.problem
    assert result.edit.new_text == TRAIN.replace("        total_loss += loss\n", FIXED_LINE, 1)
    assert apply_edits(TRAIN, result.edit.edits) == result.edit.new_text
    return result


def test_good_fix_is_one_minimal_line_edit(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER})
    result = assert_fixed(ask(fake))
    (edit,) = result.edit.edits
    assert (edit.range.start.line, edit.range.end.line, edit.new_text) == (15, 16, FIXED_LINE)
    assert [cause.likelihood.value for cause in result.fix.causes] == ["high", "medium"]
    assert result.changelog == "Accumulate the training loss with .item() so each step's graph is freed"
    assert result.usage == {"prompt_tokens": 100, "completion_tokens": 50}
    (request,) = fake.requests
    assert request["headers"]["authorization"] == "Bearer test-key-123"
    body = request["body"]
    assert body["model"] == "test-model" and body["max_tokens"] == 1500 and "response_format" not in body
    sent = json.dumps(body)
    assert "sk-proj-abcdefghijklmnopqrstuvwxyz012345" not in sent  # module level, outside the code sent


def test_streamed_answer_reports_progress(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER})
    seen: list[str] = []
    assert_fixed(ask(fake, stream=True, on_progress=seen.append))
    assert fake.requests[0]["body"]["stream"] is True
    assert seen[0] == "building the prompt" and any(
        message.startswith("receiving the answer") for message in seen
    )


def test_search_that_does_not_match_is_retried_with_the_closest_lines(fake: FakeModelServer) -> None:
    fake.script({"content": NO_MATCH_ANSWER}, {"content": GOOD_ANSWER})
    assert_fixed(ask(fake))
    retry = fake.requests[1]["body"]["messages"]
    assert retry[-2] == {"role": "assistant", "content": NO_MATCH_ANSWER}
    assert "was not found" in retry[-1]["content"] and "        total_loss += loss" in retry[-1]["content"]


def test_search_that_never_matches_leaves_the_diagnosis_without_an_edit(fake: FakeModelServer) -> None:
    fake.script({"content": NO_MATCH_ANSWER}, {"content": NO_MATCH_ANSWER})
    result = ask(fake)
    assert isinstance(result, Proposal) and result.edit is None
    assert result.problem.startswith(
        "could not apply the proposed change: the SEARCH text of the edit was not found"
    )
    assert result.fix.causes[0].title == "Loss accumulated with its graph"


def test_ambiguous_search_is_refused(fake: FakeModelServer) -> None:
    fake.script({"content": AMBIGUOUS_ANSWER}, {"content": AMBIGUOUS_ANSWER})
    result = ask(fake)
    assert isinstance(result, Proposal) and result.edit is None
    assert "matches 2 places" in result.problem


def test_edit_that_breaks_the_syntax_is_refused(fake: FakeModelServer) -> None:
    fake.script({"content": BROKEN_ANSWER}, {"content": BROKEN_ANSWER})
    result = ask(fake)
    assert isinstance(result, Proposal) and result.edit is None
    assert "does not parse" in result.problem
    assert "does not parse" in fake.requests[1]["body"]["messages"][-1]["content"]


def test_garbage_then_a_good_answer(fake: FakeModelServer) -> None:
    fake.script({"content": GARBAGE}, {"content": GOOD_ANSWER})
    assert_fixed(ask(fake))
    assert "no `## Diagnosis` section" in fake.requests[1]["body"]["messages"][-1]["content"]


def test_garbage_twice_is_a_readable_error(fake: FakeModelServer) -> None:
    fake.script({"content": GARBAGE}, {"content": GARBAGE})
    result = ask(fake)
    assert isinstance(result, FixError) and result.kind == "unparsable"
    assert "could not be read, twice" in result.message and result.answer == GARBAGE


def test_truncated_answer_is_not_half_parsed(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER[:200], "finish_reason": "length"}, {"content": GOOD_ANSWER})
    assert_fixed(ask(fake))
    assert "cut off" in fake.requests[1]["body"]["messages"][-1]["content"]


def test_rate_limit_is_retried_by_the_client(fake: FakeModelServer) -> None:
    fake.script({"status": 429, "headers": {"retry-after-ms": "10"}}, {"content": GOOD_ANSWER})
    assert_fixed(ask(fake))
    assert len(fake.requests) == 2


def test_rate_limit_that_persists(fake: FakeModelServer) -> None:
    fake.script(*[{"status": 429, "headers": {"retry-after-ms": "10"}}] * 2)
    result = ask(fake)
    assert isinstance(result, FixError) and result.kind == "busy"
    assert "HTTP 429" in result.message and len(fake.requests) == 2


def test_server_error_is_retried_then_reported(fake: FakeModelServer) -> None:
    fake.script(
        {"status": 500, "error": "boom", "headers": {"retry-after-ms": "10"}}, {"content": GOOD_ANSWER}
    )
    assert_fixed(ask(fake))
    fake.script(
        *[{"status": 500, "error": "CUDA error on the server", "headers": {"retry-after-ms": "10"}}] * 2
    )
    result = ask(fake)
    assert isinstance(result, FixError) and result.kind == "server"
    assert "HTTP 500" in result.message and "CUDA error on the server" in result.message


def test_unauthorised_names_the_variable(fake: FakeModelServer) -> None:
    fake.script({"status": 401, "error": "bad key"})
    result = ask(fake)
    assert isinstance(result, FixError) and result.kind == "auth" and "TEST_LLM_KEY" in result.message
    assert len(fake.requests) == 1  # 401 is not retried


def test_timeout(fake: FakeModelServer) -> None:
    fake.script({"delay": 5, "content": GOOD_ANSWER})
    started = time.monotonic()
    result = ask(fake, settings=settings_for(fake, timeout=0.3, max_retries=0))
    assert isinstance(result, FixError) and result.kind == "timeout"
    assert "within 0.3 s" in result.message and time.monotonic() - started < 3


def test_hang_cancelled_by_the_caller(fake: FakeModelServer) -> None:
    fake.script({"delay": 30, "content": GOOD_ANSWER})

    async def scenario() -> tuple[Proposal | FixError, float]:
        cancel = asyncio.Event()
        request = FixRequest(path="train.py", text=TRAIN, line=TARGET_LINE)
        task = asyncio.ensure_future(propose_fix(request, settings_for(fake), environ=ENV, cancel=cancel))
        while not fake.requests:
            await asyncio.sleep(0.02)
        started = time.monotonic()
        cancel.set()
        return await task, time.monotonic() - started

    result, elapsed = asyncio.run(scenario())
    assert isinstance(result, FixError) and result.kind == "cancelled"
    assert elapsed < 1


def test_task_cancellation_propagates(fake: FakeModelServer) -> None:
    fake.script({"delay": 30, "content": GOOD_ANSWER})

    async def scenario() -> None:
        request = FixRequest(path="train.py", text=TRAIN, line=TARGET_LINE)
        task = asyncio.ensure_future(propose_fix(request, settings_for(fake), environ=ENV))
        while not fake.requests:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 1)

    asyncio.run(scenario())


def test_connection_refused(fake: FakeModelServer) -> None:
    settings = settings_for(fake, base_url="http://127.0.0.1:9/v1", max_retries=0)
    result = ask(fake, settings=settings)
    assert isinstance(result, FixError) and result.kind == "connection"
    assert "is the server running?" in result.message


def test_disabled_sends_nothing(fake: FakeModelServer) -> None:
    result = ask(fake, settings=settings_for(fake, enabled=False))
    assert isinstance(result, FixError) and result.kind == "disabled"
    assert "enabled = true" in result.message and fake.requests == []


def test_missing_key_names_the_variable_and_sends_nothing(fake: FakeModelServer) -> None:
    settings = settings_for(fake, base_url="https://api.example.com/v1", api_key_env="MY_KEY")
    result = asyncio.run(propose_fix(FixRequest("train.py", TRAIN, TARGET_LINE), settings, environ={}))
    assert isinstance(result, FixError) and result.kind == "no-key"
    assert "set the environment variable MY_KEY" in result.message and fake.requests == []


def test_loopback_server_needs_no_key(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER})
    result = asyncio.run(
        propose_fix(FixRequest("train.py", TRAIN, TARGET_LINE), settings_for(fake), environ={})
    )
    assert_fixed(result)
    assert fake.requests[0]["headers"]["authorization"] == "Bearer not-needed"


def test_diagnosis_without_edit(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER.split("## Edits")[0] + "## Changelog\nNothing to change here\n"})
    result = ask(fake)
    assert (
        isinstance(result, Proposal)
        and result.edit is None
        and result.problem == "the model proposed no edit"
    )


def test_edit_outside_the_region_sent_is_refused(fake: FakeModelServer) -> None:
    outside = GOOD_ANSWER.replace(
        "        optimizer.zero_grad()\n        total_loss += loss\n=",
        "        total_loss += model(inputs.cuda(), labels.cuda())\n=",
    )
    fake.script({"content": outside}, {"content": outside})
    result = ask(fake)
    assert isinstance(result, Proposal) and result.edit is None
    assert "matches only outside the code that was sent" in result.problem  # evaluate() was not sent


def test_redacted_line_is_restored_when_edited(fake: FakeModelServer) -> None:
    text = TRAIN.replace(
        "    model.train()\n", '    model.train()\n    token = "hf_abcdefghijklmnopqrstuvwxyz"\n'
    )
    answer = GOOD_ANSWER.replace(
        "        optimizer.zero_grad()\n        total_loss += loss\n=======\n        optimizer.zero_grad()\n",
        '    token = "__REDACTED_1__"\n    optimizer.zero_grad()\n=======\n    token = "__REDACTED_1__"\n    optimizer.zero_grad(set_to_none=True)\n',
    ).replace("        total_loss += loss.item()\n>", ">")
    fake.script({"content": answer})
    request = FixRequest(path="train.py", text=text, line=TARGET_LINE + 1)
    result = asyncio.run(propose_fix(request, settings_for(fake), environ=ENV))
    assert isinstance(result, Proposal) and result.edit is not None, result
    assert (
        '    token = "hf_abcdefghijklmnopqrstuvwxyz"\n    optimizer.zero_grad(set_to_none=True)\n'
        in result.edit.new_text
    )
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in json.dumps(fake.requests[0]["body"])
    assert result.prompt.secrets == {"__REDACTED_1__": "hf_abcdefghijklmnopqrstuvwxyz"}


def test_json_schema_mode(fake: FakeModelServer) -> None:
    answer = {
        "causes": [{"title": "Loss kept with its graph", "evidence": "line 13", "likelihood": "high"}],
        "edits": [{"search": "        total_loss += loss\n", "replace": FIXED_LINE, "why": "free the graph"}],
        "validation": {"step": "profile one step", "expected": "flat peak"},
        "changelog": "Accumulate the loss with .item()",
    }
    fake.script({"content": json.dumps(answer)})
    result = assert_fixed(ask(fake, settings=settings_for(fake, response_format="json_schema")))
    assert result.fix.edits[0].why == "free the graph"
    response_format = fake.requests[0]["body"]["response_format"]
    assert response_format["type"] == "json_schema" and response_format["json_schema"]["strict"] is True


def test_json_schema_rejected_falls_back_to_text(fake: FakeModelServer) -> None:
    fake.script(
        {"status": 400, "error": "response_format json_schema is not supported"}, {"content": GOOD_ANSWER}
    )
    assert_fixed(ask(fake, settings=settings_for(fake, response_format="json_schema")))
    assert "response_format" not in fake.requests[1]["body"]
    assert "## Diagnosis" in fake.requests[1]["body"]["messages"][0]["content"]
    # Remembered for this server and model: the next request is in the text format at once.
    fake.script({"content": GOOD_ANSWER})
    assert_fixed(ask(fake, settings=settings_for(fake, response_format="json_schema")))
    assert len(fake.requests) == 3 and "response_format" not in fake.requests[2]["body"]


def test_apply_proposal_rechecks_against_a_changed_text(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER})
    proposal = assert_fixed(ask(fake))
    assert apply_proposal(TRAIN, proposal).new_text == proposal.edit.new_text
    changed = TRAIN.replace("        total_loss += loss\n", "        total_loss += loss.detach()\n", 1)
    from oom_lsp.llm.edits import EditRefused

    with pytest.raises(EditRefused):
        apply_proposal(changed, proposal)


@pytest.mark.skipif(
    not os.environ.get("OOM_LSP_TEST_LLM_BASE_URL"),
    reason="a real model server: set OOM_LSP_TEST_LLM_BASE_URL (and OOM_LSP_TEST_LLM_MODEL, OPENAI_API_KEY)",
)
def test_real_model_server() -> None:
    """Opt-in smoke test against a real OpenAI-compatible server."""
    settings = LlmSettings(
        enabled=True,
        base_url=os.environ["OOM_LSP_TEST_LLM_BASE_URL"],
        model=os.environ.get("OOM_LSP_TEST_LLM_MODEL", "default"),
        timeout=600,
        response_format=os.environ.get("OOM_LSP_TEST_LLM_FORMAT", "text"),
    )
    result = asyncio.run(propose_fix(FixRequest(path="train.py", text=TRAIN, line=TARGET_LINE), settings))
    # A real model may answer badly; the transport and the checks must not fail.
    assert isinstance(result, Proposal) or result.kind == "unparsable", result
    if isinstance(result, Proposal) and result.edit is not None:
        compile(result.edit.new_text, "train.py", "exec")


def test_an_import_can_be_added(fake: FakeModelServer) -> None:
    answer = GOOD_ANSWER.replace(
        "## Validation",
        "<<<<<<< SEARCH\nimport torch\n=======\nimport torch\nimport torch.utils.checkpoint\n>>>>>>> REPLACE\n## Validation",
    )
    fake.script({"content": answer})
    result = ask(fake)
    assert isinstance(result, Proposal) and result.edit is not None, result
    assert result.edit.new_text.startswith("import torch\nimport torch.utils.checkpoint\n")
    assert result.prompt.import_lines == (1,)


def test_the_retry_hint_is_redacted_too(fake: FakeModelServer) -> None:
    """The closest actual lines of a refused SEARCH come from the file: a secret on them
    is sent as its placeholder, as in the first prompt."""
    text = TRAIN.replace("        total_loss += loss\n", '        total_loss += loss  # token="hunter2-very-secret"\n')
    near_miss = GOOD_ANSWER.replace("        total_loss += loss\n=", '        total_loss += loss  # tokn="x"\n=')
    fake.script({"content": near_miss}, {"content": near_miss})
    request = FixRequest(path="train.py", text=text, line=TARGET_LINE)
    result = asyncio.run(propose_fix(request, settings_for(fake), environ=ENV))
    assert isinstance(result, Proposal) and result.edit is None
    retry = fake.requests[1]["body"]["messages"][-1]["content"]
    assert "Did you mean to match" in retry and 'token="__REDACTED_1__"' in retry
    assert "hunter2-very-secret" not in json.dumps([request["body"] for request in fake.requests])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "its body is not JSON"),
        ('{"choices": []}', "no choices in it"),
        ('{"object": "error"}', "no choices in it"),
        ('{"choices": [{"index": 0, "message": null}]}', "the first choice has no message"),
        ('{"choices": [{"index": 0, "message": {"content": 5}, "finish_reason": "stop"}]}', "content is int"),
    ],
)
def test_an_http_200_that_is_no_completion_is_a_message(fake: FakeModelServer, raw: str, message: str) -> None:
    fake.script({"raw": raw})
    result = ask(fake, settings=settings_for(fake, max_retries=0))
    assert isinstance(result, FixError) and result.kind == "server", result
    assert "gave an unusable answer" in result.message and message in result.message


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "no answer in it"),
        ("data: {broken\n\n", "an event of the stream is not JSON"),
        ("data: [DONE]\n\n", "no answer in it"),
        ('data: {"choices": "x"}\n\ndata: [DONE]\n\n', "no choices in it"),
    ],
)
def test_a_broken_event_stream_is_a_message(fake: FakeModelServer, raw: str, message: str) -> None:
    fake.script({"raw": raw})
    result = ask(fake, settings=settings_for(fake, max_retries=0), stream=True)
    assert isinstance(result, FixError) and result.kind == "server", result
    assert message in result.message


def test_an_answer_past_any_token_limit_is_refused(fake: FakeModelServer) -> None:
    fake.script({"content": GOOD_ANSWER + "x" * 200_000})
    result = ask(fake, stream=True)
    assert isinstance(result, FixError) and result.kind == "too-long"
    assert "longer than 100,000 characters" in result.message
