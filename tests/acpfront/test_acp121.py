"""ACP schema 1.21 at /acp and towards the child (issue 27 item 4), against a real daemon whose
child is the scripted agent with ``--auth-methods`` (one agent method, one terminal method)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import trio

from tests.acpfront.helpers import AcpHttp, Frame, Stream
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    agent = shlex.join([sys.executable, "-m", "acp.agents.scripted", "--auth-methods"])
    d = spawn_daemon(["--agent", agent, "--access-log"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as c:
        yield c


async def _call(acp: AcpHttp, stream: Stream, method: str, params: dict[str, Any]) -> Frame:
    rid = await acp.request(method, params)
    return await stream.reply(rid)


def _option(options: list[dict[str, Any]], config_id: str) -> dict[str, Any]:
    return next(o for o in options if o["id"] == config_id)


async def test_v2_initialize_is_answered_with_version_1_and_terminal_auth_is_hidden(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    cwd = str(daemon.workspace.resolve())
    async with trio.open_nursery() as nursery:
        first = AcpHttp(client, nursery)
        await first.initialize({"protocolVersion": 1})
        async with first.stream() as conn:
            await first.new_session(cwd, conn)  # an agent of the workspace now runs
            acp = AcpHttp(client, nursery)
            init = (await acp.initialize({"protocolVersion": 2}))["result"]
            assert init["protocolVersion"] == 1
            methods = init["authMethods"]
            # The agent advertised both; the terminal one would run the agent's binary on
            # the remote client's machine.
            assert [m["id"] for m in methods] == ["scripted-key"]
            assert all(m.get("type") != "terminal" for m in methods)
            assert init["agentCapabilities"]["sessionCapabilities"]["delete"] == {}
            async with acp.stream() as own:
                ok = await _call(acp, own, "authenticate", {"methodId": "scripted-key"})
                assert ok.message["result"] == {}
                refused = await _call(acp, own, "authenticate", {"methodId": "scripted-login"})
                assert refused.message["error"]["code"] == -32602
                assert refused.message["error"]["data"]["code"] == "invalid_auth_method"
                out = await _call(acp, own, "logout", {})
                assert out.message["result"] == {}
            await client.delete("/acp", headers=acp.headers())
        await client.delete("/acp", headers=first.headers())
        nursery.cancel_scope.cancel()


async def test_set_config_option_sets_select_and_boolean_options(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    cwd = str(daemon.workspace.resolve())
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            made = await acp.new_session(cwd, conn)
            sid = made["sessionId"]
            # The daemon told its child it understands boolean options: it offers one.
            assert _option(made["configOptions"], "thinking")["type"] == "boolean"
            async with acp.stream(sid) as events:
                rid = await acp.request(
                    "session/set_config_option",
                    {"sessionId": sid, "configId": "effort", "value": "high"},
                )
                frames = await events.until(lambda f: f.message.get("id") == rid)
                reply = frames[-1].message
                assert _option(reply["result"]["configOptions"], "effort")["currentValue"] == (
                    "high"
                )
                # Every client of the session saw the change, before the reply.
                updates = [
                    f.message["params"]["update"]
                    for f in frames
                    if f.method == "session/update"
                    and f.message["params"]["update"]["sessionUpdate"] == "config_option_update"
                ]
                assert _option(updates[-1]["configOptions"], "effort")["currentValue"] == "high"

                rid = await acp.request(
                    "session/set_config_option",
                    {"sessionId": sid, "configId": "thinking", "type": "boolean", "value": True},
                )
                reply = (await events.reply(rid)).message
                assert _option(reply["result"]["configOptions"], "thinking")["currentValue"] is True

                for params, code in (
                    ({"configId": "effort", "value": "extreme"}, "invalid_config_option"),
                    ({"configId": "nope", "value": "x"}, "invalid_config_option"),
                    ({"configId": "thinking", "value": "true"}, "invalid_config_option"),
                ):
                    rid = await acp.request(
                        "session/set_config_option", {"sessionId": sid, **params}
                    )
                    error = (await events.reply(rid)).message["error"]
                    assert error["code"] == -32602, error
                    assert error["data"]["code"] == code
                # The refused values changed nothing.
                r = await client.get(f"/session/{sid}/context")
                options = r.json()["state"]["configOptions"]
                assert _option(options, "effort")["currentValue"] == "high"
                assert _option(options, "thinking")["currentValue"] is True
                # model still goes through its own path.
                rid = await acp.request(
                    "session/set_config_option",
                    {"sessionId": sid, "configId": "model", "value": "scripted-slow"},
                )
                reply = (await events.reply(rid)).message
                assert _option(reply["result"]["configOptions"], "model")["currentValue"] == (
                    "scripted-slow"
                )
        await client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()


async def test_session_delete_deletes_at_the_agent_and_closes(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    cwd = str(daemon.workspace.resolve())
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            sid = (await acp.new_session(cwd, conn))["sessionId"]
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
            ) as watcher:
                reply = await _call(acp, conn, "session/delete", {"sessionId": sid})
                assert reply.message["result"] == {}
                events = await collect_until(watcher, lambda e: e.get("type") == "session_closed")
                assert events[-1]["data"].get("reason") == "client_delete"
            # The agent deleted it: it cannot be loaded again.
            reply = await _call(
                acp, conn, "session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}
            )
            assert "error" in reply.message, reply
        await client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()


async def test_cancel_request_cancels_the_named_prompt(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    cwd = str(daemon.workspace.resolve())
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            sid = (await acp.new_session(cwd, conn))["sessionId"]
            async with acp.stream(sid) as events:
                rid = await acp.request(
                    "session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": "[sleep 60000]"}]},
                )
                await events.until(
                    lambda f: f.kind == "turn_started" or f.method == "session/update"
                )
                r = await acp.post(
                    {
                        "jsonrpc": "2.0",
                        "method": "$/cancel_request",
                        "params": {"requestId": rid},
                    }
                )
                assert r.status_code == 202
                frames = await events.until(lambda f: f.message.get("id") == rid)
                assert frames[-1].message["error"]["code"] == -32800
            # The turn was cancelled at the agent: the session takes the next prompt.
            r = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "after"}]},
            )
            assert r.status_code in (200, 202), r.text
        await client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()


async def test_usage_update_and_message_ids_reach_rest_and_acp_clients(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    cwd = str(daemon.workspace.resolve())
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            sid = (await acp.new_session(cwd, conn))["sessionId"]
            async with (
                acp.stream(sid) as events,
                client.stream(
                    "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
                ) as rest,
            ):
                rid = await acp.request(
                    "session/prompt",
                    {
                        "sessionId": sid,
                        "prompt": [{"type": "text", "text": "hello [usage 10 0.5]"}],
                        "_meta": {"traceparent": TRACEPARENT},
                    },
                )
                frames = await events.until(lambda f: f.message.get("id") == rid)
                updates = [
                    f.message["params"]["update"] for f in frames if f.method == "session/update"
                ]
                usage = [u for u in updates if u["sessionUpdate"] == "usage_update"]
                chunks = [u for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
                assert usage and usage[0]["size"] == 200_000
                assert usage[-1]["cost"] == {"amount": 0.5, "currency": "USD"}
                assert chunks and all(c["messageId"].startswith("msg_") for c in chunks)
                got = await collect_until(rest, lambda e: e.get("type") == "turn_complete")
                rest_updates = [
                    e["data"]["update"] for e in got if e.get("type") == "session_update"
                ]
                assert any(u["sessionUpdate"] == "usage_update" for u in rest_updates)
                assert {
                    u["messageId"]
                    for u in rest_updates
                    if u["sessionUpdate"] == "agent_message_chunk"
                } == {c["messageId"] for c in chunks}
        await client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()
    # The traced request's log lines carry its trace id.
    with trio.fail_after(10):
        while f"[trace {TRACE_ID}]" not in daemon.stderr():  # noqa: ASYNC110 (a file)
            await trio.sleep(0.05)


async def _say(acp: AcpHttp, sid: str, text: str) -> str:
    async with acp.stream(sid) as events:
        rid = await acp.request(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
        )
        frames = await events.until(lambda f: f.message.get("id") == rid)
    assert "result" in frames[-1].message, frames[-1]
    return "".join(
        f.message["params"]["update"]["content"]["text"]
        for f in frames
        if f.method == "session/update"
        and f.message["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    )


async def test_additional_directories_are_validated_and_widen_the_file_sandbox(
    daemon: DaemonProcess, client: httpx.AsyncClient, tmp_path: Any
) -> None:
    status = (await client.get("/daemon/status")).json()
    if not status["isolation"]["sandbox"]["active"]:
        pytest.skip("no Landlock file sandbox on this kernel")
    cwd = str(daemon.workspace.resolve())
    extra = tmp_path / "extra"
    extra.mkdir()
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            before = (await client.get("/daemon/status")).json()["runtime"]["sessions"]
            for dirs in (
                ["relative/dir"],
                [str(tmp_path / "missing")],
                [str(extra)] * 40,
                [str(daemon.state_dir)],
            ):
                reply = await _call(
                    acp,
                    conn,
                    "session/new",
                    {"cwd": cwd, "mcpServers": [], "additionalDirectories": dirs},
                )
                error = reply.message["error"]
                assert error["code"] == -32602, error
                assert error["data"]["code"] == "invalid_additional_directories"
            # Nothing was made for the refused calls.
            after = (await client.get("/daemon/status")).json()["runtime"]["sessions"]
            assert after["active"] <= before["active"]

            plain = (await acp.new_session(cwd, conn))["sessionId"]
            said = await _say(acp, plain, f"[touch {extra / 'plain.txt'}]")
            assert said == "touch failed: EACCES"
            assert not (extra / "plain.txt").exists()

            rid = await acp.request(
                "session/new", {"cwd": cwd, "mcpServers": [], "additionalDirectories": [str(extra)]}
            )
            reply = await conn.reply(rid)
            widened = reply.message["result"]["sessionId"]
            said = await _say(acp, widened, f"[touch {extra / 'widened.txt'}]")
            assert said == f"touched {extra / 'widened.txt'}"
            assert (extra / "widened.txt").exists()
        await client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()


async def test_workspace_reads_answer_their_rest_twins_bodies(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    cwd = str(daemon.workspace.resolve())
    async with trio.open_nursery() as nursery:
        acp = AcpHttp(client, nursery)
        await acp.initialize({"protocolVersion": 1})
        async with acp.stream() as conn:
            await acp.new_session(cwd, conn)  # the workspace's agent
            for name in ("env", "skills", "mcp", "providers", "preflight"):
                reply = await _call(acp, conn, f"_qwen/workspace/{name}", {})
                assert "result" in reply.message, (name, reply)
                got = reply.message["result"]
                r = await client.get(f"/workspace/{name}")
                assert r.status_code == 200, r.text
                want = r.json()
                assert got["initialized"] is True
                if name == "providers":
                    # REST lists the agent's terminal method too; /acp never does.
                    assert [m["id"] for m in want.pop("authMethods")] == [
                        "scripted-key",
                        "scripted-login",
                    ]
                    assert [m["id"] for m in got.pop("authMethods")] == ["scripted-key"]
                if name == "preflight":
                    assert [c["kind"] for c in got["cells"]] == [c["kind"] for c in want["cells"]]
                else:
                    assert got == want, name
            # The mutations stay out of scope (docs/reference/acp.md): method not found.
            reply = await _call(acp, conn, "_qwen/workspace/init", {})
            assert reply.message["error"]["code"] == -32601
        await client.delete("/acp", headers=acp.headers())
        nursery.cancel_scope.cancel()


def test_additional_directories_need_the_agents_capability(tmp_path: Any) -> None:
    """An agent that does not advertise sessionCapabilities.additionalDirectories (the
    scripted agent's --legacy mode, like older agents) is never sent them: 501."""
    agent = shlex.join([sys.executable, "-m", "acp.agents.scripted", "--legacy"])
    d = spawn_daemon(["--agent", agent, "--warm-agents", "0"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:

        async def main() -> None:
            cwd = str(d.workspace.resolve())
            async with (
                httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client,
                trio.open_nursery() as nursery,
            ):
                acp = AcpHttp(client, nursery)
                await acp.initialize({"protocolVersion": 1})
                async with acp.stream() as conn:
                    reply = await _call(
                        acp,
                        conn,
                        "session/new",
                        {"cwd": cwd, "mcpServers": [], "additionalDirectories": [str(tmp_path)]},
                    )
                    error = reply.message["error"]
                    assert error["data"]["httpStatus"] == 501, error
                    assert error["data"]["code"] == "not_supported_by_agent"
                    # Without them the same agent makes sessions.
                    await acp.new_session(cwd, conn)
                await client.delete("/acp", headers=acp.headers())
                nursery.cancel_scope.cancel()

        trio.run(main)
    finally:
        d.stop()


async def test_a_rest_requests_traceparent_header_reaches_its_log_lines(
    daemon: DaemonProcess, client: httpx.AsyncClient
) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    r = await client.get(
        "/daemon/status", headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}
    )
    assert r.status_code == 200
    # The access-log line of that request carries its trace id; an invalid header is ignored.
    r = await client.get(
        "/health", headers={"traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"}
    )
    assert r.status_code == 200
    with trio.fail_after(10):
        while f"[trace {trace_id}]" not in daemon.stderr():  # noqa: ASYNC110 (a file)
            await trio.sleep(0.05)
    lines = [line for line in daemon.stderr().splitlines() if f"[trace {trace_id}]" in line]
    assert any("/daemon/status" in line for line in lines), lines
    assert "[trace 00000000" not in daemon.stderr()
