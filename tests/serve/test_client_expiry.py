"""Client ids expire (issue 16 item 11): clients that attached and never came back stop
counting, in ``clientCount`` and in the consensus electorate; through the real daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from tests.serve.test_mediation import ALLOW, Room, daemon_with, http, of_type
from tests.support.daemon import spawn_daemon

IDLE_MS = 1500


async def client_count(room: Room) -> int:
    r = await room.client.get("/daemon/status", params={"detail": "full"})
    [me] = [s for s in r.json()["full"]["sessions"] if s["sessionId"] == room.sid]
    return int(me["clientCount"])


async def test_anonymous_attaches_expire_and_consensus_is_reachable(tmp_path: Path) -> None:
    config = "policy:\n  permissionStrategy: consensus\n"
    with daemon_with(tmp_path, config, "--client-idle-timeout-ms", str(IDLE_MS)) as d:
        async with http(d) as client:
            room = await Room.open(client, 2)
            alice, bob = room.ids
            async with trio.open_nursery() as nursery:

                async def keep_alive(cid: str) -> None:
                    while True:
                        r = await client.post(
                            f"/session/{room.sid}/heartbeat", headers={"X-Qwen-Client-Id": cid}
                        )
                        assert r.status_code == 200, r.text
                        await trio.sleep(IDLE_MS / 4000)

                nursery.start_soon(keep_alive, alice)
                nursery.start_soon(keep_alive, bob)
                for _ in range(300):  # attach and vanish
                    await Room.attach_to(client, room.sid)
                await trio.sleep(2 * IDLE_MS / 1000)  # let the idle timeout pass
                assert await client_count(room) == 2

                async def both_allow(req: dict[str, Any]) -> None:
                    assert (await room.vote(req["requestId"], ALLOW, alice)).status_code == 200
                    assert (await room.vote(req["requestId"], ALLOW, bob)).status_code == 200

                events = await room.turn("[write agreed.txt yes]", both_allow, originator=alice)
                nursery.cancel_scope.cancel()
            [resolved] = of_type(events, "permission_resolved")
            assert resolved["outcome"] == {"outcome": "selected", "optionId": "allow"}
            assert (d.workspace / "agreed.txt").read_text() == "yes"


async def test_a_client_streaming_its_events_stays_registered(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy: {}\n", "--client-idle-timeout-ms", str(IDLE_MS)) as d:
        async with http(d) as client:
            room = await Room.open(client, 2)
            streamer, idle = room.ids
            headers = {"X-Qwen-Client-Id": streamer, "Last-Event-ID": "0"}
            async with client.stream("GET", f"/session/{room.sid}/events", headers=headers):
                await trio.sleep(2 * IDLE_MS / 1000)
                assert await client_count(room) == 1
                late = await client.post(
                    f"/session/{room.sid}/heartbeat", headers={"X-Qwen-Client-Id": idle}
                )
                assert late.status_code == 400 and late.json()["code"] == "invalid_client_id"
                ok = await client.post(
                    f"/session/{room.sid}/heartbeat", headers={"X-Qwen-Client-Id": streamer}
                )
                assert ok.status_code == 200


async def test_a_flood_of_attaches_does_not_push_out_a_streaming_client() -> None:
    """Issue 22 item 15: past the table's 4096 clients the idlest was dropped whatever it
    did, so 4160 anonymous attaches made the streaming client's heartbeat a 400."""
    daemon = spawn_daemon()
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            first = (await client.post("/session", json={"sessionScope": "single"})).json()
            sid, me = first["sessionId"], first["clientId"]
            headers = {"X-Qwen-Client-Id": me}
            # The stream is subscribed once its response head has arrived.
            async with client.stream("GET", f"/session/{sid}/events", headers=headers):
                for _ in range(4160):
                    attach = await client.post("/session", json={"sessionScope": "single"})
                    assert attach.json()["sessionId"] == sid
                beat = await client.post(f"/session/{sid}/heartbeat", headers=headers)
                assert beat.status_code == 200, beat.text
    finally:
        daemon.stop()
