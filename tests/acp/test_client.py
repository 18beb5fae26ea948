"""AgentConnection routing and failure handling, against a puppet agent child."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from acp import AgentConnection, BaseClientHandler, ChannelClosed, ProtocolError
from acp.errors import INVALID_PARAMS, METHOD_NOT_FOUND, REQUEST_CANCELLED
from acp.schema import PermissionOutcome, RequestPermissionParams
from tests.acp.util import eventually, pending_calls

PUPPET = str(Path(__file__).with_name("puppet_agent.py"))
INIT = {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}}


def line(obj: object) -> str:
    return json.dumps(obj)


def request(rid: object, method: str, params: object) -> str:
    return line({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


def notification(method: str, params: object) -> str:
    return line({"jsonrpc": "2.0", "method": method, "params": params})


class Handler(BaseClientHandler):
    def __init__(self) -> None:
        super().__init__()
        self.updates: list[tuple[str, str, bytes]] = []
        self.notifications: list[tuple[str, bytes]] = []
        self.permission_started = trio.Event()
        self.permission_cancelled = False

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        self.updates.append((session_id, kind, bytes(update)))

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        self.notifications.append((method, bytes(params)))

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        self.permission_started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.permission_cancelled = True
            raise
        raise AssertionError("unreachable")


class Puppet:
    def __init__(self, tmp_path: Path, config: dict[str, Any]) -> None:
        self.config_path = tmp_path / "puppet.json"
        self.log_path = tmp_path / "puppet.log"
        config.setdefault("respond", {}).setdefault("initialize", INIT)
        self.config_path.write_text(json.dumps(config))
        self.log_path.write_text("")

    def argv(self) -> list[str]:
        return [sys.executable, PUPPET, str(self.config_path), str(self.log_path)]

    def received(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.log_path.read_text().splitlines() if x.strip()]

    def reply_to(self, rid: object) -> dict[str, Any] | None:
        return next((m for m in self.received() if m.get("id") == rid and "method" not in m), None)


async def spawn(
    nursery: trio.Nursery, tmp_path: Path, config: dict[str, Any], **kw: Any
) -> tuple[AgentConnection, Handler, Puppet]:
    puppet = Puppet(tmp_path, config)
    handler = Handler()
    conn = await AgentConnection.spawn(
        nursery, puppet.argv(), cwd=str(tmp_path), handler=handler, **kw
    )
    return conn, handler, puppet


async def test_unknown_and_vendor_requests_get_method_not_found(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    conn, handler, puppet = await spawn(
        nursery,
        tmp_path,
        {
            "after": {
                "initialize": [
                    request(100, "craft/drainMidTurnQueue", {"sessionId": "s"}),
                    request("e1", "elicitation/create", {"message": "?"}),
                    notification("qwen/notify/session/mode-update", {"modeId": "default"}),
                    request(101, "fs/read_text_file", {"sessionId": "s", "path": "relative.txt"}),
                    request(102, "fs/write_text_file", {"sessionId": "s"}),
                ]
            }
        },
    )
    await conn.initialize()
    await eventually(lambda: all(puppet.reply_to(r) for r in (100, "e1", 101, 102)))
    for rid in (100, "e1"):
        reply = puppet.reply_to(rid)
        assert reply is not None and reply["error"]["code"] == METHOD_NOT_FOUND
    for rid in (101, 102):  # relative path; missing field
        reply = puppet.reply_to(rid)
        assert reply is not None and reply["error"]["code"] == INVALID_PARAMS
    assert handler.notifications == [("qwen/notify/session/mode-update", b'{"modeId": "default"}')]
    await conn.aclose()


async def test_updates_are_forwarded_byte_for_byte(nursery: trio.Nursery, tmp_path: Path) -> None:
    weird = '{"sessionUpdate": "future_kind", "x": [1, {"y": null}], "_meta": {"v": 1}}'
    chunk = (
        '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"},'
        '"unknownField":true}'
    )
    conn, handler, _ = await spawn(
        nursery,
        tmp_path,
        {
            "after": {
                "initialize": [
                    f'{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s1","update":{weird}}}}}',
                    f'{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s2","update":{chunk}}}}}',
                    notification("session/update", {"noSessionId": True}),
                ]
            }
        },
    )
    await conn.initialize()
    await eventually(lambda: len(handler.updates) == 2)
    assert handler.updates == [
        ("s1", "future_kind", weird.encode()),
        ("s2", "agent_message_chunk", chunk.encode()),
    ]
    await conn.aclose()


async def test_cancel_request_from_agent_cancels_the_permission_handler(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    perm = {
        "sessionId": "s",
        "toolCall": {"toolCallId": "c1", "title": "rm -rf /"},
        "options": [{"optionId": "a", "name": "Allow", "kind": "allow_once"}],
    }
    conn, handler, puppet = await spawn(
        nursery,
        tmp_path,
        {
            "respond": {"_test/cancel": {}},
            "after": {
                "initialize": [request(7, "session/request_permission", perm)],
                "_test/cancel": [notification("$/cancel_request", {"requestId": 7})],
            },
        },
    )
    await conn.initialize()
    await handler.permission_started.wait()
    await conn.request("_test/cancel", {})
    await eventually(lambda: puppet.reply_to(7))
    reply = puppet.reply_to(7)
    assert reply is not None and reply["error"]["code"] == REQUEST_CANCELLED
    assert handler.permission_cancelled
    await conn.aclose()


async def test_oversized_and_garbage_lines_are_survived(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    conn, _, _ = await spawn(
        nursery,
        tmp_path,
        {"startup": ["garbage {", notification("big", {"x": "y" * 5000})]},
        max_line_bytes=1000,
    )
    info = await conn.initialize()
    assert info.protocol_version == 1
    stats = conn.statistics()
    assert stats is not None and stats.dropped_oversized == 1 and stats.dropped_invalid == 1
    await conn.aclose()


async def test_stdout_closed_while_alive_closes_promptly(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    conn, _, _ = await spawn(nursery, tmp_path, {"close_stdout_after": "initialize"})
    await conn.initialize()
    with pytest.raises(ChannelClosed) as exc_info:
        await conn.request("never/answered", {}, timeout_s=30)
    assert "closed its stdout" in str(exc_info.value)
    exit_info = await conn.wait_closed()  # the child is stopped and reaped
    assert exit_info.returncode is not None


async def test_pending_calls_fail_when_the_agent_dies(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    conn, _, _ = await spawn(nursery, tmp_path, {})
    await conn.initialize()
    failures: list[ChannelClosed] = []

    async def call() -> None:
        try:
            await conn.prompt("s", [{"type": "text", "text": "x"}])
        except ChannelClosed as exc:
            failures.append(exc)

    for _ in range(3):
        nursery.start_soon(call)
    await eventually(lambda: pending_calls(conn) == 3)  # all three sent, none answered
    conn.process.signal_group(9)
    await eventually(lambda: len(failures) == 3)
    assert all(f.exit is not None and f.exit.signal == 9 for f in failures)
    with pytest.raises(ChannelClosed):
        await conn.prompt("s", [])


async def test_protocol_version_mismatch(nursery: trio.Nursery, tmp_path: Path) -> None:
    conn, _, _ = await spawn(nursery, tmp_path, {"respond": {"initialize": {"protocolVersion": 2}}})
    with pytest.raises(ProtocolError, match="version 2"):
        await conn.initialize()
    await conn.aclose()


async def test_aclose_is_idempotent_and_works_from_a_cancelled_scope(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    conn, _, _ = await spawn(nursery, tmp_path, {})
    with trio.CancelScope() as scope:
        scope.cancel()
        first = await conn.aclose()
    second = await conn.aclose()
    assert first == second and first.exit_code == 0
    assert conn.closed


async def test_cancelling_the_owning_nursery_reaps_the_agent(tmp_path: Path) -> None:
    puppet = Puppet(tmp_path, {})
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            conn = await AgentConnection.spawn(nursery, puppet.argv(), cwd=str(tmp_path))
            await conn.initialize()
            scope.cancel()
    assert conn.closed and conn.process.exited
    with pytest.raises(ChannelClosed):
        await conn.initialize()


async def test_spawn_of_a_missing_command_raises(nursery: trio.Nursery, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await AgentConnection.spawn(nursery, ["/no/such/agent", "--acp"], cwd=str(tmp_path))


async def test_prompt_extra_passes_only_meta_and_never_replaces_the_session(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    conn, _, puppet = await spawn(
        nursery, tmp_path, {"respond": {"session/prompt": {"stopReason": "end_turn"}}}
    )
    await conn.initialize()
    blocks = [{"type": "text", "text": "hi"}]
    for bad in ({"sessionId": "other"}, {"prompt": []}, {"_meta": {}, "tools": 1}):
        with pytest.raises(ValueError, match="not allowed"):
            await conn.prompt("s1", blocks, extra=bad)
    result = await conn.prompt("s1", blocks, extra={"_meta": {"k": 1}})
    assert result.stop_reason == "end_turn"
    sent = [m for m in puppet.received() if m.get("method") == "session/prompt"]
    assert [m["params"] for m in sent] == [{"_meta": {"k": 1}, "sessionId": "s1", "prompt": blocks}]
    await conn.aclose()
