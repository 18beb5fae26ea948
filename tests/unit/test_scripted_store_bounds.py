"""Issue 16 item 12: the scripted agent's session store is bounded on disk (real files)."""

from __future__ import annotations

import os
import subprocess
import sys
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
    writer.release("old")  # closed: only a held session is kept past the retention
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
        first.release(sid)
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


def test_a_session_another_live_process_holds_is_never_pruned(tmp_path: Path) -> None:
    # A live session in one agent process (here a real child holding its store) survives the
    # start of another agent process sharing the directory at a 1 ms retention: the defect
    # was a warm refill's start deleting a live session's file.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time;from acp.agents.scripted.store import *;"
            "s=Store(sys.argv[1],retention_ms=0,max_bytes=0);"
            "s.save(SessionRecord(session_id='live',cwd='/w',created_at=now_iso(),"
            "updated_at=now_iso()));print('held',flush=True);time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        path = Path(tmp_path) / "sessions" / "live.json"
        t = time.time() - 7200
        os.utime(path, (t, t))
        refill = Store(str(tmp_path), retention_ms=1, max_bytes=1)
        assert refill.pruned == 0 and path.exists()
        # The holder dies (a crash or a kill): the kernel drops its lease, the file may go.
        holder.kill()
        holder.wait()
        assert refill.prune() == 1 and not path.exists()
        assert not (Path(tmp_path) / "sessions" / "live.lease").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_closed_session_is_released_and_a_restored_one_held(tmp_path: Path) -> None:
    owner = Store(str(tmp_path), retention_ms=1, max_bytes=0)
    owner.save(_record("s"))
    _age(owner, "s", 10)
    assert Store(str(tmp_path), retention_ms=1, max_bytes=0).pruned == 0  # held by its writer
    owner.release("s")  # session/close
    other = Store(str(tmp_path), retention_ms=0, max_bytes=0)
    other.hold("s")  # session/load in another process: held before it is read
    assert Store(str(tmp_path), retention_ms=1, max_bytes=0).pruned == 0
    other.release("s")
    assert Store(str(tmp_path), retention_ms=1, max_bytes=0).pruned == 1
