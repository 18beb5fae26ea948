"""Pure logic of elicitation brokering (serve/permissions/elicitation.py): the agent's
request check, the strict answer check, and how answers become votes of the voting machine."""

from __future__ import annotations

from typing import Any

import pytest

from serve.permissions import elicitation as el
from serve.permissions.voting import Cancelled, Mediator, PartialVote, Resolved, Selected, Vote

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 5},
        "n": {"type": "integer", "minimum": 1, "maximum": 3},
        "x": {"type": "number"},
        "ok": {"type": "boolean"},
        "pick": {"type": "string", "oneOf": [{"const": "a", "title": "A"}]},
        "many": {
            "type": "array",
            "items": {"anyOf": [{"const": "p", "title": "P"}]},
            "maxItems": 1,
        },
    },
    "required": ["name"],
}


def form(schema: dict[str, Any] = SCHEMA) -> el.Spec:
    return el.parse_request(
        {"sessionId": "s", "mode": "form", "message": "m", "requestedSchema": schema}
    )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([], "params must be an object"),
        ({"mode": "form", "message": "m"}, "requestedSchema"),
        ({"mode": "_x", "message": "m"}, "unsupported elicitation mode"),
        ({"mode": "form", "message": "", "requestedSchema": {}}, "`message`"),
        ({"mode": "form", "message": "m", "requestedSchema": {"type": "array"}}, '"object"'),
        (
            {"mode": "form", "message": "m", "requestedSchema": {"properties": {"a": 1}}},
            "properties.a must be an object",
        ),
        (
            {"mode": "form", "message": "m", "requestedSchema": {"required": ["zz"]}},
            "names no property",
        ),
        (
            {
                "mode": "form",
                "message": "m",
                "requestedSchema": {"properties": {"a": {"type": "string", "enum": [1]}}},
            },
            "enum values must be strings",
        ),
        ({"mode": "url", "message": "m", "elicitationId": "e"}, "`url`"),
        (
            {"mode": "url", "message": "m", "url": "file:///etc/passwd", "elicitationId": "e"},
            "http",
        ),
        ({"mode": "url", "message": "m", "url": "https://x.test"}, "`elicitationId`"),
        (
            {
                "mode": "form",
                "message": "m",
                "requestedSchema": {
                    "properties": {f"f{i}": {"type": "string"} for i in range(el.MAX_FIELDS + 1)}
                },
            },
            "more than",
        ),
    ],
)
def test_malformed_requests_are_refused(params: Any, message: str) -> None:
    with pytest.raises(el.RequestError, match=message.replace("(", r"\(")):
        el.parse_request(params)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"name": "abcdef"}, "at most 5"),
        ({"name": "a"}, "at least 2"),
        ({"name": "ab", "n": 4}, "<= 3"),
        ({"name": "ab", "n": 0}, ">= 1"),
        ({"name": "ab", "x": "1"}, "must be a number"),
        ({"name": "ab", "x": True}, "must be a number"),
        ({"name": "ab", "pick": "b"}, "not one of"),
        ({"name": "ab", "many": ["p", "p"]}, "at most 1 items"),
        ({"name": "ab", "many": ["q"]}, "not one of"),
        ({"name": "ab", "many": "p"}, "array of strings"),
    ],
)
def test_form_answers_are_checked_against_the_schema(content: dict[str, Any], message: str) -> None:
    result = el.parse_answer(form(), {"action": "accept", "content": content})
    assert isinstance(result, str) and message in result


def test_a_fitting_form_answer_and_the_url_rules() -> None:
    good = {"name": "ab", "n": 2, "x": 1.5, "ok": False, "pick": "a", "many": ["p"]}
    assert el.parse_answer(form(), {"action": "accept", "content": good}) == el.Answer(
        "accept", good
    )
    # a form without required fields may be accepted empty
    empty = form({"type": "object", "properties": {"a": {"type": "boolean"}}})
    assert el.parse_answer(empty, {"action": "accept"}) == el.Answer("accept", None)
    url = el.parse_request(
        {
            "sessionId": "s",
            "mode": "url",
            "message": "m",
            "url": "https://x.test",
            "elicitationId": "e",
        }
    )
    assert el.parse_answer(url, {"action": "accept", "content": {"k": 1}}) == (
        "a url-mode elicitation is answered without `content`"
    )
    assert el.parse_answer(url, {"action": "accept", "content": None}) == el.Answer("accept")
    assert el.parse_answer(url, {"action": "decline", "_meta": {"k": 1}}) == el.Answer(
        "decline", None, {"k": 1}
    )
    assert el.parse_answer(url, {"action": "cancel", "_meta": 3}) == "`_meta` must be an object"


def test_equal_contents_vote_together_under_consensus() -> None:
    m = Mediator(policy="consensus")
    m.open(
        request_id="r",
        session_id="s",
        options=el.OPTIONS,
        now_ms=0,
        session_clients={"a", "b", "c"},
        option_prefixes=(el.ACCEPT_PREFIX,),
    )
    first = el.outcome_of(el.Answer("accept", {"k": 1, "j": 2}))
    other = el.outcome_of(el.Answer("accept", {"k": 2}))
    same = el.outcome_of(el.Answer("accept", {"j": 2, "k": 1}))  # key order does not matter
    assert isinstance(m.vote("r", Vote("a", True, first)), PartialVote)
    assert isinstance(m.vote("r", Vote("b", True, other)), PartialVote)
    done = m.vote("r", Vote("c", True, same))
    assert isinstance(done, Resolved) and done.outcome == first
    pending = el.Pending(form())
    pending.contents[first.option_id] = {"k": 1, "j": 2}  # type: ignore[union-attr]
    assert el.agent_response(done, pending) == {"action": "accept", "content": {"k": 1, "j": 2}}


def test_accept_options_are_only_valid_on_elicitations() -> None:
    m = Mediator()
    m.open(request_id="perm", session_id="s", options=el.OPTIONS, now_ms=0)
    refused = m.vote("perm", Vote(None, True, Selected(el.digest({}))))
    assert type(refused).__name__ == "InvalidOption"


def test_unanswered_ends_reach_the_agent_as_cancel_with_the_reason() -> None:
    m = Mediator(response_timeout_ms=10)
    m.open(
        request_id="r",
        session_id="s",
        options=el.OPTIONS,
        now_ms=0,
        option_prefixes=(el.ACCEPT_PREFIX,),
    )
    [expired] = m.expire(10)
    assert expired.outcome == Cancelled()
    pending = el.Pending(form())
    assert el.agent_response(expired, pending) == {
        "action": "cancel",
        "_meta": {el.CANCEL_META_KEY: "timeout"},
    }
    [event] = el.resolved_events(expired, pending)
    assert event.type == "elicitation_resolved"
    assert event.data == {
        "requestId": "r",
        "sessionId": "s",
        "action": "cancel",
        "reason": "timeout",
    }


def test_client_modes() -> None:
    assert el.client_modes({"elicitation": {"form": {}, "url": None}}) == {"form"}
    assert el.client_modes({"elicitation": {}}) == frozenset()
    assert el.client_modes({"elicitation": True}) == frozenset()
    assert el.client_modes(None) == frozenset()
