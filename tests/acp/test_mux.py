"""SessionMux (pure routing logic): updates and requests go to the session they name."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from acp.client import named_session
from acp.errors import INVALID_PARAMS, HandlerError
from acp.handler import BaseClientHandler
from acp.mux import MAX_UNBOUND_UPDATES, SessionMux
from acp.schema import (
    CancelledPermissionOutcome,
    PermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    SelectedPermissionOutcome,
)


class Recorder(BaseClientHandler):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.updates: list[tuple[str, str, bytes]] = []
        self.notes: list[str] = []
        self.dropped: list[int] = []

    def on_session_update(self, session_id: str, kind: str, update: msgspec.Raw) -> None:
        self.updates.append((session_id, kind, bytes(update)))

    def on_notification(self, method: str, params: msgspec.Raw) -> None:
        self.notes.append(method)

    def on_oversized_line(self, size: int, limit: int, session_id: str | None = None) -> None:
        self.dropped.append(size)

    async def request_permission(
        self, params: RequestPermissionParams, raw: msgspec.Raw
    ) -> PermissionOutcome:
        return SelectedPermissionOutcome(option_id=f"{self.name}-ok")

    async def read_text_file(self, params: ReadTextFileParams) -> str:
        return f"read by {self.name}"

    async def ext_request(self, method: str, params: msgspec.Raw) -> object:
        return {"by": self.name}


def raw(obj: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(obj))


def permission(session_id: str) -> RequestPermissionParams:
    return msgspec.json.decode(
        msgspec.json.encode(
            {"sessionId": session_id, "toolCall": {"toolCallId": "t"}, "options": []}
        ),
        type=RequestPermissionParams,
    )


async def test_updates_and_requests_reach_the_owning_session_only() -> None:
    mux = SessionMux()
    a, b = Recorder("a"), Recorder("b")
    mux.bind("sa", a)
    mux.bind("sb", b)
    mux.on_session_update("sa", "agent_message_chunk", raw({"x": 1}))
    mux.on_session_update("sb", "plan", raw({"y": 2}))
    assert a.updates == [("sa", "agent_message_chunk", b'{"x":1}')]
    assert b.updates == [("sb", "plan", b'{"y":2}')]

    assert await mux.request_permission(permission("sb"), raw({})) == SelectedPermissionOutcome(
        option_id="b-ok"
    )
    read = ReadTextFileParams(session_id="sa", path="/x")
    assert await mux.read_text_file(read) == "read by a"
    assert await mux.ext_request("craft/x", raw({"sessionId": "sb"})) == {"by": "b"}
    mux.on_notification("qwen/notify/session/mode-update", raw({"sessionId": "sa"}))
    assert a.notes == ["qwen/notify/session/mode-update"] and b.notes == []


async def test_an_unbound_session_gets_the_safe_answers() -> None:
    mux = SessionMux()
    a = Recorder("a")
    mux.bind("sa", a)
    mux.unbind("sa", a)
    assert isinstance(
        await mux.request_permission(permission("sa"), raw({})), CancelledPermissionOutcome
    )
    with pytest.raises(HandlerError) as caught:
        await mux.read_text_file(ReadTextFileParams(session_id="sa", path="/etc/passwd"))
    assert caught.value.code == INVALID_PARAMS
    with pytest.raises(HandlerError):
        await mux.ext_request("craft/x", raw({"sessionId": "sa"}))
    # unbind only removes the entry it names
    b = Recorder("b")
    mux.bind("sa", b)
    mux.unbind("sa", a)
    assert mux.handler_for("sa") is b


def test_updates_before_bind_are_delivered_in_order_and_bounded() -> None:
    mux = SessionMux()
    mux.on_session_update("new", "available_commands_update", raw({"n": 1}))
    mux.on_session_update("other", "plan", raw({"n": 2}))
    mux.on_session_update("new", "plan", raw({"n": 3}))
    a = Recorder("a")
    mux.bind("new", a)
    assert [u[2] for u in a.updates] == [b'{"n":1}', b'{"n":3}']
    b = Recorder("b")
    mux.bind("other", b)
    assert [u[2] for u in b.updates] == [b'{"n":2}']
    for i in range(MAX_UNBOUND_UPDATES + 10):
        mux.on_session_update("late", "plan", raw({"i": i}))
    c = Recorder("c")
    mux.bind("late", c)
    assert len(c.updates) == MAX_UNBOUND_UPDATES  # the oldest were dropped
    assert c.updates[-1][2] == msgspec.json.encode({"i": MAX_UNBOUND_UPDATES + 9})


def test_an_oversized_line_is_reported_to_the_session_it_names_only() -> None:
    """Issue 22, item 5: not to every co-tenant under its own prompt."""
    mux = SessionMux()
    a, b = Recorder("a"), Recorder("b")
    mux.bind("sa", a)
    mux.bind("sb", b)
    mux.on_oversized_line(5000, 4096, "sa")
    assert a.dropped == [5000] and b.dropped == []
    for unknown in (None, "gone"):  # names nobody bound here: counted, reported to no one
        mux.on_oversized_line(6000, 4096, unknown)
    assert a.dropped == [5000] and b.dropped == [] and mux.unattributed_drops == 2


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":',
            "s-1",
        ),
        (b'{"method":"session/update","params":{"update":{"text":"', None),
        (b'{"params":{"update":{"text":"say \\"sessionId\\":\\"evil\\""', None),  # in a string
    ],
)
def test_named_session_reads_the_start_then_the_end(line: bytes, expected: str | None) -> None:
    assert named_session(line + b"\n" + b'"}}}') == expected
    assert named_session(b'{"params":{"update":{}' + b"\n" + b'x"},"sessionId":"s-2"}}') == "s-2"


def test_a_session_that_left_gets_no_stale_updates_when_it_binds_again() -> None:
    """What the agent still sends for a session after it left (an abandoned turn) is not
    kept for its next bind (issue 22, item 1)."""
    mux = SessionMux()
    a = Recorder("a")
    mux.bind("sa", a)
    mux.unbind("sa", a)
    mux.on_session_update("sa", "agent_message_chunk", raw({"stale": 1}))
    again = Recorder("a2")
    mux.bind("sa", again)
    assert again.updates == []
    mux.on_session_update("sa", "plan", raw({"fresh": 1}))
    assert [u[2] for u in again.updates] == [b'{"fresh":1}']
