"""Every scripted-agent directive end to end: AgentConnection <-> a real scripted agent child."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from acp import AgentConnection, BaseClientHandler, ChannelClosed, RemoteError, RequestTimeout
from acp.process import live_group_members
from acp.schema import (
    CancelledPermissionOutcome,
    PermissionOutcome,
    RequestPermissionParams,
    SelectedPermissionOutcome,
)
from tests.acp.util import eventually, pid_alive, scripted_argv


class Recorder(BaseClientHandler):
    """Records every update; answers permission requests with the option of ``choice`` kind."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[tuple[str, str, dict[str, Any]]] = []
        self.permissions: list[RequestPermissionParams] = []
        self.choice: str | None = "allow_once"

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        decoded = msgspec.json.decode(update)
        assert decoded["sessionUpdate"] == kind
        self.updates.append((session_id, kind, decoded))

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        self.permissions.append(params)
        option = params.option_of_kind(self.choice) if self.choice else None
        if option is None:
            return CancelledPermissionOutcome()
        return SelectedPermissionOutcome(option_id=option.option_id)

    def kinds(self) -> list[str]:
        return [k for _, k, _ in self.updates]

    def texts(self, kind: str = "agent_message_chunk") -> list[str]:
        return [u["content"]["text"] for _, k, u in self.updates if k == kind]


@dataclass
class Agent:
    conn: AgentConnection
    handler: Recorder
    session_id: str
    workspace: Path
    state_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)

    async def prompt(self, text: str, **kw: Any) -> str:
        self.handler.updates.clear()
        result = await self.conn.prompt(self.session_id, [{"type": "text", "text": text}], **kw)
        return result.stop_reason


async def start(
    nursery: trio.Nursery, tmp_path: Path, *flags: str, state_dir: Path | None = None
) -> tuple[AgentConnection, Recorder]:
    handler = Recorder()
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    conn = await AgentConnection.spawn(
        nursery,
        scripted_argv(str(state_dir or tmp_path / "state"), *flags),
        cwd=str(workspace),
        handler=handler,
    )
    await conn.initialize()
    return conn, handler


@pytest.fixture
async def agent(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Agent]:
    conn, handler = await start(nursery, tmp_path)
    setup = await conn.new_session(str(tmp_path / "ws"))
    await eventually(lambda: "available_commands_update" in handler.kinds())
    yield Agent(conn, handler, setup.session_id, tmp_path / "ws", tmp_path / "state")
    await conn.aclose()


# -- handshake and session setup ------------------------------------------------------------


async def test_initialize_and_new_session(nursery: trio.Nursery, tmp_path: Path) -> None:
    conn, handler = await start(nursery, tmp_path)
    info = conn.info
    assert info is not None and info.agent_info is not None
    assert info.agent_info.name == "acp-scripted"
    assert info.load_session and info.supports_resume and info.supports_list
    assert info.supports_close
    setup = await conn.new_session(str(tmp_path / "ws"))
    assert setup.session_id.startswith("sess_")
    assert setup.modes is not None and setup.modes.current_mode_id == "default"
    assert [m.id for m in setup.modes.available_modes] == ["default", "auto-edit", "plan", "yolo"]
    assert setup.models is not None and setup.models.current_model_id == "scripted-fast"
    option = setup.model_option()
    assert option is not None and option.select_values() == ["scripted-fast", "scripted-slow"]
    assert msgspec.json.decode(setup.raw)["sessionId"] == setup.session_id
    await eventually(lambda: handler.kinds() == ["available_commands_update"])
    commands = handler.updates[0][2]["availableCommands"]
    assert handler.updates[0][0] == setup.session_id and len(commands) >= 2
    exit_info = await conn.aclose()
    assert exit_info.exit_code == 0 and exit_info.signal is None  # exited on stdin EOF


# -- directives ------------------------------------------------------------------------------


async def test_echo(agent: Agent) -> None:
    result = await agent.conn.prompt(agent.session_id, [{"type": "text", "text": "hello world"}])
    assert result.stop_reason == "end_turn"
    assert agent.handler.texts()[-1] == "echo: hello world"
    assert "scripted" in msgspec.json.decode(result.meta)


async def test_text_and_directives_run_in_order(agent: Agent) -> None:
    assert await agent.prompt("one [think hmm] two [plan a | b|c] three") == "end_turn"
    h = agent.handler
    assert h.kinds() == [
        "agent_message_chunk",
        "agent_thought_chunk",
        "agent_message_chunk",
        "plan",
        "agent_message_chunk",
    ]
    assert h.texts() == ["echo: one", "echo: two", "echo: three"]
    assert h.texts("agent_thought_chunk") == ["hmm"]
    plan = h.updates[3][2]
    assert [e["content"] for e in plan["entries"]] == ["a", "b", "c"]
    assert {e["status"] for e in plan["entries"]} == {"pending"}


@pytest.mark.parametrize(
    ("choice", "written", "final_status"),
    [("allow_once", True, "completed"), ("reject_once", False, "failed")],
)
async def test_write_asks_permission(
    agent: Agent, choice: str, written: bool, final_status: str
) -> None:
    agent.handler.choice = choice
    assert await agent.prompt("[write notes/a.txt hello there]") == "end_turn"
    target = agent.workspace / "notes" / "a.txt"
    assert target.exists() == written
    if written:
        assert target.read_text() == "hello there"
    (perm,) = agent.handler.permissions
    assert perm.session_id == agent.session_id
    assert perm.tool_call.kind == "edit"
    assert {(o.option_id, o.kind) for o in perm.options} == {
        ("allow", "allow_once"),
        ("allow_always", "allow_always"),
        ("reject", "reject_once"),
    }
    calls = [u for _, k, u in agent.handler.updates if k in ("tool_call", "tool_call_update")]
    assert calls[0]["sessionUpdate"] == "tool_call" and calls[0]["kind"] == "edit"
    assert calls[0]["locations"] == [{"path": str(target)}]
    assert calls[-1]["status"] == final_status
    assert {c["toolCallId"] for c in calls} == {calls[0]["toolCallId"]}


async def test_write_allow_always_stops_asking(agent: Agent) -> None:
    agent.handler.choice = "allow_always"
    await agent.prompt("[write a.txt 1] [write b.txt 2]")
    assert len(agent.handler.permissions) == 1
    assert (agent.workspace / "b.txt").read_text() == "2"


async def test_write_cancelled_permission_ends_the_turn(agent: Agent) -> None:
    agent.handler.choice = None  # what a client answers once it has cancelled the turn
    assert await agent.prompt("[write a.txt x] after") == "cancelled"
    assert not (agent.workspace / "a.txt").exists()
    assert "echo: after" not in agent.handler.texts()


@pytest.mark.parametrize("mode", ["yolo", "auto-edit"])
async def test_write_without_asking_in_permissive_modes(agent: Agent, mode: str) -> None:
    await agent.conn.set_mode(agent.session_id, mode)
    await agent.prompt("[write a.txt quiet]")
    assert agent.handler.permissions == []
    assert (agent.workspace / "a.txt").read_text() == "quiet"


async def test_read(agent: Agent) -> None:
    (agent.workspace / "in.txt").write_text("line one\nline two\n")
    assert await agent.prompt("[read in.txt]") == "end_turn"
    assert agent.handler.texts() == ["line one\nline two\n"]
    assert await agent.prompt("[read missing.txt]") == "end_turn"
    assert agent.handler.texts() == ["read failed: Resource not found"]


async def test_shell(agent: Agent) -> None:
    assert await agent.prompt("[shell echo out; echo err >&2; pwd]") == "end_turn"
    assert agent.handler.texts() == [f"out\nerr\n{agent.workspace}\n"]
    updates = [u for _, k, u in agent.handler.updates if k == "tool_call_update"]
    assert updates[0]["content"][0]["type"] == "terminal"
    assert updates[-1]["status"] == "completed"
    assert updates[-1]["rawOutput"] == {"exitCode": 0, "signal": None}
    assert agent.handler.terminals is not None and len(agent.handler.terminals) == 0  # released


async def test_cancel_during_shell_kills_the_terminal(agent: Agent, nursery: trio.Nursery) -> None:
    results: list[str] = []

    async def run() -> None:
        results.append(await agent.prompt("[shell sleep 1000]"))

    nursery.start_soon(run)
    terms = agent.handler.terminals
    assert terms is not None
    await eventually(lambda: len(terms) == 1)
    pid = next(iter(terms._terminals.values())).proc.pid
    await agent.conn.cancel(agent.session_id)
    await eventually(lambda: results)
    assert results == ["cancelled"]
    await eventually(lambda: not pid_alive(pid))
    await eventually(lambda: len(terms) == 0)


async def test_sleep_is_cancellable(agent: Agent, nursery: trio.Nursery) -> None:
    results: list[str] = []

    async def run() -> None:
        results.append(await agent.prompt("[think sleeping] [sleep 60000] never"))

    nursery.start_soon(run)
    # The thought comes right before the sleep: the cancel finds the agent asleep.
    await eventually(lambda: agent.handler.texts("agent_thought_chunk") == ["sleeping"])
    await agent.conn.cancel(agent.session_id)
    await eventually(lambda: results)
    assert results == ["cancelled"]
    assert "echo: never" not in agent.handler.texts()


async def test_short_sleep_completes(agent: Agent) -> None:
    assert await agent.prompt("[sleep 10] done") == "end_turn"
    assert agent.handler.texts() == ["echo: done"]


async def test_flood(agent: Agent) -> None:
    assert await agent.prompt("[flood 5000]") == "end_turn"
    texts = agent.handler.texts()
    assert len(texts) == 5000
    assert texts == [f"{i} " for i in range(5000)]


async def test_error(agent: Agent) -> None:
    with pytest.raises(RemoteError) as exc_info:
        await agent.prompt("before [error] after")
    err = exc_info.value
    assert err.code == -32603
    assert isinstance(err.data, dict) and err.data["directive"] == "error"
    assert agent.handler.texts() == ["echo: before"]
    assert await agent.prompt("still alive") == "end_turn"  # the agent survives


async def test_crash(agent: Agent, nursery: trio.Nursery) -> None:
    with pytest.raises(ChannelClosed) as exc_info:
        await agent.prompt("[crash]")
    exit_info = exc_info.value.exit
    assert exit_info is not None and exit_info.exit_code == 17
    assert "[crash]" in exit_info.stderr_tail
    assert (await agent.conn.wait_closed()).exit_code == 17
    assert agent.conn.closed
    with pytest.raises(ChannelClosed):
        await agent.conn.new_session(str(agent.workspace))
    with pytest.raises(ChannelClosed):
        await agent.conn.cancel(agent.session_id)


async def test_hang_then_stdin_eof_still_needs_a_signal(agent: Agent) -> None:
    with pytest.raises(RequestTimeout):
        await agent.prompt("[hang]", timeout_s=0.3)
    exit_info = await agent.conn.aclose(grace_s=0.2)
    assert exit_info.signal == signal.SIGTERM


async def test_hang(agent: Agent) -> None:
    with pytest.raises(RequestTimeout):
        await agent.prompt("[hang]", timeout_s=0.3)
    with pytest.raises(RequestTimeout) as exc_info:
        await agent.conn.list_sessions(timeout_s=0.3)
    assert exc_info.value.method == "session/list"
    assert not agent.conn.closed  # a timeout does not kill the connection
    exit_info = await agent.conn.aclose(grace_s=0.2)
    assert exit_info.signal == signal.SIGTERM  # it ignored stdin EOF
    assert live_group_members(agent.conn.process.pgid) == []


async def test_spawn_grandchild_is_killed_with_the_group(agent: Agent) -> None:
    await agent.prompt("[spawn-grandchild]")
    (text,) = agent.handler.texts()
    grandchild = int(text.split(":")[1])
    assert pid_alive(grandchild)
    assert os.getpgid(grandchild) == agent.conn.process.pgid
    await agent.conn.aclose()
    await eventually(lambda: not pid_alive(grandchild))
    assert live_group_members(agent.conn.process.pgid) == []


async def test_unknown_bracket_text_is_echoed(agent: Agent) -> None:
    await agent.prompt("[nonsense 1]")
    assert agent.handler.texts() == ["echo: [nonsense 1]"]


# -- models and modes ------------------------------------------------------------------------


async def test_set_model_via_config_option(agent: Agent) -> None:
    await agent.conn.set_model(agent.session_id, "scripted-slow")
    options = agent.conn.config_options(agent.session_id)
    assert options is not None and options[0].current_value == "scripted-slow"
    with pytest.raises(RemoteError) as exc_info:
        await agent.conn.set_model(agent.session_id, "no-such-model")
    assert exc_info.value.code == -32602
    # the slow model still answers, just later
    assert await agent.prompt("slow hello") == "end_turn"


async def test_set_mode_rejects_unknown_modes(agent: Agent) -> None:
    await agent.conn.set_mode(agent.session_id, "plan")
    with pytest.raises(RemoteError):
        await agent.conn.set_mode(agent.session_id, "warp-speed")


async def test_legacy_agent_fallbacks(nursery: trio.Nursery, tmp_path: Path) -> None:
    conn, _ = await start(nursery, tmp_path, "--legacy")
    setup = await conn.new_session(str(tmp_path / "ws"))
    assert setup.config_options is None and setup.models is not None
    await conn.set_model(setup.session_id, "scripted-slow")  # falls back to session/set_model
    resumed = await conn.resume_session(setup.session_id, str(tmp_path / "ws"))
    assert resumed.models is not None and resumed.models.current_model_id == "scripted-slow"
    assert conn._resume_method == "session/unstable_resumeSession"
    await conn.aclose()


# -- persistence -----------------------------------------------------------------------------


async def test_sessions_survive_an_agent_restart(nursery: trio.Nursery, tmp_path: Path) -> None:
    state = tmp_path / "state"
    ws = str(tmp_path / "ws")
    conn, _ = await start(nursery, tmp_path, state_dir=state)
    setup = await conn.new_session(ws)
    sid = setup.session_id
    await conn.set_mode(sid, "plan")
    await conn.prompt(sid, [{"type": "text", "text": "first [think deep]"}])
    await conn.prompt(sid, [{"type": "text", "text": "second"}])
    await conn.aclose()

    conn2, handler2 = await start(nursery, tmp_path, state_dir=state)
    listed = await conn2.list_sessions(cwd=ws)
    assert [s.session_id for s in listed.sessions] == [sid]
    assert listed.sessions[0].title == "first [think deep]"
    loaded = await conn2.load_session(sid, ws)
    # the replay arrived before load_session returned
    assert [(k, u["content"]["text"]) for _, k, u in handler2.updates] == [
        ("user_message_chunk", "first [think deep]"),
        ("agent_message_chunk", "echo: first"),
        ("agent_thought_chunk", "deep"),
        ("user_message_chunk", "second"),
        ("agent_message_chunk", "echo: second"),
    ]
    assert {s for s, _, _ in handler2.updates} == {sid}
    assert loaded.session_id == sid
    assert loaded.modes is not None and loaded.modes.current_mode_id == "plan"
    await conn2.close_session(sid)
    await conn2.aclose()

    conn3, handler3 = await start(nursery, tmp_path, state_dir=state)
    resumed = await conn3.resume_session(sid, ws)
    assert resumed.session_id == sid and handler3.updates == []  # resume does not replay
    assert conn3._resume_method == "session/resume"
    result = await conn3.prompt(sid, [{"type": "text", "text": "third"}])
    assert result.stop_reason == "end_turn"
    with pytest.raises(RemoteError) as exc_info:
        await conn3.load_session("sess_missing", ws)
    assert exc_info.value.code == -32002
    await conn3.aclose()


def test_the_conversation_store_is_private(tmp_path: Path) -> None:
    from acp.agents.scripted.store import SessionRecord, Store

    old = os.umask(0o022)
    try:
        store = Store(str(tmp_path / "scripted"))
        store.save(SessionRecord(session_id="s1", cwd="/w", created_at="t", updated_at="t"))
    finally:
        os.umask(old)
    for d in (tmp_path / "scripted", tmp_path / "scripted" / "sessions"):
        assert d.stat().st_mode & 0o777 == 0o700, d
    files = sorted((tmp_path / "scripted" / "sessions").iterdir())
    assert [f.name for f in files] == ["s1.json", "s1.lease"]
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f
