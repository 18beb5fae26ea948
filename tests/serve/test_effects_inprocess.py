"""The daemon run in-process (real sockets, real scripted agent) where a test needs what a
subprocess cannot give: a non-loopback voter (the app's ASGI entry with another peer
address), concurrent identical agent effects, and a controllable clock for the gate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from acp.errors import HandlerError
from acp.schema import CreateTerminalParams, ReadTextFileParams
from serve.permissions.cache import ALWAYS_ALLOW_TTL_MS
from serve.permissions.effects import EffectGate
from serve.permissions.host_request import EFFECT_DENIED
from serve.runtime.daemon import Daemon
from serve.settings import parse_settings
from tests.support.sse import iter_events

TOKEN = "inprocess-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REMOTE_PEER = ("203.0.113.9", 40123)  # TEST-NET-3: never loopback


@asynccontextmanager
async def inprocess(tmp_path: Path, config: str) -> AsyncIterator[tuple[Daemon, httpx.AsyncClient]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = tmp_path / "acp-serve.yaml"
    cfg.write_text(config)
    argv = ["--workspace", str(ws), "--port", "0", "--state-dir", str(tmp_path / "state")]
    settings = parse_settings(
        [*argv, "--config", str(cfg)], {"HOME": str(tmp_path), "QWEN_SERVER_TOKEN": TOKEN}
    )
    daemon = Daemon(settings)
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(daemon.run)
        try:
            async with httpx.AsyncClient(base_url=urls[0], headers=AUTH, timeout=30) as client:
                yield daemon, client
        finally:
            await daemon.shutdown()


async def remote_vote(
    daemon: Daemon, path: str, body: dict[str, Any], client_id: str
) -> tuple[int, Any]:
    """A vote arriving from a non-loopback peer (through the whole ASGI stack)."""
    test_client = daemon._app.test_client()
    response = await test_client.post(
        path,
        json=body,
        headers={**AUTH, "Host": f"127.0.0.1:{daemon.host.port}", "X-Qwen-Client-Id": client_id},
        scope_base={"client": REMOTE_PEER},
    )
    return response.status_code, await response.get_json()


async def watch_requests(
    client: httpx.AsyncClient,
    sid: str,
    on_request: Callable[[dict[str, Any]], Awaitable[None]],
    seen: list[dict[str, Any]],
) -> None:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        async for event in iter_events(stream):
            if event.get("type") == "permission_request":
                seen.append(event["data"])
                await on_request(event["data"])


# -- local-only with a remote voter ----------------------------------------------------------


async def test_local_only_refuses_remote_votes_but_honours_a_remote_cancel(
    tmp_path: Path,
) -> None:
    async with inprocess(tmp_path, "policy:\n  permissionStrategy: local-only\n") as (d, client):
        created = (await client.post("/session", json={"sessionScope": "thread"})).json()
        sid, alice = created["sessionId"], created["clientId"]
        bob = (await client.post(f"/session/{sid}/load", json={})).json()["clientId"]
        path = f"/session/{sid}/permission/"
        allow = {"outcome": {"outcome": "selected", "optionId": "allow"}}
        results: list[Any] = []

        async def on_request(req: dict[str, Any]) -> None:
            rid = req["requestId"]
            status, body = await remote_vote(d, path + rid, allow, bob)
            results.append((status, body))
            if len(results) == 1:  # first request: the remote cancel is honoured
                results.append(
                    await remote_vote(d, path + rid, {"outcome": {"outcome": "cancelled"}}, bob)
                )
            else:  # second request: a loopback voter resolves it
                vote = await client.post(
                    path + rid, json=allow, headers={"X-Qwen-Client-Id": alice}
                )
                results.append((vote.status_code, vote.json()))

        seen: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_requests, client, sid, on_request, seen)
            for name in ("r1.txt", "r2.txt"):
                r = await client.post(
                    f"/session/{sid}/prompt",
                    json={"prompt": [{"type": "text", "text": f"[write {name} x]"}]},
                    headers={"X-Qwen-Client-Id": alice},
                )
                assert r.status_code == 200, r.text
            nursery.cancel_scope.cancel()
        (s1, b1), (s2, b2), (s3, b3), (s4, b4) = results
        assert s1 == 403 and b1["code"] == "permission_forbidden"
        assert b1["reason"] == "remote_not_allowed"
        assert (s2, b2) == (200, {})  # cancel from a remote voter
        assert s3 == 403 and b3["reason"] == "remote_not_allowed"
        assert (s4, b4) == (200, {})
        ws = Path(d.host.settings.primary_workspace)
        assert not (ws / "r1.txt").exists()
        assert (ws / "r2.txt").read_text() == "x"


# -- the gate driven directly on a live session ---------------------------------------------


async def _open_session(client: httpx.AsyncClient) -> tuple[str, str]:
    created = (await client.post("/session", json={"sessionScope": "thread"})).json()
    return created["sessionId"], created["clientId"]


def gate_waiters(gate: EffectGate) -> int:
    """Readers parked on the gate's shared decisions (leaders included)."""
    table = gate.prompt_stage._inflight
    return sum(len(w) for w in getattr(table, "_waiters", {}).values())


async def test_concurrent_identical_effects_share_one_question(tmp_path: Path) -> None:
    async with inprocess(tmp_path, "") as (d, client):
        sid, _ = await _open_session(client)
        ws = Path(d.host.settings.primary_workspace)
        (ws / ".env").write_text("TOKEN=xyz")
        session = d.host.registry.get(sid)
        assert session is not None and isinstance(session.effects, EffectGate)
        params = ReadTextFileParams(session_id=sid, path=str(ws / ".env"))
        contents: list[str] = []

        async def read() -> None:
            contents.append(await session.effects.read_text_file(session, params))

        async def allow_once(req: dict[str, Any]) -> None:
            # Answer only once all three readers are in flight (each first resolves its
            # path in a worker thread, which a loaded machine can delay).
            with trio.move_on_after(10):
                while len(contents) < 3 and gate_waiters(session.effects) < 3:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await client.post(
                f"/session/{sid}/permission/{req['requestId']}",
                json={"outcome": {"outcome": "selected", "optionId": "allow_once"}},
            )

        seen: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_requests, client, sid, allow_once, seen)
            async with trio.open_nursery() as readers:
                for _ in range(3):
                    readers.start_soon(read)
            nursery.cancel_scope.cancel()
        assert contents == ["TOKEN=xyz"] * 3
        assert len(seen) == 1  # one question for three identical reads
        # once decided, the next identical read asks again (allow_once is not remembered)
        with trio.move_on_after(0.5) as scope:
            await session.effects.read_text_file(session, params)
        assert scope.cancelled_caught


async def test_allow_always_expires_after_eight_hours(tmp_path: Path) -> None:
    async with inprocess(tmp_path, "") as (d, client):
        sid, alice = await _open_session(client)
        now = [1_000_000]
        host = d.host
        gate = EffectGate(
            host.config_cell,
            settings=host.settings,
            mediator=host.mediator,
            live_sessions=host.registry.live,
            clock_ms=lambda: now[0],
        )
        params = CreateTerminalParams(session_id=sid, command="/bin/sh", args=["-c", "echo x"])
        answers = iter(["allow_always", "reject_once"])

        async def answer(req: dict[str, Any]) -> None:
            await client.post(
                f"/session/{sid}/permission/{req['requestId']}",
                json={"outcome": {"outcome": "selected", "optionId": next(answers)}},
            )

        seen: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_requests, client, sid, answer, seen)
            # a running prompt by alice makes her the principal of the gate's questions
            r = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[sleep 20000]"}]},
                headers={"X-Qwen-Client-Id": alice, "Prefer": "respond-async"},
            )
            assert r.status_code == 202
            session = d.host.registry.get(sid)
            assert session is not None
            with trio.fail_after(20):  # until the prompt worker picks the job up
                while session.active is None or session.active.client_id != alice:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await gate.check_terminal(session, params)  # asked: allow_always
            assert len(seen) == 1 and len(gate.cache) == 1
            now[0] += ALWAYS_ALLOW_TTL_MS - 1
            await gate.check_terminal(session, params)  # cached
            assert len(seen) == 1
            now[0] += 1
            with pytest.raises(HandlerError) as refused:  # expired: asked again, rejected
                await gate.check_terminal(session, params)
            assert refused.value.code == EFFECT_DENIED
            assert len(seen) == 2 and len(gate.cache) == 0
            await client.post(f"/session/{sid}/cancel")
            nursery.cancel_scope.cancel()


async def test_a_replaced_session_does_not_inherit_cached_allows(tmp_path: Path) -> None:
    async with inprocess(tmp_path, "") as (d, client):
        sid, _ = await _open_session(client)
        first = d.host.registry.get(sid)
        assert first is not None
        gate: EffectGate = first.effects
        old_key = gate.session_key(first)
        assert (await client.delete(f"/session/{sid}")).status_code in (200, 204)
        r = await client.post(f"/session/{sid}/load", json={})
        assert r.status_code == 200, r.text
        second = d.host.registry.get(sid)
        assert second is not None and second is not first
        assert gate.session_key(second) != old_key
