"""Session token budgets (issue 27 item 3) with a real daemon and the scripted agent.

The scripted agent reports usage in ACP shapes (``usage_update`` and the prompt response's
``usage``); ``[usage N]`` adds N tokens to the turn. The ``--legacy`` scripted agent reports
none: its sessions are unbudgeted. Waits are bounded; nothing asserts a duration.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


def _daemon(*extra: str) -> Any:
    d = spawn_daemon(["--session-token-budget", "100", *extra], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def budgeted() -> Any:
    yield from _daemon()


@pytest.fixture
def legacy() -> Any:
    agent = shlex.join([sys.executable, "-m", "acp.agents.scripted", "--legacy"])
    yield from _daemon("--agent", agent)


@pytest.fixture
async def client(budgeted: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=budgeted.url, headers=AUTH, timeout=30) as c:
        yield c


async def _events(client: httpx.AsyncClient, sid: str, stop: Any) -> list[dict[str, Any]]:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        return await collect_until(stream, stop)


async def test_a_budget_warns_cancels_the_turn_refuses_prompts_and_is_raised(
    client: httpx.AsyncClient,
) -> None:
    sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
    first = await client.post(f"/session/{sid}/prompt", json=text("[usage 85] hi"))
    assert first.status_code == 200
    read = (await client.get(f"/session/{sid}/budget")).json()
    # input: 3 words + 85 from [usage]; output: "echo: hi"
    assert read["usage"]["totalTokens"] == 90
    assert read["unbudgeted"] is False
    assert read["budget"]["maxTokens"] == 100
    assert read["exhausted"] is None

    # The context grows by 50 mid-turn: the running turn is cancelled at once.
    second = await client.post(f"/session/{sid}/prompt", json=text("[usage 50] [sleep 20000] x"))
    assert second.status_code == 402  # the blocking caller is told why, never a 500
    assert second.json()["code"] == "budget_exhausted"
    events = await _events(client, sid, lambda e: e.get("type") == "turn_error")
    kinds = [e["type"] for e in events]
    assert "budget_warning" in kinds
    warning = next(e for e in events if e["type"] == "budget_warning")
    assert warning["data"]["dimension"] == "tokens"
    assert kinds.index("budget_warning") < kinds.index("budget_exhausted")
    error = events[-1]["data"]
    assert error["code"] == "budget_exhausted"

    refused = await client.post(f"/session/{sid}/prompt", json=text("more"))
    assert refused.status_code == 402
    assert refused.json()["code"] == "budget_exhausted"
    assert refused.json()["dimension"] == "tokens"

    bad = await client.patch(f"/session/{sid}/budget", json={"maxTokens": -1})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_budget"
    unknown = await client.patch(f"/session/{sid}/budget", json={"tokens": 5})
    assert unknown.status_code == 400 and unknown.json()["field"] == "tokens"

    raised = await client.patch(f"/session/{sid}/budget", json={"maxTokens": 100000})
    assert raised.status_code == 200
    assert raised.json()["exhausted"] is None
    again = await client.post(f"/session/{sid}/prompt", json=text("more"))
    assert again.status_code == 200

    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
    row = next(s for s in status["full"]["sessions"] if s["sessionId"] == sid)
    assert row["budget"]["usage"]["totalTokens"] >= 140
    metrics = (await client.get("/metrics")).text
    tokens = next(
        line for line in metrics.splitlines() if line.startswith("acp_serve_session_tokens ")
    )
    assert float(tokens.split()[1]) >= 140
    assert "acp_serve_sessions_budget_exhausted 0.0" in metrics


async def test_an_agent_that_reports_no_usage_is_unbudgeted(legacy: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=legacy.url, headers=AUTH, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        for _ in range(2):
            done = await client.post(f"/session/{sid}/prompt", json=text("[usage 500] hi"))
            assert done.status_code == 200
        read = (await client.get(f"/session/{sid}/budget")).json()
        assert read["unbudgeted"] is True
        assert read["unbudgetedReason"] == "the agent has reported no usage"
