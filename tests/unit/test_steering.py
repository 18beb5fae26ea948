"""The pure parts of steering (serve/sessions/steering.py): what the agent advertised, what
is sent, and how its answer is read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from serve.sessions.prompt_queue import PromptRequest
from serve.sessions.steering import advertises_steering, outcome_of, steering_params


def conn(meta: bytes | None) -> Any:
    return SimpleNamespace(info=None if meta is None else SimpleNamespace(meta=meta))


@pytest.mark.parametrize(
    ("meta", "steers"),
    [
        (b'{"steering":{"supported":true}}', True),
        (b'{"steering":{"supported":"true"}}', False),  # exactly true, as the agents check
        (b'{"steering":{"supported":false}}', False),
        (b'{"steering":true}', False),
        (b'{"other":1}', False),
        (b"[1]", False),
        (b"not json", False),
        (b"", False),
        (None, False),  # no initialize answer yet
    ],
)
def test_only_a_true_steering_supported_counts(meta: bytes | None, steers: bool) -> None:
    assert advertises_steering(conn(meta)) is steers
    assert advertises_steering(None) is False


def test_params_keep_the_callers_meta_and_ask_for_prompt_required() -> None:
    request = PromptRequest(
        msgspec.Raw(b'[{"type":"text","text":"hi"}]'),
        "hi",
        None,
        extra={"_meta": {"trace": "t", "steering": {"idleBehavior": "startNewTurn", "x": 1}}},
    )
    params = steering_params("s1", request)
    assert msgspec.json.decode(msgspec.json.encode(params)) == {
        "sessionId": "s1",
        "prompt": [{"type": "text", "text": "hi"}],
        "_meta": {"trace": "t", "steering": {"idleBehavior": "promptRequired", "x": 1}},
    }


@pytest.mark.parametrize(
    ("raw", "outcome"),
    [
        (b'{"outcome":"injected"}', "injected"),
        (b'{"outcome":"promptRequired","reason":"noRunningTurn"}', "promptRequired"),
        (b'{"outcome":"failed"}', "failed"),
        (b'{"outcome":"startedNewTurn"}', "startedNewTurn"),
        # anything else: the message is the agent's now, never sent a second time
        (b"{}", "startedNewTurn"),
        (b'{"outcome":""}', "startedNewTurn"),
        (b'{"outcome":3}', "startedNewTurn"),
        (b"null", "startedNewTurn"),
        (b"garbage", "startedNewTurn"),
    ],
)
def test_the_agents_answer(raw: bytes, outcome: str) -> None:
    assert outcome_of(raw) == outcome
