"""Native fork (issue 27 item 1): ``POST /session/:id/branch`` with ACP ``session/fork``.

Real daemon, real scripted agents: the default one advertises ``sessionCapabilities.fork``,
the ``--legacy`` one does not (501 ``not_supported_by_agent``).
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

import httpx
import pytest

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


@pytest.fixture
def daemon_url() -> Any:
    d = spawn_daemon([], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d.url
    finally:
        d.stop()


@pytest.fixture
def legacy_url() -> Any:
    agent = shlex.join([sys.executable, "-m", "acp.agents.scripted", "--legacy"])
    d = spawn_daemon(["--agent", agent], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d.url
    finally:
        d.stop()


async def test_a_fork_is_a_new_session_that_names_its_parent_and_keeps_its_context(
    daemon_url: str,
) -> None:
    async with httpx.AsyncClient(base_url=daemon_url, headers=AUTH, timeout=30) as client:
        parent = (await client.post("/session", json={"sessionScope": "thread"})).json()
        pid = parent["sessionId"]
        assert (
            await client.post(f"/session/{pid}/prompt", json=text("remember me"))
        ).status_code == 200
        caps = (await client.get("/capabilities")).json()
        assert "session_branch" in caps["features"]

        forked = await client.post(f"/session/{pid}/branch", json={"name": "worker"})
        assert forked.status_code == 201, forked.text
        body = forked.json()
        fid = body["sessionId"]
        assert fid != pid
        assert body["branchedFrom"] == pid
        assert body["via"] == "session/fork"

        async with client.stream(
            "GET", f"/session/{fid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            first = await collect_until(stream, lambda e: True)
        assert first[-1]["type"] == "session_forked"
        assert first[-1]["data"]["parentSessionId"] == pid

        # its own turn; the parent is untouched and stays usable
        done = await client.post(f"/session/{fid}/prompt", json=text("child"))
        assert done.status_code == 200
        assert (await client.post(f"/session/{pid}/prompt", json=text("parent"))).status_code == 200
        # its own budget and journal-backed stream
        assert (await client.get(f"/session/{fid}/budget")).json()["sessionId"] == fid
        # closing the fork leaves the parent
        assert (await client.delete(f"/session/{fid}")).status_code in (200, 204)
        assert (await client.get(f"/session/{pid}/budget")).status_code == 200


async def test_an_agent_that_cannot_fork_answers_501(legacy_url: str) -> None:
    async with httpx.AsyncClient(base_url=legacy_url, headers=AUTH, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        refused = await client.post(f"/session/{sid}/branch", json={})
        assert refused.status_code == 501
        assert refused.json()["code"] == "not_supported_by_agent"
