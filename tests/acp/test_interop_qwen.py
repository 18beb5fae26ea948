"""Interop with a real third-party ACP agent: ``qwen --acp`` (npm ``@qwen-code/qwen-code``).

qwen runs offline against :class:`tests.support.fake_openai.FakeOpenAI` on 127.0.0.1. The test
is skipped only when node/npm are missing; if the package is absent it is installed with
``scripts/install-node-deps`` (CI runs that script beforehand).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from acp import AgentConnection, BaseClientHandler
from acp.process import live_group_members
from acp.schema import (
    CancelledPermissionOutcome,
    PermissionOutcome,
    RequestPermissionParams,
    SelectedPermissionOutcome,
    WriteTextFileParams,
)
from tests.support.fake_openai import FakeOpenAI
from tests.support.node import ensure_qwen, missing_node_reason, qwen_acp_argv, qwen_env

pytestmark = pytest.mark.skipif(
    missing_node_reason() is not None, reason=str(missing_node_reason())
)


class QwenClient(BaseClientHandler):
    def __init__(self) -> None:
        super().__init__()
        self.updates: list[tuple[str, str, dict[str, Any]]] = []
        self.notifications: list[str] = []
        self.permissions: list[RequestPermissionParams] = []
        self.writes: list[WriteTextFileParams] = []
        self.ext_methods: list[str] = []

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        self.updates.append((session_id, kind, msgspec.json.decode(update)))

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        self.notifications.append(method)

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        self.permissions.append(params)
        option = params.option_of_kind("allow_once")
        if option is None:
            return CancelledPermissionOutcome()
        return SelectedPermissionOutcome(option_id=option.option_id)

    async def write_text_file(self, params: WriteTextFileParams) -> None:
        self.writes.append(params)
        await super().write_text_file(params)

    async def ext_request(self, method: str, params: msgspec.Raw) -> object:
        self.ext_methods.append(method)
        return await super().ext_request(method, params)

    def text(self, session_id: str) -> str:
        return "".join(
            u["content"].get("text", "")
            for s, k, u in self.updates
            if s == session_id and k == "agent_message_chunk"
        )


@pytest.fixture(scope="module")
def qwen_cli() -> Path:
    return ensure_qwen()


@pytest.fixture
def fake_model(tmp_path: Path) -> Iterator[FakeOpenAI]:
    (tmp_path / "ws").mkdir()
    with FakeOpenAI(workdir=str(tmp_path / "ws")) as server:
        yield server


async def test_qwen_acp_end_to_end(
    nursery: trio.Nursery, tmp_path: Path, qwen_cli: Path, fake_model: FakeOpenAI
) -> None:
    ws = tmp_path / "ws"
    client = QwenClient()
    conn = await AgentConnection.spawn(
        nursery,
        qwen_acp_argv(qwen_cli),
        cwd=str(ws),
        env=qwen_env(tmp_path / "home", fake_model.env()),
        handler=client,
        request_timeout_s=120,
    )
    try:
        info = await conn.initialize()
        assert info.protocol_version == 1
        assert info.agent_info is not None and info.agent_info.name == "qwen-code"
        assert info.load_session and info.supports_list and info.supports_resume
        assert any(m.id == "openai" for m in info.auth_methods)

        setup = await conn.new_session(str(ws))
        sid = setup.session_id
        assert setup.modes is not None
        assert "default" in {m.id for m in setup.modes.available_modes}
        assert setup.model_option() is not None  # models are selected through configOptions

        # a plain turn: the fake model echoes, qwen streams it back as message chunks
        result = await conn.prompt(sid, [{"type": "text", "text": "hello from the interop test"}])
        assert result.stop_reason == "end_turn"
        assert client.text(sid) == "hello from the interop test"
        chunks = [u for s, k, u in client.updates if s == sid and k == "agent_message_chunk"]
        assert len(chunks) >= 2  # streamed, not one block
        assert msgspec.json.decode(result.raw)["stopReason"] == "end_turn"
        assert fake_model.chat_requests()[0]["stream"] is True

        # a tool call that needs permission once the mode asks for it
        await conn.set_mode(sid, "default")
        client.updates.clear()
        result = await conn.prompt(
            sid, [{"type": "text", "text": "please write out.txt written by qwen"}]
        )
        assert result.stop_reason == "end_turn"
        (perm,) = client.permissions
        assert perm.session_id == sid
        assert perm.tool_call.kind == "edit"
        assert {o.kind for o in perm.options} >= {"allow_once", "reject_once"}
        (write,) = client.writes
        assert write.path == str(ws / "out.txt")
        assert (ws / "out.txt").read_text() == "written by qwen"
        statuses = [
            u.get("status") for s, k, u in client.updates if k in ("tool_call", "tool_call_update")
        ]
        assert statuses[-1] == "completed"
        assert client.text(sid) == "done"
        # vendor requests such as craft/* are answered -32601 without harm
        assert all(m.startswith(("craft/", "_", "qwen/")) for m in client.ext_methods)

        listed = await conn.list_sessions(cwd=str(ws))
        assert sid in {s.session_id for s in listed.sessions}
    finally:
        exit_info = await conn.aclose(grace_s=5)
    assert exit_info.returncode is not None
    assert live_group_members(conn.process.pgid) == []
