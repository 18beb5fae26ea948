"""Is a closed session (actor, event log, ring) released once it is gone?

    .venv/bin/python scripts/repro_session_release.py

Runs the daemon in-process, fills one session's log with 200 prompts, closes it, waits until
the registry forgot it, collects garbage and says whether the actor is still alive — then
once more after the next session was created.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import weakref
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve.runtime.daemon import Daemon
from serve.settings import parse_settings

TOKEN = "release-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        argv = ["--workspace", str(ws), "--port", "0", "--state-dir", str(Path(tmp) / "state")]
        daemon = Daemon(parse_settings(argv, {"HOME": tmp, "QWEN_SERVER_TOKEN": TOKEN}))
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(daemon.run)
            try:
                async with httpx.AsyncClient(base_url=urls[0], headers=AUTH, timeout=30) as c:
                    sid = (await c.post("/session", json={"sessionScope": "thread"})).json()[
                        "sessionId"
                    ]
                    for i in range(200):
                        await c.post(
                            f"/session/{sid}/prompt",
                            json={"prompt": [{"type": "text", "text": f"hello {i}"}]},
                        )
                    session = daemon.registry.get(sid)
                    assert session is not None
                    events = session.log.last_id
                    ref = weakref.ref(session)
                    del session
                    await c.delete(f"/session/{sid}")
                    while any(  # noqa: ASYNC110
                        sid in rt.registry.sessions for rt in daemon.registry
                    ):
                        await trio.sleep(0.01)
                    await trio.sleep(0.2)
                    gc.collect()
                    print(f"session with {events} events closed and forgotten by the registry:")
                    print(f"  actor still alive: {ref() is not None}")
                    await c.post("/session", json={"sessionScope": "thread"})
                    gc.collect()
                    print(f"  after the next session was created: {ref() is not None}")
            finally:
                await daemon.shutdown()


if __name__ == "__main__":
    trio.run(main)
