"""EventLog: ids, encoding, replay and resync, backpressure, close."""

from __future__ import annotations

import json

import msgspec
import pytest
import trio
import trio.testing

from serve.events import EventLog, SubscriberLimitExceeded
from serve.events.log import MAX_SUBSCRIBERS


def parse(chunk: bytes | None) -> list[dict]:
    """Parse SSE frames the way the SDK does: JSON of the data: lines."""
    assert chunk is not None
    events = []
    for block in chunk.decode().split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events


def types(chunk: bytes | None) -> list[str]:
    return [e["type"] for e in parse(chunk)]


def test_ids_are_monotonic_from_one_and_frames_carry_the_envelope() -> None:
    log = EventLog("s1")
    assert log.publish("turn_complete", {"sessionId": "s1", "stopReason": "end_turn"}) == 1
    raw = msgspec.Raw(b'{"sessionId":"s1","update":{"sessionUpdate":"x_unknown","extra":[1]}}')
    assert log.publish("session_update", raw, prompt_id="p1", originator="c1") == 2
    frame = log.frame(2)
    assert frame is not None
    assert frame.startswith(b"id: 2\nevent: session_update\ndata: {")
    envelope = parse(frame)[0]
    assert envelope["id"] == 2 and envelope["v"] == 1 and envelope["type"] == "session_update"
    # Unknown update kinds and fields are relayed untouched.
    assert envelope["data"]["update"] == {"sessionUpdate": "x_unknown", "extra": [1]}
    assert envelope["promptId"] == "p1" and envelope["originatorClientId"] == "c1"
    assert isinstance(envelope["_meta"]["serverTimestamp"], int)


def test_unencodable_event_does_not_burn_an_id() -> None:
    log = EventLog("s1")
    assert log.publish("x", {"bad": object()}) is None
    assert log.publish("x", {}) == 1


def test_live_subscriber_gets_only_new_events() -> None:
    log = EventLog("s1")
    log.publish("a", {})
    sub = log.subscribe()
    assert sub.take_nowait() == b""
    log.publish("b", {})
    assert [e["id"] for e in parse(sub.take_nowait())] == [2]


def test_replay_after_last_event_id_then_replay_complete() -> None:
    log = EventLog("s1")
    for _ in range(5):
        log.publish("a", {})
    events = parse(log.subscribe(last_event_id=2).take_nowait())
    assert [e.get("id") for e in events] == [3, 4, 5, None]
    assert events[-1]["type"] == "replay_complete"
    assert events[-1]["data"] == {"replayedCount": 3, "lastReplayedEventId": 5, "lastEventId": 5}


def test_replay_from_zero_gives_everything() -> None:
    log = EventLog("s1")
    log.publish("a", {})
    assert types(log.subscribe(last_event_id=0).take_nowait()) == ["a", "replay_complete"]


def test_ring_evicted_resync_when_the_cursor_fell_out() -> None:
    log = EventLog("s1", ring_size=3)
    for _ in range(6):
        log.publish("a", {})
    events = parse(log.subscribe(last_event_id=1).take_nowait())
    assert events[0]["type"] == "state_resync_required"
    assert events[0]["data"] == {
        "reason": "ring_evicted",
        "lastDeliveredId": 1,
        "earliestAvailableId": 4,
    }
    assert [e.get("id") for e in events[1:]] == [4, 5, 6, None]


def test_epoch_mismatch_replays_the_whole_ring() -> None:
    log = EventLog("s1")
    log.publish("a", {})
    log.publish("a", {})
    events = parse(log.subscribe(last_event_id=2, epoch="other").take_nowait())
    assert events[0]["data"]["reason"] == "epoch_reset"
    assert events[0]["data"]["detail"] == "epoch_mismatch"
    assert [e.get("id") for e in events[1:]] == [1, 2, None]


def test_future_last_event_id_is_an_epoch_reset_without_detail() -> None:
    log = EventLog("s1")
    log.publish("a", {})
    events = parse(log.subscribe(last_event_id=99).take_nowait())
    assert events[0]["data"] == {
        "reason": "epoch_reset",
        "lastDeliveredId": 99,
        "earliestAvailableId": 1,
    }


def test_seeded_replay_not_in_ring() -> None:
    log = EventLog("s1", next_id=10)
    events = parse(log.subscribe(last_event_id=3).take_nowait())
    assert events[0]["data"]["reason"] == "seeded_replay_not_in_ring"
    assert events[0]["data"]["earliestAvailableId"] == 10


def test_replay_budget_is_enforced() -> None:
    log = EventLog("s1")
    big = "x" * (3 * 1024 * 1024)
    for _ in range(4):
        log.publish("a", {"big": big})
    events = parse(log.subscribe(last_event_id=0).take_nowait())
    assert [e.get("id") for e in events[:2]] == [1, 2]
    assert events[2]["data"]["reason"] == "replay_budget_exceeded"
    assert events[2]["data"]["earliestAvailableId"] == 3
    assert events[-1]["type"] == "replay_complete"


def test_slow_subscriber_is_warned_once_then_evicted() -> None:
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)
    assert sub.take_nowait() == b""  # the writer "went away" to write
    for _ in range(12):
        log.publish("a", {})
    chunk = sub.take_nowait()
    assert types(chunk)[0] == "slow_client_warning"
    assert types(chunk).count("a") == 12
    for _ in range(12):
        log.publish("a", {})
    assert "slow_client_warning" not in types(sub.take_nowait())  # one per episode
    for _ in range(17):
        log.publish("a", {})
    evicted = parse(sub.take_nowait())
    assert evicted[-1]["type"] == "client_evicted"
    assert evicted[-1]["data"]["reason"] == "queue_overflow"
    assert evicted[-1]["data"]["droppedAfter"] == 24
    assert sub.take_nowait() is None
    assert sub not in log.subscribers


def test_warning_rearms_below_threshold() -> None:
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)
    sub.take_nowait()
    for _ in range(12):
        log.publish("a", {})
    assert "slow_client_warning" in types(sub.take_nowait())
    log.publish("a", {})
    sub.take_nowait()  # pressure 1 <= 6: re-armed
    for _ in range(12):
        log.publish("a", {})
    assert "slow_client_warning" in types(sub.take_nowait())


async def test_a_burst_while_parked_does_not_evict_a_reader_that_keeps_up() -> None:
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)
    received: list[int] = []

    async def reader() -> None:
        while (chunk := await sub.next_chunk()) is not None:
            received.extend(e["id"] for e in parse(chunk) if "id" in e)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(5000):  # one synchronous burst, far beyond max_queued
            log.publish("a", {})
        log.close()
    assert received == list(range(1, 5001))


async def test_close_lets_subscribers_drain_then_end() -> None:
    log = EventLog("s1")
    sub = log.subscribe()
    log.publish("session_died", {"reason": "channel_closed"})
    log.close()
    assert log.publish("late", {}) is None
    assert types(await sub.next_chunk()) == ["session_died"]
    assert await sub.next_chunk() is None


async def test_next_chunk_times_out_with_empty_bytes(autojump_clock: trio.abc.Clock) -> None:
    log = EventLog("s1")
    sub = log.subscribe()
    assert await sub.next_chunk(timeout_s=15) == b""


def test_subscriber_limit() -> None:
    log = EventLog("s1")
    for _ in range(MAX_SUBSCRIBERS):
        log.subscribe()
    with pytest.raises(SubscriberLimitExceeded):
        log.subscribe()


def test_sink_sees_every_frame_in_order() -> None:
    seen: list[tuple[int, str]] = []
    log = EventLog("s1", sink=lambda i, t, f: seen.append((i, t)))
    log.publish("a", {})
    log.publish("b", {})
    assert seen == [(1, "a"), (2, "b")]


async def test_wait_drained_paces_the_publisher_until_writers_catch_up(
    autojump_clock: trio.abc.Clock,
) -> None:
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)
    sub.take_nowait()  # the writer is now "away" writing
    for _ in range(10):
        log.publish("a", {})
    assert log.max_pressure() == 10 / 16
    waited: list[float] = []

    async def publisher() -> None:
        t0 = trio.current_time()
        await log.wait_drained(threshold=0.5, max_wait_s=5)
        waited.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher)
        await trio.sleep(1)
        assert waited == []  # still paced: the writer has not taken anything
        sub.take_nowait()
    assert waited == [1.0]


async def test_wait_drained_gives_up_on_a_stuck_writer(autojump_clock: trio.abc.Clock) -> None:
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)
    sub.take_nowait()
    for _ in range(12):
        log.publish("a", {})
    t0 = trio.current_time()
    await log.wait_drained(threshold=0.5, max_wait_s=0.25)
    assert trio.current_time() - t0 == pytest.approx(0.25)


async def test_parked_subscribers_never_pace_the_publisher() -> None:
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)

    async def reader() -> None:
        await sub.next_chunk()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(100):  # the parked reader has not run yet: backlog, not pressure
            log.publish("a", {})
        assert log.max_pressure() == 0.0
        log.close()


def test_the_ring_is_bounded_in_bytes_and_keeps_the_newest_frame() -> None:
    log = EventLog("s", ring_size=100, ring_bytes=10_000)
    for _ in range(10):
        log.publish("session_update", {"text": "x" * 2_000})
    assert log.held_bytes <= 10_000 and log.first_id is not None and log.first_id > 1
    kept = log.next_id - log.first_id
    assert 3 <= kept <= 5 and log.byte_evictions == 10 - kept
    log.publish("session_update", {"text": "y" * 50_000})  # larger than the whole ring
    assert log.first_id == log.last_id == 11 and log.frame(11) is not None
    sub = log.subscribe(last_event_id=2)
    resync = sub._pending[0]
    assert b"state_resync_required" in resync and b'"ring_evicted"' in resync


async def test_pacing_counts_the_bytes_a_busy_reader_has_not_taken() -> None:
    log = EventLog("s", ring_size=100, ring_bytes=100_000)
    sub = log.subscribe()
    log.publish("session_update", {"text": "x" * 30_000})
    assert sub.take_nowait()  # taken, now "writing" it (not parked)
    assert log.max_pressure() == 0.0
    log.publish("session_update", {"text": "x" * 30_000})  # pending for the busy reader
    assert 0.29 < log.max_pressure() < 0.32
    # The line being received will evict it when published: pressure enough to wait.
    assert log.max_pressure(incoming_bytes=80_000) == 1.0


async def test_a_writer_blocked_past_its_bound_is_evicted_while_it_is_away() -> None:
    """Issue 22 item 14: the stream of a reader that stopped reading ends (its owner is
    told once, its slot is free) while its writer is still blocked, not when it returns."""
    log = EventLog("s1")
    sub = log.subscribe(max_queued=16)
    ended: list[str] = []
    sub.on_close = lambda: ended.append("ended")
    other = log.subscribe(max_queued=16)
    assert sub.take_nowait() == b""  # the writer went away to write, and is stuck there
    for _ in range(17):
        log.publish("a", {})
        assert other.take_nowait()  # a reader that keeps up is not touched
    await log.wait_drained()  # the agent reader's pacing check, between two chunks
    assert ended == ["ended"] and sub not in log.subscribers and sub.finished
    assert log.subscribers == {other}
    evicted = parse(sub.take_nowait())  # the writer comes back: its terminal frame...
    assert [e["type"] for e in evicted] == ["client_evicted"]
    assert evicted[0]["data"]["reason"] == "queue_overflow"
    assert sub.take_nowait() is None  # ...then the end
    sub.close()
    assert ended == ["ended"]  # told once
