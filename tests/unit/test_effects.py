"""The EffectGate's pure parts: agent approvals, terminal spellings, the Host's own request."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from acp.errors import INTERNAL_ERROR, INVALID_PARAMS, RESOURCE_NOT_FOUND
from acp.schema import RequestPermissionParams
from serve.permissions.agent_approvals import (
    AGENT_APPROVAL_USES,
    AGENT_APPROVAL_WINDOW_MS,
    AgentApproval,
    AgentApprovals,
    agent_approval_from,
    terminal_texts,
)
from serve.permissions.approval import classify_read, classify_write, decide
from serve.permissions.config import ApprovalConfig, CapabilitiesConfig
from serve.permissions.grants import resolve_grants
from serve.permissions.host_request import (
    EFFECT_DENIED,
    MAX_PREVIEW_CHARS,
    fs_error,
    host_options,
    host_tool_call,
)
from serve.permissions.terminal_guard import classify_terminal
from serve.workspaces.files.errors import make_error

WS = "/w"
OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "always", "name": "Always", "kind": "allow_always"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
]


def request(tool_call: dict[str, Any]) -> RequestPermissionParams:
    return msgspec.convert(
        {"sessionId": "s", "toolCall": {"toolCallId": "t1", **tool_call}, "options": OPTIONS},
        RequestPermissionParams,
    )


# -- what an allowed agent request covers --------------------------------------------------


@pytest.mark.parametrize(
    ("tool_call", "option", "caps", "paths", "commands", "always"),
    [
        (  # an edit names its file in locations and rawInput: write (and read) that file
            {"kind": "edit", "locations": [{"path": "/w/a.txt"}], "rawInput": {"path": "/w/a.txt"}},
            "allow", {"fs.write", "fs.read"}, {"/w/a.txt"}, set(), False,
        ),
        (  # qwen-code style rawInput keys, a relative path (joined to the cwd), normalised
            {"kind": "edit", "rawInput": {"file_path": "sub/../b.txt", "absolute_path": "/w/c"}},
            "always", {"fs.write", "fs.read"}, {"/w/b.txt", "/w/c"}, set(), True,
        ),
        (  # a read covers reads only
            {"kind": "read", "locations": [{"path": "/w/r.txt", "line": 3}]},
            "allow", {"fs.read"}, {"/w/r.txt"}, set(), False,
        ),
        (  # execute covers the command text
            {"kind": "execute", "rawInput": {"command": "  make test "}},
            "allow", {"terminal.exec"}, set(), {"make test"}, False,
        ),
        (  # no kind: anything the tool call names
            {"rawInput": {"paths": ["/w/x", 7, "/w/y"], "cmd": "ls"}},
            "allow", {"fs.read", "fs.write", "terminal.exec"}, {"/w/x", "/w/y"}, {"ls"}, False,
        ),
        (  # malformed locations are skipped, not fatal
            {"kind": "edit", "locations": ["/w/a", {"path": 3}, {"path": "/w/ok"}]},
            "allow", {"fs.write", "fs.read"}, {"/w/ok"}, set(), False,
        ),
    ],
)  # fmt: skip
def test_agent_approval_from_allowed_requests(
    tool_call: dict[str, Any],
    option: str,
    caps: set[str],
    paths: set[str],
    commands: set[str],
    always: bool,
) -> None:
    approval = agent_approval_from(request(tool_call), option, cwd=WS, prompt_id="p1")
    assert approval is not None
    assert approval.tool_call_id == "t1" and approval.prompt_id == "p1"
    assert approval.capabilities == caps
    assert approval.paths == paths
    assert approval.commands == commands
    assert approval.always is always


@pytest.mark.parametrize("option", ["no", "unknown-option"])
def test_a_reject_or_unknown_option_approves_nothing(option: str) -> None:
    req = request({"kind": "edit", "locations": [{"path": "/w/a"}]})
    assert agent_approval_from(req, option, cwd=WS, prompt_id=None) is None


# -- matching Host effects against agent approvals -----------------------------------------


def approval(**kw: Any) -> AgentApproval:
    base: dict[str, Any] = {
        "tool_call_id": "t1",
        "prompt_id": "p1",
        "capabilities": frozenset({"fs.write", "fs.read"}),
        "paths": frozenset({"/w/a.txt"}),
        "commands": frozenset(),
        "always": False,
    }
    base.update(kw)
    return AgentApproval(**base)


@pytest.mark.parametrize(
    ("prompt_id", "capability", "paths", "commands", "now", "hit"),
    [
        ("p1", "fs.write", ["/w/a.txt"], [], 1, True),
        ("p1", "fs.read", ["/w/other", "/w/a.txt"], [], 1, True),  # any spelling matches
        ("p2", "fs.write", ["/w/a.txt"], [], 1, False),  # another prompt
        (None, "fs.write", ["/w/a.txt"], [], 1, False),
        ("p1", "fs.write", ["/w/b.txt"], [], 1, False),  # another file
        ("p1", "terminal.exec", [], ["/w/a.txt"], 1, False),  # not a capability it implies
        ("p1", "fs.write", ["/w/a.txt"], [], AGENT_APPROVAL_WINDOW_MS, False),  # expired
    ],
)
def test_match_rule(
    prompt_id: str | None,
    capability: str,
    paths: list[str],
    commands: list[str],
    now: int,
    hit: bool,
) -> None:
    table = AgentApprovals()
    table.note("s#1", approval(), now_ms=0)
    found = table.match("s#1", prompt_id, capability, paths=paths, commands=commands, now_ms=now)
    assert (found == "t1") is hit
    assert table.match("s#2", "p1", "fs.write", paths=["/w/a.txt"], now_ms=1) is None


def test_terminal_match_uses_command_texts() -> None:
    table = AgentApprovals()
    table.note(
        "s",
        approval(capabilities=frozenset({"terminal.exec"}), commands=frozenset({"echo hi"})),
        now_ms=0,
    )
    miss = terminal_texts("/bin/sh", ["-c", "echo bye"])
    assert table.match("s", "p1", "terminal.exec", commands=miss, now_ms=1) is None
    hit = terminal_texts("/bin/sh", ["-c", "echo hi"])
    assert table.match("s", "p1", "terminal.exec", commands=hit, now_ms=1) == "t1"


def test_an_approval_covers_a_bounded_number_of_effects() -> None:
    table = AgentApprovals()
    table.note("s", approval(), now_ms=0)
    for _ in range(AGENT_APPROVAL_USES):
        assert table.match("s", "p1", "fs.write", paths=["/w/a.txt"], now_ms=1) == "t1"
    assert table.match("s", "p1", "fs.write", paths=["/w/a.txt"], now_ms=1) is None


def test_tables_are_bounded_and_forgettable() -> None:
    table = AgentApprovals(max_per_session=2, max_sessions=2)
    for i in range(3):
        table.note("s", approval(tool_call_id=f"t{i}", paths=frozenset({f"/w/{i}"})), now_ms=0)
    assert len(table) == 2
    assert table.match("s", "p1", "fs.write", paths=["/w/0"], now_ms=1) is None  # evicted
    assert table.match("s", "p1", "fs.write", paths=["/w/2"], now_ms=1) == "t2"
    table.note("t", approval(), now_ms=0)
    table.note("u", approval(), now_ms=0)
    assert table.sessions() == ["t", "u"]  # the oldest session went first
    table.forget("t")
    assert table.sessions() == ["u"]
    with pytest.raises(ValueError):
        AgentApprovals(window_ms=0)


def test_terminal_texts_spellings() -> None:
    assert terminal_texts("/bin/sh", ["-c", "ls -l"]) == {
        "/bin/sh",
        "/bin/sh -c 'ls -l'",
        "/bin/sh -c ls -l",
        "ls -l",
    }
    assert terminal_texts("git", ["status"]) == {"git", "git status"}


# -- the Host's own permission request -----------------------------------------------------

GRANTS = resolve_grants(CapabilitiesConfig())
APPROVAL = ApprovalConfig()


def test_host_tool_call_for_a_write_shows_path_size_and_preview() -> None:
    effect = classify_write("/w/.env", [WS])
    decision = decide(effect, GRANTS, APPROVAL, "auto")
    call = host_tool_call(effect, decision, content="SECRET=1\n", tool_call_id="host_x")
    assert call["toolCallId"] == "host_x"
    assert call["kind"] == "edit" and call["title"] == "Write /w/.env"
    assert call["locations"] == [{"path": "/w/.env"}]
    assert call["rawInput"] == {"path": "/w/.env", "bytes": 9}
    assert call["content"] == [{"type": "diff", "path": "/w/.env", "newText": "SECRET=1\n"}]
    meta = call["_meta"]["qwen.daemon.effect"]
    assert meta["capability"] == "fs.write" and meta["source"] == "host"
    assert meta["rule"].startswith("guard:sensitive") and meta["risk"] == "high"
    big = host_tool_call(effect, decision, content="x" * (MAX_PREVIEW_CHARS + 1))
    assert "content" not in big and big["toolCallId"].startswith("host_")


def test_host_tool_call_for_reads_and_commands() -> None:
    read = classify_read("/etc/hosts", [WS])
    call = host_tool_call(read, decide(read, GRANTS, APPROVAL, "default"))
    assert (call["kind"], call["title"]) == ("read", "Read /etc/hosts")
    cmd = classify_terminal("make", ["test"], cwd=WS, workspace_roots=[WS])
    call = host_tool_call(cmd, decide(cmd, GRANTS, APPROVAL, "default"), cwd=WS)
    assert call["kind"] == "execute" and "locations" not in call
    assert call["rawInput"] == {"command": "make test", "cwd": WS}


def test_host_options_offer_allow_always_only_when_cacheable() -> None:
    kinds = [o["kind"] for o in host_options(offer_always=True)]
    assert kinds == ["allow_once", "allow_always", "reject_once"]
    assert [o["optionId"] for o in host_options(offer_always=False)] == [
        "allow_once",
        "reject_once",
    ]


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("path_not_found", RESOURCE_NOT_FOUND),
        ("symlink_escape", EFFECT_DENIED),
        ("path_outside_workspace", EFFECT_DENIED),
        ("untrusted_workspace", EFFECT_DENIED),
        ("binary_file", INVALID_PARAMS),
        ("file_too_large", INVALID_PARAMS),
        ("parse_error", INVALID_PARAMS),
        ("io_error", INTERNAL_ERROR),
        ("permission_denied", INTERNAL_ERROR),
    ],
)
def test_workspace_errors_map_to_json_rpc_codes(kind: str, code: int) -> None:
    err = fs_error(make_error(kind, "boom", "a hint"), "/w/x")  # type: ignore[arg-type]
    assert err.code == code
    assert isinstance(err.data, dict)
    assert err.data["path"] == "/w/x" and err.data["errorKind"] == kind
