"""The outbox and the JSON-RPC parser: pure logic, in process."""

from __future__ import annotations

from serve.acpfront import jsonrpc
from serve.acpfront.outbox import Outbox


async def test_bounds_refuse_and_nothing_is_stored() -> None:
    box = Outbox(max_messages=2, max_bytes=10)
    assert box.push(None, b"12345")
    assert box.push(1, b"123")
    assert not box.push(2, b"1")  # third message
    assert len(box) == 2
    box2 = Outbox(max_messages=10, max_bytes=4)
    assert not box2.push(None, b"12345")  # bytes
    assert len(box2) == 0 and box2.size_bytes == 0


async def test_one_reader_a_second_ends_the_first() -> None:
    box = Outbox()
    first = box.attach()
    box.push(1, b"a")
    assert await box.take(first, 1) == [(1, b"a")]
    assert box.last_taken == 1
    second = box.attach()
    assert await box.take(first, 1) is None  # replaced
    box.push(None, b"r")
    assert await box.take(second, 1) == [(None, b"r")]


async def test_end_drains_then_stops_and_heartbeat_timeout_is_empty() -> None:
    box = Outbox()
    token = box.attach()
    assert await box.take(token, 0.01) == []  # nothing: time for a heartbeat
    box.push(3, b"x")
    box.end()
    assert await box.take(token, 1) == [(3, b"x")]
    assert await box.take(token, 1) is None


async def test_drop_events_keeps_replies_and_reports_lowest_id() -> None:
    box = Outbox()
    box.push(5, b"e5")
    box.push(None, b"reply")
    box.push(6, b"e6")
    assert box.drop_events() == (2, 5)
    assert box.take_replies() == [b"reply"]
    assert len(box) == 0


def test_parse_classifies_every_shape() -> None:
    assert isinstance(jsonrpc.parse(b"nope"), jsonrpc.Invalid)
    assert jsonrpc.parse(b"nope").error.code == jsonrpc.PARSE_ERROR  # type: ignore[union-attr]
    assert isinstance(jsonrpc.parse(b"[]"), jsonrpc.Batch)
    bad = jsonrpc.parse(b'{"jsonrpc":"2.0","id":true,"method":"x"}')
    assert isinstance(bad, jsonrpc.Invalid) and bad.id is None
    req = jsonrpc.parse(b'{"jsonrpc":"2.0","id":"a","method":"m","params":{"k":1}}')
    assert req == jsonrpc.Request("a", "m", {"k": 1})
    note = jsonrpc.parse(b'{"jsonrpc":"2.0","method":"m"}')
    assert note == jsonrpc.Notification("m", {})
    resp = jsonrpc.parse(b'{"jsonrpc":"2.0","id":3,"result":{}}')
    assert resp == jsonrpc.Response(3, {}, None)
    both = jsonrpc.parse(b'{"jsonrpc":"2.0","id":3,"result":{},"error":{}}')
    assert isinstance(both, jsonrpc.Invalid) and both.id == 3
    arr = jsonrpc.parse(b'{"jsonrpc":"2.0","id":4,"method":"m","params":[1]}')
    assert isinstance(arr, jsonrpc.Invalid) and arr.error.code == jsonrpc.INVALID_PARAMS


async def test_loaded_connections_share_the_logs_frames_not_copies() -> None:
    """Issue 22 item 18: every connection that loaded a session queued its own copy of each
    event (64 non-reading connections + one 7 MiB prompt: +470 MiB). Now each outbox holds
    the ring's own frame, and the message is built only for a reader."""
    import json

    import msgspec

    from serve.acpfront.translate import translate_frame
    from serve.events import EventLog

    log = EventLog("s1")
    big = "x" * (1 << 20)
    update = {"sessionId": "s1", "update": {"sessionUpdate": "user_message_chunk", "text": big}}
    log.publish("session_update", msgspec.Raw(msgspec.json.encode(update)))
    log.publish("turn_complete", {"stopReason": "end_turn"}, prompt_id="p1")
    boxes = [Outbox() for _ in range(3)]
    for box in boxes:
        frames = log.subscribe(last_event_id=0).frames_nowait()
        assert frames is not None
        for frame in frames:
            msg = translate_frame(frame)
            assert msg is not None
            box.push(msg.event_id, msg.payload)
    ring_frame = log.frame(1)
    for box in boxes:
        # The queued item is the ring's frame object itself, counted at its size.
        assert box._items[0][1].frame is ring_frame  # type: ignore[union-attr]
        assert box.size_bytes < len(ring_frame) + 4096
    token = boxes[0].attach()
    taken = await boxes[0].take(token, 1)
    assert taken is not None
    messages = [(event_id, json.loads(payload)) for event_id, payload in taken]
    assert messages[0] == (1, {"jsonrpc": "2.0", "method": "session/update", "params": update})
    assert messages[1][0] == 2 and messages[1][1]["params"]["kind"] == "turn_complete"
    assert messages[1][1]["params"]["promptId"] == "p1"
    assert messages[2][0] is None and messages[2][1]["params"]["kind"] == "replay_complete"
