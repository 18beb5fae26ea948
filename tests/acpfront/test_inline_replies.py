"""The published qwen SDK's connection gets each reply as its POST's answer (real daemon,
scripted agent, real sockets).

Its ``AcpHttpTransport`` waits for a stream reply only once the POST's 202 has arrived and
drops a reply it does not know yet; a process that reads both in one wake-up handles the
stream first, so under load its ``closeSession`` failed with ``TimeoutError`` after 30 s.
It also reads a 200 ``application/json`` answer as the reply, which cannot race
(``serve/acpfront/routing.py``). Other clients keep the 202 and the stream.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.acpfront.helpers import AcpHttp
from tests.support.daemon import DaemonProcess

SDK_INFO = {"clientInfo": {"name": "qwen-code-sdk", "version": "1.0.0"}}


def _call(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


async def _answer(acp: AcpHttp, rid: int, method: str, params: dict[str, Any]) -> Any:
    response = await acp.post(_call(rid, method, params))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == rid
    return body


async def test_the_document_describes_the_replies_in_the_post(
    acp: AcpHttp, client: httpx.AsyncClient
) -> None:
    """``POST /acp``'s documented 200 admits an inline result and an inline error reply,
    neither of which carries ``Acp-Connection-Id`` (only ``initialize``'s does)."""
    jsonschema = pytest.importorskip("jsonschema")
    doc = (await client.get("/openapi.json")).json()
    documented = doc["paths"]["/acp"]["post"]["responses"]["200"]
    schema = documented["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
    assert documented["headers"]["Acp-Connection-Id"]["required"] is False
    await acp.initialize(SDK_INFO)
    for rid, method in ((2, "_qwen/health"), (3, "no/such_method")):
        response = await acp.post(_call(rid, method, {}))
        assert response.status_code == 200, response.text
        assert "Acp-Connection-Id" not in response.headers
        errors = [e.message for e in validator.iter_errors(response.json())]
        assert errors == [], f"{method}: {errors}"


async def test_the_qwen_sdk_gets_every_reply_in_its_post(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize(SDK_INFO)
    # No stream is open on this connection: each reply can only be the POST's answer.
    health = await _answer(acp, 2, "_qwen/health", {})
    assert health["result"] == {"status": "ok"}
    created = await _answer(acp, 3, "session/new", {"cwd": str(daemon_proc.workspace)})
    sid = created["result"]["sessionId"]
    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "inline"}]}
    turn = await _answer(acp, 4, "session/prompt", prompt)
    assert turn["result"]["stopReason"] == "end_turn"
    beat = await _answer(acp, 5, "_qwen/session/heartbeat", {"sessionId": sid})
    assert beat["result"]["sessionId"] == sid
    unknown = await _answer(acp, 6, "no/such_method", {})
    assert unknown["error"]["code"] == -32601
    # The SDK's closeSession accepts only 204 or 404: the reply says 404 "closed".
    closed = await _answer(acp, 7, "session/close", {"sessionId": sid})
    assert closed["error"]["data"] == {"httpStatus": 404, "sessionId": sid, "done": "close"}
    gone = await _answer(acp, 8, "_qwen/session/heartbeat", {"sessionId": sid})
    assert gone["error"]["data"]["httpStatus"] == 404
    # A notification has no reply: still 202.
    cancel = await acp.post(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
    )
    assert cancel.status_code == 202 and cancel.content == b""


async def test_other_clients_keep_the_202_and_the_stream(acp: AcpHttp) -> None:
    await acp.initialize({"clientInfo": {"name": "some-client", "version": "1"}})
    async with acp.stream() as conn:
        rid = await acp.request("_qwen/health", {})  # asserts 202 and an empty body
        reply = await conn.reply(rid)
        assert reply.message["result"] == {"status": "ok"}
