"""The real ``qwen --acp`` agent behind acp-serve: create → prompt → events → permission → close.

qwen runs offline against the fake OpenAI server; the test is skipped only when node/npm are
missing (CI installs the package with scripts/install-node-deps).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from acp.process import live_group_members
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess
from tests.support.node import missing_node_reason
from tests.support.qwen_daemon import qwen_behind_daemon
from tests.support.sse import iter_events

pytestmark = pytest.mark.skipif(
    missing_node_reason() is not None, reason=str(missing_node_reason())
)


@pytest.fixture(scope="module")
def qwen_daemon() -> Iterator[DaemonProcess]:
    with qwen_behind_daemon(TOKEN, prefix="acp-serve-qwen-") as daemon:
        yield daemon


async def test_qwen_session_prompt_permission_close(qwen_daemon: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=qwen_daemon.url, timeout=120, headers=AUTH) as client:
        created = (await client.post("/session", json={"sessionScope": "thread"})).json()
        sid, cid = created["sessionId"], created["clientId"]
        headers = {"X-Qwen-Client-Id": cid}
        # qwen starts in mode "auto"; in "default" it asks before writing.
        r = await client.post(
            f"/session/{sid}/approval-mode", json={"mode": "default"}, headers=headers
        )
        assert r.status_code == 200, r.text
        r = await client.post(
            f"/session/{sid}/prompt",
            json={"prompt": [{"type": "text", "text": "please write notes.txt hello from qwen"}]},
            headers={**headers, "Prefer": "respond-async"},
        )
        assert r.status_code == 202
        prompt_id = r.json()["promptId"]
        events: list[dict[str, Any]] = []
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            async for event in iter_events(stream):
                if "comment" in event:
                    continue
                events.append(event)
                if event["type"] == "permission_request":
                    options = {o["kind"]: o["optionId"] for o in event["data"]["options"]}
                    vote = await client.post(
                        f"/session/{sid}/permission/{event['data']['requestId']}",
                        json={
                            "outcome": {"outcome": "selected", "optionId": options["allow_once"]}
                        },
                        headers=headers,
                    )
                    assert vote.status_code == 200
                if event["type"] in ("turn_complete", "turn_error"):
                    break
        assert events[-1]["type"] == "turn_complete", events[-1]
        assert events[-1]["promptId"] == prompt_id
        types = [e["type"] for e in events]
        assert "permission_request" in types and "permission_resolved" in types
        updates = [
            e["data"]["update"]["sessionUpdate"] for e in events if e["type"] == "session_update"
        ]
        assert "tool_call" in updates
        assert (qwen_daemon.workspace / "notes.txt").read_text().startswith("hello from qwen")
        # The session's own agent (its process group); a warm spare of the pool stays.
        status = (await client.get("/daemon/status", params={"detail": "full"})).json()
        agent = next(s for s in status["full"]["sessions"] if s["sessionId"] == sid)["agentPid"]
        session_pid_groups_before = [g for g in _agent_groups(qwen_daemon) if g == agent]
        assert (await client.delete(f"/session/{sid}", headers=headers)).status_code == 204
        assert (await client.post(f"/session/{sid}/heartbeat")).status_code == 404
    # The agent's process group is gone shortly after close (stopped by escalation).
    assert session_pid_groups_before
    deadline = time.monotonic() + 10
    while any(live_group_members(g) for g in session_pid_groups_before):
        assert time.monotonic() < deadline, "agent process group still alive after close"
        await trio.sleep(0.1)


def _agent_groups(daemon: DaemonProcess) -> list[int]:
    import os

    groups = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ppid, pgid = int(fields[1]), int(fields[2])
        if ppid == daemon.proc.pid:
            groups.append(pgid)
    return groups
