"""Issue 45 items 1 and 2, and the retention takeover: whoever restores a session that is
not live goes by its owner record, as an attacker would try it.

Two users of a tokens file (``ann`` and ``ben``, role ``user``) and the operator token, a
real daemon with the scripted agent (its sessions kept in the state directory, so a closed
session can be loaded again through the agent). Every session has an owner on record from
its first event, the operator's too; a session with none is restored by ``admin`` only;
with ``--no-journal``, or once the janitor deleted a closed session's journal, the daemon
still knows the owner of a closed session.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from pathlib import Path

import httpx
import trio

from tests.acpfront.helpers import Ws
from tests.support.daemon import ROOT, DaemonProcess, spawn_daemon

TOKEN = "operator-token-owner-records"
OP = {"Authorization": f"Bearer {TOKEN}"}
ANN = "ann-token-0123456789"
BEN = "ben-token-0123456789"
ENV = {"QWEN_SERVER_TOKEN": TOKEN}


def tokens_file(directory: Path) -> Path:
    path = directory / "tokens.json"
    path.write_text(
        json.dumps(
            [
                {"id": n, "sha256": hashlib.sha256(t.encode()).hexdigest(), "principal": n}
                for n, t in (("ann", ANN), ("ben", BEN))
            ]
        )
    )
    return path


def client(d: DaemonProcess, token: str) -> httpx.Client:
    return httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def made_prompted_closed(http: httpx.Client, text: str) -> str:
    """A thread session of the caller, prompted with ``text``, then closed."""
    r = http.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    sid = str(r.json()["sessionId"])
    r = http.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]})
    assert r.status_code == 200, r.text
    assert http.delete(f"/session/{sid}").status_code in (200, 204)
    return sid


def refused(r: httpx.Response) -> None:
    assert r.status_code == 404, r.text
    assert r.json()["code"] == "session_not_found", r.text


def owner(http: httpx.Client, sid: str) -> str:
    r = http.get(f"/session/{sid}/members")
    assert r.status_code == 200, r.text
    return str(r.json()["owner"])


async def acp_restores(d: DaemonProcess, token: str, sid: str) -> list[int]:
    """``session/load`` and ``session/resume`` of ``sid`` over the ``/acp`` WebSocket: the
    ``httpStatus`` of each answer (200: restored)."""
    ws = await Ws.connect(d.port, headers={"Authorization": f"Bearer {token}"})
    out = []
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"sessionId": sid, "cwd": str(d.workspace), "mcpServers": []}
        for rid, method in ((2, "session/load"), (3, "session/resume")):
            await ws.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            reply = (await ws.until(lambda m, rid=rid: m.get("id") == rid))[-1]
            out.append(200 if "result" in reply else reply["error"]["data"]["httpStatus"])
    finally:
        await ws.abort()
    return out


def test_a_closed_operator_session_is_not_taken_over(
    tmp_path: Path, journal_args: list[str]
) -> None:
    """Item 1: the operator's session, closed, is not B's to load (it was: B owned it and
    read the operator's prompt); A cannot either; the operator still can. The owner record
    is the journal's: on files and on PostgreSQL."""
    d = spawn_daemon(["--auth-tokens-file", str(tokens_file(tmp_path)), *journal_args], env=ENV)
    try:
        op, ann, ben = client(d, TOKEN), client(d, ANN), client(d, BEN)
        sid = made_prompted_closed(op, "the operator's secret plan")
        refused(ben.post(f"/session/{sid}/load", json={}))
        refused(ben.post(f"/session/{sid}/resume", json={}))
        refused(ann.post(f"/session/{sid}/load", json={}))
        assert trio.run(acp_restores, d, BEN, sid) == [404, 404]  # /acp load and resume
        refused(ben.get(f"/session/{sid}/members"))  # nothing was restored for them
        assert op.post(f"/session/{sid}/load", json={}).status_code == 200
        assert owner(op, sid) == "operator"
        # Live now: still not theirs.
        refused(ben.post(f"/session/{sid}/load", json={}))
    finally:
        d.stop()


def test_a_session_journaled_before_auth_is_restored_by_admin_only(tmp_path: Path) -> None:
    """Item 1: a journal with no owner record (written before ``--auth-*`` was turned on,
    by a daemon that did not record the operator) is restorable by ``admin`` only."""
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    d = spawn_daemon([], workspace=ws, state_dir=state, env=ENV)
    try:
        sid = made_prompted_closed(client(d, TOKEN), "before auth")
    finally:
        d.stop()
    meta_path = state / "journal" / sid / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert json.loads(meta["meta"]["attrs"]["access"])["owner"] == "operator"  # recorded now
    del meta["meta"]["attrs"]["access"]  # as an older daemon left it
    meta_path.write_text(json.dumps(meta))
    args = ["--auth-tokens-file", str(tokens_file(tmp_path))]
    d = spawn_daemon(args, workspace=ws, state_dir=state, env=ENV)
    try:
        op, ann, ben = client(d, TOKEN), client(d, ANN), client(d, BEN)
        for http in (ben, ann):
            refused(http.post(f"/session/{sid}/load", json={}))
            refused(http.post(f"/session/{sid}/resume", json={}))
        assert op.post(f"/session/{sid}/load", json={}).status_code == 200
        assert owner(op, sid) == "operator"
    finally:
        d.stop()


def test_without_a_journal_a_closed_session_keeps_its_owner(tmp_path: Path) -> None:
    """Item 2: with ``--no-journal`` B could load A's closed session and own it (A's own
    load was then a 404); the daemon now keeps the owner of a closed session."""
    args = ["--no-journal", "--auth-tokens-file", str(tokens_file(tmp_path))]
    d = spawn_daemon(args, env=ENV)
    try:
        ann, ben = client(d, ANN), client(d, BEN)
        sid = made_prompted_closed(ann, "ann without a journal")
        refused(ben.post(f"/session/{sid}/load", json={}))
        refused(ben.post(f"/session/{sid}/resume", json={}))
        r = ann.post(f"/session/{sid}/load", json={})
        assert r.status_code == 200, r.text
        assert owner(ann, sid) == "ann"
        # Shared, closed again: the member's role comes back with it.
        r = ann.put(f"/session/{sid}/members", json={"members": {"ben": "observer"}})
        assert r.is_success, r.text
        assert ann.delete(f"/session/{sid}").status_code in (200, 204)
        assert ben.post(f"/session/{sid}/load", json={}).status_code == 200
        assert owner(ben, sid) == "ann"
        r = ben.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "x"}]})
        assert r.status_code == 403
    finally:
        d.stop()


def test_a_journal_the_janitor_deleted_does_not_hand_the_session_over(tmp_path: Path) -> None:
    """Suspected: retention deletes a closed session's journal (its owner record with it)
    while the agent keeps the session. B's load went to the agent and B owned it; now the
    daemon's kept record answers, and after a restart (no record at all) only an admin
    restores it."""
    state = tmp_path / "state"
    ws = tmp_path / "ws"
    ws.mkdir()
    # The agent keeps its sessions for its own 7 days (the default scripted agent would
    # take the daemon's retention as its own and forget them too).
    agent = [sys.executable, "-m", "acp.agents.scripted", "--state-dir", str(ws / ".agent")]
    args = [
        "--journal-retention-ms",
        "1",
        "--agent",
        shlex.join(agent),
        "--auth-tokens-file",
        str(tokens_file(tmp_path)),
    ]
    d = spawn_daemon(args, workspace=ws, state_dir=state, env=ENV)
    try:
        ann, ben = client(d, ANN), client(d, BEN)
        sid = made_prompted_closed(ann, "ann's retained notes")
        journal = state / "journal" / sid
        deadline = time.monotonic() + 30
        while journal.exists():
            assert time.monotonic() < deadline, "the janitor did not delete the journal"
            time.sleep(0.1)
        refused(ben.post(f"/session/{sid}/load", json={}))
        assert ann.post(f"/session/{sid}/load", json={}).status_code == 200
        assert owner(ann, sid) == "ann"
        assert ann.delete(f"/session/{sid}").status_code in (200, 204)
    finally:
        d.stop()
    deadline = time.monotonic() + 30
    d = spawn_daemon(args, workspace=ws, state_dir=state, env=ENV)
    try:
        while (state / "journal" / sid).exists():
            assert time.monotonic() < deadline, "the janitor did not delete the journal"
            time.sleep(0.1)
        refused(client(d, BEN).post(f"/session/{sid}/load", json={}))
        assert client(d, TOKEN).post(f"/session/{sid}/load", json={}).status_code == 200
    finally:
        d.stop()


def _puppet(tmp_path: Path) -> list[str]:
    """An agent that forks only by qwen's vendor branch method (``newSessionId``) and
    loads any session."""
    config = {
        "respond": {
            "initialize": {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}},
            "session/new": {"sessionId": "puppet-parent"},
            "session/load": {},
            "session/prompt": {"stopReason": "end_turn"},
            "qwen/control/session/branch": {"newSessionId": "puppet-branch"},
        },
    }
    (tmp_path / "puppet.json").write_text(json.dumps(config))
    puppet = ROOT / "tests" / "acp" / "puppet_agent.py"
    log = tmp_path / "ws" / "log.jsonl"
    return [sys.executable, str(puppet), str(tmp_path / "puppet.json"), str(log)]


def test_a_vendor_branch_belongs_to_its_brancher(tmp_path: Path) -> None:
    """Item 1: a session made by the vendor branch route was restored with no owner (the
    operator's default, never journaled): its brancher could not reach it, and once closed
    anyone could load it and own it. Now it is the brancher's, on record."""
    ws = tmp_path / "ws"
    ws.mkdir()
    args = [
        "--agent",
        shlex.join(_puppet(tmp_path)),
        "--auth-tokens-file",
        str(tokens_file(tmp_path)),
    ]
    d = spawn_daemon(args, workspace=ws, env=ENV)
    try:
        ann, ben = client(d, ANN), client(d, BEN)
        r = ann.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 200, r.text
        parent = r.json()["sessionId"]
        r = ann.put(f"/session/{parent}/members", json={"members": {"ben": "collaborator"}})
        assert r.is_success, r.text
        r = ben.post(f"/session/{parent}/branch", json={})
        assert r.status_code == 201, r.text
        branch = r.json()
        assert (branch["sessionId"], branch["restored"]) == ("puppet-branch", True), branch
        assert owner(ben, "puppet-branch") == "ben"
        refused(ann.get("/session/puppet-branch/members"))  # a fork is its brancher's
        assert ben.delete("/session/puppet-branch").status_code in (200, 204)
        refused(ann.post("/session/puppet-branch/load", json={}))
        assert ben.post("/session/puppet-branch/load", json={}).status_code == 200
        assert owner(ben, "puppet-branch") == "ben"
    finally:
        d.stop()


def test_a_vendor_branch_only_persisted_is_its_branchers_after_a_restart(
    tmp_path: Path,
) -> None:
    """Item 1: a branch the agent only persisted (``atRecordId``: not loaded) had no owner
    on record, so anyone could load it and own it; it is its brancher's, also after a
    daemon restart (a journal holding only the record)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    args = [
        "--agent",
        shlex.join(_puppet(tmp_path)),
        "--auth-tokens-file",
        str(tokens_file(tmp_path)),
    ]
    d = spawn_daemon(args, workspace=ws, state_dir=state, env=ENV)
    try:
        ann, ben = client(d, ANN), client(d, BEN)
        parent = ann.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        r = ann.put(f"/session/{parent}/members", json={"members": {"ben": "collaborator"}})
        assert r.is_success, r.text
        r = ben.post(f"/session/{parent}/branch", json={"atRecordId": "r1"})
        assert r.status_code == 201, r.text
        assert (r.json()["sessionId"], r.json()["restored"]) == ("puppet-branch", False)
    finally:
        d.stop()
    d = spawn_daemon(args, workspace=ws, state_dir=state, env=ENV)
    try:
        ann, ben = client(d, ANN), client(d, BEN)
        refused(ann.post("/session/puppet-branch/load", json={}))
        assert ben.post("/session/puppet-branch/load", json={}).status_code == 200
        assert owner(ben, "puppet-branch") == "ben"
    finally:
        d.stop()
