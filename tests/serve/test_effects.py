"""The Host's EffectGate end to end: a real daemon, the scripted agent, real files.

Every agent effect (``[read P]`` → ``fs/read_text_file``, ``[write P T]`` →
``fs/write_text_file``, ``[shell C]`` → ``terminal/create``) is checked against the grants
and the approval policy before it runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import collect_until, iter_events

Vote = Callable[[dict[str, Any]], Awaitable[None]]


async def new_session(client: httpx.AsyncClient) -> tuple[str, str]:
    r = await client.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def attach(client: httpx.AsyncClient, sid: str) -> str:
    r = await client.post(f"/session/{sid}/load", json={})
    assert r.status_code == 200 and r.json()["attached"] is True, r.text
    return r.json()["clientId"]  # type: ignore[no-any-return]


async def set_mode(client: httpx.AsyncClient, sid: str, mode: str) -> None:
    r = await client.post(f"/session/{sid}/approval-mode", json={"mode": mode})
    assert r.status_code == 200, r.text


async def turn(
    client: httpx.AsyncClient,
    sid: str,
    text: str,
    *,
    client_id: str | None = None,
    on_permission: Vote | None = None,
) -> list[dict[str, Any]]:
    """Run one prompt; answer permission requests with ``on_permission``; its events."""
    headers = {"Prefer": "respond-async"}
    if client_id is not None:
        headers["X-Qwen-Client-Id"] = client_id
    r = await client.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers=headers,
    )
    assert r.status_code == 202, r.text
    accepted = r.json()
    events: list[dict[str, Any]] = []
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(accepted["lastEventId"])}
    ) as stream:
        async for event in iter_events(stream):
            if "comment" in event or "id" not in event:
                continue
            events.append(event)
            if event["type"] == "permission_request":
                assert on_permission is not None, f"unexpected request: {event['data']}"
                await on_permission(event["data"])
            if event["type"] in ("turn_complete", "turn_error"):
                if event.get("promptId") == accepted["promptId"]:
                    break
    return events


def answer(client: httpx.AsyncClient, sid: str, option: str, client_id: str | None = None) -> Vote:
    async def vote(request: dict[str, Any]) -> None:
        headers = {"X-Qwen-Client-Id": client_id} if client_id else {}
        r = await client.post(
            f"/session/{sid}/permission/{request['requestId']}",
            json={"outcome": {"outcome": "selected", "optionId": option}},
            headers=headers,
        )
        assert r.status_code == 200, r.text

    return vote


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == kind]


def said(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    )


# -- refused without asking anyone ---------------------------------------------------------


async def test_reading_etc_passwd_is_refused_without_asking_anyone(
    client: httpx.AsyncClient,
) -> None:
    sid, cid = await new_session(client)
    events = await turn(client, sid, "[read /etc/passwd]", client_id=cid)
    assert of_type(events, "permission_request") == []
    [denied] = of_type(events, "effect_denied")
    assert denied["sessionId"] == sid
    assert (denied["capability"], denied["target"]) == ("fs.read", "/etc/passwd")
    assert denied["rule"] == "grant:fs.read" and "workspace" in denied["reason"]
    assert "read failed" in said(events) and "root:" not in said(events)
    assert events[-1]["type"] == "turn_complete"


async def test_writing_outside_the_workspace_is_refused_and_nothing_is_written(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    await set_mode(client, sid, "yolo")  # the agent does not ask; the Host still refuses
    outside = daemon_proc.workspace.parent / "outside.txt"
    events = await turn(client, sid, "[write ../outside.txt x]", client_id=cid)
    assert of_type(events, "permission_request") == []
    [denied] = of_type(events, "effect_denied")
    assert (denied["capability"], denied["target"]) == ("fs.write", str(outside))
    assert denied["rule"] == "grant:fs.write"
    assert not outside.exists()
    failed = [
        e["data"]["update"]
        for e in events
        if e["type"] == "session_update" and e["data"]["update"].get("status") == "failed"
    ]
    assert failed and "refused by the Host" in str(failed[0]["content"])


async def test_the_agents_own_request_for_an_ungranted_effect_never_reaches_a_client(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    """Default mode: the agent asks its own question about an outside write, which no
    grant allows; the policy answers it (reject) before any client is asked (16.15)."""
    sid, cid = await new_session(client)
    outside = daemon_proc.workspace.parent / "outside2.txt"
    asked: list[dict[str, Any]] = []

    async def record(req: dict[str, Any]) -> None:
        asked.append(req)
        await answer(client, sid, "allow", cid)(req)

    events = await turn(
        client, sid, "[write ../outside2.txt x]", client_id=cid, on_permission=record
    )
    assert of_type(events, "permission_request") == [] and asked == []
    [denied] = of_type(events, "effect_denied")
    assert (denied["capability"], denied["target"], denied["rule"]) == (
        "fs.write",
        str(outside),
        "grant:fs.write",
    )
    assert not outside.exists()
    failed = [
        e["data"]["update"]
        for e in events
        if e["type"] == "session_update" and e["data"]["update"].get("status") == "failed"
    ]
    assert failed and "rejected" in str(failed[0])


async def test_a_symlink_out_of_the_workspace_is_refused(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    outside_dir = daemon_proc.workspace.parent / "elsewhere"
    outside_dir.mkdir(exist_ok=True)
    (outside_dir / "secret.txt").write_text("top secret")
    link = daemon_proc.workspace / "leak"
    if not link.exists():
        link.symlink_to(outside_dir)
    sid, cid = await new_session(client)
    await set_mode(client, sid, "yolo")
    read = await turn(client, sid, "[read leak/secret.txt]", client_id=cid)
    assert of_type(read, "effect_denied")[0]["target"] == str(outside_dir / "secret.txt")
    assert "top secret" not in said(read)
    write = await turn(client, sid, "[write leak/new.txt x]", client_id=cid)
    assert of_type(write, "effect_denied")[0]["capability"] == "fs.write"
    assert of_type(read + write, "permission_request") == []
    assert not (outside_dir / "new.txt").exists()


async def test_plan_mode_denies_writes_even_when_a_client_allowed(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    await set_mode(client, sid, "plan")
    events = await turn(
        client,
        sid,
        "[write planned.txt x]",
        client_id=cid,
        on_permission=answer(client, sid, "allow", cid),
    )
    [denied] = of_type(events, "effect_denied")
    assert denied["rule"] == "mode:plan"
    assert not (daemon_proc.workspace / "planned.txt").exists()


# -- asked once ----------------------------------------------------------------------------


async def test_an_agent_approved_write_is_not_asked_twice(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    decisions = (await client.get("/workspace/permissions")).json()["decisions"]
    events = await turn(
        client,
        sid,
        "[write notes/once.txt hello]",
        client_id=cid,
        on_permission=answer(client, sid, "allow", cid),
    )
    requests = of_type(events, "permission_request")
    assert len(requests) == 1 and requests[0]["toolCall"]["kind"] == "edit"
    assert of_type(events, "effect_denied") == []
    assert (daemon_proc.workspace / "notes" / "once.txt").read_text() == "hello"
    after = (await client.get("/workspace/permissions")).json()["decisions"]
    assert after["allowedByAgentApproval"] == decisions["allowedByAgentApproval"] + 1
    assert after["prompted"] == decisions["prompted"]


async def test_a_rejected_agent_request_writes_nothing(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    await turn(
        client,
        sid,
        "[write rejected.txt x]",
        client_id=cid,
        on_permission=answer(client, sid, "reject", cid),
    )
    assert not (daemon_proc.workspace / "rejected.txt").exists()


async def test_reads_inside_the_workspace_run_without_asking(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    (daemon_proc.workspace / "plain.txt").write_text("just text")
    sid, cid = await new_session(client)
    events = await turn(client, sid, "[read plain.txt]", client_id=cid)
    assert of_type(events, "permission_request") == []
    assert "just text" in said(events)


async def test_a_sensitive_read_in_the_workspace_prompts_through_the_mediator(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    (daemon_proc.workspace / ".env").write_text("API_KEY=abc123")
    sid, cid = await new_session(client)
    await set_mode(client, sid, "yolo")  # yolo cannot weaken the guard's prompt
    seen: list[dict[str, Any]] = []

    async def allow_once(request: dict[str, Any]) -> None:
        seen.append(request)
        await answer(client, sid, "allow_once", cid)(request)

    events = await turn(client, sid, "[read .env]", client_id=cid, on_permission=allow_once)
    [request] = seen
    call = request["toolCall"]
    assert call["toolCallId"].startswith("host_") and call["kind"] == "read"
    assert call["locations"] == [{"path": str(daemon_proc.workspace / ".env")}]
    effect = call["_meta"]["qwen.daemon.effect"]
    assert effect["capability"] == "fs.read" and effect["rule"] == "guard:sensitive_file:.env"
    assert [o["optionId"] for o in request["options"]] == [
        "allow_once",
        "allow_always",
        "reject_once",
    ]
    assert "API_KEY=abc123" in said(events)


async def test_a_shell_command_prompts_and_a_reject_refuses_it(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    marker = daemon_proc.workspace / "ran.txt"
    events = await turn(
        client,
        sid,
        "[shell touch ran.txt]",
        client_id=cid,
        on_permission=answer(client, sid, "reject_once", cid),
    )
    [request] = of_type(events, "permission_request")
    assert request["toolCall"]["kind"] == "execute"
    assert "touch ran.txt" in request["toolCall"]["rawInput"]["command"]
    [denied] = of_type(events, "effect_denied")
    assert (denied["capability"], denied["rule"]) == ("terminal.exec", "permission:rejected")
    assert not marker.exists()


async def test_allow_always_is_cached_for_that_client_in_that_session(
    client: httpx.AsyncClient,
) -> None:
    sid, alice = await new_session(client)
    bob = await attach(client, sid)
    first = await turn(
        client,
        sid,
        "[shell echo one]",
        client_id=alice,
        on_permission=answer(client, sid, "allow_always", alice),
    )
    assert len(of_type(first, "permission_request")) == 1 and "one" in said(first)
    again = await turn(client, sid, "[shell echo two]", client_id=alice)  # no handler: no ask
    assert of_type(again, "permission_request") == [] and "two" in said(again)
    # another principal is asked again (and may only answer for itself)
    for_bob = await turn(
        client,
        sid,
        "[shell echo three]",
        client_id=bob,
        on_permission=answer(client, sid, "allow_once", bob),
    )
    assert len(of_type(for_bob, "permission_request")) == 1 and "three" in said(for_bob)
    # another command class is asked again
    other = await turn(
        client,
        sid,
        "[shell ls]",
        client_id=alice,
        on_permission=answer(client, sid, "allow_once", alice),
    )
    assert len(of_type(other, "permission_request")) == 1
    # an anonymous prompt has no principal: allow_always is not offered
    offered: list[list[str]] = []

    async def record(request: dict[str, Any]) -> None:
        offered.append([o["optionId"] for o in request["options"]])
        await answer(client, sid, "allow_once")(request)

    await turn(client, sid, "[shell echo four]", on_permission=record)
    assert offered == [["allow_once", "reject_once"]]
    before = (await client.get("/workspace/permissions")).json()["alwaysAllow"]["entries"]
    assert before >= 1
    # closing the session drops its cached allow (the one for alice's "echo")
    assert (await client.delete(f"/session/{sid}")).status_code in (200, 204)
    after = (await client.get("/workspace/permissions")).json()["alwaysAllow"]["entries"]
    assert after == before - 1


async def test_an_agent_allow_always_also_covers_the_hosts_question(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    """'Always allow' on the agent's write question: the agent stops asking, so must we."""
    sid, cid = await new_session(client)
    first = await turn(
        client,
        sid,
        "[write a1.txt x]",
        client_id=cid,
        on_permission=answer(client, sid, "allow_always", cid),
    )
    assert len(of_type(first, "permission_request")) == 1
    second = await turn(client, sid, "[write a2.txt y]", client_id=cid)
    assert of_type(second, "permission_request") == [] and of_type(second, "effect_denied") == []
    assert (daemon_proc.workspace / "a2.txt").read_text() == "y"


# -- visibility ----------------------------------------------------------------------------


async def test_workspace_permissions_shows_grants_and_policy(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    sid, cid = await new_session(client)
    await set_mode(client, sid, "auto-edit")
    r = await client.get("/workspace/permissions", headers={"X-Qwen-Client-Id": cid})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    body = r.json()
    assert body["workspaceCwd"] == str(daemon_proc.workspace.resolve())
    assert body["policy"]["permissionStrategy"] == "first-responder"
    assert body["grants"]["defaults"] == {
        "fs.read": {"scope": "workspace"},
        "fs.write": {"scope": "workspace"},
        "terminal.exec": {"scope": "workspace"},
    }
    assert body["verdictOrder"] == ["auto", "prompt", "deny"]
    mine = next(s for s in body["sessions"] if s["sessionId"] == sid)
    assert mine["approvalMode"] == "auto-edit" and mine["agent"] == "acp-scripted"
    assert len(mine["fingerprint"]) == 32
    bad = await client.get("/workspace/permissions", headers={"X-Qwen-Client-Id": "nobody"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_client_id"


# -- a configured policy -------------------------------------------------------------------

CONFIG = """
capabilities:
  defaults:
    fs.read: {scope: any}
    fs.write: {}
    terminal.exec: {}
  agents:
    acp-scripted:
      terminal.exec: false
approval:
  capabilities:
    fs.write: deny
"""


async def test_configured_grants_and_approvals_apply_monotonically(tmp_path: Path) -> None:
    config = tmp_path / "acp.yaml"
    config.write_text(CONFIG)
    outside = tmp_path / "outside-note.txt"
    outside.write_text("outside words")
    token = AUTH["Authorization"].removeprefix("Bearer ")
    with running_daemon(["--config", str(config)], env={"QWEN_SERVER_TOKEN": token}) as d:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            sid, cid = await new_session(client)
            await set_mode(client, sid, "yolo")
            # fs.read granted anywhere, but an outside read still needs a human
            read = await turn(
                client,
                sid,
                f"[read {outside}]",
                client_id=cid,
                on_permission=answer(client, sid, "allow_once", cid),
            )
            [request] = of_type(read, "permission_request")
            assert request["toolCall"]["_meta"]["qwen.daemon.effect"]["rule"] == (
                "guard:outside_workspace"
            )
            assert "outside words" in said(read)
            # approval.capabilities fs.write: deny beats the yolo mode
            write = await turn(client, sid, "[write w.txt x]", client_id=cid)
            assert of_type(write, "effect_denied")[0]["rule"] == "approval.capabilities.fs.write"
            assert not (d.workspace / "w.txt").exists()
            # terminal.exec revoked for this agent
            shell = await turn(client, sid, "[shell echo hi]", client_id=cid)
            assert of_type(shell, "effect_denied")[0]["rule"] == "grant:terminal.exec"
            body = (await client.get("/workspace/permissions")).json()
            assert body["grants"]["defaults"]["fs.read"] == {"scope": "any"}
            assert body["grants"]["agents"]["acp-scripted"]["terminal.exec"] == "revoked"
            assert body["approval"]["capabilities"] == {"fs.write": "deny"}
            mine = next(s for s in body["sessions"] if s["sessionId"] == sid)
            assert mine["grants"]["terminal.exec"] == "revoked"
    assert outside.read_text() == "outside words"  # read, not changed


async def test_agents_read_whole_large_files_and_long_windows(tmp_path: Path) -> None:
    """The HTTP /file caps (256 KiB, 2000 lines) are for clients; an agent's
    fs/read_text_file gets the whole file it asks for."""
    big = "".join(f"line {i}\n" for i in range(60_000))  # ~600 KiB, 60k lines
    with running_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}) as daemon:
        (daemon.workspace / "big.txt").write_text(big)
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            r = await client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[read big.txt]"}]},
            )
            assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "turn_complete")
            text = "".join(
                e["data"]["update"]["content"]["text"]
                for e in events
                if e["type"] == "session_update"
                and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
            )
            assert "line 59999" in text
            assert "effect_denied" not in [e["type"] for e in events]
            # The HTTP route keeps its cap.
            r = await client.get("/file", params={"path": "big.txt"})
            assert r.status_code == 413


# -- files the daemon runs commands from -----------------------------------------------------


async def test_writing_the_mcp_settings_is_a_command_even_in_yolo(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    target = daemon_proc.workspace / ".qwen" / "settings.json"
    for mode in ("auto-edit", "yolo"):
        sid, cid = await new_session(client)
        await set_mode(client, sid, mode)
        events = await turn(
            client,
            sid,
            "[write .qwen/settings.json x]",
            client_id=cid,
            on_permission=answer(client, sid, "reject_once", cid),
        )
        [request] = of_type(events, "permission_request")
        assert ".qwen/settings.json" in str(request["toolCall"])
        [denied] = of_type(events, "effect_denied")
        assert (denied["capability"], denied["rule"]) == ("terminal.exec", "permission:rejected")
        assert not target.exists(), mode
    # An explicit answer lets it through.
    sid, cid = await new_session(client)
    await set_mode(client, sid, "yolo")
    events = await turn(
        client,
        sid,
        "[write .qwen/settings.json x]",
        client_id=cid,
        on_permission=answer(client, sid, "allow_once", cid),
    )
    assert len(of_type(events, "permission_request")) == 1
    assert target.read_text() == "x"
    target.unlink()
