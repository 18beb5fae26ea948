"""ACP schema: what we send has the wire shape of the spec; what agents send is read leniently."""

# ruff: noqa: E501  (JSON test vectors are kept one message per line)

from __future__ import annotations

import msgspec
import pytest

from acp import schema as s


def enc(obj: object) -> object:
    return msgspec.json.decode(msgspec.json.encode(obj))


def test_initialize_params_wire_shape() -> None:
    params = s.InitializeParams(
        protocol_version=1,
        client_capabilities=s.ClientCapabilities(
            fs=s.FileSystemCapability(read_text_file=True, write_text_file=True), terminal=True
        ),
        client_info=s.Implementation(name="acp-serve", version="0.1.0"),
    )
    assert enc(params) == {
        "protocolVersion": 1,
        "clientCapabilities": {
            "fs": {"readTextFile": True, "writeTextFile": True},
            "terminal": True,
        },
        "clientInfo": {"name": "acp-serve", "version": "0.1.0"},
    }


def test_required_fields_are_sent_even_when_empty() -> None:
    assert enc(s.NewSessionParams(cwd="/w", mcp_servers=[])) == {"cwd": "/w", "mcpServers": []}
    assert enc(s.LoadSessionParams(session_id="a", cwd="/w", mcp_servers=[])) == {
        "sessionId": "a",
        "cwd": "/w",
        "mcpServers": [],
    }
    assert enc(s.TerminalExitStatus(exit_code=0)) == {"exitCode": 0, "signal": None}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            s.RequestPermissionResult(outcome=s.SelectedPermissionOutcome(option_id="a1")),
            {"outcome": {"outcome": "selected", "optionId": "a1"}},
        ),
        (
            s.RequestPermissionResult(outcome=s.CancelledPermissionOutcome()),
            {"outcome": {"outcome": "cancelled"}},
        ),
        (
            s.SetConfigOptionParams(session_id="x", config_id="brave", value=True, type="boolean"),
            {"sessionId": "x", "configId": "brave", "value": True, "type": "boolean"},
        ),
        (
            s.SetConfigOptionParams(session_id="x", config_id="model", value="smart"),
            {"sessionId": "x", "configId": "model", "value": "smart"},
        ),
        (
            s.McpServerHttp(name="api", url="http://127.0.0.1:9/mcp", headers=[]),
            {"type": "http", "name": "api", "url": "http://127.0.0.1:9/mcp", "headers": []},
        ),
        (
            s.McpServerStdio(name="fs", command="/bin/x", args=[], env=[]),
            {"name": "fs", "command": "/bin/x", "args": [], "env": []},
        ),
    ],
)
def test_wire_shapes(obj: object, expected: object) -> None:
    assert enc(obj) == expected


# One example of every update kind (reference/acp-and-stack.md §1.6), decoded and re-encoded.
UPDATES = [
    b'{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"hi"},"messageId":"m_u1"}',
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Sure, "},"messageId":"m_a1"}',
    b'{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"need to read t.py"}}',
    b'{"sessionUpdate":"tool_call","toolCallId":"call_1","title":"Read t.py","kind":"read","status":"pending","locations":[{"path":"/p/t.py","line":1}],"rawInput":{"path":"t.py"}}',
    b'{"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"ok"}},{"type":"diff","path":"/p/t.py","newText":"b","oldText":"a"},{"type":"terminal","terminalId":"term_1"}]}',
    b'{"sessionUpdate":"plan","entries":[{"content":"Run tests","priority":"high","status":"in_progress"}]}',
    b'{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"review","description":"Review changes","input":{"hint":"file or dir"}}]}',
    b'{"sessionUpdate":"current_mode_update","currentModeId":"code"}',
    b'{"sessionUpdate":"config_option_update","configOptions":[{"id":"model","name":"Model","type":"select","currentValue":"fast","category":"model","options":[{"value":"fast","name":"Fast"}]}]}',
    b'{"sessionUpdate":"session_info_update","title":"Fix tests","updatedAt":"2026-11-29T12:00:00Z"}',
    b'{"sessionUpdate":"usage_update","used":53000,"size":200000,"cost":{"amount":0.04,"currency":"USD"}}',
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"image","data":"AAAA","mimeType":"image/png"}}',
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"resource_link","uri":"file:///a","name":"a"}}',
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"resource","resource":{"uri":"file:///a","text":"x"}}}',
    b'{"sessionUpdate":"user_message_chunk","content":{"type":"audio","data":"AAAA","mimeType":"audio/wav"}}',
]


@pytest.mark.parametrize("raw", UPDATES)
def test_every_update_kind_decodes_and_round_trips(raw: bytes) -> None:
    update = s.decode_session_update(raw)
    assert not isinstance(update, s.UnknownSessionUpdate)
    assert enc(update) == msgspec.json.decode(raw)
    assert msgspec.json.decode(raw)["sessionUpdate"] in s.SESSION_UPDATE_KINDS


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'{"sessionUpdate":"compaction_started","x":1}', "compaction_started"),
        (b'{"sessionUpdate":"plan","entries":"not a list"}', "plan"),
        (b'{"content":{"type":"text","text":"no tag"}}', ""),
    ],
)
def test_unknown_or_malformed_updates_stay_raw(raw: bytes, kind: str) -> None:
    update = s.decode_session_update(raw)
    assert isinstance(update, s.UnknownSessionUpdate)
    assert update.kind == kind
    assert bytes(update.raw) == raw


def test_session_setup_is_lenient_per_part() -> None:
    raw = msgspec.Raw(
        b'{"sessionId":"s1","modes":{"currentModeId":"ask","availableModes":[{"id":"ask","name":"Ask"}]},'
        b'"models":"garbage","configOptions":[{"id":"model","name":"M","category":"model","type":"select",'
        b'"currentValue":"a","options":[{"group":"g","name":"G","options":[{"value":"a","name":"A"},'
        b'{"value":"b","name":"B"}]}]},42,{"id":"brave","name":"Brave","type":"boolean","currentValue":true}],'
        b'"_meta":{"vendor":{"x":1}},"futureField":[1]}'
    )
    setup = s.decode_session_setup(raw)
    assert setup.session_id == "s1"
    assert setup.modes is not None and setup.modes.current_mode_id == "ask"
    assert setup.models is None  # malformed part -> None, the call still succeeds
    assert setup.config_options is not None
    assert [o.id for o in setup.config_options] == ["model", "brave"]  # invalid item skipped
    option = setup.model_option()
    assert option is not None and option.select_values() == ["a", "b"]
    assert msgspec.json.decode(setup.meta) == {"vendor": {"x": 1}}
    assert bytes(setup.raw) == bytes(raw)


def test_find_model_option_prefers_category() -> None:
    opts = [
        s.SessionConfigOption(id="model", name="legacy", type="select"),
        s.SessionConfigOption(id="m2", name="M", type="select", category="model"),
    ]
    found = s.find_model_option(opts)
    assert found is not None and found.id == "m2"
    assert s.find_model_option([s.SessionConfigOption(id="x", name="X", type="boolean")]) is None
    assert s.find_model_option(None) is None


def test_initialize_result_capability_helpers() -> None:
    raw = msgspec.Raw(
        b'{"protocolVersion":1,"agentCapabilities":{"loadSession":true,"sessionCapabilities":'
        b'{"list":{},"resume":{},"close":null}},"authMethods":[{"id":"openai","name":"OpenAI"},'
        b'{"bad":1}],"agentInfo":{"name":"qwen","version":"0.24.4"}}'
    )
    info = s.decode_initialize_result(raw)
    assert info.load_session and info.supports_resume and info.supports_list
    assert not info.supports_close
    assert [m.id for m in info.auth_methods] == ["openai"]
    assert info.agent_info is not None and info.agent_info.name == "qwen"
    bare = s.decode_initialize_result(msgspec.Raw(b'{"protocolVersion":1}'))
    assert not bare.load_session and not bare.supports_resume and bare.auth_methods == []


def test_prompt_result_keeps_meta_and_unknown_stop_reason() -> None:
    raw = msgspec.Raw(b'{"stopReason":"new_reason","_meta":{"qwen.branchPoint":"b1"}}')
    result = s.decode_prompt_result(raw)
    assert result.stop_reason == "new_reason"
    assert msgspec.json.decode(result.meta) == {"qwen.branchPoint": "b1"}
    with pytest.raises(msgspec.ValidationError):
        s.decode_prompt_result(msgspec.Raw(b'{"_meta":{}}'))


def test_request_permission_params_decode() -> None:
    raw = (
        b'{"sessionId":"s","toolCall":{"toolCallId":"c1","title":"rm","kind":"execute",'
        b'"status":"pending","futureField":1},"options":[{"optionId":"a1","name":"Allow",'
        b'"kind":"allow_once"},{"optionId":"r1","name":"Reject","kind":"reject_once"}]}'
    )
    params = msgspec.json.decode(raw, type=s.RequestPermissionParams)
    assert params.tool_call.tool_call_id == "c1"
    allow = params.option_of_kind("allow_once")
    assert allow is not None and allow.option_id == "a1"
    assert params.option_of_kind("allow_always") is None


def test_list_sessions_result() -> None:
    raw = msgspec.Raw(
        b'{"sessions":[{"sessionId":"a","cwd":"/w","title":"T","updatedAt":"2026-01-01T00:00:00Z"},'
        b'{"nope":1}],"nextCursor":"c2"}'
    )
    result = s.decode_list_sessions_result(raw)
    assert [x.session_id for x in result.sessions] == ["a"]
    assert result.next_cursor == "c2"
