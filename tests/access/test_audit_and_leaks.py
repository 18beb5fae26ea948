"""The audit log on every path, and answers that tell a user nothing of others (issue 45,
items 7, 8 and 9), tried as an attacker would: two users of a real tokens file (alice and
bob, role ``user``), the operator token, a real daemon with the scripted agent.

* Every mutation is audited exactly once, with principal, action and session: a vote sent
  as the JSON-RPC response to a forwarded ``session/request_permission``, ``DELETE /acp``,
  a WebSocket's frames and its end.
* A flood of unauthenticated requests is counted and sampled, not written one by one: it
  cannot rotate the authenticated entries out of the retained log.
* Deep health, the permission counters, ``detach`` and every ``/acp`` session method, and a
  workspace bob may not use answer him as if what he may not see were not there.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.workspaces.runtimes import workspace_id
from tests.acpfront.helpers import Stream, Ws
from tests.serve.test_agent_pool import flaky_agent
from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "operator-token-0123456789"
OP = {"Authorization": f"Bearer {TOKEN}"}
TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef"}
ALICE = {"Authorization": f"Bearer {TOKENS['alice']}"}
BOB = {"Authorization": f"Bearer {TOKENS['bob']}"}
WAIT_S = 30.0


def tokens_file(tmp: Path) -> Path:
    path = tmp / "tokens.json"
    entries = [
        {"id": who, "sha256": hashlib.sha256(token.encode()).hexdigest(), "principal": who}
        for who, token in TOKENS.items()
    ]
    path.write_text(json.dumps(entries))
    return path


def start(tmp: Path, *args: str, workspace: Path | None = None) -> DaemonProcess:
    return spawn_daemon(
        ["--auth-tokens-file", str(tokens_file(tmp)), *args],
        workspace=workspace,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = start(tmp_path_factory.mktemp("audit"))
    yield d
    d.stop()


def client(d: DaemonProcess, headers: dict[str, str]) -> httpx.Client:
    return httpx.Client(base_url=d.url, headers=headers, timeout=30)


def new_session(http: httpx.Client, d: DaemonProcess) -> str:
    r = http.post("/session", json={"cwd": str(d.workspace), "sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return str(r.json()["sessionId"])


def settled(d: DaemonProcess) -> list[dict[str, Any]]:
    """Every entry written so far: a marker (bob's refused ``POST /workspace/reload``, with
    its own request id) is audited after them, so once it is readable, they all are."""
    marker = str(uuid.uuid4())
    r = httpx.post(f"{d.url}/workspace/reload", headers={**BOB, "X-Request-Id": marker}, timeout=30)
    assert r.status_code == 403, r.text
    deadline = time.monotonic() + WAIT_S
    while True:
        r = httpx.get(f"{d.url}/daemon/audit", params={"limit": 500}, headers=OP, timeout=30)
        assert r.status_code == 200, r.text
        entries: list[dict[str, Any]] = r.json()["entries"]
        if any(e.get("requestId") == marker for e in entries):
            return entries
        assert time.monotonic() < deadline, "the audit marker was never written"


def lines(entries: list[dict[str, Any]], who: str, action: str, sid: str) -> list[dict[str, Any]]:
    """The entries of ``who`` doing ``action`` (a route or an ACP method) on ``sid``."""
    return [
        e
        for e in entries
        if e.get("principal") == who
        and action in (e.get("route"), e.get("method"))
        and (e.get("session") == sid or sid in e.get("sessions", ()))
    ]


async def wait_for(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not predicate():  # noqa: ASYNC110 (a file the agent writes: no event to wait on)
            await trio.sleep(0.05)


# ---- item 7: every mutation is audited once, on every path --------------------------------


async def test_a_vote_sent_as_a_json_rpc_response_is_audited_once(
    daemon: DaemonProcess,
) -> None:
    """Bob, a collaborator on alice's session over the ``/acp`` WebSocket, answers the
    forwarded ``session/request_permission`` with a JSON-RPC response: the file is written,
    and the audit log has one line naming bob, the request and the session."""
    alice = client(daemon, ALICE)
    sid = await trio.to_thread.run_sync(new_session, alice, daemon)
    r = await trio.to_thread.run_sync(
        lambda: alice.put(f"/session/{sid}/members", json={"members": {"bob": "collaborator"}})
    )
    assert r.status_code == 200, r.text
    ws = await Ws.connect(daemon.port, headers=BOB)
    try:
        init = {"protocolVersion": 1}  # an ACP client: it gets requests, not notifications
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"sessionId": sid, "cwd": str(daemon.workspace), "mcpServers": []}
        await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": params})
        assert "result" in (await ws.until(lambda m: m.get("id") == 2))[-1]
        prompt = {"prompt": [{"type": "text", "text": "[write by_response.txt bob]"}]}
        r = await trio.to_thread.run_sync(
            lambda: alice.post(
                f"/session/{sid}/prompt", json=prompt, headers={"Prefer": "respond-async"}
            )
        )
        assert r.status_code == 202, r.text
        ask = (await ws.until(lambda m: m.get("method") == "session/request_permission"))[-1]
        allow = {"outcome": {"outcome": "selected", "optionId": "allow"}}
        await ws.send({"jsonrpc": "2.0", "id": ask["id"], "result": allow})
        await wait_for((daemon.workspace / "by_response.txt").exists)
    finally:
        await ws.abort()
    entries = await trio.to_thread.run_sync(settled, daemon)
    votes = lines(entries, "bob", "session/request_permission", sid)
    assert [(e["outcome"], e["status"]) for e in votes] == [("ok", 200)], entries


async def test_an_elicitation_answered_as_a_json_rpc_response_is_audited_once(
    daemon: DaemonProcess,
) -> None:
    """Bob's answer to a forwarded ``elicitation/create`` (a JSON-RPC response on his
    WebSocket) is a vote too: one line, his, naming the session."""
    ws = await Ws.connect(daemon.port, headers=BOB)
    try:
        init = {"protocolVersion": 1, "clientCapabilities": {"elicitation": {"form": {}}}}
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"cwd": str(daemon.workspace), "mcpServers": []}
        await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params})
        sid = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]["sessionId"]
        ask = {"sessionId": sid, "prompt": [{"type": "text", "text": "[elicit form]"}]}
        await ws.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": ask})
        asked = (await ws.until(lambda m: m.get("method") == "elicitation/create"))[-1]
        await ws.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}})
        done = (await ws.until(lambda m: m.get("id") == 3))[-1]
        assert done["result"]["stopReason"] == "end_turn", done
    finally:
        await ws.abort()
    entries = await trio.to_thread.run_sync(settled, daemon)
    answers = lines(entries, "bob", "elicitation/create", sid)
    assert [(e["outcome"], e["status"]) for e in answers] == [("ok", 200)], entries


async def test_delete_acp_is_audited_once_with_the_sessions_it_closed(
    daemon: DaemonProcess,
) -> None:
    """``DELETE /acp`` closes the session the connection made: one line, bob's, naming it."""
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as http:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        r = await http.post("/acp", json=init, headers=BOB)
        assert r.status_code == 200, r.text
        conn = {**BOB, "Acp-Connection-Id": r.headers["acp-connection-id"]}
        request = http.build_request(
            "GET", "/acp", headers={**conn, "Accept": "text/event-stream"}, timeout=None
        )
        response = await http.send(request, stream=True)
        try:
            stream = Stream(response)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.pump)
                params = {"cwd": str(daemon.workspace), "mcpServers": []}
                new = {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params}
                assert (await http.post("/acp", json=new, headers=conn)).status_code == 202
                sid = (await stream.reply(2)).message["result"]["sessionId"]
                assert (await http.delete("/acp", headers=conn)).status_code == 202
                nursery.cancel_scope.cancel()
        finally:
            await response.aclose()
    op = client(daemon, OP)

    def closed() -> bool:
        return op.get(f"/session/{sid}/context").status_code == 404

    await wait_for(closed)
    entries = await trio.to_thread.run_sync(settled, daemon)
    deleted = lines(entries, "bob", "DELETE /acp", sid)
    assert [(e["outcome"], e["status"]) for e in deleted] == [("ok", 202)], entries
    assert len(lines(entries, "bob", "session/new", sid) + deleted) == 1 + 1


async def test_websocket_frames_and_its_end_are_audited_once(daemon: DaemonProcess) -> None:
    """Over the WebSocket: a prompt is one line, a prompt cancelled by ``$/cancel_request``
    is one (``cancelled``) line, and the socket's end, which closes bob's session, is one."""
    ws = await Ws.connect(daemon.port, headers=BOB)
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"cwd": str(daemon.workspace), "mcpServers": []}
        await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params})
        sid = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]["sessionId"]
        text = {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
        await ws.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": text})
        assert "result" in (await ws.until(lambda m: m.get("id") == 3))[-1]
        slow = {"sessionId": sid, "prompt": [{"type": "text", "text": "begun [sleep 20000]"}]}
        await ws.send({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": slow})
        await ws.until(lambda m: "begun" in json.dumps(m))  # the turn runs
        cancel = {"requestId": 4}
        await ws.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": cancel})
        await ws.until(lambda m: m.get("id") == 4)
    finally:
        await ws.abort()
    op = client(daemon, OP)

    def closed() -> bool:
        return op.get(f"/session/{sid}/context").status_code == 404

    await wait_for(closed)
    entries = await trio.to_thread.run_sync(settled, daemon)
    prompts = lines(entries, "bob", "session/prompt", sid)
    assert sorted((e["outcome"], e["status"]) for e in prompts) == [
        ("cancelled", 499),
        ("ok", 200),
    ], entries
    ended = lines(entries, "bob", "WS /acp", sid)
    assert [(e["outcome"], e["status"]) for e in ended] == [("ok", 1000)], entries


# ---- item 8: unauthenticated failures are counted and sampled ------------------------------


def test_a_flood_of_bad_requests_cannot_rotate_the_audit_log(tmp_path: Path) -> None:
    """With ``--audit-max-bytes 65536`` (4 files: 256 KiB retained), 60 requests with 7 KB
    paths and ``Bearer nope`` and 60 with no credential leave alice's entries readable; the
    refusals are counted (``GET /daemon/audit`` ``refused``, ``/metrics``) and sampled."""
    d = start(tmp_path, "--audit-max-bytes", "65536")
    try:
        alice = client(d, ALICE)
        sid = new_session(alice, d)
        long_path = "/session/" + "x" * 7000
        with httpx.Client(base_url=d.url, timeout=30) as anyone:
            for _ in range(60):
                r = anyone.post(long_path, headers={"Authorization": "Bearer nope"})
                assert r.status_code == 401
                r = anyone.post(long_path)
                assert r.status_code == 401
        entries = settled(d)
        made = [
            e for e in entries if e.get("principal") == "alice" and e["route"] == "POST /session"
        ]
        assert [e["outcome"] for e in made] == ["ok"], entries
        sampled = [e for e in entries if e.get("status") == 401]
        assert 1 <= len(sampled) <= 4, sampled  # at most one per reason per minute
        assert all(len(e["route"]) < 300 and e["count"] >= 1 for e in sampled), sampled
        page = httpx.get(f"{d.url}/daemon/audit", headers=OP).json()
        assert page["refused"] == {"bad_credential": 60, "no_credential": 60}
        metrics = httpx.get(f"{d.url}/metrics", headers=OP).text
        assert 'acp_serve_auth_refused_total{reason="bad_credential"} 60.0' in metrics
        assert alice.get(f"/session/{sid}/context").status_code == 200
    finally:
        d.stop()


# ---- item 9: nothing about what the caller may not see -------------------------------------


def test_deep_health_is_for_admins(daemon: DaemonProcess) -> None:
    alice = client(daemon, ALICE)
    new_session(alice, daemon)
    plain = {"status": "ok"}
    assert client(daemon, BOB).get("/health", params={"deep": "1"}).json() == plain
    anonymous = httpx.get(f"{daemon.url}/health", params={"deep": "1"})  # loopback, no token
    assert (anonymous.status_code, anonymous.json()) == (200, plain)
    deep = client(daemon, OP).get("/health", params={"deep": "1"}).json()
    assert deep["sessions"] >= 1 and "pendingPermissions" in deep


def test_permission_counters_are_the_callers(tmp_path: Path) -> None:
    """Alice's turn asks for a permission, she allows it and the file is written (the
    Host counts its decisions): bob, with no session, sees zero everywhere; alice sees
    hers; the operator sees the daemon's."""
    daemon = start(tmp_path)
    try:
        _counters(daemon)
    finally:
        daemon.stop()


def _counters(daemon: DaemonProcess) -> None:
    alice = client(daemon, ALICE)
    sid = new_session(alice, daemon)
    prompt = {"prompt": [{"type": "text", "text": "[write counted.txt x]"}]}
    r = alice.post(f"/session/{sid}/prompt", json=prompt, headers={"Prefer": "respond-async"})
    assert r.status_code == 202, r.text
    request_id = None
    since = {"Last-Event-ID": str(r.json()["lastEventId"])}
    with alice.stream("GET", f"/session/{sid}/events", headers=since) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and '"permission_request"' in line:
                request_id = json.loads(line[6:])["data"]["requestId"]
                break
    assert request_id is not None
    vote = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    assert alice.post(f"/session/{sid}/permission/{request_id}", json=vote).status_code == 200
    trio.run(wait_for, (daemon.workspace / "counted.txt").exists)
    daemon_wide = client(daemon, OP).get("/workspace/permissions").json()
    assert sum(daemon_wide["decisions"].values()) >= 1, daemon_wide["decisions"]
    bob_view = client(daemon, BOB).get("/workspace/permissions").json()
    assert set(bob_view["decisions"].values()) == {0}, bob_view["decisions"]
    assert bob_view["sessions"] == [] and bob_view["alwaysAllow"]["entries"] == 0
    mine = alice.get("/workspace/permissions").json()
    assert sum(mine["decisions"].values()) >= 1, mine["decisions"]
    assert sid in [s["sessionId"] for s in mine["sessions"]]


def test_detach_answers_alike_for_another_users_session_and_an_unknown_id(
    daemon: DaemonProcess,
) -> None:
    alice = client(daemon, ALICE)
    sid = new_session(alice, daemon)
    bob = client(daemon, BOB)
    theirs = bob.post(f"/session/{sid}/detach")
    unknown = bob.post(f"/session/{uuid.uuid4()}/detach")
    assert (theirs.status_code, theirs.content) == (unknown.status_code, unknown.content)
    assert theirs.status_code == 204
    assert alice.get(f"/session/{sid}/context").status_code == 200  # nothing was detached
    # The audit log, for admins, tells the truth: bob was refused.
    refused = lines(settled(daemon), "bob", "POST /session/<session_id>/detach", sid)
    assert [(e["outcome"], e["status"]) for e in refused] == [("denied", 204)], refused
    # Every other session route: the same 404 for both.
    for method, route in (("GET", "context"), ("POST", "heartbeat"), ("DELETE", "")):
        answers = []
        for target in (sid, str(uuid.uuid4())):
            r = bob.request(method, f"/session/{target}" + (f"/{route}" if route else ""))
            answers.append((r.status_code, r.text.replace(target, "<id>")))
        assert answers[0] == answers[1] and answers[0][0] == 404, answers


async def test_acp_methods_answer_alike_for_another_users_session_and_an_unknown_id(
    daemon: DaemonProcess,
) -> None:
    alice = client(daemon, ALICE)
    sid = await trio.to_thread.run_sync(new_session, alice, daemon)
    cwd = str(daemon.workspace)
    methods: list[tuple[str, dict[str, Any]]] = [
        ("_qwen/session/heartbeat", {}),
        ("_qwen/session/detach", {}),
        ("_qwen/session/context", {}),
        ("_qwen/session/supported_commands", {}),
        ("session/prompt", {"prompt": [{"type": "text", "text": "x"}]}),
        ("session/cancel", {}),
        ("_session/steering", {"prompt": [{"type": "text", "text": "x"}]}),
        ("session/fork", {"cwd": cwd, "mcpServers": []}),
        ("session/permission", {"requestId": "r1", "outcome": {"outcome": "cancelled"}}),
        ("session/set_mode", {"modeId": "yolo"}),
        ("session/set_model", {"modelId": "m"}),
        ("_qwen/session/update_metadata", {"title": "t"}),
        ("session/close", {}),
        ("session/delete", {}),
    ]
    ws = await Ws.connect(daemon.port, headers=BOB)
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)
        rid = 10
        for method, params in methods:
            answers = []
            for target in (sid, str(uuid.uuid4())):
                rid += 1
                message = {"sessionId": target, **params}
                await ws.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": message})
                reply = (await ws.until(lambda m, rid=rid: m.get("id") == rid))[-1]
                answers.append(json.dumps(reply["error"]).replace(target, "<id>"))
            assert answers[0] == answers[1], (method, answers)
        # A restore of alice's live session is refused as not found (as on REST).
        rid += 1
        load = {"sessionId": sid, "cwd": cwd, "mcpServers": []}
        await ws.send({"jsonrpc": "2.0", "id": rid, "method": "session/load", "params": load})
        reply = (await ws.until(lambda m: m.get("id") == rid))[-1]
        assert reply["error"]["data"]["code"] == "session_not_found", reply
    finally:
        await ws.abort()
    r = await trio.to_thread.run_sync(alice.get, f"/session/{sid}/context")
    assert r.status_code == 200  # alice's session is untouched


async def test_a_restricted_workspace_answers_as_an_unserved_one(tmp_path: Path) -> None:
    """A second workspace only alice may use: bob gets, on every route that names a
    workspace, exactly what a workspace the daemon does not serve gets."""
    primary, private = tmp_path / "primary", tmp_path / "private"
    primary.mkdir()
    private.mkdir()
    (private / "note.txt").write_text("secret")
    (private / ".agent-down").touch()  # its agent fails: /readyz would name it
    config = tmp_path / "config.yaml"
    config.write_text(f"access:\n  workspaces:\n    {private}: [alice]\n")
    agent = flaky_agent("--down", ".agent-down")
    d = start(
        tmp_path,
        *("--workspace", str(private), "--config", str(config), "--agent", agent),
        workspace=primary,
    )
    try:
        unserved = tmp_path / "unserved"
        unserved.mkdir()
        refs = {
            "private": (str(private.resolve()), workspace_id(str(private.resolve()))),
            "unserved": (str(unserved.resolve()), workspace_id(str(unserved.resolve()))),
        }

        def rest(path: str, ref: str) -> tuple[int, str]:
            with client(d, BOB) as bob:
                if path == "POST /session":
                    r = bob.post("/session", json={"cwd": ref})
                elif path == "POST acp":
                    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
                    r = bob.post(f"/workspaces/{ref}/acp", json=init)
                else:
                    r = bob.get(f"/workspaces/{ref}/{path}", params={"path": "note.txt"})
            return r.status_code, r.text

        for path, which in (
            ("POST /session", 0),
            ("sessions", 1),
            ("file", 1),
            ("POST acp", 1),
        ):
            answers = []
            for name in ("private", "unserved"):
                ref = refs[name][which]
                status, text = await trio.to_thread.run_sync(rest, path, ref)
                answers.append((status, text.replace(ref, "<ws>")))
            assert answers[0] == answers[1], (path, answers)
            assert answers[0][0] in (400, 404), answers
        # The /acp WebSocket of the workspace, and session/new with its cwd.
        replies = []
        for name in ("private", "unserved"):
            path, ident = refs[name]
            ws = await Ws.connect(d.port, f"/workspaces/{ident}/acp", BOB)
            try:
                await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
                reply = (await ws.until(lambda m: m.get("id") == 1))[-1]
            finally:
                await ws.abort()
            replies.append(json.dumps(reply).replace(ident, "<ws>"))
            ws = await Ws.connect(d.port, "/acp", BOB)
            try:
                await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
                await ws.until(lambda m: m.get("id") == 1)
                params = {"cwd": path, "mcpServers": []}
                await ws.send(
                    {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params}
                )
                reply = (await ws.until(lambda m: m.get("id") == 2))[-1]
            finally:
                await ws.abort()
            replies.append(json.dumps(reply).replace(path, "<ws>"))
        assert replies[0] == replies[2] and replies[1] == replies[3], replies
        # Nor is it listed to bob: capabilities, and /readyz's failing agents.
        private_path = refs["private"][0]

        def listed(headers: dict[str, str]) -> tuple[list[str], list[str]]:
            caps = httpx.get(f"{d.url}/capabilities", headers=headers, timeout=30).json()
            ready = httpx.get(f"{d.url}/readyz", headers=headers, timeout=30).json()
            return [w["cwd"] for w in caps["workspaces"]], ready.get("agentsFailing", [])

        await wait_for(lambda: private_path in listed(OP)[1])
        assert await trio.to_thread.run_sync(listed, BOB) == ([str(primary.resolve())], [])
        ready = await trio.to_thread.run_sync(lambda: httpx.get(f"{d.url}/readyz").json())
        assert "agentsFailing" not in ready, ready  # an anonymous probe
        shown, failing = await trio.to_thread.run_sync(listed, ALICE)
        assert private_path in shown and failing == [private_path]
    finally:
        d.stop()


def test_every_rule_says_what_it_protects() -> None:
    from serve.access.rules import PROTECTS, RULES  # (here: the other tests run on old code)

    assert set(PROTECTS) == set(RULES)
