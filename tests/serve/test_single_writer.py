"""One writer per session log (issue 15 item 2): workspace-wide events reach every session's
log through the WorkspaceHub and the session actor, and are there when the route answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.support.daemon import running_daemon
from tests.support.sse import iter_events

TOKEN = "single-writer-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def replay(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """Everything the session's log holds now (up to ``replay_complete``; no waiting)."""
    out: list[dict[str, Any]] = []
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        async for event in iter_events(stream):
            if event.get("type") == "replay_complete":
                return out
            if "id" in event:
                out.append(event)
    return out


async def test_a_workspace_event_is_in_every_log_when_the_route_answers(tmp_path: Path) -> None:
    with running_daemon(["--token", TOKEN]) as d:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            sids = []
            for _ in range(3):
                r = await client.post("/session", json={"sessionScope": "thread"})
                sids.append(r.json()["sessionId"])
            for n in range(5):
                w = await client.post(
                    "/file/write",
                    json={"path": f"f{n}.txt", "content": str(n), "mode": "create"},
                )
                assert w.status_code in (200, 201), w.text
                for sid in sids:  # read right after the answer: already published
                    changed = [
                        e["data"]["path"]
                        for e in await replay(client, sid)
                        if e["type"] == "workspace_file_changed"
                    ]
                    assert changed == [f"f{i}.txt" for i in range(n + 1)]
            ids = [e["id"] for e in await replay(client, sids[0])]
            assert ids == sorted(ids) and len(set(ids)) == len(ids)  # gap-free, in order
