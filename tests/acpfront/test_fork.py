"""ACP ``session/fork`` at ``/acp`` (issue 27 item 1): the same use case as ``POST
/session/:id/branch``, over Streamable HTTP, real daemons and real agents.

The default scripted agent advertises ``sessionCapabilities.fork``; ``--legacy`` does not
(the precise error); the claude flavor with ``--fork`` starts a fork in its default mode and
model (as claude-agent-acp), so the daemon's inheritance shows at ``/acp`` too.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.acpfront.helpers import AcpHttp, Frame
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon

ROOT = Path(__file__).resolve().parents[2]
FLAVOR = str(ROOT / "tests" / "support" / "flavor_agent.py")


def _spawn(agent: list[str] | None, tmp: Path | None = None) -> DaemonProcess:
    args = ["--agent", shlex.join(agent)] if agent else []
    ws = None
    if tmp is not None:
        ws = tmp / "ws"
        (ws / ".agent-sessions").mkdir(parents=True)
    return spawn_daemon(args, workspace=ws, env={"QWEN_SERVER_TOKEN": TOKEN})


@pytest.fixture
def scripted() -> Iterator[DaemonProcess]:
    d = _spawn(None)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def legacy() -> Iterator[DaemonProcess]:
    d = _spawn([sys.executable, "-m", "acp.agents.scripted", "--legacy"])
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def flavor(tmp_path: Path) -> Iterator[DaemonProcess]:
    store = tmp_path / "ws" / ".agent-sessions"
    d = _spawn([sys.executable, FLAVOR, "claude", f"--fork={store}"], tmp_path)
    try:
        yield d
    finally:
        d.stop()


@asynccontextmanager
async def _acp(d: DaemonProcess) -> AsyncIterator[tuple[AcpHttp, httpx.AsyncClient]]:
    async with (
        httpx.AsyncClient(base_url=d.url, timeout=30, headers=AUTH) as client,
        trio.open_nursery() as nursery,
    ):
        conn = AcpHttp(client, nursery)
        try:
            yield conn, client
        finally:
            if conn.connection_id:
                await client.delete("/acp", headers=conn.headers())
            nursery.cancel_scope.cancel()


def _ws(d: DaemonProcess) -> str:
    return str(d.workspace.resolve())


def _text(frames: list[Frame]) -> str:
    return "".join(
        (f.message["params"]["update"].get("content") or {}).get("text", "")
        for f in frames
        if f.method == "session/update"
        and f.message["params"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )


async def _prompt(acp: AcpHttp, sess: Any, sid: str, words: str) -> list[Frame]:
    rid = await acp.request(
        "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": words}]}
    )
    frames = await sess.until(lambda f: f.message.get("id") == rid and f.method is None)
    assert frames[-1].message["result"]["stopReason"] == "end_turn", frames[-1]
    return frames


async def test_session_fork_makes_a_daemon_session_whose_stream_names_its_parent(
    scripted: DaemonProcess,
) -> None:
    async with _acp(scripted) as (acp, client):
        init = await acp.initialize({"protocolVersion": 1})
        assert "fork" in init["result"]["agentCapabilities"]["sessionCapabilities"]
        async with acp.stream() as conn:
            pid = (await acp.new_session(_ws(scripted), conn))["sessionId"]
            async with acp.stream(pid) as sess:
                await _prompt(acp, sess, pid, "remember the parent")
            rid = await acp.request(
                "session/fork", {"sessionId": pid, "cwd": _ws(scripted), "mcpServers": []}
            )
            reply = await conn.reply(rid)
            result = reply.message["result"]
            fid = result["sessionId"]
            assert fid != pid
            assert result["parentSessionId"] == pid
            assert result["workspaceCwd"] == _ws(scripted)
            assert result["modes"]["currentModeId"] and result["models"]["currentModelId"]
            async with acp.stream(fid) as sess:
                first = await sess.next()
                assert first is not None and first.kind == "session_forked", first
                assert first.message["params"]["data"] == {
                    "sessionId": fid,
                    "parentSessionId": pid,
                }
                # Its own turns; it knows the parent's conversation (the scripted agent
                # copies the parent's history into the fork).
                await _prompt(acp, sess, fid, "in the fork")
                # A daemon session like any: REST sees it, with its own budget.
                budget = (await client.get(f"/session/{fid}/budget")).json()
                assert budget["sessionId"] == fid
                context = (await client.get(f"/session/{fid}/context")).json()
                assert context["agent"]["fork"] == {"supported": True, "via": "session/fork"}
                # Closing the fork (its reply rides its stream) leaves the parent.
                close = await acp.request("session/close", {"sessionId": fid})
                assert "result" in (await sess.reply(close)).message
            assert (await client.get(f"/session/{fid}/budget")).status_code == 404
            assert (await client.get(f"/session/{pid}/budget")).status_code == 200


async def test_session_fork_errors_are_precise(
    scripted: DaemonProcess, legacy: DaemonProcess
) -> None:
    async with _acp(scripted) as (acp, client):
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            rid = await acp.request(
                "session/fork", {"sessionId": "sess_nope", "cwd": _ws(scripted)}
            )
            error = (await conn.reply(rid)).message["error"]
            assert error["code"] == -32002
            assert error["data"]["code"] == "session_not_found"
            rid = await acp.request("session/fork", {"cwd": _ws(scripted)})
            assert (await conn.reply(rid)).message["error"]["code"] == -32602
            pid = (await acp.new_session(_ws(scripted), conn))["sessionId"]
            rid = await acp.request("session/fork", {"sessionId": pid, "cwd": "/nowhere"})
            error = (await conn.reply(rid)).message["error"]
            assert error["code"] == -32602 and error["data"]["code"] == "workspace_mismatch"
    async with _acp(legacy) as (acp, client):
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            pid = (await acp.new_session(_ws(legacy), conn))["sessionId"]
            rid = await acp.request("session/fork", {"sessionId": pid, "cwd": _ws(legacy)})
            error = (await conn.reply(rid)).message["error"]
            assert error["code"] == -32601, error
            assert error["data"]["httpStatus"] == 501
            assert error["data"]["code"] == "not_supported_by_agent"
            assert "sessionCapabilities.fork" in error["message"]
        # Once the daemon knows its agent cannot fork, /acp no longer offers it.
        again = AcpHttp(client, acp.nursery)
        init = await again.initialize({"protocolVersion": 1})
        assert "fork" not in init["result"]["agentCapabilities"]["sessionCapabilities"]
        await client.delete("/acp", headers=again.headers())


async def test_session_fork_inherits_model_and_mode_at_acp(flavor: DaemonProcess) -> None:
    async with _acp(flavor) as (acp, _client):
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            pid = (await acp.new_session(_ws(flavor), conn))["sessionId"]
            async with acp.stream(pid) as sess:
                rid = await acp.request("session/set_mode", {"sessionId": pid, "modeId": "plan"})
                await sess.reply(rid)
                rid = await acp.request(
                    "session/set_config_option",
                    {"sessionId": pid, "configId": "model", "value": "claude-haiku"},
                )
                await sess.reply(rid)
            rid = await acp.request("session/fork", {"sessionId": pid, "cwd": _ws(flavor)})
            result = (await conn.reply(rid)).message["result"]
            fid = result["sessionId"]
            assert result["inherited"] == {"model": "claude-haiku", "mode": "plan"}
            # The reply shows the fork as it now is, not as the agent made it.
            assert result["modes"]["currentModeId"] == "plan"
            model = next(o for o in result["configOptions"] if o["id"] == "model")
            assert model["currentValue"] == "claude-haiku"
            async with acp.stream(fid) as sess:
                agent = json.loads(_text(await _prompt(acp, sess, fid, "setup")))
            assert agent["via"] == "session/fork" and agent["parent"] == pid
            assert (agent["mode"], agent["model"]) == ("plan", "claude-haiku")
