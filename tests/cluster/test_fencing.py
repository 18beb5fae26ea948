"""A frozen owner (SIGSTOP) past its lease: another daemon takes the session over on the
next request; the owner, resumed, finds its lease taken, ends the session on its side
(``session_died {reason: "lease_lost"}`` to the streams open there, nothing journaled) and
forwards the session's next request to the new owner. Two real daemons on one PostgreSQL
journal, ``--journal-lease-ms 2000`` (renewed every 500 ms)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.cluster.test_forwarding import daemon_id, lease, prompt, until_turn_of
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import iter_events


def epochs_in_id_order(url: str, sid: str) -> list[int]:
    """The lease epoch of each journaled event of ``sid``, in event id order."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT lease_epoch FROM journal_events WHERE session_id = %s ORDER BY event_id",
            (sid,),
        ).fetchall()
    return [int(r[0]) for r in rows]


async def test_a_frozen_owner_is_fenced_and_ends_its_copy_when_it_resumes(
    tmp_path: Path, pg_url: str
) -> None:
    ws, shared = tmp_path / "ws", tmp_path / "shared"
    ws.mkdir()
    shared.mkdir()
    daemons: list[DaemonProcess] = []
    for name in ("a", "b"):
        state = tmp_path / f"state-{name}"
        state.mkdir()
        daemons.append(
            spawn_daemon(
                [
                    "--journal-url",
                    pg_url,
                    "--journal-lease-ms",
                    "2000",
                    "--shared-dir",
                    str(shared),
                ],
                workspace=ws,
                state_dir=state,
                env={"QWEN_SERVER_TOKEN": TOKEN},
            )
        )
    a, b = daemons
    frozen = False
    try:
        async with (
            httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=30) as on_a,
            httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=30) as on_b,
        ):
            created = (await on_a.post("/session", json={})).json()
            sid, cid = created["sessionId"], created["clientId"]
            owner_a, epoch_a = await trio.to_thread.run_sync(lease, pg_url, sid)
            with trio.fail_after(10):  # A's first events committed (a 50 ms batch)
                while not await trio.to_thread.run_sync(epochs_in_id_order, pg_url, sid):  # noqa: ASYNC110 (the database)
                    await trio.sleep(0.05)
            async with on_a.stream("GET", f"/session/{sid}/events") as watcher:
                os.kill(a.proc.pid, signal.SIGSTOP)
                frozen = True
                with trio.fail_after(15):  # its lease (2 s) expires; B takes the session
                    while True:
                        answered = await prompt(on_b, sid, cid, "[echo on b]")
                        if answered.status_code == 202:
                            break
                        assert answered.status_code == 503, answered.text
                        await trio.sleep(0.2)
                owner_b, epoch_b = await trio.to_thread.run_sync(lease, pg_url, sid)
                assert (owner_a, owner_b) == (daemon_id(a), daemon_id(b))
                assert epoch_b > epoch_a
                os.kill(a.proc.pid, signal.SIGCONT)
                frozen = False
                # A wakes, its renewal finds the lease taken: its copy of the session ends.
                with trio.fail_after(15):
                    ended = [e async for e in _until_died(watcher)]
                assert ended[-1]["data"]["reason"] == "lease_lost"
            # A no longer serves it: a request sent to A is forwarded to B.
            again = await prompt(on_a, sid, cid, "[echo via a]")
            assert again.status_code == 202, again.text
            events = await until_turn_of(on_b, sid, again.json()["promptId"])
            ids = [e["id"] for e in events if "id" in e]
            assert ids == sorted(set(ids))
            assert not any(e.get("type") == "session_died" for e in events)  # not journaled
            # A's events, then B's, never one of A's after B took over (the fence held).
            epochs = await trio.to_thread.run_sync(epochs_in_id_order, pg_url, sid)
            assert epochs == sorted(epochs) and epochs[-1] == epoch_b
            assert set(epochs) == {epoch_a, epoch_b}
            assert "lease lost" in a.stderr_path.read_text()
    finally:
        if frozen:
            os.kill(a.proc.pid, signal.SIGCONT)
        for d in daemons:
            d.stop()


async def _until_died(stream: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for event in iter_events(stream):
        if "comment" in event:
            continue
        yield event
        if event.get("type") == "session_died":
            return
