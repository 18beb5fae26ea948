"""Sans-IO JSON-RPC: line framing and envelope classification, table-driven."""

from __future__ import annotations

import msgspec
import pytest

from acp import jsonrpc
from acp.errors import INVALID_REQUEST, PARSE_ERROR
from acp.jsonrpc import (
    EXCERPT_BYTES,
    Invalid,
    LineFramer,
    Notification,
    OversizedLine,
    Request,
    Response,
)


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[bytes | OversizedLine]:
    out: list[bytes | OversizedLine] = []
    for chunk in chunks:
        out.extend(framer.feed(chunk))
    return out


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b'{"a":1}\n'], [b'{"a":1}']),
        ([b'{"a":', b"1}\n"], [b'{"a":1}']),  # split line
        ([b'{"a"', b":", b"1", b"}", b"\n"], [b'{"a":1}']),  # byte by byte-ish
        ([b"x\ny\nz"], [b"x", b"y"]),  # unfinished last line is kept back
        ([b"x\ny\nz", b"\n"], [b"x", b"y", b"z"]),
        ([b"a\r\nb\r\n"], [b"a", b"b"]),  # CRLF tolerated
        ([b"\n\n  \n", b"a\n"], [b"a"]),  # blank lines ignored
        ([b""], []),
    ],
)
def test_framer_splits_lines(chunks: list[bytes], expected: list[bytes]) -> None:
    assert feed_all(LineFramer(100), chunks) == expected


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        # exactly at the cap passes, one over is dropped and reported with its full size
        ([b"x" * 10 + b"\n"], [b"x" * 10]),
        ([b"x" * 11 + b"\nok\n"], [OversizedLine(11), b"ok"]),
        # an oversized line arriving in pieces is never buffered past the cap
        ([b"x" * 6, b"x" * 6, b"x" * 6, b"\nok\n"], [OversizedLine(18), b"ok"]),
        ([b"x" * 8, b"xxxx\n", b"ok\n"], [OversizedLine(12), b"ok"]),
        ([b"ok\n" + b"y" * 30, b"y\nz\n"], [b"ok", OversizedLine(31), b"z"]),
    ],
)
def test_framer_drops_oversized_lines(
    chunks: list[bytes], expected: list[bytes | OversizedLine]
) -> None:
    framer = LineFramer(10)
    out: list[bytes | OversizedLine] = []
    for chunk in chunks:
        out.extend(framer.feed(chunk))
        assert framer.buffered_bytes <= 10
    sizes = [OversizedLine(o.size) if isinstance(o, OversizedLine) else o for o in out]
    assert sizes == expected


@pytest.mark.parametrize(
    "chunks",
    [
        [b"<head>" + b"m" * 3000 + b"<tail>\nok\n"],  # one chunk
        [b"<head>" + b"m" * 5, b"m" * 2995 + b"<tail>\nok\n"],  # over the cap in the 2nd
        [b"<head>" + b"m" * 1500, b"m" * 1500, b"<t", b"ail>\nok\n"],  # discarded in pieces
    ],
)
def test_an_oversized_line_keeps_its_start_and_end(chunks: list[bytes]) -> None:
    """Enough to tell whose line it was (a shared connection: issue 22, item 5)."""
    framer = LineFramer(100)
    out = [line for chunk in chunks for line in framer.feed(chunk)]
    assert len(out) == 2 and out[1] == b"ok"
    dropped = out[0]
    assert isinstance(dropped, OversizedLine) and dropped.size == 3012
    assert dropped.head.startswith(b"<head>mmm") and len(dropped.head) == EXCERPT_BYTES
    assert dropped.tail.endswith(b"mmm<tail>") and len(dropped.tail) == EXCERPT_BYTES


def test_framer_rejects_nonpositive_cap() -> None:
    with pytest.raises(ValueError):
        LineFramer(0)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            b'{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{"path":"/a"}}',
            Request(3, "fs/read_text_file", msgspec.Raw(b'{"path":"/a"}')),
        ),
        (
            b'{"jsonrpc":"2.0","id":"x-1","method":"m"}',
            Request("x-1", "m", jsonrpc.NULL),
        ),
        (
            b'{"jsonrpc":"2.0","method":"session/update","params":{"u":1}}',
            Notification("session/update", msgspec.Raw(b'{"u":1}')),
        ),
        (
            b'{"jsonrpc":"2.0","id":7,"result":{"stopReason":"end_turn"}}',
            Response(7, msgspec.Raw(b'{"stopReason":"end_turn"}'), None),
        ),
        (b'{"jsonrpc":"2.0","id":7,"result":null}', Response(7, jsonrpc.NULL, None)),
        (
            b'{"jsonrpc":"2.0","id":8,"error":{"code":-32603,"message":"boom","data":{"x":1}}}',
            Response(8, jsonrpc.EMPTY, jsonrpc.ErrorObject(-32603, "boom", {"x": 1})),
        ),
        (
            b'{"jsonrpc":"2.0","id":9,"error":"nope"}',
            Response(
                9,
                jsonrpc.EMPTY,
                jsonrpc.ErrorObject(-32603, "agent sent a malformed error object"),
            ),
        ),
    ],
)
def test_parse_line_classifies(line: bytes, expected: jsonrpc.Message) -> None:
    got = jsonrpc.parse_line(line)
    assert type(got) is type(expected)
    for field in expected.__struct_fields__:
        a, b = getattr(got, field), getattr(expected, field)
        if isinstance(b, msgspec.Raw):
            assert bytes(a) == bytes(b)
        else:
            assert a == b


@pytest.mark.parametrize(
    ("line", "code", "has_id"),
    [
        (b"{not json", PARSE_ERROR, False),
        (b"\xff\xfe", PARSE_ERROR, False),
        (b"[1,2,3]", INVALID_REQUEST, False),
        (b'{"jsonrpc":"2.0"}', INVALID_REQUEST, False),
        (b'{"jsonrpc":"2.0","id":{"a":1},"method":"x"}', INVALID_REQUEST, False),
        (b'{"jsonrpc":"2.0","id":4}', INVALID_REQUEST, True),
    ],
)
def test_parse_line_invalid(line: bytes, code: int, has_id: bool) -> None:
    got = jsonrpc.parse_line(line)
    assert isinstance(got, Invalid)
    assert got.code == code
    assert (got.id is not msgspec.UNSET) == has_id


def test_unknown_fields_survive_in_raw_params() -> None:
    line = b'{"jsonrpc":"2.0","method":"session/update","params":{"x":{"future":[1,{"k":null}]}}}'
    msg = jsonrpc.parse_line(line)
    assert isinstance(msg, Notification)
    assert bytes(msg.params) == b'{"x":{"future":[1,{"k":null}]}}'


@pytest.mark.parametrize(
    ("encoded", "expected"),
    [
        (
            jsonrpc.encode_request(1, "m", {"a": 1}),
            {"jsonrpc": "2.0", "id": 1, "method": "m", "params": {"a": 1}},
        ),
        (
            jsonrpc.encode_request(2, "m", None),
            {"jsonrpc": "2.0", "id": 2, "method": "m", "params": {}},
        ),
        (
            jsonrpc.encode_notification("n", msgspec.Raw(b"[1]")),
            {"jsonrpc": "2.0", "method": "n", "params": [1]},
        ),
        (jsonrpc.encode_result("s", None), {"jsonrpc": "2.0", "id": "s", "result": None}),
        (
            jsonrpc.encode_error(None, -32700, "Parse error"),
            {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}},
        ),
        (
            jsonrpc.encode_error(5, -32601, "Method not found", {"method": "craft/x"}),
            {
                "jsonrpc": "2.0",
                "id": 5,
                "error": {
                    "code": -32601,
                    "message": "Method not found",
                    "data": {"method": "craft/x"},
                },
            },
        ),
    ],
)
def test_encoders(encoded: bytes, expected: object) -> None:
    assert encoded.endswith(b"\n") and encoded.count(b"\n") == 1
    assert msgspec.json.decode(encoded) == expected


def test_encoded_text_with_newlines_stays_one_line() -> None:
    line = jsonrpc.encode_notification("n", {"text": "a\nb\r\nc"})
    assert line.count(b"\n") == 1
    assert msgspec.json.decode(line)["params"]["text"] == "a\nb\r\nc"
