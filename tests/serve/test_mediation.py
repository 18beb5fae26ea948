"""Multi-client permission mediation end to end: the config file picks the policy, several
HTTP clients vote on a real scripted-agent permission request (``[write F T]`` asks
``session/request_permission``; ``[shell C]`` makes the Host ask through the mediator)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import iter_events

TOKEN = "mediation-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow"}}
REJECT = {"outcome": {"outcome": "selected", "optionId": "reject"}}
CANCEL = {"outcome": {"outcome": "cancelled"}}


@contextmanager
def daemon_with(tmp_path: Path, config: str, *args: str) -> Iterator[DaemonProcess]:
    path = tmp_path / "acp-serve.yaml"
    path.write_text(config)
    with running_daemon(["--config", str(path), *args], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        yield d


@asynccontextmanager
async def http(d: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
        yield client


class Room:
    """One session with several registered clients (the first one created it)."""

    def __init__(self, client: httpx.AsyncClient, sid: str, ids: list[str]) -> None:
        self.client = client
        self.sid = sid
        self.ids = ids

    @classmethod
    async def open(cls, client: httpx.AsyncClient, n: int) -> Room:
        r = await client.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 200, r.text
        sid = r.json()["sessionId"]
        ids = [r.json()["clientId"]]
        for _ in range(n - 1):
            ids.append(await cls.attach_to(client, sid))
        return cls(client, sid, ids)

    @staticmethod
    async def attach_to(client: httpx.AsyncClient, sid: str) -> str:
        r = await client.post(f"/session/{sid}/load", json={})
        assert r.status_code == 200 and r.json()["attached"], r.text
        return r.json()["clientId"]  # type: ignore[no-any-return]

    async def vote(
        self, request_id: str, body: dict[str, Any], voter: str | None
    ) -> httpx.Response:
        headers = {"X-Qwen-Client-Id": voter} if voter else {}
        return await self.client.post(
            f"/session/{self.sid}/permission/{request_id}", json=body, headers=headers
        )

    async def turn(
        self,
        text: str,
        on_request: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        originator: str | None,
        until: frozenset[str] = frozenset({"turn_complete", "turn_error"}),
    ) -> list[dict[str, Any]]:
        """Prompt ``text`` as ``originator``; ``on_request`` handles each permission request;
        the events up to the first of type ``until``."""
        headers = {"Prefer": "respond-async"}
        if originator:
            headers["X-Qwen-Client-Id"] = originator
        r = await self.client.post(
            f"/session/{self.sid}/prompt",
            json={"prompt": [{"type": "text", "text": text}]},
            headers=headers,
        )
        assert r.status_code == 202, r.text
        accepted = r.json()
        events: list[dict[str, Any]] = []
        async with self.client.stream(
            "GET",
            f"/session/{self.sid}/events",
            headers={"Last-Event-ID": str(accepted["lastEventId"])},
        ) as stream:
            async for event in iter_events(stream):
                if "comment" in event or "id" not in event:
                    continue
                events.append(event)
                if event["type"] == "permission_request":
                    await on_request(event["data"])
                if event["type"] in until:
                    break
        return events


def of_type(events: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def forbidden(r: httpx.Response, reason: str) -> None:
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["code"] == "permission_forbidden" and body["reason"] == reason, body


# -- first-responder -----------------------------------------------------------------------


async def test_first_responder_first_vote_wins_late_votes_404(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: first-responder\n") as d:
        async with http(d) as client:
            room = await Room.open(client, 2)
            alice, bob = room.ids

            async def on_request(req: dict[str, Any]) -> None:
                status = (await client.get("/daemon/status", params={"detail": "full"})).json()
                perms = status["runtime"]["permissions"]
                assert perms["policy"] == "first-responder" and perms["pending"] == 1
                assert perms["requests"][0]["requestId"] == req["requestId"]
                assert perms["requests"][0]["sessionId"] == room.sid
                assert (await room.vote(req["requestId"], ALLOW, bob)).status_code == 200
                late = await room.vote(req["requestId"], REJECT, alice)
                assert late.status_code == 404
                assert late.json()["requestId"] == req["requestId"]

            events = await room.turn("[write fr.txt first]", on_request, originator=alice)
            # The late vote's event comes from the mediator, not the turn: it may land after
            # the turn's end. Read the stream on from there until it is in (bounded).
            with trio.fail_after(30):
                if not of_type(events, "permission_already_resolved"):
                    async with client.stream(
                        "GET",
                        f"/session/{room.sid}/events",
                        headers={"Last-Event-ID": str(events[-1]["id"])},
                    ) as stream:
                        async for event in iter_events(stream):
                            if "comment" in event or "id" not in event:
                                continue
                            events.append(event)
                            if event["type"] == "permission_already_resolved":
                                break
            [resolved] = of_type(events, "permission_resolved")
            assert resolved["voterClientId"] == bob
            assert resolved["outcome"] == {"outcome": "selected", "optionId": "allow"}
            [late] = of_type(events, "permission_already_resolved")
            assert late["outcome"] == resolved["outcome"]
            assert (d.workspace / "fr.txt").read_text() == "first"
            status = (await client.get("/daemon/status")).json()
            assert status["runtime"]["permissions"]["pending"] == 0


# -- designated ----------------------------------------------------------------------------


async def test_designated_only_the_originator_resolves(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: designated\n") as d:
        async with http(d) as client:
            caps = (await client.get("/capabilities")).json()
            assert caps["policy"]["permission"] == "designated"
            room = await Room.open(client, 2)
            alice, bob = room.ids

            async def on_request(req: dict[str, Any]) -> None:
                rid = req["requestId"]
                forbidden(await room.vote(rid, ALLOW, bob), "designated_mismatch")
                forbidden(await room.vote(rid, ALLOW, None), "designated_mismatch")
                assert (await room.vote(rid, ALLOW, alice)).status_code == 200

            events = await room.turn("[write des.txt mine]", on_request, originator=alice)
            refusals = of_type(events, "permission_forbidden")
            assert [f["reason"] for f in refusals] == ["designated_mismatch"] * 2
            assert refusals[0]["clientId"] == bob
            assert of_type(events, "permission_resolved")[0]["voterClientId"] == alice
            assert (d.workspace / "des.txt").read_text() == "mine"

            # a cancel from anyone is honoured under every policy
            async def bob_cancels(req: dict[str, Any]) -> None:
                assert (await room.vote(req["requestId"], CANCEL, bob)).status_code == 200

            events = await room.turn("[write des2.txt no]", bob_cancels, originator=alice)
            assert of_type(events, "permission_resolved")[0]["outcome"] == {"outcome": "cancelled"}
            assert not (d.workspace / "des2.txt").exists()

            # an anonymous prompt has no designated voter: first responder
            async def bob_answers(req: dict[str, Any]) -> None:
                assert (await room.vote(req["requestId"], ALLOW, bob)).status_code == 200

            await room.turn("[write des3.txt anon]", bob_answers, originator=None)
            assert (d.workspace / "des3.txt").read_text() == "anon"


# -- consensus -----------------------------------------------------------------------------


async def test_consensus_needs_a_quorum_of_the_electorate(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: consensus\n") as d:
        async with http(d) as client:
            room = await Room.open(client, 3)  # quorum floor(3/2)+1 = 2
            alice, bob, carol = room.ids

            async def on_request(req: dict[str, Any]) -> None:
                rid = req["requestId"]
                late_joiner = await Room.attach_to(client, room.sid)  # not in the electorate
                assert (await room.vote(rid, ALLOW, alice)).status_code == 200
                assert (await room.vote(rid, ALLOW, alice)).status_code == 200  # no-op repeat
                forbidden(await room.vote(rid, ALLOW, None), "designated_mismatch")
                forbidden(await room.vote(rid, ALLOW, late_joiner), "designated_mismatch")
                assert (await room.vote(rid, REJECT, bob)).status_code == 200  # 1 : 1
                assert (await room.vote(rid, ALLOW, carol)).status_code == 200  # 2 : 1

            events = await room.turn("[write vote.txt agreed]", on_request, originator=alice)
            partial = of_type(events, "permission_partial_vote")
            assert len(partial) == 2  # the repeat vote published nothing
            assert partial[0]["votesReceived"] == 1 and partial[0]["quorum"] == 2
            assert partial[0]["votesNeeded"] == 1
            assert partial[0]["optionTallies"] == {"allow": 1}
            assert partial[1]["optionTallies"] == {"allow": 1, "reject": 1}
            assert partial[1]["votesReceived"] == 2 and partial[1]["votesNeeded"] == 1
            [resolved] = of_type(events, "permission_resolved")
            assert resolved["outcome"] == {"outcome": "selected", "optionId": "allow"}
            assert (d.workspace / "vote.txt").read_text() == "agreed"

            async def one_cancel(req: dict[str, Any]) -> None:
                assert (await room.vote(req["requestId"], CANCEL, carol)).status_code == 200

            events = await room.turn("[write vote2.txt no]", one_cancel, originator=alice)
            assert of_type(events, "permission_resolved")[0]["outcome"] == {"outcome": "cancelled"}
            assert not (d.workspace / "vote2.txt").exists()


async def test_consensus_quorum_from_the_config_file(tmp_path: Path) -> None:
    config = "policy:\n  permissionStrategy: consensus\n  consensusQuorum: 3\n"
    with daemon_with(tmp_path, config) as d:
        async with http(d) as client:
            room = await Room.open(client, 3)

            async def on_request(req: dict[str, Any]) -> None:
                for voter in room.ids:
                    assert (await room.vote(req["requestId"], ALLOW, voter)).status_code == 200

            events = await room.turn("[write q.txt all]", on_request, originator=room.ids[0])
            needed = [p["votesNeeded"] for p in of_type(events, "permission_partial_vote")]
            assert needed == [2, 1]
            assert [p["quorum"] for p in of_type(events, "permission_partial_vote")] == [3, 3]
            assert (d.workspace / "q.txt").read_text() == "all"


# -- local-only ----------------------------------------------------------------------------


async def test_local_only_loopback_votes_resolve(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: local-only\n") as d:
        async with http(d) as client:
            room = await Room.open(client, 2)

            async def on_request(req: dict[str, Any]) -> None:
                assert (await room.vote(req["requestId"], ALLOW, room.ids[1])).status_code == 200

            await room.turn("[write lo.txt local]", on_request, originator=room.ids[0])
            assert (d.workspace / "lo.txt").read_text() == "local"
    # remote voters (403 remote_not_allowed) are covered in test_effects_inprocess.py


# -- timeout and cancellation --------------------------------------------------------------


async def test_unanswered_requests_time_out_as_cancelled(tmp_path: Path) -> None:
    config = "policy:\n  permissionStrategy: first-responder\n"
    with daemon_with(tmp_path, config, "--permission-response-timeout-ms", "300") as d:
        async with http(d) as client:
            room = await Room.open(client, 1)
            ids: list[str] = []

            async def ignore(req: dict[str, Any]) -> None:
                ids.append(req["requestId"])

            events = await room.turn("[write late.txt x]", ignore, originator=room.ids[0])
            [resolved] = of_type(events, "permission_resolved")
            assert resolved["outcome"] == {"outcome": "cancelled"}
            assert not (d.workspace / "late.txt").exists()
            late = await room.vote(ids[0], ALLOW, room.ids[0])
            assert late.status_code == 404
            legacy = await client.post(f"/permission/{ids[0]}", json=ALLOW)
            assert legacy.status_code == 404

            # a Host question that nobody answers refuses the effect
            events = await room.turn("[shell touch t.txt]", ignore, originator=room.ids[0])
            assert of_type(events, "permission_resolved")[0]["outcome"] == {"outcome": "cancelled"}
            [denied] = of_type(events, "effect_denied")
            assert denied["rule"] == "permission:cancelled"
            assert not (d.workspace / "t.txt").exists()
            # the late votes were announced
            async with client.stream(
                "GET", f"/session/{room.sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                replay = []
                async for event in iter_events(stream):
                    if event.get("type") == "replay_complete":
                        break
                    if "id" in event:
                        replay.append(event)
            assert len(of_type(replay, "permission_already_resolved")) == 2


async def test_closing_the_session_resolves_its_pending_requests(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: consensus\n") as d:
        async with http(d) as client:
            room = await Room.open(client, 2)
            ids: list[str] = []

            async def close_instead(req: dict[str, Any]) -> None:
                ids.append(req["requestId"])
                assert (await client.delete(f"/session/{room.sid}")).status_code in (200, 204)

            events = await room.turn(
                "[shell touch c.txt]",
                close_instead,
                originator=room.ids[0],
                until=frozenset({"session_closed"}),
            )
            assert of_type(events, "permission_resolved")[0]["outcome"] == {"outcome": "cancelled"}
            assert of_type(events, "turn_complete")[0]["stopReason"] == "cancelled"
            assert not (d.workspace / "c.txt").exists()
            late = await client.post(f"/permission/{ids[0]}", json=ALLOW)
            assert late.status_code == 404
            status = (await client.get("/daemon/status")).json()
            assert status["runtime"]["permissions"]["pending"] == 0
