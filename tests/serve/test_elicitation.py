"""ACP elicitation (``elicitation/create``, form and url modes) brokered to REST clients:
the scripted agent's ``[elicit ...]`` asks, the daemon publishes ``elicitation_request``,
clients answer ``POST /session/:id/elicitation/:requestId`` under the mediation policy, the
agent says what it got (real daemon, real scripted-agent child, real sockets)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.conftest import AUTH, TOKEN
from tests.serve.test_mediation import Room, daemon_with, http, of_type
from tests.support.daemon import ROOT, spawn_daemon
from tests.support.sse import iter_events

FIRST = "policy:\n  permissionStrategy: first-responder\n"
FORM = "[elicit form name:string! count:integer color:string=red|green tags:array=a|b ok:boolean]"


async def answer(room: Room, request_id: str, body: Any, voter: str | None) -> httpx.Response:
    headers = {"X-Qwen-Client-Id": voter} if voter else {}
    return await room.client.post(
        f"/session/{room.sid}/elicitation/{request_id}", json=body, headers=headers
    )


def said(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        if e["type"] == "session_update":
            update = e["data"]["update"]
            if update.get("sessionUpdate") == "agent_message_chunk":
                out.append(update["content"]["text"])
    return out


async def elicit_turn(
    room: Room, text: str, on_request: Any, *, originator: str | None = None
) -> list[dict[str, Any]]:
    """Like ``Room.turn``, for ``elicitation_request`` events."""
    headers = {"Prefer": "respond-async"}
    if originator:
        headers["X-Qwen-Client-Id"] = originator
    r = await room.client.post(
        f"/session/{room.sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers=headers,
    )
    assert r.status_code == 202, r.text
    events: list[dict[str, Any]] = []
    async with room.client.stream(
        "GET",
        f"/session/{room.sid}/events",
        headers={"Last-Event-ID": str(r.json()["lastEventId"])},
    ) as stream:
        async for event in iter_events(stream):
            if "comment" in event or "id" not in event:
                continue
            events.append(event)
            if event["type"] == "elicitation_request":
                await on_request(event["data"])
            if event["type"] in ("turn_complete", "turn_error"):
                break
    return events


async def test_form_answer_is_checked_strictly_then_reaches_the_agent(tmp_path: Path) -> None:
    with daemon_with(tmp_path, FIRST) as d:
        async with http(d) as client:
            caps = (await client.get("/capabilities")).json()["features"]
            assert "session_elicitation" in caps
            room = await Room.open(client, 2)
            alice, bob = room.ids

            async def on_request(req: dict[str, Any]) -> None:
                assert req["mode"] == "form" and req["sessionId"] == room.sid
                schema = req["requestedSchema"]
                assert schema["required"] == ["name"]
                assert set(schema["properties"]) == {"name", "count", "color", "tags", "ok"}
                rid = req["requestId"]
                bad = [
                    ({"action": "accept", "content": {"count": 3}}, "`content.name` is required"),
                    ({"action": "accept", "content": {"name": 5}}, "must be a string"),
                    (
                        {"action": "accept", "content": {"name": "x", "count": 1.5}},
                        "must be an integer",
                    ),
                    (
                        {"action": "accept", "content": {"name": "x", "count": True}},
                        "must be an integer",
                    ),
                    ({"action": "accept", "content": {"name": "x", "color": "blue"}}, "not one"),
                    ({"action": "accept", "content": {"name": "x", "tags": ["c"]}}, "not one"),
                    ({"action": "accept", "content": {"name": "x", "ok": "yes"}}, "boolean"),
                    ({"action": "accept", "content": {"name": "x", "zip": 1}}, "not a field"),
                    ({"action": "accept", "content": ["x"]}, "`content` must be an object"),
                    ({"action": "maybe"}, "`action` must be"),
                    ({"action": "accept", "extra": 1}, "unknown member `extra`"),
                    ({"outcome": {"outcome": "cancelled"}}, "unknown member `outcome`"),
                ]
                for body, message in bad:
                    r = await answer(room, rid, body, bob)
                    assert r.status_code == 400, (body, r.text)
                    assert r.json()["code"] == "invalid_elicitation_response"
                    assert message in r.json()["error"], (body, r.json())
                # A permission vote never answers an elicitation.
                vote = await room.vote(rid, {"outcome": {"outcome": "cancelled"}}, bob)
                assert vote.status_code == 404, vote.text
                good = {"name": "Ada", "count": 3, "color": "green", "tags": ["a"], "ok": True}
                r = await answer(room, rid, {"action": "accept", "content": good}, bob)
                assert r.status_code == 200, r.text
                late = await answer(room, rid, {"action": "decline"}, alice)
                assert late.status_code == 404, late.text

            events = await elicit_turn(room, FORM, on_request, originator=alice)
            [resolved] = of_type(events, "elicitation_resolved")
            assert resolved["action"] == "accept" and resolved["voterClientId"] == bob
            assert resolved["content"]["name"] == "Ada"
            text = [t for t in said(events) if t.startswith("elicitation:")]
            assert text == [
                "elicitation: accept "
                + json.dumps(
                    {"color": "green", "count": 3, "name": "Ada", "ok": True, "tags": ["a"]},
                    sort_keys=True,
                )
            ]
            assert events[-1]["type"] == "turn_complete"


async def test_decline_and_cancel_answers(tmp_path: Path) -> None:
    with daemon_with(tmp_path, FIRST) as d:
        async with http(d) as client:
            room = await Room.open(client, 1)
            for action in ("decline", "cancel"):

                async def on_request(req: dict[str, Any], action: str = action) -> None:
                    # content on a decline/cancel is ignored (ACP), never forwarded
                    body = {"action": action, "content": {"name": "x"}}
                    assert (await answer(room, req["requestId"], body, None)).status_code == 200

                events = await elicit_turn(room, "[elicit form]", on_request)
                [resolved] = of_type(events, "elicitation_resolved")
                assert resolved["action"] == action and "content" not in resolved
                assert f"elicitation: {action}" in said(events)


async def test_url_mode_accept_has_no_content_and_completion_is_published(
    tmp_path: Path,
) -> None:
    with daemon_with(tmp_path, FIRST) as d:
        async with http(d) as client:
            room = await Room.open(client, 1)

            async def on_request(req: dict[str, Any]) -> None:
                assert req["mode"] == "url"
                assert req["url"] == "https://example.test/oauth"
                assert req["elicitationId"].startswith("scripted-")
                assert "requestedSchema" not in req
                rid = req["requestId"]
                r = await answer(room, rid, {"action": "accept", "content": {"token": "x"}}, None)
                assert r.status_code == 400 and "without `content`" in r.json()["error"]
                assert (await answer(room, rid, {"action": "accept"}, None)).status_code == 200

            events = await elicit_turn(room, "[elicit url https://example.test/oauth]", on_request)
            [request] = of_type(events, "elicitation_request")
            [resolved] = of_type(events, "elicitation_resolved")
            assert resolved["action"] == "accept" and "content" not in resolved
            assert "elicitation: accept" in said(events)
            [complete] = of_type(events, "elicitation_complete")
            assert complete == {"sessionId": room.sid, "elicitationId": request["elicitationId"]}


async def test_unanswered_elicitation_times_out_as_cancel(tmp_path: Path) -> None:
    with daemon_with(tmp_path, FIRST, "--permission-response-timeout-ms", "300") as d:
        async with http(d) as client:
            room = await Room.open(client, 1)

            async def nobody(req: dict[str, Any]) -> None:
                pass

            events = await elicit_turn(room, "[elicit form]", nobody)
            [resolved] = of_type(events, "elicitation_resolved")
            assert resolved["action"] == "cancel" and resolved["reason"] == "timeout"
            assert "elicitation: cancel" in said(events)
            assert events[-1]["type"] == "turn_complete"


async def test_cancelled_turn_cancels_its_elicitation(tmp_path: Path) -> None:
    with daemon_with(tmp_path, FIRST) as d:
        async with http(d) as client:
            room = await Room.open(client, 1)

            async def cancel_turn(req: dict[str, Any]) -> None:
                r = await client.post(f"/session/{room.sid}/cancel", json={})
                assert r.status_code in (200, 202, 204), r.text

            events = await elicit_turn(room, "[elicit form] [think after]", cancel_turn)
            [resolved] = of_type(events, "elicitation_resolved")
            assert resolved["action"] == "cancel" and "reason" in resolved
            done = events[-1]
            assert done["type"] == "turn_complete" and done["data"]["stopReason"] == "cancelled"
            status = (await client.get("/daemon/status", params={"detail": "full"})).json()
            assert status["runtime"]["permissions"]["pending"] == 0


async def test_closed_session_cancels_its_elicitation(tmp_path: Path) -> None:
    with daemon_with(tmp_path, FIRST) as d:
        async with http(d) as client:
            room = await Room.open(client, 1)
            seen: list[dict[str, Any]] = []

            async def close(req: dict[str, Any]) -> None:
                r = await client.delete(f"/session/{room.sid}")
                assert r.status_code in (200, 204), r.text

            r = await client.post(
                f"/session/{room.sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[elicit url]"}]},
                headers={"Prefer": "respond-async"},
            )
            assert r.status_code == 202
            async with client.stream(
                "GET",
                f"/session/{room.sid}/events",
                headers={"Last-Event-ID": str(r.json()["lastEventId"])},
            ) as stream:
                async for event in iter_events(stream):
                    if "id" not in event:
                        continue
                    seen.append(event)
                    if event["type"] == "elicitation_request":
                        await close(event["data"])
                    if event["type"] == "session_closed":
                        break
            [resolved] = of_type(seen, "elicitation_resolved")
            # the close ends the turn first, which withdraws what it asked
            assert resolved["action"] == "cancel"
            assert resolved["reason"] in ("turn_ended", "session_closed")
            status = (await client.get("/daemon/status", params={"detail": "full"})).json()
            assert status["runtime"]["permissions"]["pending"] == 0


async def test_designated_policy_lets_only_the_originator_answer(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: designated\n") as d:
        async with http(d) as client:
            room = await Room.open(client, 2)
            alice, bob = room.ids

            async def on_request(req: dict[str, Any]) -> None:
                rid = req["requestId"]
                r = await answer(room, rid, {"action": "decline"}, bob)
                assert r.status_code == 403, r.text
                assert r.json()["code"] == "elicitation_forbidden"
                assert r.json()["reason"] == "designated_mismatch"
                ok = await answer(
                    room, rid, {"action": "accept", "content": {"strategy": "balanced"}}, alice
                )
                assert ok.status_code == 200, ok.text

            events = await elicit_turn(room, "[elicit form]", on_request, originator=alice)
            [forbidden] = of_type(events, "elicitation_forbidden")
            assert forbidden["clientId"] == bob
            [resolved] = of_type(events, "elicitation_resolved")
            assert resolved["voterClientId"] == alice
            assert 'elicitation: accept {"strategy": "balanced"}' in said(events)


async def test_consensus_counts_only_equal_contents_together(tmp_path: Path) -> None:
    with daemon_with(tmp_path, "policy:\n  permissionStrategy: consensus\n") as d:
        async with http(d) as client:
            room = await Room.open(client, 3)
            alice, bob, carol = room.ids

            async def on_request(req: dict[str, Any]) -> None:
                rid = req["requestId"]

                def pick(s: str) -> dict[str, Any]:
                    return {"action": "accept", "content": {"strategy": s}}

                assert (await answer(room, rid, pick("balanced"), alice)).status_code == 200
                # another content is another answer: no quorum (2 of 3) yet
                assert (await answer(room, rid, pick("aggressive"), bob)).status_code == 200
                assert (await answer(room, rid, pick("balanced"), carol)).status_code == 200

            events = await elicit_turn(room, "[elicit form]", on_request, originator=alice)
            partial = of_type(events, "elicitation_partial_vote")
            assert len(partial) == 2 and partial[-1]["votesReceived"] == 2
            [resolved] = of_type(events, "elicitation_resolved")
            assert resolved["action"] == "accept"
            assert resolved["content"] == {"strategy": "balanced"}
            assert 'elicitation: accept {"strategy": "balanced"}' in said(events)


async def test_agent_requests_are_validated_and_the_capability_is_advertised(
    tmp_path: Path,
) -> None:
    """A puppet agent: the daemon's ``initialize`` offers both modes; malformed requests get
    ``-32602``; a request-scoped one (no session to ask) is answered ``cancel``."""

    def ask(rid: str, params: dict[str, Any]) -> str:
        return json.dumps(
            {"jsonrpc": "2.0", "id": rid, "method": "elicitation/create", "params": params}
        )

    sid = "puppet-session-1"
    schema = {"type": "object", "properties": {}}
    asks = {
        "mode": ask("e1", {"sessionId": sid, "mode": "_custom", "message": "m"}),
        "type": ask(
            "e2",
            {
                "sessionId": sid,
                "mode": "form",
                "message": "m",
                "requestedSchema": {"type": "object", "properties": {"a": {"type": "date"}}},
            },
        ),
        "url": ask(
            "e3",
            {
                "sessionId": sid,
                "mode": "url",
                "message": "m",
                "url": "javascript:alert(1)",
                "elicitationId": "x",
            },
        ),
        "no-message": ask("e4", {"sessionId": sid, "mode": "form", "requestedSchema": schema}),
        "scoped": ask(
            "e5", {"requestId": 5, "mode": "form", "message": "m", "requestedSchema": schema}
        ),
    }
    config = tmp_path / "puppet.json"
    config.write_text(
        json.dumps(
            {
                "respond": {
                    "initialize": {"protocolVersion": 1, "agentCapabilities": {}},
                    "session/new": {"sessionId": sid},
                    "session/prompt": {"stopReason": "end_turn"},
                },
                "after": {"session/prompt": list(asks.values())},
            }
        )
    )
    log_path = tmp_path / "puppet.log"
    agent = shlex.join(
        [
            sys.executable,
            str(ROOT / "tests" / "acp" / "puppet_agent.py"),
            str(config),
            str(log_path),
        ]
    )
    daemon = spawn_daemon(
        ["--agent", agent, "--warm-agents", "0"],
        workspace=tmp_path,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            r = await client.post("/session", json={"sessionScope": "thread"})
            assert r.status_code == 200, r.text
            r = await client.post(
                f"/session/{r.json()['sessionId']}/prompt",
                json={"prompt": [{"type": "text", "text": "hi"}]},
            )
            assert r.status_code == 200, r.text
            replies: dict[str, Any] = {}
            with trio.fail_after(30):
                while len(replies) < len(asks):
                    await trio.sleep(0.05)
                    lines = [json.loads(x) for x in log_path.read_text().splitlines() if x]
                    replies = {m["id"]: m for m in lines if str(m.get("id", "")).startswith("e")}
                    init = next(m for m in lines if m.get("method") == "initialize")
        caps = init["params"]["clientCapabilities"]
        assert caps["elicitation"] == {"form": {}, "url": {}}
        for rid in ("e1", "e2", "e3", "e4"):
            assert replies[rid]["error"]["code"] == -32602, replies[rid]
        assert "mode" in replies["e1"]["error"]["message"]
        assert "type" in replies["e2"]["error"]["message"]
        assert "url" in replies["e3"]["error"]["message"]
        assert "message" in replies["e4"]["error"]["message"]
        assert replies["e5"]["result"] == {"action": "cancel"}
    finally:
        daemon.stop()
