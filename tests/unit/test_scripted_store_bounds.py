"""Issue 16 item 12: the scripted agent's session store is bounded on disk (real files)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from acp.agents.scripted.store import SessionRecord, Store, now_iso


def _record(sid: str, text: str = "") -> SessionRecord:
    record = SessionRecord(session_id=sid, cwd="/w", created_at=now_iso(), updated_at=now_iso())
    record.add("user", text)
    return record


def _age(store: Store, sid: str, seconds: float) -> None:
    path = os.path.join(store.dir, sid + ".json")
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_old_sessions_are_pruned_but_not_the_ones_this_process_writes(tmp_path: Path) -> None:
    writer = Store(str(tmp_path), retention_ms=3_600_000, max_bytes=0)
    for sid in ("old", "fresh"):
        writer.save(_record(sid))
    _age(writer, "old", 7200)
    _age(writer, "fresh", 60)
    other = Store(str(tmp_path), retention_ms=3_600_000, max_bytes=0)  # a new agent process
    assert other.pruned == 1
    assert [r.session_id for r in other.list()] == ["fresh"]
    # The process that wrote a session never prunes it, however old.
    _age(writer, "fresh", 7200)
    assert writer.prune() == 0


def test_the_byte_bound_removes_the_least_recently_written(tmp_path: Path) -> None:
    first = Store(str(tmp_path), retention_ms=0, max_bytes=0)
    for age, sid in enumerate(("c", "b", "a")):
        first.save(_record(sid, "x" * 10_000))
        _age(first, sid, 100 * (age + 1))
    other = Store(str(tmp_path), retention_ms=0, max_bytes=25_000)
    assert other.pruned == 1  # "a", the oldest
    assert sorted(r.session_id for r in other.list()) == ["b", "c"]


def test_stale_temporary_files_are_removed(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    store.save(_record("s"))
    tmp = Path(store.dir) / "s.json.123.tmp"
    tmp.write_bytes(b"half")
    t = time.time() - 7200
    os.utime(tmp, (t, t))
    Store(str(tmp_path))
    assert not tmp.exists() and (Path(store.dir) / "s.json").exists()
