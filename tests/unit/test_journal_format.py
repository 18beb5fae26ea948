"""Journal record format: round trip and every way a segment's bytes can be damaged."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from serve.journal.format import (
    HEADER_BYTES,
    MAGIC,
    JournalRecord,
    decode_segment,
    encode_record,
    encode_records,
    parse_segment_name,
    record_parts,
    segment_header,
    segment_name,
)


def frame(event_id: int, event_type: str = "session_update", payload: str = "x") -> bytes:
    return (
        f"id: {event_id}\nevent: {event_type}\ndata: "
        f'{{"id":{event_id},"v":1,"type":"{event_type}","data":{{"p":"{payload}"}}}}\n\n'
    ).encode()


def segment(first_id: int, count: int, event_type: str = "session_update") -> bytes:
    items = [(i, event_type, frame(i, event_type)) for i in range(first_id, first_id + count)]
    return segment_header(first_id) + encode_records(items)


def offsets(data: bytes) -> list[int]:
    """Start offset of every record in a well-formed segment."""
    out = []
    pos = HEADER_BYTES
    while pos < len(data):
        out.append(pos)
        (length,) = struct.unpack_from("<I", data, pos)
        pos += 4 + length + 4
    return out


def test_round_trip_keeps_ids_types_and_exact_frame_bytes() -> None:
    items = [(7 + i, f"type_{i % 3}", frame(7 + i, payload="é" * i)) for i in range(50)]
    data = segment_header(7) + encode_records(items)
    found = decode_segment(data, 7)
    assert found.problem is None
    assert found.records == [JournalRecord(*item) for item in items]
    assert (found.good_records, found.next_id, found.good_bytes) == (50, 57, len(data))


def test_record_parts_share_the_frame_and_join_to_the_record() -> None:
    f = frame(3)
    head, same, crc = record_parts(3, "session_update", f)
    assert same is f
    assert head + f + crc == encode_record(3, "session_update", f)
    assert len(head) == 14 + len("session_update") and len(crc) == 4


def test_non_ascii_event_type_round_trips() -> None:
    data = segment_header(1) + encode_record(1, "évènement", frame(1))
    assert decode_segment(data, 1).records[0].event_type == "évènement"


def test_header_only_segment_is_valid_and_empty() -> None:
    found = decode_segment(segment_header(42), 42)
    assert (found.problem, found.good_records, found.next_id, found.good_bytes) == (
        None,
        0,
        42,
        HEADER_BYTES,
    )


def test_without_collect_nothing_is_materialised_but_validation_is_the_same() -> None:
    data = segment(1, 10)
    found = decode_segment(data, 1, collect=False)
    assert found.records == [] and found.good_records == 10 and found.problem is None


def _flip(offset_of: Callable[[bytes], int]) -> Callable[[bytes], bytes]:
    def mutate(data: bytes) -> bytes:
        at = offset_of(data)
        return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]

    return mutate


def _record(n: int) -> Callable[[bytes], int]:
    return lambda data: offsets(data)[n]


# (name, mutation of a 5-record segment starting at id 1, good records, problem substring)
CORRUPTIONS: list[tuple[str, Callable[[bytes], bytes], int, str]] = [
    ("empty file", lambda d: b"", 0, "truncated segment header"),
    ("half a header", lambda d: d[:9], 0, "truncated segment header"),
    ("bad magic", lambda d: b"NOTJRNL1" + d[8:], 0, "bad segment magic"),
    ("header id differs", lambda d: segment_header(2) + d[HEADER_BYTES:], 0, "header id"),
    ("torn in a length field", lambda d: d[: offsets(d)[4] + 2], 4, "truncated record header"),
    ("torn mid body", lambda d: d[: offsets(d)[4] + 20], 4, "truncated record"),
    ("torn in the crc", lambda d: d[:-2], 4, "truncated record"),
    ("garbage appended", lambda d: d + b"\x17garbage\x00\xff" * 3, 5, "record"),
    ("zeros appended", lambda d: d + b"\x00" * 64, 5, "bad record length 0"),
    ("huge length", lambda d: d + struct.pack("<I", 2**31) + b"x" * 20, 5, "bad record length"),
    ("flipped byte in middle frame", _flip(lambda d: offsets(d)[2] + 40), 2, "bad checksum"),
    ("flipped byte in middle id", _flip(lambda d: offsets(d)[2] + 5), 2, "bad checksum"),
    ("flipped byte in middle crc", _flip(lambda d: offsets(d)[3] - 1), 2, "bad checksum"),
    ("flipped byte in first length", _flip(lambda d: offsets(d)[0]), 0, "bad checksum"),
    (
        "record with a valid crc but the wrong id",
        lambda d: d[: offsets(d)[3]] + encode_record(9, "t", frame(9)),
        3,
        "event id 9 where 4 was expected",
    ),
    (
        "type length past the body",
        lambda d: d + _forged_body(struct.pack("<QH", 6, 500) + b"short"),
        5,
        "bad type length",
    ),
    (
        "type not utf-8",
        lambda d: d + _forged_body(struct.pack("<QH", 6, 2) + b"\xff\xfe" + frame(6)),
        5,
        "not UTF-8",
    ),
]


def _forged_body(body: bytes) -> bytes:
    """A record whose checksum is right but whose body is not what a writer produces."""
    import zlib

    length = struct.pack("<I", len(body))
    return length + body + struct.pack("<I", zlib.crc32(length + body))


@pytest.mark.parametrize(
    ("mutate", "good", "problem"),
    [pytest.param(m, g, p, id=n) for n, m, g, p in CORRUPTIONS],
)
def test_decoding_stops_at_the_first_bad_byte_and_says_why(
    mutate: Callable[[bytes], bytes], good: int, problem: str
) -> None:
    clean = segment(1, 5)
    data = mutate(clean)
    found = decode_segment(data, 1)
    assert found.problem is not None and problem in found.problem
    assert [r.event_id for r in found.records] == list(range(1, 1 + good))
    assert found.good_records == good and found.next_id == 1 + good
    expected_good = [*offsets(clean), len(clean)][good] if found.good_bytes else 0
    assert found.good_bytes == expected_good
    # Whatever is cut, what was kept decodes cleanly on its own.
    if found.good_bytes:
        again = decode_segment(data[: found.good_bytes], 1)
        assert again.problem is None and again.good_records == good


@pytest.mark.parametrize(
    ("name", "first_id"),
    [
        (segment_name(1), 1),
        (segment_name(2**63), 2**63),
        ("00000000000000000001.seg.tmp", None),
        ("0000000000000000001.seg", None),
        ("meta.json", None),
        ("0000000000000000000x.seg", None),
        ("lock", None),
    ],
)
def test_segment_names(name: str, first_id: int | None) -> None:
    assert parse_segment_name(name) == first_id


def test_header_layout() -> None:
    assert segment_header(5) == MAGIC + (5).to_bytes(8, "little")
