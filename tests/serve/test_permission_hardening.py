"""Permission requests a misbehaving agent cannot use to hurt its session (issue 16, items 2
and 15), through the real daemon and a small fake ACP agent (tests/support/
permission_agent.py) that withdraws its requests, abandons them, or asks about effects the
approval policy already decides; plus the order of permission events and agent updates."""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import iter_events

TOKEN = "hardening-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AGENT = shlex.join(
    [sys.executable, str(Path(__file__).parents[1] / "support" / "permission_agent.py")]
)
ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow"}}
CANCELLED = {"outcome": "cancelled"}

OnRequest = Callable[[dict[str, Any]], Awaitable[None]]


@contextmanager
def daemon(tmp_path: Path, *args: str, config: str | None = None) -> Iterator[DaemonProcess]:
    extra: list[str] = []
    if config is not None:
        path = tmp_path / "acp-serve.yaml"
        path.write_text(config)
        extra = ["--config", str(path)]
    with running_daemon(["--agent", AGENT, *extra, *args], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        yield d


@asynccontextmanager
async def http(d: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=60) as client:
        yield client


async def session(client: httpx.AsyncClient) -> tuple[str, str]:
    r = await client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def turn(
    client: httpx.AsyncClient, sid: str, cid: str, text: str, on_request: OnRequest | None = None
) -> list[dict[str, Any]]:
    """Prompt ``text``; answer each ``permission_request`` with ``on_request``; return the
    events of the turn up to its terminal event."""
    r = await client.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={"Prefer": "respond-async", "X-Qwen-Client-Id": cid},
    )
    assert r.status_code == 202, r.text
    events: list[dict[str, Any]] = []
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(r.json()["lastEventId"])}
    ) as stream:
        async for event in iter_events(stream):
            if "id" not in event:
                continue
            events.append(event)
            if event["type"] == "permission_request" and on_request is not None:
                await on_request(event["data"])
            if event["type"] in ("turn_complete", "turn_error"):
                return events
    raise AssertionError("the stream ended before the turn did")


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def said(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


def index_of(events: list[dict[str, Any]], pred: Callable[[dict[str, Any]], bool]) -> int:
    return next(i for i, e in enumerate(events) if pred(e))


async def pending(client: httpx.AsyncClient) -> int:
    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return int(status["runtime"]["permissions"]["pending"])


def voter(client: httpx.AsyncClient, sid: str, cid: str, real: str) -> OnRequest:
    """Allow the request whose tool call targets ``real``; ignore the others."""

    async def on_request(req: dict[str, Any]) -> None:
        if req["toolCall"]["locations"][0]["path"].endswith(real):
            r = await client.post(
                f"/session/{sid}/permission/{req['requestId']}",
                json=ALLOW,
                headers={"X-Qwen-Client-Id": cid},
            )
            assert r.status_code == 200, r.text

    return on_request


# -- 16.2: withdrawn and abandoned requests -------------------------------------------------


async def test_withdrawn_requests_leave_the_mediator_at_once(tmp_path: Path) -> None:
    """150 requests withdrawn with ``$/cancel_request`` (more than the per-session cap of 64),
    with no response timeout at all: each one the daemon had announced resolves
    ``cancelled`` (one withdrawn before the daemon got to it is never announced), nothing
    stays pending, and the session's next real request still reaches its client."""
    with daemon(tmp_path, "--permission-response-timeout-ms", "0") as d:
        async with http(d) as client:
            sid, cid = await session(client)
            events = await turn(
                client,
                sid,
                cid,
                "withdraw 150 5 ask edit real.txt",
                voter(client, sid, cid, "real.txt"),
            )
            requests = of_type(events, "permission_request")
            by_id = {r["requestId"]: r for r in of_type(events, "permission_resolved")}
            withdrawn = [r for r in requests if r["toolCall"]["kind"] == "other"]
            assert len(withdrawn) > 64 and len(requests) == len(withdrawn) + 1
            assert all(by_id[r["requestId"]]["outcome"] == CANCELLED for r in withdrawn)
            assert said(events) == ["outcome: allow"]  # asked, and a client answered
            assert await pending(client) == 0


async def test_a_turn_that_ends_withdraws_its_requests(tmp_path: Path) -> None:
    """An agent that ends its turn with requests still open: they resolve ``cancelled``
    (reason ``turn_ended``) when the turn ends, and the session keeps working."""
    with daemon(tmp_path, "--permission-response-timeout-ms", "0") as d:
        async with http(d) as client:
            sid, cid = await session(client)
            left: list[str] = []

            async def note(req: dict[str, Any]) -> None:
                left.append(req["requestId"])

            for _ in range(15):  # 75 abandoned requests in all: more than the cap of 64
                events = await turn(client, sid, cid, "leave 5 100", note)
            assert len(left) > 64  # (one the turn's end overtook is never announced)
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                resolved: dict[str, Any] = {}
                async for event in iter_events(stream):
                    if event.get("type") == "permission_resolved":
                        resolved[event["data"]["requestId"]] = event["data"]["outcome"]
                    if event.get("type") == "replay_complete":
                        break
            assert all(resolved.get(rid) == CANCELLED for rid in left)
            assert await pending(client) == 0
            events = await turn(
                client, sid, cid, "ask edit after.txt", voter(client, sid, cid, "after.txt")
            )
            assert said(events) == ["outcome: allow"]


# -- 16.15: the approval policy decides before anyone is asked ------------------------------


async def test_a_denied_capability_is_refused_without_asking_anyone(tmp_path: Path) -> None:
    config = "approval:\n  capabilities: {fs.write: deny}\n"
    with daemon(tmp_path, config=config) as d:
        async with http(d) as client:
            sid, cid = await session(client)
            asked: list[dict[str, Any]] = []

            async def record(req: dict[str, Any]) -> None:
                asked.append(req)

            events = await turn(client, sid, cid, "ask edit w.txt", record)
            assert asked == [] and of_type(events, "permission_request") == []
            [denied] = of_type(events, "effect_denied")
            assert denied == {
                "sessionId": sid,
                "capability": "fs.write",
                "target": str((d.workspace / "w.txt").resolve()),
                "rule": "approval.capabilities.fs.write",
                "reason": "approval.capabilities",
                "risk": "medium",
            }
            assert said(events) == ["outcome: reject"]  # the agent got its reject option
            # the denial is in the log before the agent's reaction to it
            first_word = index_of(
                events,
                lambda e: (
                    e["type"] == "session_update"
                    and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
                ),
            )
            assert index_of(events, lambda e: e["type"] == "effect_denied") < first_word


async def test_auto_answers_allow_and_prompt_asks(tmp_path: Path) -> None:
    with daemon(tmp_path) as d:  # default mode: in-workspace reads are auto
        async with http(d) as client:
            sid, cid = await session(client)
            events = await turn(client, sid, cid, "ask read r.txt")
            assert of_type(events, "permission_request") == []
            assert said(events) == ["outcome: allow"]
    with daemon(tmp_path, config="approval:\n  capabilities: {fs.read: prompt}\n") as d:
        async with http(d) as client:
            sid, cid = await session(client)
            events = await turn(
                client, sid, cid, "ask read r.txt", voter(client, sid, cid, "r.txt")
            )
            assert len(of_type(events, "permission_request")) == 1
            assert said(events) == ["outcome: allow"]


# -- ordering (single writer) ---------------------------------------------------------------


async def test_permission_events_precede_the_agents_later_updates(tmp_path: Path) -> None:
    """The mediator's events reach the log through the session actor, yet the log reads
    request → resolved → the agent's updates after its answer, every time."""
    with daemon(tmp_path) as d:
        async with http(d) as client:
            sid, cid = await session(client)
            for n in range(20):
                events = await turn(
                    client, sid, cid, f"ask edit o{n}.txt", voter(client, sid, cid, f"o{n}.txt")
                )
                kinds = [
                    e["type"]
                    if e["type"] != "session_update"
                    else e["data"]["update"]["sessionUpdate"]
                    for e in events
                ]
                assert kinds[-5:] == [
                    "permission_request",
                    "permission_resolved",
                    "agent_message_chunk",
                    "tool_call_update",
                    "turn_complete",
                ], kinds
