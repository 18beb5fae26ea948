"""The sans-IO resume cursor and the reconnect backoff, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from serve.client._cursor import Backoff, StreamCursor, Verdict
from serve.client.types import Event


def ev(type_: str, id_: int | None = None, **data: Any) -> Event:
    return Event(id=id_, v=1, type=type_, data=data)


@pytest.mark.parametrize(
    ("start", "events", "verdicts", "last"),
    [
        # live start: everything delivered, cursor follows ids
        (None, [ev("a", 1), ev("b", 2)], ["deliver", "deliver"], 2),
        # duplicates (a replay overlapping what was delivered) are skipped
        (2, [ev("a", 1), ev("b", 2), ev("c", 3)], ["skip", "skip", "deliver"], 3),
        # synthetic frames are delivered and do not move the cursor
        (
            5,
            [ev("replay_complete", replayedCount=0), ev("slow_client_warning"), ev("x", 6)],
            ["deliver", "deliver", "deliver"],
            6,
        ),
        # a gap the daemon reports is delivered; ids keep counting from the ring
        (
            5,
            [ev("state_resync_required", reason="ring_evicted"), ev("x", 40)],
            ["deliver", "deliver"],
            40,
        ),
        # an epoch reset restarts ids: the replayed ring is delivered from id 1
        (
            50,
            [ev("state_resync_required", reason="epoch_reset"), ev("x", 1), ev("y", 2)],
            ["deliver", "deliver", "deliver"],
            2,
        ),
        # a terminal event stops the stream; nothing after it is delivered
        (
            None,
            [ev("x", 1), ev("session_closed", 2), ev("y", 3), ev("client_evicted")],
            ["deliver", "stop", "skip", "skip"],
            2,
        ),
        (None, [ev("session_died", 4)], ["stop"], 4),
    ],
)
def test_cursor_table(
    start: int | None, events: list[Event], verdicts: list[str], last: int | None
) -> None:
    cursor = StreamCursor(start)
    assert [cursor.observe(e).value for e in events] == verdicts
    assert cursor.last_event_id == last


def test_resume_headers_carry_the_cursor_and_epoch() -> None:
    cursor = StreamCursor()
    cursor.connected("epoch-1")
    assert cursor.resume_headers() == {}  # live start, nothing seen: resume live
    assert cursor.observe(ev("x", 12)) is Verdict.DELIVER
    assert cursor.resume_headers() == {"Last-Event-ID": "12", "X-Qwen-Event-Epoch": "epoch-1"}
    cursor.connected(None)  # a response without the header keeps the known epoch
    assert cursor.resume_headers()["X-Qwen-Event-Epoch"] == "epoch-1"
    assert StreamCursor(0).resume_headers() == {"Last-Event-ID": "0"}


@pytest.mark.parametrize(
    ("attempt", "cap", "floor", "expected"),
    [
        (1, None, None, 0.1),
        (2, None, None, 0.2),
        (4, None, None, 0.8),
        (10, None, None, 5.0),  # capped at max_s
        (10, 3.0, None, 3.0),  # the daemon's retry: hint caps it
        (1, 3.0, 2.0, 2.0),  # a Retry-After raises it
        (1, None, 60.0, 5.0),  # ... but never beyond max_s
    ],
)
def test_backoff_table(
    attempt: int, cap: float | None, floor: float | None, expected: float
) -> None:
    assert Backoff().delay(attempt, cap_s=cap, floor_s=floor) == pytest.approx(expected)


def test_backoff_is_bounded_in_attempts() -> None:
    backoff = Backoff(max_attempts=3)
    assert [backoff.exhausted(n) for n in (1, 2, 3, 4)] == [False, False, False, True]
