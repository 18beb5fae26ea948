"""A closed session is released at once (issue 16 item 13): nothing keeps its actor, its
event log or its ring alive once it is gone, not even the last message an actor handled."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from serve.runtime.daemon import Daemon
from serve.settings import parse_settings

TOKEN = "lifetime-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def inprocess(tmp_path: Path, *extra: str) -> AsyncIterator[tuple[Daemon, httpx.AsyncClient]]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    argv = ["--workspace", str(ws), "--port", "0", "--state-dir", str(tmp_path / "state")]
    argv += extra
    daemon = Daemon(parse_settings(argv, {"HOME": str(tmp_path), "QWEN_SERVER_TOKEN": TOKEN}))
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(daemon.run)
        try:
            async with httpx.AsyncClient(base_url=urls[0], headers=AUTH, timeout=30) as client:
                yield daemon, client
        finally:
            await daemon.shutdown()


def referrers(obj: object) -> list[str]:
    return [type(r).__name__ for r in gc.get_referrers(obj)]


async def test_a_closed_session_is_released_before_the_next_one_starts(tmp_path: Path) -> None:
    async with inprocess(tmp_path) as (d, client):
        created = (await client.post("/session", json={"sessionScope": "thread"})).json()
        sid = created["sessionId"]
        r = await client.post(
            f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hello"}]}
        )
        assert r.status_code == 200
        session = d.host.registry.get(sid)
        assert session is not None
        gone = session.gone
        refs = [weakref.ref(session), weakref.ref(session.log)]  # the ring lives in the log
        del session
        assert (await client.delete(f"/session/{sid}")).status_code == 204
        await gone.wait()
        await trio.lowlevel.checkpoint()  # let the supervisor finish its bookkeeping
        gc.collect()
        alive = [ref() for ref in refs if ref() is not None]
        assert alive == [], [referrers(obj) for obj in alive]
