"""Linking an agent's approval to its later effect: diff paths, earlier tool calls (issue 18)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from acp.schema import RequestPermissionParams
from serve.permissions.agent_approvals import (
    MAX_TOOL_CALLS_PER_SESSION,
    AgentApprovals,
    ToolCallLog,
    agent_approval_from,
)

OPTIONS = [
    {"optionId": "ok", "name": "Approve", "kind": "allow_once"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


def request(tool_call: dict[str, Any]) -> RequestPermissionParams:
    return msgspec.convert(
        {"sessionId": "s", "toolCall": {"toolCallId": "t1", **tool_call}, "options": OPTIONS},
        RequestPermissionParams,
    )


def update(**fields: Any) -> bytes:
    return json.dumps({"sessionUpdate": "tool_call", "toolCallId": "t1", **fields}).encode()


def test_a_diff_block_names_the_path() -> None:
    params = request(
        {
            "kind": "edit",
            "content": [
                {"type": "content", "content": {"type": "text", "text": "x"}},
                {"type": "diff", "path": "/w/a.txt", "oldText": None, "newText": "hi"},
                {"type": "diff", "path": "rel/b.txt", "newText": "hi"},
            ],
        }
    )
    approval = agent_approval_from(params, "ok", cwd="/w", prompt_id="p")
    assert approval is not None
    assert approval.paths == {"/w/a.txt", "/w/rel/b.txt"}
    assert agent_approval_from(params, "no", cwd="/w", prompt_id="p") is None


def test_the_earlier_tool_call_with_the_same_id_names_kind_and_paths() -> None:
    log = ToolCallLog()
    log.note("k", update(title="Write", kind="edit", locations=[{"path": "/w/a.txt"}]))
    log.note(
        "k",
        update(
            sessionUpdate="tool_call_update",
            content=[{"type": "diff", "path": "/w/b.txt", "newText": ""}],
            rawInput={"command": "touch /w/c"},
        ),
    )
    log.note("k", update(toolCallId="other", locations=[{"path": "/w/z.txt"}]))
    earlier = log.get("k", "t1")
    assert earlier is not None and earlier.kind == "edit"
    assert earlier.paths == ("/w/a.txt", "/w/b.txt") and earlier.commands == ("touch /w/c",)
    params = request({"title": "Write"})  # only the id (and a title)
    approval = agent_approval_from(params, "ok", cwd="/w", prompt_id="p", earlier=earlier)
    assert approval is not None
    assert approval.paths == {"/w/a.txt", "/w/b.txt"}
    assert approval.capabilities == {"fs.write", "fs.read"}  # the earlier kind
    approvals = AgentApprovals()
    approvals.note("k", approval, now_ms=0)
    assert approvals.match("k", "p", "fs.write", paths=["/w/z.txt"], now_ms=1) is None
    assert approvals.match("k", "p", "fs.write", paths=["/w/a.txt"], now_ms=1) == "t1"
    assert log.get("other-session", "t1") is None


def test_the_tool_call_log_is_bounded_and_ignores_garbage() -> None:
    log = ToolCallLog(max_sessions=2)
    log.note("k", b"not json")
    log.note("k", b'{"sessionUpdate":"tool_call"}')  # no id
    assert log.get("k", "t1") is None
    for i in range(MAX_TOOL_CALLS_PER_SESSION + 5):
        log.note("k", update(toolCallId=f"t{i}", locations=[{"path": f"/w/{i}"}]))
    assert log.get("k", "t0") is None  # the oldest went first
    assert log.get("k", f"t{MAX_TOOL_CALLS_PER_SESSION + 4}") is not None
    log.note("k2", update(kind="edit"))
    log.note("k3", update(kind="edit"))
    assert log.sessions() == ["k2", "k3"]
    many = [{"path": f"/w/{i}"} for i in range(100)]
    log.note("k3", update(locations=many))
    targets = log.get("k3", "t1")
    assert targets is not None and len(targets.paths) == 16
