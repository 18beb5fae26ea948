"""The sans-IO SSE parser and envelope decoder, table-driven, split at every byte."""

from __future__ import annotations

import pytest

from serve.client._sse import SseComment, SseFrame, SseParser, decode_event
from serve.client.errors import ProtocolError

DAEMON_STREAM = (
    b"retry: 3000\n\n"
    b'id: 1\nevent: session_update\ndata: {"id":1,"v":1,"type":"session_update",'
    b'"data":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk",'
    b'"content":{"type":"text","text":"h\xc3\xa9\xe2\x80\xa8llo"}}},"_meta":{"serverTimestamp":5}}\n\n'
    b": heartbeat\n\n"
    b'event: replay_complete\ndata: {"v":1,"type":"replay_complete","data":{"replayedCount":1}}\n\n'
)


def parse_all(chunks: list[bytes]) -> list[SseFrame | SseComment]:
    parser = SseParser()
    out: list[SseFrame | SseComment] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out


def test_daemon_framing_is_parsed_identically_at_every_split_point() -> None:
    whole = parse_all([DAEMON_STREAM])
    assert [type(x).__name__ for x in whole] == ["SseFrame", "SseFrame", "SseComment", "SseFrame"]
    assert whole[0] == SseFrame(retry_ms=3000)
    assert isinstance(whole[1], SseFrame) and whole[1].id == "1"
    assert whole[1].event == "session_update"
    assert whole[2] == SseComment("heartbeat")
    for cut in range(1, len(DAEMON_STREAM)):
        assert parse_all([DAEMON_STREAM[:cut], DAEMON_STREAM[cut:]]) == whole, cut
    assert parse_all([bytes([b]) for b in DAEMON_STREAM]) == whole


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # CRLF and lone CR line endings, also split between \r and \n
        (b"data: a\r\n\r\n", [SseFrame(data="a")]),
        (b"data: a\r\rdata: b\r\r\n", [SseFrame(data="a"), SseFrame(data="b")]),
        # several data lines join with \n; only one leading space is stripped
        (b"data: a\ndata:  b\ndata:c\n\n", [SseFrame(data="a\n b\nc")]),
        # a field without a colon is the field name with an empty value
        (b"data\n\n", [SseFrame(data="")]),
        # unknown fields are ignored; a frame of only unknown fields is not dispatched
        (b"foo: bar\n\n", []),
        # invalid retry is ignored; an id with NUL is ignored
        (b"retry: soon\ndata: x\n\n", [SseFrame(data="x")]),
        (b"id: a\x00b\ndata: x\n\n", [SseFrame(data="x")]),
        # a comment is reported as soon as its line ends, even inside a frame
        (b"data: x\n: ping\n\n", [SseComment("ping"), SseFrame(data="x")]),
        # blank lines without fields dispatch nothing
        (b"\n\n\n", []),
        # an unterminated frame is not dispatched
        (b"data: x\n", []),
    ],
)
def test_parser_table(raw: bytes, expected: list[SseFrame | SseComment]) -> None:
    assert parse_all([raw]) == expected
    assert parse_all([raw[:1], raw[1:]]) == expected
    if b"\r" in raw:
        i = raw.index(b"\r") + 1
        assert parse_all([raw[:i], raw[i:]]) == expected


def test_a_trailing_cr_waits_for_the_next_chunk() -> None:
    parser = SseParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r") == []  # "\r\n" ended the line; "\r" may start "\r\n"
    assert parser.feed(b"\n") == [SseFrame(data="a")]


def test_an_endless_frame_is_refused_not_buffered_forever() -> None:
    parser = SseParser(max_frame_chars=1000)
    parser.feed(b"data: " + b"x" * 500 + b"\n")
    with pytest.raises(ProtocolError):
        parser.feed(b"data: " + b"y" * 600 + b"\n")
    parser = SseParser(max_frame_chars=1000)
    with pytest.raises(ProtocolError):
        parser.feed(b"data: " + b"z" * 2000)  # no line end at all


@pytest.mark.parametrize(
    ("data", "ok"),
    [
        ('{"id":3,"v":1,"type":"t","data":{}}', True),
        ('{"v":1,"type":"replay_complete","data":{"replayedCount":0}}', True),
        ('{"id":3,"v":2,"type":"t","data":{}}', False),  # unknown schema version
        ('{"id":0,"v":1,"type":"t","data":{}}', False),  # ids start at 1
        ('{"id":9007199254740992,"v":1,"type":"t","data":{}}', False),  # not a safe integer
        ('{"id":"3","v":1,"type":"t","data":{}}', False),
        ('{"id":1.5,"v":1,"type":"t","data":{}}', False),
        ('{"v":1,"type":3,"data":{}}', False),
        ('{"v":1,"type":"t","data":[]}', False),
        ('{"type":"t","data":{}}', False),  # no version
        ("[1,2]", False),
        ("not json", False),
    ],
)
def test_envelope_contract(data: str, ok: bool) -> None:
    assert (decode_event(data) is not None) is ok


def test_envelope_fields_are_typed() -> None:
    event = decode_event(
        '{"id":7,"v":1,"type":"turn_complete","data":{"sessionId":"s","stopReason":"end_turn",'
        '"promptId":"p"},"promptId":"p","originatorClientId":"c","_meta":{"serverTimestamp":9},'
        '"futureField":true}'
    )
    assert event is not None
    assert (event.id, event.type, event.prompt_id, event.originator_client_id) == (
        7,
        "turn_complete",
        "p",
        "c",
    )
    assert event.server_timestamp == 9
    assert event.payload.stop_reason == "end_turn"
    assert not event.is_synthetic and not event.is_terminal
