"""Many users, round two (issue 45, items 3, 4 and 6), against real daemons with a tokens
file (alice and bob, role ``user``), the operator token and the scripted agent.

* A client id belongs to the principal that registered it: bob, holding alice's id, is
  answered as for an unknown id when he heartbeats, detaches, re-attaches, votes or stamps a
  workspace file event with it; alice's own actions still work.
* Every path that starts or extends a turn is charged to the prompt quota and the budgets:
  REST and ``/acp`` steering, ``btw`` and ``recap``.
* Removing a member, his group's role, or his token ends his open REST SSE stream and his
  ``/acp`` WebSocket within a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.access.steering_files import mentions, steering_part
from serve.sessions.clients import ClientTable
from serve.workspaces.runtimes import workspace_id
from tests.acpfront.helpers import Ws, WsClosed
from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "operator-token-0123456789"
OP = {"Authorization": f"Bearer {TOKEN}"}
ALICE = "alice-scoped-token-0123456789"
BOB = "bob-scoped-token-0123456789"
PROMPT = {"prompt": [{"type": "text", "text": "hi"}]}
ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow"}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token_entry(token: str, principal: str, **extra: Any) -> dict[str, Any]:
    digest = hashlib.sha256(token.encode()).hexdigest()
    return {"id": principal, "sha256": digest, "principal": principal, **extra}


def write_tokens(path: Path, *entries: dict[str, Any]) -> None:
    """Replace the tokens file at once (the daemon never reads half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(entries)))
    tmp.replace(path)


def users_daemon(tmp: Path, *args: str, config: str | None = None) -> DaemonProcess:
    tokens = tmp / "tokens.json"
    write_tokens(tokens, token_entry(ALICE, "alice"), token_entry(BOB, "bob"))
    argv = ["--auth-tokens-file", str(tokens), *args]
    if config is not None:
        (tmp / "config.yaml").write_text(config)
        argv += ["--config", str(tmp / "config.yaml")]
    return spawn_daemon(argv, env={"QWEN_SERVER_TOKEN": TOKEN})


def client(d: DaemonProcess, token: str) -> httpx.Client:
    return httpx.Client(base_url=d.url, headers=bearer(token), timeout=30)


def new_session(http: httpx.Client, scope: str = "single") -> tuple[str, str]:
    r = http.post("/session", json={"sessionScope": scope})
    assert r.status_code == 200, r.text
    return str(r.json()["sessionId"]), str(r.json()["clientId"])


def first_event(http: httpx.Client, sid: str, after: int, kind: str) -> dict[str, Any]:
    """The first ``kind`` event of ``sid`` after event ``after`` (its ``data``)."""
    with http.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(after)}
    ) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and f'"{kind}"' in line:
                return dict(json.loads(line[6:])["data"])
    raise AssertionError(f"no {kind} event")


# ---- item 3: client ids ------------------------------------------------------------------


def test_a_client_table_knows_whose_each_client_is() -> None:
    table = ClientTable(0)
    table.register("c1", "10.0.0.1", principal="alice")
    assert table.owned_by("c1", "alice") and not table.owned_by("c1", "bob")
    assert table.of("alice") == {"c1"} and table.of("bob") == frozenset()
    assert not table.stream_opened("c1", "bob")  # bob's stream naming it keeps nothing alive
    with pytest.raises(ValueError):
        table.register("c1", "10.0.0.2", principal="bob")


@pytest.fixture(scope="module")
def designated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = users_daemon(
        tmp_path_factory.mktemp("designated"),
        config="policy:\n  permissionStrategy: designated\n",
    )
    yield d
    d.stop()


def test_another_principals_client_id_is_an_unknown_one(designated: DaemonProcess) -> None:
    d = designated
    alice, bob = client(d, ALICE), client(d, BOB)
    sid, mine = new_session(alice)
    path = f"/session/{sid}"
    assert alice.put(f"{path}/members", json={"members": {"bob": "observer"}}).is_success
    as_alice = {"X-Qwen-Client-Id": mine}
    # Re-attaching with alice's id gives bob an id of his own; alice's is untouched.
    r = bob.post(f"{path}/load", json={}, headers=as_alice)
    assert r.status_code == 200, r.text
    his = r.json()["clientId"]
    assert his != mine
    # Heartbeat and detach with alice's id: as for an unknown id.
    for what, r in (
        ("heartbeat", bob.post(f"{path}/heartbeat", headers=as_alice)),
        ("detach", bob.post(f"{path}/detach", headers=as_alice)),
        ("pending", bob.get(f"{path}/pending-prompts", headers=as_alice)),
    ):
        assert (r.status_code, r.json()["code"]) == (400, "invalid_client_id"), (what, r.text)
    assert bob.post(f"{path}/heartbeat", headers={"X-Qwen-Client-Id": his}).status_code == 200
    # Workspace file events stamped with alice's id: refused; with his own: written.
    write = {"path": "bob.txt", "content": "b", "mode": "create"}
    r = bob.post("/file/write", json=write, headers=as_alice)
    assert (r.status_code, r.json()["code"]) == (400, "invalid_client_id"), r.text
    r = bob.post("/file/write", json=write, headers={"X-Qwen-Client-Id": his})
    assert r.status_code == 201, r.text
    # Alice's own client still works, and the session is still hers and open.
    r = alice.post(f"{path}/heartbeat", headers=as_alice)
    assert (r.status_code, r.json()["clientId"]) == (200, mine)
    # Designated: only alice's client may answer her prompt's permission request. Bob, now
    # a collaborator, cannot vote as her, by the session's route or the request id alone.
    assert alice.put(f"{path}/members", json={"members": {"bob": "collaborator"}}).is_success
    r = alice.post(
        f"{path}/prompt",
        json={"prompt": [{"type": "text", "text": "[write voted.txt by-alice]"}]},
        headers={"Prefer": "respond-async", **as_alice},
    )
    assert r.status_code == 202, r.text
    request = first_event(alice, sid, r.json()["lastEventId"], "permission_request")
    rid = request["requestId"]
    reject = {"outcome": {"outcome": "selected", "optionId": "reject"}}
    for r in (
        bob.post(f"{path}/permission/{rid}", json=reject, headers=as_alice),
        bob.post(f"/permission/{rid}", json=reject, headers=as_alice),
    ):
        assert (r.status_code, r.json()["code"]) == (400, "invalid_client_id"), r.text
    r = alice.post(f"{path}/permission/{rid}", json=ALLOW, headers=as_alice)
    assert r.status_code == 200, r.text
    first_event(alice, sid, 0, "turn_complete")
    assert (d.workspace / "voted.txt").read_text() == "by-alice"


async def test_an_acp_link_client_id_is_its_principals(designated: DaemonProcess) -> None:
    """The client id an ``/acp`` link was given is its principal's too: bob presenting
    alice's link id over REST is answered as for an unknown id."""
    d = designated
    ws = await Ws.connect(d.port, headers=bearer(ALICE))
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"cwd": str(d.workspace), "mcpServers": [], "_meta": {}}
        await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params})
        made = (await ws.until(lambda m: m.get("id") == 2))[-1]["result"]
        sid, link = made["sessionId"], made["clientId"]

        def rest() -> None:
            alice, bob = client(d, ALICE), client(d, BOB)
            members = {"members": {"bob": "collaborator"}}
            assert alice.put(f"/session/{sid}/members", json=members).is_success
            r = bob.post(f"/session/{sid}/heartbeat", headers={"X-Qwen-Client-Id": link})
            assert (r.status_code, r.json()["code"]) == (400, "invalid_client_id"), r.text
            r = bob.post(f"/session/{sid}/detach", headers={"X-Qwen-Client-Id": link})
            assert r.status_code == 400, r.text
            r = alice.post(f"/session/{sid}/heartbeat", headers={"X-Qwen-Client-Id": link})
            assert r.status_code == 200, r.text

        await trio.to_thread.run_sync(rest)
    finally:
        await ws.abort()


# ---- item 4: quotas and steering -----------------------------------------------------------


async def acp_steer(d: DaemonProcess, token: str, sid: str) -> dict[str, Any]:
    """One ``_session/steering`` of ``sid`` over a new ``/acp`` WebSocket (loaded first)."""
    ws = await Ws.connect(d.port, headers=bearer(token))
    try:
        await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
        await ws.until(lambda m: m.get("id") == 1)
        params = {"sessionId": sid, "cwd": str(d.workspace), "mcpServers": []}
        await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": params})
        loaded = (await ws.until(lambda m: m.get("id") == 2))[-1]
        assert "result" in loaded, loaded
        steer = {"sessionId": sid, "prompt": [{"type": "text", "text": "steer [usage 600]"}]}
        await ws.send({"jsonrpc": "2.0", "id": 3, "method": "_session/steering", "params": steer})
        return (await ws.until(lambda m: m.get("id") == 3))[-1]
    finally:
        await ws.abort()


async def test_steering_btw_and_recap_are_charged_to_the_prompt_quota(tmp_path: Path) -> None:
    d = users_daemon(tmp_path, "--quota-prompts-per-minute", "1")
    try:
        bob = client(d, BOB)
        sid, _ = await trio.to_thread.run_sync(new_session, bob)
        r = await trio.to_thread.run_sync(lambda: bob.post(f"/session/{sid}/prompt", json=PROMPT))
        assert r.status_code == 200, r.text
        refused = await acp_steer(d, BOB, sid)
        assert refused["error"]["data"]["httpStatus"] == 429, refused
        assert refused["error"]["data"]["code"] == "quota_exceeded"

        def rest() -> None:
            for what, r in (
                ("steer", bob.post(f"/session/{sid}/prompt", json={**PROMPT, "steer": True})),
                ("btw", bob.post(f"/session/{sid}/btw", json={"question": "why?"})),
                ("recap", bob.post(f"/session/{sid}/recap", json={})),
            ):
                assert r.status_code == 429, (what, r.text)
                assert (r.json()["code"], r.json()["quota"]) == (
                    "quota_exceeded",
                    "prompts_per_minute",
                ), what

        await trio.to_thread.run_sync(rest)
        # The operator (an admin) is exempt.
        ok = await acp_steer(d, TOKEN, sid)
        assert ok.get("result", {}).get("outcome") == "startedNewTurn", ok
    finally:
        d.stop()


async def test_steering_is_refused_once_the_token_budget_is_spent(tmp_path: Path) -> None:
    d = users_daemon(tmp_path, "--quota-token-budget", "1000")
    try:
        bob = client(d, BOB)
        sid, _ = await trio.to_thread.run_sync(new_session, bob)
        # Under the budget a steer starts a turn (and spends 600 tokens).
        first = await acp_steer(d, BOB, sid)
        assert first.get("result", {}).get("outcome") == "startedNewTurn", first
        await trio.to_thread.run_sync(first_event, bob, sid, 0, "turn_complete")
        spend = {"prompt": [{"type": "text", "text": "[usage 600] more"}]}
        r = await trio.to_thread.run_sync(lambda: bob.post(f"/session/{sid}/prompt", json=spend))
        assert r.status_code == 200, r.text
        refused = await acp_steer(d, BOB, sid)
        assert refused["error"]["data"]["httpStatus"] == 402, refused
        assert refused["error"]["data"]["code"] == "budget_exhausted"

        def rest() -> None:
            for what, r in (
                ("prompt", bob.post(f"/session/{sid}/prompt", json=PROMPT)),
                ("steer", bob.post(f"/session/{sid}/prompt", json={**PROMPT, "steer": True})),
                ("btw", bob.post(f"/session/{sid}/btw", json={"question": "why?"})),
                ("recap", bob.post(f"/session/{sid}/recap", json={})),
            ):
                assert r.status_code == 402, (what, r.text)
                assert r.json()["code"] == "budget_exhausted", what

        await trio.to_thread.run_sync(rest)
    finally:
        d.stop()


# ---- item 5: files that steer agents -------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "found"),
    [
        (("QWEN.md",), "QWEN.md"),
        (("sub", "deep", "agents.MD"), "sub/deep/agents.MD"),
        ((".Qwen", "settings.json"), ".Qwen"),
        ((".github", "copilot-instructions.md"), ".github/copilot-instructions.md"),
        (("NOTES.md",), "NOTES.md"),  # the configured memory file name
        (("src", "main.py"), None),
        ((".github", "workflows", "ci.yml"), None),
        (("qwen.md.bak",), None),
    ],
)
def test_the_steering_list(parts: tuple[str, ...], found: str | None) -> None:
    assert steering_part(parts, ("notes.md",)) == found


def test_the_shell_tripwire() -> None:
    assert mentions("echo hi > ./sub/Agents.md") == "Agents.md"
    assert mentions("cat .mcp.json") == ".mcp.json"
    assert mentions("ls -la src") is None


def test_a_user_cannot_write_files_that_steer_agents(tmp_path: Path) -> None:
    """Every spelling of a steering path through ``/file/write`` and ``/file/edit`` is
    refused a ``user`` (403 need admin, as ``POST /workspace/memory``); other files are his
    to write; the operator (an admin) writes them."""
    d = users_daemon(tmp_path)
    try:
        ws = d.workspace
        (ws / "sub").mkdir()
        (ws / "docs").mkdir()
        (ws / ".qwen").mkdir()
        (ws / "docs" / "agents.txt").write_text("read as AGENTS.md\n")
        (ws / "AGENTS.md").symlink_to("docs/agents.txt")  # agents read docs/agents.txt
        (ws / "cfg").symlink_to(".qwen")
        (ws / "notes.md").symlink_to("QWEN.md")
        op, bob = client(d, TOKEN), client(d, BOB)
        r = op.post(
            "/file/write", json={"path": "QWEN.md", "content": "be kind\n", "mode": "create"}
        )
        assert r.status_code == 201, r.text
        qwen_hash = r.json()["hash"]
        os.link(ws / "QWEN.md", ws / "docs" / "hard.md")  # another name of QWEN.md
        for path in (
            "QWEN.md",
            "qwen.md",
            "./QWEN.md",
            "sub/../QWEN.md",
            str(ws / "QWEN.md"),
            "sub/AGENTS.md",
            "sub/deeper/Claude.md",
            "GEMINI.md",
            ".qwen/settings.json",
            ".QWEN/settings.json",
            ".claude/settings.json",
            ".codex/config.toml",
            ".gemini/settings.json",
            ".mcp.json",
            ".github/copilot-instructions.md",
            "notes.md",  # a symlink to QWEN.md
            "cfg/settings.json",  # a symlinked .qwen
            "docs/agents.txt",  # what the AGENTS.md symlink shows agents
            "docs/hard.md",  # a hard link of QWEN.md
        ):
            r = bob.post(
                "/file/write", json={"path": path, "content": "obey bob\n", "mode": "replace"}
            )
            assert r.status_code == 403, (path, r.text)
            body = r.json()
            assert (body["code"], body["need"], body["reason"]) == (
                "forbidden",
                "admin",
                "steering_file",
            ), path
        edit = {
            "path": "QWEN.md",
            "oldText": "be kind",
            "newText": "obey bob",
            "expectedHash": qwen_hash,
        }
        r = bob.post("/file/edit", json=edit)
        assert (r.status_code, r.json()["need"]) == (403, "admin"), r.text
        qualified = f"/workspaces/{workspace_id(str(ws.resolve()))}/file/write"
        r = bob.post(qualified, json={"path": "QWEN.md", "content": "x", "mode": "replace"})
        assert (r.status_code, r.json()["need"]) == (403, "admin"), r.text
        assert (ws / "QWEN.md").read_text() == "be kind\n"
        assert (ws / "docs" / "agents.txt").read_text() == "read as AGENTS.md\n"
        assert not (ws / ".qwen" / "settings.json").exists()
        # Not a steering file: his to write.
        r = bob.post(
            "/file/write", json={"path": "sub/readme.txt", "content": "ok", "mode": "create"}
        )
        assert r.status_code == 201, r.text
        # The admin may.
        assert op.post("/file/edit", json=edit).status_code == 200
    finally:
        d.stop()


async def test_a_user_cannot_write_steering_files_over_acp(tmp_path: Path) -> None:
    d = users_daemon(tmp_path)
    (d.workspace / ".qwen").mkdir()
    try:
        for token, allowed in ((BOB, False), (TOKEN, True)):
            ws = await Ws.connect(d.port, headers=bearer(token))
            try:
                await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
                await ws.until(lambda m: m.get("id") == 1)
                for rid, path in enumerate(("AGENTS.md", "./sub/../.qwen/settings.json"), start=2):
                    params = {"path": path, "content": "x", "mode": "create"}
                    message = {"jsonrpc": "2.0", "id": rid, "method": "_qwen/file/write"}
                    await ws.send({**message, "params": params})
                    reply = (await ws.until(lambda m, rid=rid: m.get("id") == rid))[-1]
                    if allowed:
                        assert "result" in reply, reply
                    else:
                        assert reply["error"]["data"]["httpStatus"] == 403, reply
                        assert reply["error"]["data"]["need"] == "admin", reply
            finally:
                await ws.abort()
            assert (d.workspace / "AGENTS.md").exists() is allowed
    finally:
        d.stop()


def test_a_users_shell_command_naming_a_steering_file_is_refused(tmp_path: Path) -> None:
    d = users_daemon(tmp_path, "--enable-session-shell")
    try:
        alice, bob = client(d, ALICE), client(d, BOB)
        sid, _ = new_session(alice)
        assert alice.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"}).is_success
        members = {"members": {"bob": "collaborator"}}
        assert alice.put(f"/session/{sid}/members", json=members).is_success
        his = bob.post(f"/session/{sid}/load", json={}).json()["clientId"]
        shell = f"/session/{sid}/shell"
        for command in ("echo obey > QWEN.md", "cp x .Qwen/settings.json", "cat >> sub/agents.md"):
            r = bob.post(shell, json={"command": command}, headers={"X-Qwen-Client-Id": his})
            assert r.status_code == 403, (command, r.text)
            assert (r.json()["need"], r.json()["reason"]) == ("admin", "steering_file")
        assert not (d.workspace / "QWEN.md").exists()
        r = bob.post(shell, json={"command": "echo hi"}, headers={"X-Qwen-Client-Id": his})
        assert (r.status_code, r.json()["output"]) == (200, "hi\n"), r.text
        op = client(d, TOKEN)
        mine = op.post(f"/session/{sid}/load", json={}).json()["clientId"]
        r = op.post(
            shell, json={"command": "echo ok > QWEN.md"}, headers={"X-Qwen-Client-Id": mine}
        )
        assert r.status_code == 200, r.text
        assert (d.workspace / "QWEN.md").read_text() == "ok\n"
    finally:
        d.stop()


# ---- item 6: streams end with the access ----------------------------------------------------


class SseReader:
    """A REST SSE stream read in a thread: ``opened`` once its headers arrived, ``ended``
    (with the time) once the daemon ended it."""

    def __init__(self, d: DaemonProcess, token: str, sid: str) -> None:
        self.opened = threading.Event()
        self.ended = threading.Event()
        self.ended_at = 0.0
        self.status = 0
        self.frames: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(d, token, sid), daemon=True)
        self._thread.start()
        assert self.opened.wait(30), "the stream did not open"
        assert self.status == 200, self.status

    def _run(self, d: DaemonProcess, token: str, sid: str) -> None:
        with httpx.Client(base_url=d.url, headers=bearer(token), timeout=None) as http:
            try:
                with http.stream("GET", f"/session/{sid}/events") as stream:
                    self.status = stream.status_code
                    self.opened.set()
                    for line in stream.iter_lines():
                        self.frames.append(line)
            except httpx.HTTPError:
                pass
            finally:
                self.ended_at = time.monotonic()
                self.opened.set()
                self.ended.set()


async def open_ws(d: DaemonProcess, token: str, sid: str) -> Ws:
    """An ``/acp`` WebSocket with ``sid`` loaded."""
    ws = await Ws.connect(d.port, headers=bearer(token))
    await ws.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    await ws.until(lambda m: m.get("id") == 1)
    params = {"sessionId": sid, "cwd": str(d.workspace), "mcpServers": []}
    await ws.send({"jsonrpc": "2.0", "id": 2, "method": "session/load", "params": params})
    loaded = (await ws.until(lambda m: m.get("id") == 2))[-1]
    assert "result" in loaded, loaded
    return ws


def revoked(m: dict[str, Any]) -> bool:
    params = m.get("params") or {}
    return m.get("method") == "_qwen/notify" and params.get("kind") == "session_access_revoked"


#: "Within a second", with room for a loaded test machine.
BOUND_S = 2.0


@pytest.mark.parametrize("grant", ["bob", "group:eng"])
async def test_removing_a_member_or_his_groups_role_ends_his_streams(
    tmp_path: Path, grant: str
) -> None:
    tokens = tmp_path / "tokens.json"
    d = users_daemon(tmp_path)
    write_tokens(tokens, token_entry(ALICE, "alice"), token_entry(BOB, "bob", groups=["eng"]))
    try:
        alice = client(d, ALICE)
        sid, _ = await trio.to_thread.run_sync(new_session, alice)
        members = {"members": {grant: "observer"}}

        def share() -> SseReader:
            # (bob's token now carries his group: a request resolves it again)
            assert alice.put(f"/session/{sid}/members", json=members).is_success
            return SseReader(d, BOB, sid)

        sse = await trio.to_thread.run_sync(share)
        ws = await open_ws(d, BOB, sid)
        try:
            r = await trio.to_thread.run_sync(
                lambda: alice.put(f"/session/{sid}/members", json={"members": {}})
            )
            assert r.is_success, r.text
            removed_at = time.monotonic()
            with trio.fail_after(10):
                await ws.until(revoked)
            ws_s = time.monotonic() - removed_at
            assert await trio.to_thread.run_sync(sse.ended.wait, 10)
            sse_s = sse.ended_at - removed_at
            assert ws_s < BOUND_S and sse_s < BOUND_S, (ws_s, sse_s)
            # The socket stays open; the session is no longer bob's to use or see.
            beat = {"sessionId": sid}
            await ws.send(
                {"jsonrpc": "2.0", "id": 9, "method": "_qwen/session/heartbeat", "params": beat}
            )
            reply = (await ws.until(lambda m: m.get("id") == 9))[-1]
            assert "error" in reply, reply
            events = await trio.to_thread.run_sync(
                lambda: client(d, BOB).get(f"/session/{sid}/events")
            )
            assert events.status_code == 404
        finally:
            await ws.abort()
    finally:
        d.stop()


async def test_revoking_a_token_ends_its_streams(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    d = users_daemon(tmp_path)
    try:
        alice = client(d, ALICE)
        sid, _ = await trio.to_thread.run_sync(new_session, alice)
        members = {"members": {"bob": "collaborator"}}
        assert (
            await trio.to_thread.run_sync(
                lambda: alice.put(f"/session/{sid}/members", json=members)
            )
        ).is_success
        sse = await trio.to_thread.run_sync(SseReader, d, BOB, sid)
        ws = await open_ws(d, BOB, sid)
        try:
            write_tokens(tokens, token_entry(ALICE, "alice"))  # bob's token is gone
            revoked_at = time.monotonic()
            with pytest.raises(WsClosed) as closed, trio.fail_after(10):
                await ws.until(lambda m: False)
            ws_s = time.monotonic() - revoked_at
            assert closed.value.code == 1008
            assert await trio.to_thread.run_sync(sse.ended.wait, 10)
            sse_s = sse.ended_at - revoked_at
            # The tokens file is looked at once a second: that, plus the streams' check.
            assert ws_s < BOUND_S + 1 and sse_s < BOUND_S + 1, (ws_s, sse_s)
        finally:
            await ws.abort()
        r = await trio.to_thread.run_sync(lambda: client(d, BOB).get("/capabilities"))
        assert r.status_code == 401
        # Alice's own streams go on.
        mine = await trio.to_thread.run_sync(SseReader, d, ALICE, sid)
        assert not mine.ended.is_set()
    finally:
        d.stop()


def test_a_queued_prompt_gets_no_new_content_once_the_budget_is_spent(tmp_path: Path) -> None:
    """A pending-prompt edit adds no turn (no prompt is taken from the per-minute quota)
    but is new content for the agent: refused 402 once the principal's budget is spent."""
    d = users_daemon(tmp_path, "--quota-token-budget", "1000")
    try:
        bob = client(d, BOB)
        sid, _ = new_session(bob)
        run = {"prompt": [{"type": "text", "text": "[sleep 20000]"}]}
        later = {"prompt": [{"type": "text", "text": "later"}]}
        r = bob.post(f"/session/{sid}/prompt", json=run, headers={"Prefer": "respond-async"})
        assert r.status_code == 202, r.text
        q = bob.post(f"/session/{sid}/prompt", json=later, headers={"Prefer": "respond-async"})
        assert q.status_code == 202, q.text
        edit = {"prompt": [{"type": "text", "text": "[usage 5000] more"}]}
        pending = f"/session/{sid}/pending-prompts/{q.json()['promptId']}"
        assert bob.put(pending, json=edit).status_code == 200  # under the budget
        other, _ = new_session(bob, "thread")  # his other session spends the budget
        spend = {"prompt": [{"type": "text", "text": "[usage 1200] spend"}]}
        assert bob.post(f"/session/{other}/prompt", json=spend).status_code == 200
        r = bob.put(pending, json=edit)
        assert r.status_code == 402, (r.status_code, r.text)
        assert r.json()["code"] == "budget_exhausted", r.text
        assert bob.post(f"/session/{sid}/cancel").status_code == 204
    finally:
        d.stop()
