"""The journal across process boundaries: a clean exit, and SIGKILL in the middle of a flood."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from serve.journal import Journal, JournalMeta, Replay
from serve.journal.pg import PgJournal

REPO = Path(__file__).resolve().parents[2]

#: A daemon-like writer: EventLog -> SessionJournal sink, flusher task running.
CHILD = r"""
import hashlib, sys
import trio
from serve.events import EventLog
from serve.journal import Journal, JournalLimits, JournalMeta

async def main(state_dir: str, mode: str, count: int) -> None:
    limits = JournalLimits(max_session_bytes=1 << 30, segment_bytes=1 << 20)
    if state_dir.startswith("postgresql://"):
        from serve.journal.pg import PgJournal
        journal = PgJournal(state_dir, limits)
    else:
        journal = Journal(state_dir, limits)
    meta = JournalMeta(session_id="crash", epoch="epoch-c", workspace="/w", acp_session_id="a")
    writer = await journal.open_writer(meta)
    digest = hashlib.sha256()

    def sink(event_id: int, event_type: str, frame: bytes) -> None:
        digest.update(frame)
        writer.sink(event_id, event_type, frame)

    log = EventLog("crash", epoch="epoch-c", sink=sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        n = 0
        while mode == "flood" or n < count:
            for _ in range(100):
                log.publish("session_update", {"n": n, "pad": "x" * (n % 300)})
                n += 1
            if mode == "flood" and n % 5000 == 0:
                await writer.flush()
                print("durable", log.last_id, flush=True)
            await trio.sleep(0)
        await writer.aclose()
        print("digest", digest.hexdigest(), log.last_id, flush=True)
        nursery.cancel_scope.cancel()

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


def spawn(state_dir: Path | str, mode: str, count: int = 0) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state_dir), mode, str(count)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def check_frame(event_id: int, event_type: str, frame: bytes) -> None:
    head, data = frame.split(b"\ndata: ", 1)
    assert head == b"id: %d\nevent: session_update" % event_id and event_type == "session_update"
    assert data.endswith(b"\n\n")
    envelope = json.loads(data)
    assert envelope["id"] == event_id and envelope["data"]["n"] == event_id - 1


def test_everything_survives_a_clean_exit_of_the_writing_process(tmp_path: Path) -> None:
    proc = spawn(tmp_path, "close", 10_000)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    _, digest, last = out.split()
    replay = Journal(tmp_path).load("crash")
    assert replay.clean and replay.problems == ()
    assert replay.meta == JournalMeta(
        session_id="crash", epoch="epoch-c", workspace="/w", acp_session_id="a"
    )
    assert (replay.count, replay.first_id, replay.last_id) == (10_000, 1, int(last))
    assert hashlib.sha256(b"".join(r.frame for r in replay)).hexdigest() == digest


def load(target: Path | str) -> Replay:
    """The crashed writer's journal as another process reads it (files: cut the tail)."""
    if isinstance(target, Path):
        return Journal(target).load("crash")

    async def read() -> Replay:
        journal = PgJournal(target)
        try:
            return await journal.read("crash")
        finally:
            await journal.aclose()

    return trio.run(read)


@pytest.mark.parametrize("backend", ["files", "postgresql"])
@pytest.mark.parametrize("delay_s", [0.0, 0.013, 0.04])
def test_sigkill_mid_flood_leaves_a_gap_free_prefix(
    tmp_path: Path, delay_s: float, backend: str, request: pytest.FixtureRequest
) -> None:
    """Files: the torn tail is cut on the next read. PostgreSQL: a batch is a transaction,
    so what a crash leaves is whole batches, and every batch continues the last."""
    target: Path | str = tmp_path
    if backend == "postgresql":
        target = request.getfixturevalue("postgres_server").new_database()
    proc = spawn(target, "flood")
    durable = 0
    try:
        assert proc.stdout is not None
        while durable < 30_000:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "writer exited"
            durable = int(line.split()[1])
        time.sleep(delay_s)  # land the kill at a different point of the flush cycle
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL

    replay = load(target)
    ids = [r.event_id for r in replay]
    assert ids == list(range(1, len(ids) + 1))
    assert len(ids) >= durable  # everything flush() confirmed is there
    assert not replay.clean
    for record in replay.records[:: max(1, len(ids) // 500)] + replay.records[-3:]:
        check_frame(*record)
    # Reading repaired the tail: the next read agrees and finds nothing more to cut.
    again = load(target)
    assert again.problems == () and again.last_id == replay.last_id
