"""Journal file layer on real files: segments, rotation, repair of damaged journals, names."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from serve.journal import store
from serve.journal.format import HEADER_BYTES, segment_name
from serve.journal.store import (
    Appender,
    JournalMeta,
    MetaFile,
    list_segments,
    read_meta,
    safe_name,
    scan,
    write_meta,
)

Item = tuple[int, str, bytes]


def frame(event_id: int) -> bytes:
    body = f'{{"id":{event_id},"v":1,"type":"session_update","data":{{"n":{event_id}}}}}'
    return f"id: {event_id}\nevent: session_update\ndata: {body}\n\n".encode()


def items(first: int, last: int) -> list[Item]:
    return [(i, "session_update", frame(i)) for i in range(first, last + 1)]


def appender(directory: Path, *, max_bytes: int = 1 << 20, segment_bytes: int = 4096) -> Appender:
    return Appender(
        directory, scan(directory, collect=False), max_bytes=max_bytes, segment_bytes=segment_bytes
    )


def ids(directory: Path, **kw: object) -> list[int]:
    return [r.event_id for r in scan(directory, **kw).records]  # type: ignore[arg-type]


def write_journal(directory: Path, last: int = 300, segment_bytes: int = 4096) -> None:
    app = appender(directory, segment_bytes=segment_bytes)
    for start in range(1, last + 1, 37):
        app.append_items(items(start, min(last, start + 36)))
    app.close()


def test_round_trip_across_segments_keeps_exact_bytes(tmp_path: Path) -> None:
    write_journal(tmp_path, 2000)
    segments = list_segments(tmp_path)
    assert len(segments) > 10
    assert all(s.size <= 4096 for s in segments)
    found = scan(tmp_path)
    assert found.problems == [] and found.cut_bytes == 0
    assert [tuple(r) for r in found.records] == items(1, 2000)
    assert (found.first_id, found.last_id, found.next_id, found.count) == (1, 2000, 2001, 2000)


def test_tail_keeps_only_the_newest_records(tmp_path: Path) -> None:
    write_journal(tmp_path, 500)
    found = scan(tmp_path, tail=30)
    assert [r.event_id for r in found.records] == list(range(471, 501))
    assert found.count == 500 and found.first_id == 1


def test_rotation_bound_is_honoured_after_every_batch(tmp_path: Path) -> None:
    app = appender(tmp_path, max_bytes=64 * 1024, segment_bytes=16 * 1024)
    for start in range(1, 10_001, 100):
        app.append_items(items(start, start + 99))
        on_disk = sum(s.size for s in list_segments(tmp_path))
        assert on_disk <= 64 * 1024
        assert on_disk == app.disk_bytes
    app.close()
    found = scan(tmp_path)
    kept = [r.event_id for r in found.records]
    assert kept == list(range(kept[0], 10_001)) and kept[0] > 1
    assert found.count == app.count == len(kept)
    assert len(list_segments(tmp_path)) <= 5
    assert app.rotated_segments > 0


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    app = appender(tmp_path, segment_bytes=1024)
    big = b"id: 2\nevent: x\ndata: " + b"y" * 5000 + b"\n\n"
    app.append_items([(1, "x", frame(1)), (2, "x", big), (3, "x", frame(3))])
    app.close()
    assert [s.first_id for s in list_segments(tmp_path)] == [1, 2, 3]
    assert [r.frame for r in scan(tmp_path).records] == [frame(1), big, frame(3)]


def test_reopened_appender_continues_the_last_segment(tmp_path: Path) -> None:
    app = appender(tmp_path, segment_bytes=1 << 20)
    app.append_items(items(1, 10))
    app.close()
    app = appender(tmp_path, segment_bytes=1 << 20)
    assert app.next_id == 11 and app.last_id == 10
    app.append_items(items(11, 20))
    app.close()
    assert [s.first_id for s in list_segments(tmp_path)] == [1]
    assert ids(tmp_path) == list(range(1, 21))


@pytest.mark.parametrize(("second", "expected"), [(500, range(500, 521)), (5, range(5, 26))])
def test_an_id_discontinuity_resets_the_journal_to_the_new_run(
    tmp_path: Path, second: int, expected: range
) -> None:
    app = appender(tmp_path)
    app.append_items(items(1, 100))
    app.append_items(items(second, second + 20))
    app.close()
    assert app.resets == 1
    assert ids(tmp_path) == list(expected)
    assert scan(tmp_path).problems == []


def test_a_gap_inside_one_batch_also_resets(tmp_path: Path) -> None:
    app = appender(tmp_path)
    app.append_items(items(1, 10) + items(20, 30))
    app.close()
    assert ids(tmp_path) == list(range(20, 31))


# ---- damaged journals -------------------------------------------------------------------


def _segments(d: Path) -> list[Path]:
    return [s.path for s in list_segments(d)]


def _record_starts(path: Path) -> list[int]:
    data = path.read_bytes()
    out, pos = [], HEADER_BYTES
    while pos < len(data):
        out.append(pos)
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    return out


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _first_id_of(path: Path) -> int:
    return int(path.name.split(".")[0])


def truncate_mid_record(d: Path) -> int:
    last = _segments(d)[-1]
    starts = _record_starts(last)
    os.truncate(last, starts[-1] + 11)
    return _first_id_of(last) + len(starts) - 2


def garbage_appended(d: Path) -> int:
    with _segments(d)[-1].open("ab") as f:
        f.write(b"\xde\xad\xbe\xef" * 50)
    return 300


def flipped_byte_in_middle_record_of_last_segment(d: Path) -> int:
    last = _segments(d)[-1]
    starts = _record_starts(last)
    middle = len(starts) // 2
    _flip(last, starts[middle] + 30)
    return _first_id_of(last) + middle - 1


def flipped_byte_in_first_segment(d: Path) -> int:
    first = _segments(d)[0]
    _flip(first, _record_starts(first)[3] + 30)
    return 3


def middle_segment_missing(d: Path) -> int:
    segs = _segments(d)
    segs[2].unlink()
    return _first_id_of(segs[2]) - 1


def last_segment_header_torn(d: Path) -> int:
    last = _segments(d)[-1]
    os.truncate(last, 5)
    return _first_id_of(last) - 1


def empty_file_after_the_last(d: Path) -> int:
    (d / segment_name(301)).write_bytes(b"")
    return 300


def bad_magic_in_second_segment(d: Path) -> int:
    second = _segments(d)[1]
    data = second.read_bytes()
    second.write_bytes(b"XXXXXXXX" + data[8:])
    return _first_id_of(second) - 1


def everything_torn(d: Path) -> int:
    for path in _segments(d):
        os.truncate(path, 3)
    return 0


DAMAGE: list[Callable[[Path], int]] = [
    truncate_mid_record,
    garbage_appended,
    flipped_byte_in_middle_record_of_last_segment,
    flipped_byte_in_first_segment,
    middle_segment_missing,
    last_segment_header_torn,
    empty_file_after_the_last,
    bad_magic_in_second_segment,
    everything_torn,
]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_damage_is_cut_to_the_longest_valid_prefix_and_writing_continues(
    tmp_path: Path, damage: Callable[[Path], int]
) -> None:
    write_journal(tmp_path, 300)
    assert len(_segments(tmp_path)) >= 4
    last_good = damage(tmp_path)

    found = scan(tmp_path)
    assert found.problems
    assert [r.event_id for r in found.records] == list(range(1, last_good + 1))
    assert [tuple(r) for r in found.records] == items(1, last_good)

    # Repaired on disk: a second scan finds nothing wrong and the same records.
    again = scan(tmp_path)
    assert again.problems == [] and again.cut_bytes == 0
    assert [r.event_id for r in again.records] == list(range(1, last_good + 1))

    # The journal continues right after the cut.
    app = appender(tmp_path)
    app.append_items(items(last_good + 1, last_good + 50))
    app.close()
    final = scan(tmp_path)
    assert final.problems == []
    assert [r.event_id for r in final.records] == list(range(1, last_good + 51))


def test_read_only_scan_reports_damage_but_leaves_files_alone(tmp_path: Path) -> None:
    write_journal(tmp_path, 300)
    truncate_mid_record(tmp_path)
    before = {p.name: p.read_bytes() for p in _segments(tmp_path)}
    found = scan(tmp_path, repair=False)
    assert found.problems
    assert {p.name: p.read_bytes() for p in _segments(tmp_path)} == before


def test_stray_files_are_ignored(tmp_path: Path) -> None:
    write_journal(tmp_path, 50)
    (tmp_path / "meta.json.tmp").write_bytes(b"{")
    (tmp_path / "notes.txt").write_bytes(b"hello")
    (tmp_path / (segment_name(7) + ".tmp")).write_bytes(b"junk")
    found = scan(tmp_path)
    assert found.problems == [] and found.count == 50
    assert (tmp_path / "notes.txt").exists()


def test_empty_directory_scans_as_an_empty_journal(tmp_path: Path) -> None:
    found = scan(tmp_path)
    assert (found.count, found.first_id, found.last_id, found.next_id) == (0, None, None, None)
    assert scan(tmp_path / "missing").count == 0


# ---- failures while writing ---------------------------------------------------------------


def test_a_torn_failed_write_is_repaired_and_the_retry_is_not_duplicated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = appender(tmp_path, segment_bytes=1 << 20)
    app.append_items(items(1, 100))
    real_writev_all = store._writev_all

    def torn(fd: int, parts: list[bytes]) -> int:
        data = b"".join(parts)
        store._write_all(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_writev_all", torn)
    with pytest.raises(OSError):
        app.append_items(items(101, 200))
    monkeypatch.setattr(store, "_writev_all", real_writev_all)
    # The caller retries the same batch plus what arrived meanwhile.
    app.append_items(items(101, 250))
    app.close()
    found = scan(tmp_path)
    assert found.problems == []
    assert [tuple(r) for r in found.records] == items(1, 250)


def test_writev_handles_short_writes_and_many_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [bytes([65 + i % 26]) * (i % 7 + 1) for i in range(3000)]  # > IOV_MAX parts
    real_writev = os.writev

    def short(fd: int, buffers: list[bytes]) -> int:  # at most 5 bytes per call
        return real_writev(fd, [memoryview(b"".join(bytes(b) for b in buffers[:2]))[:5]])

    monkeypatch.setattr(os, "writev", short)
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        assert store._writev_all(fd, parts) == sum(map(len, parts))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(parts)


def test_a_large_frame_gets_its_crc_from_the_writer(tmp_path: Path) -> None:
    from serve.journal.format import DEFER_CRC_BYTES, record_parts, record_parts_deferred

    frame = b"data: " + b"z" * DEFER_CRC_BYTES
    run = store.Run(1)
    head, _, placeholder = record_parts_deferred(1, "session_update", frame)
    run.add(head, frame, placeholder)  # type: ignore[arg-type]
    run.deferred.append((head, frame, placeholder))
    app = appender(tmp_path)
    app.append([run])
    app.close()
    assert bytes(placeholder) == record_parts(1, "session_update", frame)[2]
    found = scan(tmp_path)
    assert found.problems == [] and [r.frame for r in found.records] == [frame]


# ---- names and meta -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "kept"),
    [
        ("0b6f1c9e-4c1a-4d7e-9f00-123456789abc", True),
        ("session_1.v2", True),
        ("a" * 100, True),
        ("a" * 101, False),
        ("../escape", False),
        ("a/b", False),
        (".", False),
        ("..", False),
        (".hidden", False),
        ("", False),
        ("tab\there", False),
        ("sessión", False),
        ("~abc", False),
        ("CON:", False),
    ],
)
def test_safe_names(session_id: str, kept: bool) -> None:
    name = safe_name(session_id)
    assert (name == session_id) is kept
    assert "/" not in name and name not in ("", ".", "..")
    if not kept:
        assert name.startswith("~") and len(name) == 65


def test_distinct_ids_get_distinct_names() -> None:
    ids_ = ["a/b", "a_b", "a\\b", "a%2Fb", "A/B", "~" + "0" * 64, "x" * 101, "x" * 102]
    assert len({safe_name(i) for i in ids_}) == len(ids_)


def test_meta_round_trip_and_unreadable_meta(tmp_path: Path) -> None:
    meta = JournalMeta(
        session_id="s",
        epoch="e",
        workspace="/w",
        acp_session_id="acp-s",
        origin="load",
        created_at_ms=5,
        attrs={"displayName": "x"},
    )
    write_meta(tmp_path, MetaFile(meta=meta, clean_last_id=9))
    assert read_meta(tmp_path) == MetaFile(meta=meta, clean_last_id=9)
    assert not (tmp_path / "meta.json.tmp").exists()
    for garbage in (b"", b"{", b'{"meta": 1}', b'{"format": 2, "meta": {}}', b"\xff" * 10):
        (tmp_path / "meta.json").write_bytes(garbage)
        assert read_meta(tmp_path) is None
    assert read_meta(tmp_path / "missing") is None
