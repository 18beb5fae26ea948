"""Elicitation at /acp: the child agent's ``elicitation/create`` reaches ACP clients that
advertised the mode as ``elicitation/create`` (their reply is a vote), others as
``_qwen/notify``; url completions as ``elicitation/complete`` (real daemon, scripted agent,
real sockets)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.acpfront.helpers import AcpHttp, Frame, Ws
from tests.conftest import AUTH
from tests.support.daemon import DaemonProcess

FORM_AND_URL = {
    "protocolVersion": 1,
    "clientCapabilities": {"elicitation": {"form": {}, "url": {}}},
}


def _ws(daemon_proc: DaemonProcess) -> str:
    return str(daemon_proc.workspace.resolve())


def _said(frames: list[Frame]) -> list[str]:
    return [
        f.message["params"]["update"]["content"]["text"]
        for f in frames
        if f.method == "session/update"
        and f.message["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


async def _prompt(acp: AcpHttp, sid: str, text: str) -> int:
    return await acp.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
    )


async def _reply(acp: AcpHttp, sid: str, rid: Any, result: Any) -> None:
    r = await acp.post({"jsonrpc": "2.0", "id": rid, "result": result}, sid)
    assert r.status_code == 202, r.text


async def test_form_elicitation_is_forwarded_and_the_reply_reaches_the_agent(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize(FORM_AND_URL)
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await _prompt(acp, sid, "[elicit form]")
            ask = (await sess.until(lambda f: f.method == "elicitation/create"))[-1]
            assert isinstance(ask.message["id"], str)
            params = ask.message["params"]
            assert params["sessionId"] == sid and params["mode"] == "form"
            assert params["requestedSchema"]["required"] == ["strategy"]
            request_id = params["_meta"]["qwen"]["requestId"]
            await _reply(
                acp,
                sid,
                ask.message["id"],
                {"action": "accept", "content": {"strategy": "aggressive"}},
            )
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    [resolved] = [f for f in frames if f.kind == "elicitation_resolved"]
    data = resolved.message["params"]["data"]
    assert data["requestId"] == request_id and data["action"] == "accept"
    assert 'elicitation: accept {"strategy": "aggressive"}' in _said(frames)
    assert frames[-1].message["result"]["stopReason"] == "end_turn"


async def test_a_reply_that_fails_the_check_counts_as_cancel(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize(FORM_AND_URL)
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await _prompt(acp, sid, "[elicit form]")
            ask = (await sess.until(lambda f: f.method == "elicitation/create"))[-1]
            await _reply(
                acp, sid, ask.message["id"], {"action": "accept", "content": {"strategy": 7}}
            )
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    [resolved] = [f for f in frames if f.kind == "elicitation_resolved"]
    assert resolved.message["params"]["data"]["action"] == "cancel"
    assert "elicitation: cancel" in _said(frames)


async def test_url_elicitation_and_its_completion(acp: AcpHttp, daemon_proc: DaemonProcess) -> None:
    await acp.initialize(FORM_AND_URL)
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await _prompt(acp, sid, "[elicit url https://example.test/x]")
            ask = (await sess.until(lambda f: f.method == "elicitation/create"))[-1]
            params = ask.message["params"]
            assert params["mode"] == "url" and params["url"] == "https://example.test/x"
            await _reply(acp, sid, ask.message["id"], {"action": "accept"})
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    [complete] = [f for f in frames if f.method == "elicitation/complete"]
    assert complete.message["params"] == {"elicitationId": params["elicitationId"]}
    assert "elicitation: accept" in _said(frames)


async def test_a_client_without_the_mode_gets_a_notification_and_answers_over_rest(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    # form only: a url elicitation is not sent to it as a request (ACP forbids asking a mode
    # the client did not advertise), it sees the event and may answer over REST.
    await acp.initialize(
        {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"form": {}}}}
    )
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await _prompt(acp, sid, "[elicit url]")
            seen = await sess.until(lambda f: f.kind == "elicitation_request")
            assert not any(f.method == "elicitation/create" for f in seen)
            data = seen[-1].message["params"]["data"]
            r = await client.post(
                f"/session/{sid}/elicitation/{data['requestId']}", json={"action": "decline"}
            )
            assert r.status_code == 200, r.text
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    assert not any(f.method in ("elicitation/create", "elicitation/complete") for f in frames)
    assert "elicitation: decline" in _said(frames)


async def test_elicitation_over_one_websocket(daemon_proc: DaemonProcess) -> None:
    ws = await Ws.connect(daemon_proc.port, headers=AUTH)
    await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": FORM_AND_URL})
    assert (await ws.recv())["result"]["protocolVersion"] == 1
    await ws.send(
        {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": _ws(daemon_proc)}}
    )
    sid = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]["sessionId"]
    await ws.send(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "[elicit form]"}]},
        }
    )
    ask = (await ws.until(lambda m: m.get("method") == "elicitation/create"))[-1]
    assert ask["params"]["sessionId"] == sid
    await ws.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "decline"}})
    rest = await ws.until(lambda m: m.get("id") == 3)
    assert rest[-1]["result"]["stopReason"] == "end_turn"
    texts = [
        m["params"]["update"]["content"]["text"]
        for m in rest
        if m.get("method") == "session/update"
        and m["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]
    assert "elicitation: decline" in texts
    await ws.abort()
