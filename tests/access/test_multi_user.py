"""Many users on one daemon, end to end: a real JWKS on 127.0.0.1 (keys made here with
cryptography), a real tokens file, a real daemon with the scripted agent.

User B never sees, reads, prompts, votes on, changes, forks or closes user A's session over
REST, SSE or /acp; an observer reads the stream and cannot vote; bad JWTs are one uniform
401; key rotation is picked up; every denial is in the audit log; two users in one working
directory get two sessions; a ``user`` changes nothing workspace- or daemon-wide.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from serve.workspaces.runtimes import workspace_id
from tests.acpfront.helpers import Stream, Ws, WsClosed
from tests.acpfront.test_attach import Editor
from tests.support.daemon import ROOT, DaemonProcess, running_daemon, spawn_daemon

TOKEN = "operator-token-0123456789"
OP = {"Authorization": f"Bearer {TOKEN}"}
AUD = "acp-serve-test"
ISS = "https://idp.test"
CAROL_TOKEN = "carol-scoped-token-abcdef"


class Jwks:
    """A JWKS served on 127.0.0.1, its keys made here; ``rotate`` adds a new one."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.add("k1")
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(jwks.document()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def document(self) -> dict[str, Any]:
        keys = []
        for kid, key in list(self.keys.items()):
            jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def token(self, sub: str, *, kid: str = "k1", **claims: Any) -> str:
        now = int(time.time())
        payload = {"sub": sub, "aud": AUD, "iss": ISS, "iat": now, "exp": now + 600, **claims}
        key = self.keys.get(kid) or rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def jwks() -> Iterator[Jwks]:
    server = Jwks()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def daemon(jwks: Jwks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("mu")
    tokens = tmp / "tokens.json"
    digest = hashlib.sha256(CAROL_TOKEN.encode()).hexdigest()
    tokens.write_text(json.dumps([{"id": "c1", "sha256": digest, "principal": "carol"}]))
    d = spawn_daemon(
        [
            "--auth-jwks-url",
            jwks.url,
            "--auth-issuer",
            ISS,
            "--auth-audience",
            AUD,
            "--auth-algorithms",
            "RS256",
            "--auth-tokens-file",
            str(tokens),
        ],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    yield d
    d.stop()


def client(d: DaemonProcess, headers: dict[str, str]) -> httpx.Client:
    return httpx.Client(base_url=d.url, headers=headers, timeout=30)


def new_session(http: httpx.Client, d: DaemonProcess) -> str:
    r = http.post("/session", json={"cwd": str(d.workspace)})
    assert r.status_code == 200, r.text
    return str(r.json()["sessionId"])


Entries = list[dict[str, Any]]


def audit(d: DaemonProcess, until: Callable[[Entries], bool]) -> Entries:
    """The audit log (newest first) once ``until`` holds of it: the audit actor writes in
    the background. Bounded: after 10 s, the entries as they are (the caller's assertion
    then says what is missing)."""
    deadline = time.monotonic() + 10.0
    while True:
        r = httpx.get(f"{d.url}/daemon/audit?limit=500", headers=OP)
        assert r.status_code == 200, r.text
        entries: Entries = r.json()["entries"]
        if until(entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.05)


def test_bad_jwts_are_one_uniform_401_and_audited(daemon: DaemonProcess, jwks: Jwks) -> None:
    now = int(time.time())
    bad = {
        "expired": jwks.token("alice", exp=now - 3600, iat=now - 7200),
        "wrong audience": jwks.token("alice", aud="someone-else"),
        "wrong issuer": jwks.token("alice", iss="https://evil.test"),
        "unknown kid": jwks.token("alice", kid="nobody"),
        "operator sub": jwks.token("operator"),
        "garbage": "not.a.jwt",
        "unknown token": "some-other-token",
    }
    for why, token in bad.items():
        r = httpx.get(f"{daemon.url}/capabilities", headers=bearer(token))
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), why
    good = httpx.get(f"{daemon.url}/capabilities", headers=bearer(jwks.token("alice")))
    assert good.status_code == 200
    body = good.json()
    assert body["principal"] == {"id": "alice", "kind": "jwt", "roles": ["user"]}
    assert "multi_user_auth" in body["features"]
    assert body["auth"] == {"modes": ["jwt", "tokens"]}

    def unauthorized(entries: Entries) -> Entries:
        return [e for e in entries if e.get("status") == 401]

    denied = unauthorized(audit(daemon, lambda es: bool(unauthorized(es))))
    assert denied and all(e["reason"] == "bad_credential" for e in denied), denied
    # Counted, and sampled rather than written one by one (serve/access/audit.py).
    page = httpx.get(f"{daemon.url}/daemon/audit", headers=OP).json()
    assert page["refused"]["bad_credential"] >= len(bad) > len(denied)


def test_key_rotation_is_picked_up(daemon: DaemonProcess, jwks: Jwks) -> None:
    assert httpx.get(f"{daemon.url}/capabilities", headers=bearer(jwks.token("alice"))).is_success
    time.sleep(1.1)  # refreshes are at least a second apart
    jwks.add("k2")
    r = httpx.get(f"{daemon.url}/capabilities", headers=bearer(jwks.token("alice", kid="k2")))
    assert r.status_code == 200, r.text


def test_scoped_token_from_the_file(daemon: DaemonProcess) -> None:
    r = httpx.get(f"{daemon.url}/capabilities", headers=bearer(CAROL_TOKEN))
    assert r.status_code == 200
    assert r.json()["principal"] == {"id": "carol", "kind": "token", "roles": ["user"]}
    op = httpx.get(f"{daemon.url}/capabilities", headers=OP).json()
    assert op["principal"] == {"id": "operator", "kind": "operator", "roles": ["admin"]}


def test_b_cannot_reach_a_session_over_rest_and_sse(daemon: DaemonProcess, jwks: Jwks) -> None:
    a = client(daemon, bearer(jwks.token("alice")))
    b = client(daemon, bearer(jwks.token("bob")))
    sid = new_session(a, daemon)
    # Two users in one working directory: B gets a session of its own, never A's.
    sid_b = new_session(b, daemon)
    assert sid_b != sid
    assert new_session(a, daemon) == sid  # A's single scope still attaches to A's own
    listed = b.get(f"/workspace/{daemon.workspace}/sessions".replace("//", "/")).json()
    assert [s["sessionId"] for s in listed["sessions"]] == [sid_b]
    prompt = {"prompt": [{"type": "text", "text": "hi"}]}
    refusals = {
        "events": b.get(f"/session/{sid}/events"),
        "context": b.get(f"/session/{sid}/context"),
        "prompt": b.post(f"/session/{sid}/prompt", json=prompt),
        "model": b.post(f"/session/{sid}/model", json={"modelId": "m"}),
        "mode": b.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"}),
        "fork": b.post(f"/session/{sid}/branch", json={}),
        "load": b.post(f"/session/{sid}/load", json={}),
        "members": b.put(f"/session/{sid}/members", json={"members": {"bob": "collaborator"}}),
        "close": b.delete(f"/session/{sid}"),
    }
    for what, r in refusals.items():
        assert r.status_code == 404, (what, r.text)
        assert r.json()["code"] == "session_not_found", what
    # Shared as observer: B reads the stream, and may not prompt or change anything.
    r = a.put(f"/session/{sid}/members", json={"members": {"bob": "observer"}})
    assert r.status_code == 200 and r.json()["members"] == {"bob": "observer"}
    with b.stream("GET", f"/session/{sid}/events") as stream:
        assert stream.status_code == 200
    r = b.post(f"/session/{sid}/prompt", json=prompt)
    assert r.status_code == 403
    assert r.json() == {
        "error": "This needs the role collaborator",
        "code": "forbidden",
        "need": "collaborator",
        "sessionId": sid,
    }
    assert b.delete(f"/session/{sid}").json()["need"] == "owner"

    def bobs(entries: Entries) -> Entries:
        return [e for e in entries if e.get("principal") == "bob"]

    # The refused close is the last of bob's requests: once it is in, every one is.
    closed = "DELETE /session/<session_id>"
    denials = bobs(audit(daemon, lambda es: any(e["route"] == closed for e in bobs(es))))
    assert {e["status"] for e in denials if e["outcome"] == "denied"} >= {403, 404}
    routes = {e["route"] for e in denials if e["outcome"] == "denied"}
    assert "POST /session/<session_id>/prompt" in routes
    assert "DELETE /session/<session_id>" in routes


def test_an_observer_cannot_vote(daemon: DaemonProcess, jwks: Jwks) -> None:
    a = client(daemon, bearer(jwks.token("alice2")))
    b = client(daemon, bearer(jwks.token("bob2")))
    sid = new_session(a, daemon)
    assert a.put(f"/session/{sid}/members", json={"members": {"bob2": "observer"}}).is_success
    r = a.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": "[write voted.txt hello]"}]},
        headers={"Prefer": "respond-async"},
    )
    assert r.status_code == 202, r.text
    request_id = None
    since = {"Last-Event-ID": str(r.json()["lastEventId"])}  # the turn's events, all of them
    with b.stream("GET", f"/session/{sid}/events", headers=since) as stream:  # the observer's
        for line in stream.iter_lines():
            if line.startswith("data: ") and '"permission_request"' in line:
                request_id = json.loads(line[6:])["data"]["requestId"]
                break
    assert request_id is not None
    vote = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    r = b.post(f"/session/{sid}/permission/{request_id}", json=vote)
    assert (r.status_code, r.json()["need"]) == (403, "collaborator")
    r = b.post(f"/permission/{request_id}", json=vote)  # by request id alone
    assert r.status_code == 404
    r = a.post(f"/session/{sid}/permission/{request_id}", json=vote)
    assert r.status_code == 200, r.text


def test_members_routes_two_users(daemon: DaemonProcess, jwks: Jwks) -> None:
    """GET/PUT /session/:id/members: someone else's session is a 404 both ways; an
    observer (and a collaborator) reads the members and may not change them; the owner's
    bad body is a 400; the refusals are audited."""
    a = client(daemon, bearer(jwks.token("alice6")))
    b = client(daemon, bearer(jwks.token("bob6")))
    sid = new_session(a, daemon)
    path = f"/session/{sid}/members"
    for r in (b.get(path), b.put(path, json={"members": {"bob6": "collaborator"}})):
        assert (r.status_code, r.json()["code"]) == (404, "session_not_found"), r.text
    for role in ("observer", "collaborator"):
        assert a.put(path, json={"members": {"bob6": role}}).is_success
        r = b.get(path)
        assert r.status_code == 200, r.text
        assert r.json() == {"sessionId": sid, "owner": "alice6", "members": {"bob6": role}}
        r = b.put(path, json={"members": {"bob6": "collaborator", "eve6": "observer"}})
        assert (r.status_code, r.json()["code"], r.json()["need"]) == (403, "forbidden", "owner")
    # Unchanged by the refused edits.
    assert a.get(path).json()["members"] == {"bob6": "collaborator"}
    for bad in (
        {"members": {"bob6": "owner"}},
        {"members": ["bob6"]},
        {"members": {"": "observer"}},
    ):
        r = a.put(path, json=bad)
        assert (r.status_code, r.json()["code"]) == (400, "invalid_members"), bad
    expected = {
        ("GET /session/<session_id>/members", 404),
        ("PUT /session/<session_id>/members", 404),
        ("PUT /session/<session_id>/members", 403),
    }

    def refused(entries: Entries) -> set[tuple[str, int]]:
        return {
            (e["route"], e["status"])
            for e in entries
            if e.get("principal") == "bob6" and e["outcome"] == "denied"
        }

    assert refused(audit(daemon, lambda es: refused(es) >= expected)) >= expected


def test_the_audit_log_is_for_admins(daemon: DaemonProcess, jwks: Jwks) -> None:
    """GET /daemon/audit: a ``user`` gets 403 need admin (audited); an admin by group
    pages it newest first; a bad page is a 400."""
    r = client(daemon, bearer(jwks.token("bob5"))).get("/daemon/audit")
    assert (r.status_code, r.json()["code"], r.json()["need"]) == (403, "forbidden", "admin")
    admin = client(daemon, bearer(jwks.token("ada", groups=["admin"])))

    def bob5_refused(entries: Entries) -> bool:
        return any(
            e.get("principal") == "bob5"
            and e["route"] == "GET /daemon/audit"
            and e["status"] == 403
            for e in entries
        )

    assert bob5_refused(audit(daemon, bob5_refused))
    r = admin.get("/daemon/audit", params={"limit": 2})
    assert r.status_code == 200, r.text
    page = r.json()
    assert len(page["entries"]) == 2 and page["nextBefore"] == page["entries"][-1]["seq"]
    assert page["entries"][0]["seq"] > page["entries"][1]["seq"]
    older = admin.get("/daemon/audit", params={"limit": 500, "before": page["nextBefore"]})
    assert all(e["seq"] < page["nextBefore"] for e in older.json()["entries"])
    for query in ({"limit": "x"}, {"before": "-1"}):
        r = admin.get("/daemon/audit", params=query)
        assert (r.status_code, r.json()["code"]) == (400, "invalid_page"), query


def test_without_auth_flags_the_routes_answer_for_the_operator() -> None:
    """No --auth-*: no multi_user_auth tag, the operator owns every session (its members
    route answers) and the audit log is off."""
    with running_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        op = client(d, OP)
        assert "multi_user_auth" not in op.get("/capabilities").json()["features"]
        assert "principal" not in op.get("/capabilities").json()
        sid = new_session(op, d)
        r = op.get(f"/session/{sid}/members")
        assert r.json() == {"sessionId": sid, "owner": "operator", "members": {}}
        r = op.get("/daemon/audit")
        assert (r.status_code, r.json()["code"]) == (404, "audit_log_off")


def test_a_user_changes_nothing_workspace_or_daemon_wide(daemon: DaemonProcess, jwks: Jwks) -> None:
    b = client(daemon, bearer(jwks.token("bob")))
    for method, path, body in (
        ("POST", "/workspace/settings", {"key": "x", "value": 1}),
        ("POST", "/workspace/memory", {"content": "x"}),
        ("POST", "/workspace/reload", {}),
        ("POST", "/workspace/init", {}),
        ("POST", "/workspace/tools/shell/enable", {"enabled": False}),
        ("POST", "/workspace/mcp/x/restart", {}),
        ("POST", "/workspace/auth/device-flow", {"providerId": "x"}),
        ("POST", "/daemon/drain", {}),
        ("POST", "/daemon/bind", {}),
        ("GET", "/daemon/status", None),
        ("GET", "/daemon/audit", None),
    ):
        r = b.request(method, path, json=body)
        assert (r.status_code, r.json().get("need")) == (403, "admin"), (path, r.text)


async def test_acp_websocket_b_never_reaches_a(daemon: DaemonProcess, jwks: Jwks) -> None:
    a = client(daemon, bearer(jwks.token("alice3")))
    sid = await trio.to_thread.run_sync(new_session, a, daemon)
    ws = await Ws.connect(daemon.port, headers=bearer(jwks.token("bob3")))
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)

        async def call(rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            await ws.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            return (await ws.until(lambda m: m.get("id") == rid))[-1]

        listed = await call(2, "session/list", {})
        assert sid not in [s["sessionId"] for s in listed["result"]["sessions"]]
        cwd = str(daemon.workspace)
        for rid, (method, params) in enumerate(
            (
                ("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
                ("session/resume", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
                ("session/fork", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
                ("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}),
                ("session/close", {"sessionId": sid}),
                ("session/set_mode", {"sessionId": sid, "modeId": "yolo"}),
            ),
            start=10,
        ):
            reply = await call(rid, method, params)
            # As for an unknown id: a restore or fork 404, a method on a session the
            # connection does not own 403 session_not_owned (test_audit_and_leaks.py).
            unknown = 404 if method in ("session/load", "session/resume", "session/fork") else 403
            assert reply["error"]["data"]["httpStatus"] == unknown, (method, reply)
        made = await call(30, "session/new", {"cwd": cwd, "mcpServers": []})
        assert made["result"]["sessionId"] != sid
        status = await call(31, "_qwen/status", {})
        assert status["error"]["data"]["need"] == "admin"
    finally:
        await ws.abort()

    def refused_status(entries: Entries) -> bool:  # the last of bob3's requests
        return any(
            e.get("principal") == "bob3" and e.get("method") == "_qwen/status" for e in entries
        )

    entries = await trio.to_thread.run_sync(audit, daemon, refused_status)
    bobs = [
        (e.get("method"), e["outcome"], e["status"])
        for e in entries
        if e.get("principal") == "bob3"
    ]
    denied = [m for m, outcome, _ in bobs if outcome == "denied"]
    assert {"session/load", "session/prompt", "session/close", "_qwen/status"} <= set(denied)
    assert len(denied) == len(set(denied)), bobs  # each refusal once
    # The WebSocket's successful mutation is audited by its method; its reads are not.
    assert ("session/new", "ok", 200) in bobs
    assert "session/list" not in [m for m, *_ in bobs]
    # A's session is untouched (the operator, an admin, still reads it).
    context = await trio.to_thread.run_sync(
        lambda: a.get(f"/session/{sid}/context", headers=OP).status_code
    )
    assert context == 200


async def test_the_audit_log_alone_records_mutations_without_multi_user_auth(
    tmp_path: Path,
) -> None:
    """``--audit-log`` without ``--auth-*``: the operator's REST and ``/acp`` WebSocket
    mutations are audited (reads are not), and the operator pages them."""
    log = tmp_path / "audit.jsonl"
    d = spawn_daemon(["--audit-log", str(log)], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        http = client(d, OP)
        sid = await trio.to_thread.run_sync(new_session, http, d)
        assert (await trio.to_thread.run_sync(http.get, "/session/" + sid + "/context")).is_success
        ws = await Ws.connect(d.port, headers=OP)
        try:
            await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
            await ws.until(lambda m: m.get("id") == 1)
            params = {"cwd": str(d.workspace), "mcpServers": []}
            await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params})
            made = (await ws.until(lambda m: m.get("id") == 2))[-1]
            await ws.send({"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {}})
            await ws.until(lambda m: m.get("id") == 3)
        finally:
            await ws.abort()
        # A last mutation: once its entry is in, every request before it has been audited
        # (the actor writes in order), so a read recorded by mistake would show too.
        closed = await trio.to_thread.run_sync(http.delete, "/session/" + sid)
        assert closed.status_code == 204, closed.text
        last = "DELETE /session/<session_id>"
        entries = await trio.to_thread.run_sync(
            audit, d, lambda es: any(e.get("route") == last for e in es)
        )
        seen = {
            (e.get("route") or e.get("method"), e.get("session"), e["outcome"]) for e in entries
        }
        assert ("POST /session", sid, "ok") in seen, entries
        assert ("session/new", made["result"]["sessionId"], "ok") in seen, entries
        assert all(e["principal"] == "operator" for e in entries), entries
        assert not [e for e in entries if e.get("method") == "session/list"]
        assert not [e for e in entries if str(e.get("route", "")).startswith("GET ")]
        assert made["result"]["sessionId"] != sid
        on_disk = [json.loads(line) for line in log.read_text().splitlines()]
        assert [e["seq"] for e in on_disk] == sorted(e["seq"] for e in entries)
    finally:
        d.stop()


def test_workspace_access_rules(jwks: Jwks, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "note.txt").write_text("secret")
    config = tmp_path / "config.yaml"
    config.write_text(f"access:\n  workspaces:\n    {ws}: [alice, 'group:team']\n")
    d = spawn_daemon(
        ["--auth-jwks-url", jwks.url, "--auth-audience", AUD, "--config", str(config)],
        workspace=ws,
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        for who, groups, allowed in (
            ("alice", [], True),
            ("dan", ["team"], True),
            ("eve", [], False),
        ):
            http = client(d, bearer(jwks.token(who, groups=groups)))
            file = http.get("/file", params={"path": "note.txt"})
            session = http.post("/session", json={"cwd": str(ws)})
            if allowed:
                assert file.status_code == 200 and session.status_code == 200, who
            else:
                for r in (file, session):
                    assert r.status_code == 404, r.text
                    assert r.json()["code"] == "workspace_not_found"
        # The workspace's own /acp WebSocket is refused at its handshake, and audited.
        path = f"/workspaces/{workspace_id(str(ws.resolve()))}/acp"
        with pytest.raises(WsClosed) as refused:
            trio.run(Ws.connect, d.port, path, bearer(jwks.token("eve")))
        assert str(refused.value) == "closed -404"

        def eves(entries: Entries) -> Entries:
            return [e for e in entries if e["principal"] == "eve" and e["route"].startswith("WS ")]

        denied = eves(audit(d, lambda es: bool(eves(es))))
        assert [(e["outcome"], e["status"]) for e in denied] == [("denied", 404)], denied
    finally:
        d.stop()


def test_head_is_refused_or_allowed_as_its_get(daemon: DaemonProcess, jwks: Jwks) -> None:
    b = client(daemon, bearer(jwks.token("bob6")))
    for path, status in (("/capabilities", 200), ("/workspace/settings", 200)):
        assert b.get(path).status_code == status, path
        assert b.head(path).status_code == status, path
    assert b.head("/daemon/status").status_code == b.get("/daemon/status").status_code == 403


def _auth_args(jwks: Jwks) -> list[str]:
    return ["--auth-jwks-url", jwks.url, "--auth-audience", AUD, "--auth-issuer", ISS]


def test_ownership_survives_a_daemon_restart(jwks: Jwks, tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"QWEN_SERVER_TOKEN": TOKEN}
    d = spawn_daemon(_auth_args(jwks), workspace=tmp_path / "ws", state_dir=state, env=env)
    try:
        a = client(d, bearer(jwks.token("alice")))
        sid = new_session(a, d)
        r = a.put(f"/session/{sid}/members", json={"members": {"carl": "observer"}})
        assert r.is_success
        r = a.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "x"}]})
        assert r.status_code == 200, r.text
    finally:
        d.stop()
    d = spawn_daemon(_auth_args(jwks), workspace=tmp_path / "ws", state_dir=state, env=env)
    try:
        b = client(d, bearer(jwks.token("bob")))
        r = b.post(f"/session/{sid}/load", json={})
        assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
        assert b.get(f"/session/{sid}/context").status_code == 404  # nothing was loaded
        a = client(d, bearer(jwks.token("alice")))
        assert a.post(f"/session/{sid}/load", json={}).status_code == 200
        members = a.get(f"/session/{sid}/members").json()
        assert members == {"sessionId": sid, "owner": "alice", "members": {"carl": "observer"}}
        carl = client(d, bearer(jwks.token("carl")))
        assert carl.get(f"/session/{sid}/context").status_code == 200
        r = carl.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "y"}]})
        assert r.status_code == 403
    finally:
        d.stop()


def test_quotas_per_principal(jwks: Jwks) -> None:
    d = spawn_daemon(
        [*_auth_args(jwks), "--quota-sessions", "1", "--quota-prompts-per-minute", "2"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        b = client(d, bearer(jwks.token("bob")))
        sid = new_session(b, d)
        assert new_session(b, d) == sid  # attaching to its own single session is no new one
        r = b.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 429
        body = r.json()
        assert (body["code"], body["quota"], body["limit"]) == ("quota_exceeded", "sessions", 1)
        assert r.headers["Retry-After"] == "5"
        prompt = {"prompt": [{"type": "text", "text": "x"}]}
        assert [b.post(f"/session/{sid}/prompt", json=prompt).status_code for _ in range(3)] == [
            200,
            200,
            429,
        ]
        # Another principal has its own quota; the operator (an admin) has none.
        c = client(d, bearer(jwks.token("carol")))
        assert c.post("/session", json={"sessionScope": "thread"}).status_code == 200
        op = client(d, OP)
        assert all(
            op.post("/session", json={"sessionScope": "thread"}).status_code == 200
            for _ in range(2)
        )
    finally:
        d.stop()


async def test_two_attach_clients_in_one_directory(daemon: DaemonProcess, jwks: Jwks) -> None:
    tmp = daemon.state_dir.parent
    token_file = tmp / "alice.jwt"
    token_file.write_text(jwks.token("attach-alice") + "\n")
    cwd = str(daemon.workspace.resolve())
    meta = {"qwen-code/sessionScope": "single"}
    editors = []
    for argv_extra, env_token in ((["--token-file", str(token_file)], None), ([], "bob")):
        env = {"PATH": "/usr/bin:/bin"}
        if env_token is not None:
            env["QWEN_SERVER_TOKEN"] = jwks.token("attach-bob")
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "serve", "attach", daemon.url, *argv_extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        editors.append(Editor(process))
    alice, bob = editors
    try:
        sids = []
        for editor in editors:
            init = await editor.request(1, "initialize", {"protocolVersion": 1})
            assert "result" in init, init
            made = await editor.request(
                2, "session/new", {"cwd": cwd, "mcpServers": [], "_meta": meta}
            )
            sids.append(made["result"]["sessionId"])
        assert sids[0] != sids[1]
        again = await alice.request(3, "session/new", {"cwd": cwd, "mcpServers": [], "_meta": meta})
        assert again["result"]["sessionId"] == sids[0]
        stolen = await bob.request(
            4, "session/load", {"sessionId": sids[0], "cwd": cwd, "mcpServers": []}
        )
        assert stolen["error"]["data"]["httpStatus"] == 404
    finally:
        for editor in editors:
            assert editor.process.stdin is not None
            await editor.process.stdin.aclose()
            with trio.fail_after(30):
                await editor.process.wait()


async def test_acp_over_http_fixes_the_principal_at_initialize(
    daemon: DaemonProcess, jwks: Jwks
) -> None:
    a = client(daemon, bearer(jwks.token("alice4")))
    sid = await trio.to_thread.run_sync(new_session, a, daemon)
    bob = bearer(jwks.token("bob4"))
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as http:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        r = await http.post("/acp", json=init, headers=bob)
        assert r.status_code == 200, r.text
        conn = {**bob, "Acp-Connection-Id": r.headers["acp-connection-id"]}
        # Alice's credentials cannot use Bob's connection (nor the reverse).
        alice_on_it = {
            **bearer(jwks.token("alice4")),
            "Acp-Connection-Id": conn["Acp-Connection-Id"],
        }
        probe = {"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}}
        assert (await http.post("/acp", json=probe, headers=alice_on_it)).status_code == 404
        request = http.build_request(
            "GET", "/acp", headers={**conn, "Accept": "text/event-stream"}, timeout=None
        )
        response = await http.send(request, stream=True)
        try:
            stream = Stream(response)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.pump)
                cwd = str(daemon.workspace)
                for rid, (method, params) in enumerate(
                    (
                        ("session/load", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
                        ("session/fork", {"sessionId": sid, "cwd": cwd, "mcpServers": []}),
                        ("session/permission", {"requestId": "perm-1"}),
                    ),
                    start=10,
                ):
                    message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
                    assert (await http.post("/acp", json=message, headers=conn)).status_code == 202
                    reply = (await stream.reply(rid)).message
                    assert reply["error"]["data"]["httpStatus"] == 404, (method, reply)
                listed = {"jsonrpc": "2.0", "id": 20, "method": "session/list", "params": {}}
                assert (await http.post("/acp", json=listed, headers=conn)).status_code == 202
                sessions = (await stream.reply(20)).message["result"]["sessions"]
                assert sid not in [s["sessionId"] for s in sessions]
                nursery.cancel_scope.cancel()
        finally:
            await response.aclose()


async def test_a_group_collaborator_votes_over_acp_with_keys_from_a_file(
    jwks: Jwks, tmp_path: Path
) -> None:
    """``--auth-jwks-file`` and a ``sessionGroups`` rule: a member of the group, who holds
    no role of its own on alice's session, loads it over the ``/acp`` WebSocket and its
    answer to the permission request is the vote that lets the turn write."""
    keys = tmp_path / "jwks.json"
    keys.write_text(json.dumps(jwks.document()))
    config = tmp_path / "config.yaml"
    config.write_text("access:\n  sessionGroups:\n    reviewers: collaborator\n")
    d = spawn_daemon(
        ["--auth-jwks-file", str(keys), "--auth-audience", AUD, "--config", str(config)],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        alice = client(d, bearer(jwks.token("alice7")))
        sid = await trio.to_thread.run_sync(new_session, alice, d)
        ws = await Ws.connect(d.port, headers=bearer(jwks.token("rev", groups=["reviewers"])))
        try:
            init = {"protocolVersion": 1}  # an ACP client: it sees requests, not notifications
            await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
            await ws.until(lambda m: m.get("id") == 1)
            params = {"sessionId": sid, "cwd": str(d.workspace), "mcpServers": []}
            await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": params})
            loaded = (await ws.until(lambda m: m.get("id") == 2))[-1]
            assert "result" in loaded, loaded
            prompt = {"prompt": [{"type": "text", "text": "[write by_group.txt voted]"}]}
            r = await trio.to_thread.run_sync(
                lambda: alice.post(
                    f"/session/{sid}/prompt", json=prompt, headers={"Prefer": "respond-async"}
                )
            )
            assert r.status_code == 202, r.text
            ask = (await ws.until(lambda m: m.get("method") == "session/request_permission"))[-1]
            allow = {"outcome": {"outcome": "selected", "optionId": "allow"}}
            await ws.send({"jsonrpc": "2.0", "id": ask["id"], "result": allow})
            written = d.workspace / "by_group.txt"
            with trio.fail_after(30):  # until its content is there (the file exists first)
                while not (written.exists() and written.read_text() == "voted"):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            assert written.read_text() == "voted"
        finally:
            await ws.abort()
        # Without the group, the same principal has no role: the session is not disclosed.
        outsider = client(d, bearer(jwks.token("rev")))
        r = await trio.to_thread.run_sync(outsider.get, f"/session/{sid}/context")
        assert r.status_code == 404
    finally:
        d.stop()


def test_a_principals_token_budget_counts_its_closed_sessions(jwks: Jwks) -> None:
    """``--quota-token-budget``: what a closed session spent still counts, so closing a
    session and opening another does not reset the principal's spending."""
    d = spawn_daemon(
        [*_auth_args(jwks), "--quota-token-budget", "1000"], env={"QWEN_SERVER_TOKEN": TOKEN}
    )
    try:
        bob = client(d, bearer(jwks.token("bob8")))
        first = bob.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        spend = {"prompt": [{"type": "text", "text": "[usage 1200] spend"}]}
        assert bob.post(f"/session/{first}/prompt", json=spend).status_code == 200
        assert bob.delete(f"/session/{first}").status_code in (200, 204)
        second = bob.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        r = bob.post(f"/session/{second}/prompt", json={"prompt": [{"type": "text", "text": "x"}]})
        assert r.status_code == 402, r.text
        body = r.json()
        assert (body["code"], body["scope"], body["dimension"]) == (
            "budget_exhausted",
            "principal",
            "token",
        )
        assert body["spent"] >= 1200 and body["limit"] == 1000
        # Another principal's budget is its own.
        carl = client(d, bearer(jwks.token("carl8")))
        sid = carl.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        ok = carl.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "y"}]})
        assert ok.status_code == 200, ok.text
    finally:
        d.stop()
