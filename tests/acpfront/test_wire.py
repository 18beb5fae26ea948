"""ACP over Streamable HTTP at /acp, on the wire: status codes, headers, routing, resume,
cross-transport visibility, release on DELETE, auth, and a seeded fuzz of malformed
JSON-RPC (real daemon, scripted agent, real sockets)."""

from __future__ import annotations

import json
import random
from urllib.parse import quote

import httpx
import pytest
import trio

from tests.acpfront.helpers import AcpHttp, Frame
from tests.support.daemon import DaemonProcess
from tests.support.sse import collect_until


def _ws(daemon_proc: DaemonProcess) -> str:
    return str(daemon_proc.workspace.resolve())


# ---- POST ---------------------------------------------------------------------------------


async def test_initialize_needs_no_connection_and_answers_inline(acp: AcpHttp) -> None:
    body = await acp.initialize({"clientInfo": {"name": "qwen-code-sdk", "version": "1"}})
    assert body["jsonrpc"] == "2.0" and body["id"] == 1
    result = body["result"]
    assert result["protocolVersion"] == 1
    meta = result["agentCapabilities"]["_meta"]["qwen"]
    assert meta["connectionId"] == acp.connection_id
    assert {"session/new", "session/prompt", "_qwen/health", "session/permission"} <= set(
        meta["methods"]
    )
    assert result["agentCapabilities"]["loadSession"] is True


async def test_protocol_version_is_clamped_to_1(acp: AcpHttp) -> None:
    body = await acp.initialize({"protocolVersion": 7, "clientCapabilities": {}})
    assert body["result"]["protocolVersion"] == 1


async def test_post_needs_json_and_rejects_batches_and_non_jsonrpc(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/acp", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = await client.post("/acp", json=[{"jsonrpc": "2.0", "id": 1, "method": "initialize"}])
    assert r.status_code == 501
    assert r.json()["error"]["code"] == -32600
    r = await client.post("/acp", json={"hello": "world"})
    assert r.status_code == 400
    assert r.json()["id"] is None and r.json()["error"]["code"] == -32600
    r = await client.post(
        "/acp", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700
    deep = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":' + b"[" * 100_000
    r = await client.post(
        "/acp",
        content=deep + b"]" * 100_000 + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700  # not a 500


async def test_connection_id_missing_400_unknown_404(client: httpx.AsyncClient) -> None:
    msg = {"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}}
    r = await client.post("/acp", json=msg)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32600
    r = await client.post("/acp", json=msg, headers={"Acp-Connection-Id": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == -32600
    r = await client.get("/acp", headers={"Accept": "text/event-stream"})
    assert r.status_code == 400
    r = await client.get("/acp", headers={"Accept": "text/event-stream", "Acp-Connection-Id": "x"})
    assert r.status_code == 404
    r = await client.delete("/acp", headers={"Acp-Connection-Id": "nope"})
    assert r.status_code == 404


async def test_get_needs_event_stream_accept_first(client: httpx.AsyncClient) -> None:
    # 406 is checked before the (missing) connection id.
    r = await client.get("/acp", headers={"Accept": "application/json"})
    assert r.status_code == 406


# ---- streams and routing ------------------------------------------------------------------


async def test_streams_headers_retry_and_routing(acp: AcpHttp, daemon_proc: DaemonProcess) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        assert conn.response.headers["cache-control"] == "no-cache, no-transform"
        assert conn.response.headers["x-accel-buffering"] == "no"
        created = await acp.new_session(_ws(daemon_proc), conn)
        sid = created["sessionId"]
        assert created["workspaceCwd"] == _ws(daemon_proc)
        assert conn.first_line == "retry: 3000"
        async with acp.stream(sid) as sess:
            assert sess.response.headers["x-qwen-event-epoch"]
            rid = await acp.request(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
            )
            frames = await sess.until(lambda f: f.message.get("id") == rid)
            reply = frames[-1]
            # The prompt's reply rides the session stream, after its events, with no id:.
            assert reply.id is None and reply.message["result"]["stopReason"] == "end_turn"
            updates = [f for f in frames if f.method == "session/update"]
            assert updates and all(isinstance(f.id, int) for f in updates)
            assert any(f.kind == "turn_complete" for f in frames)
            ids = [f.id for f in frames if f.id is not None]
            assert ids == sorted(ids)
            # The connection stream never carries a session/update.
            lrid = await acp.request("session/list", {})
            listed = await conn.until(lambda f: f.message.get("id") == lrid)
            assert all(f.method != "session/update" for f in listed)
            assert sid in [s["sessionId"] for s in listed[-1].message["result"]["sessions"]]


async def test_ownership_and_header_mismatch_errors_on_connection_stream(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    rest = (await client.post("/session", json={"sessionScope": "thread"})).json()
    async with acp.stream() as conn:
        created = await acp.new_session(_ws(daemon_proc), conn)
        mine = created["sessionId"]
        # A session this connection does not own: 202, then -32602 on the connection stream.
        rid = await acp.request(
            "session/prompt",
            {"sessionId": rest["sessionId"], "prompt": [{"type": "text", "text": "x"}]},
        )
        assert (await conn.reply(rid)).message["error"]["code"] == -32602
        # Acp-Session-Id contradicting params.sessionId: the same.
        rid = await acp.request("session/cancel", {"sessionId": mine}, session_id="other")
        assert (await conn.reply(rid)).message["error"]["code"] == -32602
    # GET of a session the connection does not own: 403.
    r = await client.get(
        "/acp",
        headers=acp.headers(rest["sessionId"], Accept="text/event-stream"),
    )
    assert r.status_code == 403


async def test_events_before_the_session_stream_opens_are_delivered(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        rid = await acp.request(
            "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "early"}]}
        )
        # The turn runs with no session stream open; everything waits in the outbox.
        async with acp.stream(sid) as sess:
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    texts = [
        f.message["params"]["update"].get("content", {}).get("text")
        for f in frames
        if f.method == "session/update"
    ]
    assert "echo: early" in texts


async def test_a_second_reader_ends_the_first(acp: AcpHttp, daemon_proc: DaemonProcess) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as first:
            async with acp.stream(sid) as second:
                # The first reader's stream ends; the second one gets what follows.
                leftovers = []
                while (frame := await first.next()) is not None:
                    leftovers.append(frame)
                rid = await acp.request(
                    "session/prompt",
                    {"sessionId": sid, "prompt": [{"type": "text", "text": "second"}]},
                )
                assert (await second.reply(rid)).message["result"]["stopReason"] == "end_turn"
                assert all(f.message.get("id") != rid for f in leftovers)


async def test_resume_with_last_event_id_replays_in_order(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await acp.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "[think a] one two"}]},
            )
            live = await sess.until(lambda f: f.message.get("id") == rid)
        live_ids = [f.id for f in live if f.id is not None]
        assert len(live_ids) >= 3
        cut = live_ids[0]
        async with acp.stream(sid, **{"Last-Event-ID": str(cut)}) as again:
            replayed = await again.until(lambda f: f.kind == "replay_complete")
    done = replayed[-1]
    assert done.id is None  # the marker carries no id
    ids = [f.id for f in replayed if f.id is not None]
    assert ids == [i for i in live_ids if i > cut]
    # JSON-RPC replies are not replayed.
    assert all(f.message.get("id") != rid for f in replayed)


# ---- cross-transport ----------------------------------------------------------------------


async def test_cross_transport_visibility(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    ws = _ws(daemon_proc)
    async with acp.stream() as conn:
        sid = (await acp.new_session(ws, conn))["sessionId"]
        # In the REST list at once.
        listed = (await client.get(f"/workspace/{quote(ws, safe='')}/sessions")).json()
        assert sid in [s["sessionId"] for s in listed["sessions"]]
        async with (
            acp.stream(sid) as sess,
            client.stream(
                "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
            ) as rest_events,
        ):
            assert rest_events.status_code == 200
            # An /acp prompt's events reach GET /session/:id/events.
            rid = await acp.request(
                "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "acp"}]}
            )
            await sess.reply(rid)
            got = await collect_until(rest_events, lambda e: e.get("type") == "turn_complete")
            texts = [
                e["data"]["update"].get("content", {}).get("text")
                for e in got
                if e.get("type") == "session_update"
            ]
            assert "echo: acp" in texts
            # A REST prompt's turn shows on the /acp session stream.
            r = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "rest"}]}
            )
            assert r.status_code == 200, r.text
            frames = await sess.until(lambda f: f.kind == "turn_complete")
            texts = [
                f.message["params"]["update"].get("content", {}).get("text")
                for f in frames
                if f.method == "session/update"
            ]
            assert "echo: rest" in texts


async def test_permission_answered_by_response_is_a_vote(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await acp.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "[write vote.txt v]"}]},
            )
            ask = (await sess.until(lambda f: f.method == "session/request_permission"))[-1]
            assert isinstance(ask.message["id"], str)
            assert ask.id is not None  # a session-bus message
            request_id = ask.message["params"]["_meta"]["qwen"]["requestId"]
            r = await acp.post(
                {
                    "jsonrpc": "2.0",
                    "id": ask.message["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "reject"}},
                },
                sid,
            )
            assert r.status_code == 202
            frames = await sess.until(lambda f: f.message.get("id") == rid)
    resolved = [f for f in frames if f.kind == "permission_resolved"]
    assert resolved and resolved[0].message["params"]["data"]["requestId"] == request_id
    assert not (daemon_proc.workspace / "vote.txt").exists()


# ---- DELETE -------------------------------------------------------------------------------


async def test_delete_ends_streams_and_releases_sessions(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with (
            acp.stream(sid) as sess,
            client.stream(
                "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
            ) as watcher,
        ):
            r = await client.delete("/acp", headers=acp.headers())
            assert r.status_code == 202
            while await conn.next() is not None:
                pass
            while await sess.next() is not None:
                pass
            # The session nobody else held is closed (a REST watcher does not hold it).
            with trio.fail_after(30):
                ended = await collect_until(watcher, lambda e: e.get("type") == "session_closed")
            assert ended[-1]["data"]["reason"] == "acp_connection_closed"
    r = await client.post(
        "/acp",
        json={"jsonrpc": "2.0", "id": 9, "method": "session/list"},
        headers=acp.headers(),
    )
    assert r.status_code == 404
    acp.connection_id = None
    assert (await client.get(f"/session/{sid}/pending-prompts")).status_code == 404


async def test_delete_keeps_a_session_another_client_holds(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    rest = (await client.post("/session", json={"sessionScope": "thread"})).json()
    sid = rest["sessionId"]
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        rid = await acp.request("session/resume", {"sessionId": sid, "cwd": _ws(daemon_proc)})
        assert (await conn.reply(rid)).message["result"]["attached"] is True
    r = await client.delete("/acp", headers=acp.headers())
    assert r.status_code == 202
    acp.connection_id = None
    r = await client.post(
        f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "s"}]}
    )
    assert r.status_code == 200


# ---- auth ---------------------------------------------------------------------------------


async def test_token_is_required_for_every_acp_request(daemon_proc: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30) as bare:
        r = await bare.post(
            "/acp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        )
        assert r.status_code == 401
        r = await bare.get("/acp", headers={"Accept": "text/event-stream"})
        assert r.status_code == 401
        r = await bare.delete("/acp", headers={"Acp-Connection-Id": "x"})
        assert r.status_code == 401
        # (The WebSocket upgrade without the token: test_websocket.py.)
        r = await bare.post(
            "/acp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers={"Authorization": "Bearer wrong"},
        )
        assert r.status_code == 401


# ---- fuzz ---------------------------------------------------------------------------------


def _junk(rng: random.Random, depth: int = 0) -> object:
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.randint(-(2**63), 2**63)
    if choice == 3:
        return rng.random() * 1e6
    if choice == 4:
        return "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(rng.randrange(12)))
    if choice == 5:
        return rng.choice(["session/prompt", "session/new", "initialize", "_qwen/health", ""])
    if choice == 6:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["jsonrpc", "id", "method", "params", "result", "error", "sessionId", "prompt"]
    return {rng.choice(keys): _junk(rng, depth + 1) for _ in range(rng.randrange(6))}


def _message(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:  # bytes that may not even be JSON
        return bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    if kind == 1:
        return json.dumps(_junk(rng)).encode()
    body: dict[str, object] = {"jsonrpc": rng.choice(["2.0", "2.0", "1.0", 2, None])}
    for key in ("id", "method", "params", "result", "error"):
        if rng.random() < 0.6:
            body[key] = _junk(rng)
    if rng.random() < 0.5:
        body["method"] = rng.choice(
            [
                "session/prompt",
                "session/new",
                "session/load",
                "session/close",
                "session/set_mode",
                "session/permission",
                "session/cancel",
                "_qwen/health",
                "_qwen/session/heartbeat",
                "session/list",
                "nope/x",
                "initialize",
            ]
        )
    if rng.random() < 0.5:
        body["params"] = {"sessionId": _junk(rng), "prompt": _junk(rng), "cwd": _junk(rng)}
    return json.dumps(body).encode()


async def test_fuzzed_jsonrpc_never_500s_or_hangs(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    await acp.initialize({"protocolVersion": 1})
    rng = random.Random(19)
    async with acp.stream() as conn:
        for _ in range(300):
            raw = _message(rng)
            with trio.fail_after(10):
                r = await client.post(
                    "/acp",
                    content=raw,
                    headers={**acp.headers(), "Content-Type": "application/json"},
                )
            assert r.status_code in (200, 202, 400, 404, 429, 501), (raw, r.status_code, r.text)
            if r.status_code != 202:
                assert r.headers["content-type"].startswith("application/json")
                body = r.json()
                assert body["jsonrpc"] == "2.0"
                assert (
                    ("result" in body)
                    if r.status_code == 200
                    else isinstance(body["error"]["code"], int)
                )
        # The connection still serves: a request after the fuzz is answered.
        rid = await acp.request("_qwen/health", {})
        assert (await conn.reply(rid)).message["result"] == {"status": "ok"}
    r = await client.get("/health")
    assert r.status_code == 200
    # No handler failed unexpectedly (each would be logged with its traceback).
    assert "ACP request failed" not in daemon_proc.stderr()
    assert "unhandled error" not in daemon_proc.stderr()


async def test_fuzz_frame_shape_of_errors(acp: AcpHttp) -> None:
    """Errors delivered on the stream are JSON-RPC error objects with the request's id."""
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        cases = [
            ({"jsonrpc": "2.0", "id": "a", "method": "nope"}, -32601),
            (
                {
                    "jsonrpc": "2.0",
                    "id": "b",
                    "method": "session/prompt",
                    "params": {"sessionId": 5},
                },
                -32602,
            ),
            (
                {"jsonrpc": "2.0", "id": "c", "method": "session/new", "params": {"cwd": "rel"}},
                -32602,
            ),
            ({"jsonrpc": "2.0", "id": "d", "method": "initialize", "params": {}}, -32600),
            ({"jsonrpc": "2.0", "id": "e", "method": "session/permission", "params": {}}, -32602),
        ]
        for message, code in cases:
            r = await acp.post(message)
            if message["method"] == "initialize":
                assert r.status_code == 200  # a fresh connection
                continue
            assert r.status_code == 202
            frame: Frame = await conn.reply(message["id"])
            assert frame.message["error"]["code"] == code, frame


# ---- the daemon surface as _qwen/* methods ------------------------------------------------


async def test_qwen_file_status_and_context_methods(
    acp: AcpHttp, daemon_proc: DaemonProcess, client: httpx.AsyncClient
) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]

        async def call(method: str, params: dict) -> dict:
            rid = await acp.request(method, params)
            return (await conn.reply(rid)).message

        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Accept": "text/event-stream"}
        ) as watcher:
            wrote = await call(
                "_qwen/file/write", {"path": "f.txt", "content": "one\ntwo\n", "mode": "create"}
            )
            assert wrote.get("result", {}).get("created") is True, wrote
            changed = await collect_until(
                watcher, lambda e: e.get("type") == "workspace_file_changed"
            )
            assert changed[-1]["data"]["path"] == "f.txt"
        read = await call("_qwen/file/read", {"path": "f.txt"})
        assert read["result"]["content"] == "one\ntwo\n"
        edited = await call(
            "_qwen/file/edit",
            {
                "path": "f.txt",
                "oldText": "two",
                "newText": "2",
                "expectedHash": read["result"]["hash"],
            },
        )
        assert "result" in edited, edited
        assert (daemon_proc.workspace / "f.txt").read_text() == "one\n2\n"
        stale = await call(
            "_qwen/file/edit",
            {
                "path": "f.txt",
                "oldText": "one",
                "newText": "1",
                "expectedHash": read["result"]["hash"],
            },
        )
        assert stale["error"]["data"]["httpStatus"] == 409
        assert stale["error"]["data"]["errorKind"] == "hash_mismatch"
        missing = await call("_qwen/file/stat", {"path": "nope.txt"})
        assert missing["error"]["data"]["httpStatus"] == 404
        outside = await call("_qwen/file/read", {"path": "../../etc/passwd"})
        assert "error" in outside
        listed = await call("_qwen/file/list", {})
        assert "f.txt" in json.dumps(listed["result"])
        globbed = await call("_qwen/file/glob", {"pattern": "*.txt"})
        assert "f.txt" in json.dumps(globbed["result"])
        bad = await call("_qwen/file/read", {"path": "f.txt", "maxBytes": "10"})
        assert bad["error"]["code"] == -32602
        status = await call("_qwen/status", {})
        assert "daemon" in status["result"] or status["result"]
        context = await call("_qwen/session/context", {"sessionId": sid})
        assert context["result"]["sessionId"] == sid
        commands = await call("_qwen/session/supported_commands", {"sessionId": sid})
        assert isinstance(commands["result"]["availableCommands"], list)


@pytest.mark.timeout(60)  # a hang guard: this glob took hours before (issue 22, item 20)
async def test_qwen_file_glob_answers_a_hostile_pattern(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    (daemon_proc.workspace / ("b" * 60 + ".md")).write_text("x")
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        rid = await acp.request("_qwen/file/glob", {"pattern": "*?" * 9 + "*Q"})
        reply = (await conn.reply(rid)).message
        assert reply["result"]["matches"] == [], reply
        rid = await acp.request("_qwen/file/glob", {"pattern": "*" * 1025})
        error = (await conn.reply(rid)).message["error"]
        assert error["code"] == -32602 and error["data"]["errorKind"] == "parse_error"


# ---- the session methods ------------------------------------------------------------------


async def test_mode_model_config_and_cancel(acp: AcpHttp, daemon_proc: DaemonProcess) -> None:
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await acp.request("session/set_mode", {"sessionId": sid, "modeId": "auto-edit"})
            frames = await sess.until(lambda f: f.message.get("id") == rid)
            assert frames[-1].message["result"]["mode"] == "auto-edit"
            assert any(f.kind == "approval_mode_changed" for f in frames)
            # In auto-edit the agent writes without asking.
            rid = await acp.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "[write mode.txt m]"}]},
            )
            frames = await sess.until(lambda f: f.message.get("id") == rid)
            assert not any(f.method == "session/request_permission" for f in frames)
            assert (daemon_proc.workspace / "mode.txt").read_text() == "m"

            rid = await acp.request(
                "session/set_model", {"sessionId": sid, "modelId": "scripted-slow"}
            )
            frames = await sess.until(lambda f: f.message.get("id") == rid)
            assert frames[-1].message["result"]["modelId"] == "scripted-slow"
            assert any(f.kind == "model_switched" for f in frames)
            rid = await acp.request(
                "session/set_config_option",
                {"sessionId": sid, "configId": "model", "value": "scripted-fast"},
            )
            reply = (await sess.until(lambda f: f.message.get("id") == rid))[-1]
            assert isinstance(reply.message["result"]["configOptions"], list)
            rid = await acp.request(
                "session/set_config_option", {"sessionId": sid, "configId": "x", "value": "y"}
            )
            assert (await sess.reply(rid)).message["error"]["code"] == -32602
            rid = await acp.request(
                "session/set_mode", {"sessionId": sid, "modeId": "no-such-mode"}
            )
            assert (await sess.reply(rid)).message["error"]["code"] == -32602

            # session/cancel as a notification ends the running turn.
            rid = await acp.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "[sleep 20000] late"}]},
            )
            await sess.until(
                lambda f: (
                    f.method == "session/update"
                    and f.message["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                )
            )
            r = await acp.post(
                {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}
            )
            assert r.status_code == 202
            reply = await sess.reply(rid)
            assert reply.message["result"]["stopReason"] == "cancelled"


async def test_load_replays_history_and_resume_does_not(
    acp: AcpHttp, client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    ws = _ws(daemon_proc)
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(ws, conn))["sessionId"]
        async with acp.stream(sid) as sess:
            rid = await acp.request(
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": "remember me"}]},
            )
            await sess.reply(rid)
    # A second connection loads the (live) session: its history is replayed to it.
    async with trio.open_nursery() as nursery:
        other = AcpHttp(client, nursery)
        await other.initialize({"protocolVersion": 1})
        async with other.stream() as conn2:
            rid = await other.request("session/load", {"sessionId": sid, "cwd": ws})
            loaded = (await conn2.reply(rid)).message["result"]
            assert loaded["sessionId"] == sid and loaded["attached"] is True
            assert loaded["lastEventId"] >= 1 and loaded["eventEpoch"]
            async with other.stream(sid) as sess2:
                frames = await sess2.until(lambda f: f.kind == "replay_complete")
            texts = [
                f.message["params"]["update"].get("content", {}).get("text")
                for f in frames
                if f.method == "session/update"
            ]
            assert "remember me" in texts and "echo: remember me" in texts
            # resume on a third connection: no replay, live from now.
            third = AcpHttp(client, nursery)
            await third.initialize({"protocolVersion": 1})
            async with third.stream() as conn3:
                rid = await third.request("session/resume", {"sessionId": sid, "cwd": ws})
                assert (await conn3.reply(rid)).message["result"]["sessionId"] == sid
                async with third.stream(sid) as sess3:
                    rid = await third.request(
                        "session/prompt",
                        {"sessionId": sid, "prompt": [{"type": "text", "text": "now"}]},
                    )
                    frames = await sess3.until(lambda f: f.message.get("id") == rid)
            texts = [
                f.message["params"]["update"].get("content", {}).get("text")
                for f in frames
                if f.method == "session/update"
            ]
            assert "remember me" not in texts and "echo: now" in texts
            await client.delete("/acp", headers=other.headers())
            await client.delete("/acp", headers=third.headers())
            nursery.cancel_scope.cancel()


async def test_workspace_qualified_endpoint(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    ws = _ws(daemon_proc)
    path = f"/workspaces/{quote(ws, safe='')}/acp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
    r = await client.post(path, json=init)
    assert r.status_code == 200
    headers = {"Acp-Connection-Id": r.headers["acp-connection-id"]}
    async with client.stream(
        "GET", path, headers={**headers, "Accept": "text/event-stream"}
    ) as stream:
        r = await client.post(
            path,
            json={"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {}},
            headers=headers,
        )
        assert r.status_code == 202
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                reply = json.loads(line[6:])
                break
    # No cwd: the session is made in the endpoint's workspace.
    assert reply["result"]["workspaceCwd"] == ws
    assert (await client.delete(path, headers=headers)).status_code == 202
    r = await client.post("/workspaces/%2Fno%2Fsuch/acp", json=init)
    assert r.status_code == 404


async def test_prompt_params_are_checked_as_rest_checks_a_prompt_body(
    acp: AcpHttp, daemon_proc: DaemonProcess
) -> None:
    """One validation under both fronts (serve/api/prompts.py): ``promptId`` and
    ``deadlineMs`` get REST's bounds and codes at ``/acp`` too, as JSON-RPC -32602."""
    await acp.initialize({"protocolVersion": 1})
    async with acp.stream() as conn:
        sid = (await acp.new_session(_ws(daemon_proc), conn))["sessionId"]
        text = [{"type": "text", "text": "hi"}]
        async with acp.stream(sid) as sess:
            cases = [
                ({"deadlineMs": 2**31}, "invalid_deadline_ms"),
                ({"deadlineMs": 0}, "invalid_deadline_ms"),
                ({"promptId": ""}, "invalid_prompt_id"),
                ({"promptId": "x" * 129}, "invalid_prompt_id"),
            ]
            for extra, code in cases:
                rid = await acp.request(
                    "session/prompt", {"sessionId": sid, "prompt": text, **extra}
                )
                error = (await sess.reply(rid)).message["error"]
                assert error["code"] == -32602, error
                assert error["data"]["code"] == code and error["data"]["httpStatus"] == 400
            # The largest deadline REST takes is taken here too, and the turn runs.
            rid = await acp.request(
                "session/prompt", {"sessionId": sid, "prompt": text, "deadlineMs": 2**31 - 1}
            )
            assert (await sess.reply(rid)).message["result"]["stopReason"] == "end_turn"
