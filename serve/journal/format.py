"""The journal's on-disk record format: pure encoding and decoding, no I/O.

Segment file (``<first id, 20 digits>.seg``)::

    header   16 bytes   b"ACPJRNL1" | u64 LE first event id (must match the file name)
    record*             u32 LE body length | body | u32 LE crc32(length bytes + body)
    body                u64 LE event id | u16 LE type length | type (UTF-8) | SSE frame bytes

Ids inside a segment are consecutive from the header's first id. The checksum covers the
length field too, so a flipped bit anywhere in a record (length included) is caught; a
length that runs past the end of the data is a truncated record (a torn write).

A record is produced as three parts (head, frame, crc) so the frame bytes the EventLog
already holds are never copied on the hot path; one ``b"".join`` per batch assembles them.

:func:`decode_segment` walks records from the header and stops at the first one that is
not perfect, reporting how many bytes were good and why it stopped; the caller decides
what to cut. Nothing here raises on bad input: corruption is a result, not an exception.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from typing import NamedTuple

MAGIC = b"ACPJRNL1"
SEGMENT_HEADER = struct.Struct("<8sQ")
HEADER_BYTES = SEGMENT_HEADER.size  # 16
_HEAD = struct.Struct("<IQH")  # body length, event id, type length
_ID_TYPE = struct.Struct("<QH")
_CRC = struct.Struct("<I")
#: Bytes a record adds around its type and frame.
RECORD_OVERHEAD_BYTES = _HEAD.size + _CRC.size  # 18
#: A body longer than this is corruption, not an event (sanity bound for the length field).
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_TYPE_BYTES = 0xFFFF
SEGMENT_SUFFIX = ".seg"

_crc32 = zlib.crc32


class JournalRecord(NamedTuple):
    """One journaled event: unpacks as ``event_id, event_type, frame``."""

    event_id: int
    event_type: str
    frame: bytes


class SegmentScan(NamedTuple):
    """What :func:`decode_segment` found in one segment's bytes."""

    records: list[JournalRecord]  # empty unless collect=True
    good_records: int  # good records
    next_id: int  # id after the last good record (the header's first id if none)
    good_bytes: int  # offset just past the last good record (0 when the header is bad)
    problem: str | None  # why decoding stopped before the end of the data, or None


def segment_name(first_id: int) -> str:
    return f"{first_id:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """The first id encoded in a segment file name, or None for any other file."""
    if not name.endswith(SEGMENT_SUFFIX):
        return None
    stem = name[: -len(SEGMENT_SUFFIX)]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def segment_header(first_id: int) -> bytes:
    return SEGMENT_HEADER.pack(MAGIC, first_id)


_type_bytes: dict[str, bytes] = {}


def _encoded_type(event_type: str) -> bytes:
    cached = _type_bytes.get(event_type)
    if cached is None:
        cached = event_type.encode()[:MAX_TYPE_BYTES]
        if len(_type_bytes) < 1024:  # event types are a small closed set; bound the cache
            _type_bytes[event_type] = cached
    return cached


def record_parts(event_id: int, event_type: str, frame: bytes) -> tuple[bytes, bytes, bytes]:
    """One record as (head, frame, crc): the frame object itself, not a copy. ~0.5 µs."""
    type_bytes = _type_bytes.get(event_type) or _encoded_type(event_type)
    head = _HEAD.pack(len(type_bytes) + len(frame) + _ID_TYPE.size, event_id, len(type_bytes))
    head += type_bytes
    return head, frame, _CRC.pack(_crc32(frame, _crc32(head)))


#: Frames at least this large get their CRC computed by the writer thread, not the sink
#: (``zlib.crc32`` releases the GIL there; on the trio thread a 16 MiB frame costs ~10 ms).
DEFER_CRC_BYTES = 64 * 1024


def record_parts_deferred(
    event_id: int, event_type: str, frame: bytes
) -> tuple[bytes, bytes, bytearray]:
    """:func:`record_parts` with the CRC left to :func:`fill_crc` (a 4-byte placeholder)."""
    type_bytes = _type_bytes.get(event_type) or _encoded_type(event_type)
    head = _HEAD.pack(len(type_bytes) + len(frame) + _ID_TYPE.size, event_id, len(type_bytes))
    head += type_bytes
    return head, frame, bytearray(_CRC.size)


def fill_crc(head: bytes, frame: bytes, placeholder: bytearray) -> None:
    """Compute a deferred record's CRC into its placeholder (any thread)."""
    _CRC.pack_into(placeholder, 0, _crc32(frame, _crc32(head)))


def encode_record(event_id: int, event_type: str, frame: bytes) -> bytes:
    return b"".join(record_parts(event_id, event_type, frame))


def encode_records(items: Iterable[tuple[int, str, bytes]]) -> bytes:
    """Several records back to back."""
    return b"".join([encode_record(i, t, f) for i, t, f in items])


def decode_segment(data: bytes, first_id: int, *, collect: bool = True) -> SegmentScan:
    """Validate (and with ``collect`` materialise) the records of one segment.

    ``first_id`` is the id the file name promises; the header must agree.
    """
    if len(data) < HEADER_BYTES:
        return SegmentScan([], 0, first_id, 0, "truncated segment header")
    magic, header_id = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        return SegmentScan([], 0, first_id, 0, "bad segment magic")
    if header_id != first_id:
        return SegmentScan([], 0, first_id, 0, f"header id {header_id} != file name id")
    records: list[JournalRecord] = []
    view = memoryview(data)
    size = len(data)
    pos = HEADER_BYTES
    expected = first_id
    problem: str | None = None
    unpack_len = _CRC.unpack_from
    unpack_it = _ID_TYPE.unpack_from
    while pos < size:
        if size - pos < 4:
            problem = "truncated record header"
            break
        (length,) = unpack_len(data, pos)
        if length < _ID_TYPE.size or length > MAX_RECORD_BYTES:
            problem = f"bad record length {length}"
            break
        body_start = pos + 4
        body_end = body_start + length
        end = body_end + 4
        if end > size:
            problem = "truncated record"
            break
        (crc,) = unpack_len(data, body_end)
        if _crc32(view[pos:body_end]) != crc:
            problem = "bad checksum"
            break
        body = view[body_start:body_end]
        event_id, type_len = unpack_it(body, 0)
        if event_id != expected:
            problem = f"event id {event_id} where {expected} was expected"
            break
        frame_start = _ID_TYPE.size + type_len
        if frame_start > length:
            problem = "bad type length"
            break
        if collect:
            try:
                event_type = str(body[_ID_TYPE.size : frame_start], "utf-8")
            except UnicodeDecodeError:
                problem = "event type is not UTF-8"
                break
            records.append(JournalRecord(event_id, event_type, bytes(body[frame_start:])))
        expected += 1
        pos = end
    return SegmentScan(records, expected - first_id, expected, pos, problem)
