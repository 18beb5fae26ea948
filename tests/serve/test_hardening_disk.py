"""Issue 16 item 12: closed sessions' journals and scripted-agent files are deleted after
the retention (a real daemon and the scripted agent)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon


async def _gone(path: Path) -> bool:
    exists = path.exists
    with trio.move_on_after(30):
        while exists():  # noqa: ASYNC110
            await trio.sleep(0.1)
    return not exists()


async def test_closed_sessions_leave_no_journal_or_store_file_past_the_retention() -> None:
    daemon = spawn_daemon(
        ["--journal-retention-ms", "1", "--warm-agents", "0"], env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            created = (await client.post("/session", json={"sessionScope": "thread"})).json()
            sid = created["sessionId"]
            r = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
            )
            assert r.status_code == 200
            journal_dir = daemon.state_dir / "journal" / sid
            store_file = daemon.state_dir / "scripted" / "sessions" / f"{sid}.json"
            assert journal_dir.is_dir() and store_file.is_file()
            assert (await client.delete(f"/session/{sid}")).status_code in (200, 204)
            assert await _gone(journal_dir)  # swept right after its writer closed
            # The next scripted agent prunes the store at start.
            other = (await client.post("/session", json={"sessionScope": "thread"})).json()
            assert await _gone(store_file)
            assert (daemon.state_dir / "journal" / other["sessionId"]).is_dir()
    finally:
        daemon.stop()
