"""serve/api/prompts.py, sans-IO: the one validation of a prompt body and a turn's outcome.

The refusals are pinned as REST renders them (the bodies routes/sessions.py always sent);
the order of the checks is the reference's: content, ``_meta``, ``steer``, ``promptId``,
``deadlineMs``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from serve.api import PromptBody, TurnCompleted, parse_prompt, prompt_content, turn_outcome
from serve.api.prompts import MAX_DEADLINE_MS
from serve.http.errors import to_api_error
from serve.sessions.errors import (
    InvalidRequest,
    TurnAgentUnavailable,
    TurnBudgetExhausted,
    TurnFailed,
    TurnRetryable,
    TurnSessionLost,
)
from serve.sessions.messages import Admission

TEXT = [{"type": "text", "text": "hi"}]


def refusal(body: dict[str, Any], **kw: bool) -> tuple[int, bytes]:
    with pytest.raises(InvalidRequest) as caught:
        parse_prompt(body, **kw)
    mapped = to_api_error(caught.value)
    assert mapped is not None and mapped.headers == {}
    return mapped.status, msgspec.json.encode(mapped.body)


def test_a_valid_body_is_typed_and_forwards_only_meta() -> None:
    body = {
        "sessionId": "s-from-the-body",
        "prompt": [*TEXT, {"type": "image", "data": "x"}, {"type": "text", "text": "there"}],
        "promptId": "p1",
        "deadlineMs": MAX_DEADLINE_MS,
        "steer": True,
        "_meta": {"k": 1},
        "model": "not forwarded",
    }
    parsed = parse_prompt(body)
    assert isinstance(parsed, PromptBody)
    assert parsed.content.text == "hi\nthere"
    assert msgspec.json.decode(bytes(parsed.content.blocks)) == body["prompt"]
    assert parsed.extra == {"_meta": {"k": 1}}  # never the body's sessionId
    assert (parsed.steer, parsed.prompt_id, parsed.deadline_ms) == (True, "p1", MAX_DEADLINE_MS)
    request = parsed.request("c1")
    assert (request.client_id, request.extra, request.prompt_id) == (
        "c1",
        {"_meta": {"k": 1}},
        "p1",
    )
    assert parse_prompt({"prompt": TEXT}).request(None).extra is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, b'{"error":"`prompt` must be a non-empty array of content blocks"}'),
        ({"prompt": []}, b'{"error":"`prompt` must be a non-empty array of content blocks"}'),
        (
            {"prompt": [{"text": "x"}]},
            b'{"error":"`prompt` must be a non-empty array of content blocks"}',
        ),
        ({"prompt": [{"type": "text"}]}, b'{"error":"text content blocks need a string `text`"}'),
        (
            {"prompt": [{"type": "image"}] * 257},
            b'{"error":"at most 256 non-text content blocks per prompt"}',
        ),
        ({"prompt": TEXT, "_meta": 3}, b'{"error":"`_meta` must be a JSON object"}'),
        (
            {"prompt": TEXT, "steer": "yes"},
            b'{"error":"`steer` must be a boolean","code":"invalid_steer"}',
        ),
        (
            {"prompt": TEXT, "promptId": "x" * 129},
            b'{"error":"`promptId` must be a non-empty string of at most 128 characters",'
            b'"code":"invalid_prompt_id"}',
        ),
        (
            {"prompt": TEXT, "promptId": ""},
            b'{"error":"`promptId` must be a non-empty string of at most 128 characters",'
            b'"code":"invalid_prompt_id"}',
        ),
        *[
            (
                {"prompt": TEXT, "deadlineMs": bad},
                b'{"error":"`deadlineMs` must be a positive integer","code":"invalid_deadline_ms"}',
            )
            for bad in (0, -1, True, 1.5, "10", MAX_DEADLINE_MS + 1)
        ],
    ],
)
def test_each_refusal_has_its_rest_body(body: dict[str, Any], expected: bytes) -> None:
    assert refusal(body) == (400, expected)


def test_the_checks_run_in_the_reference_order() -> None:
    everything_wrong = {"prompt": [], "_meta": 1, "steer": 1, "promptId": 1, "deadlineMs": 0}
    order = []
    body = dict(everything_wrong)
    for key in ("prompt", "_meta", "steer", "promptId", "deadlineMs"):
        order.append(refusal(body)[1])
        body[key] = {"prompt": TEXT, "_meta": {}, "steer": False, "promptId": "p", "deadlineMs": 1}[
            key
        ]
    assert [b"content blocks" in order[0], b"_meta" in order[1], b"steer" in order[2]] == [True] * 3
    assert b"promptId" in order[3] and b"deadlineMs" in order[4]
    parse_prompt(body)


def test_a_front_without_steering_ignores_the_field() -> None:
    assert parse_prompt({"prompt": TEXT, "steer": "junk"}, steering=False).steer is False


def test_prompt_content_alone() -> None:
    assert prompt_content(TEXT).text == "hi"
    with pytest.raises(InvalidRequest):
        prompt_content("hi")


def _admission(kind: str, data: dict[str, Any]) -> Admission:
    job = SimpleNamespace(terminal=SimpleNamespace(kind=kind, data=data))
    return Admission("p1", 0, "e", job, None)


def test_a_completed_turn() -> None:
    done = turn_outcome(_admission("turn_complete", {"stopReason": "end_turn"}))
    assert done == TurnCompleted("p1", "end_turn", {})
    done = turn_outcome(_admission("turn_complete", {"stopReason": "x", "branchPoint": None}))
    assert done.fields == {"branchPoint": None}


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("budget_exhausted", TurnBudgetExhausted),
        ("agent_session_not_found", TurnSessionLost),
        ("agent_unavailable", TurnAgentUnavailable),
        ("channel_closed", TurnRetryable),
        ("agent_oom", TurnRetryable),
        ("prompt_deadline_exceeded", TurnFailed),
        (-32603, TurnFailed),
        (None, TurnFailed),
    ],
)
def test_a_failed_turn_raises_its_class(code: object, kind: type[TurnFailed]) -> None:
    data = {"message": "m"} if code is None else {"message": "m", "code": code}
    with pytest.raises(TurnFailed) as caught:
        turn_outcome(_admission("turn_error", data))
    assert type(caught.value) is kind
    expected = {"error": "m", **({"code": code} if code is not None else {}), "promptId": "p1"}
    assert caught.value.body() == expected
