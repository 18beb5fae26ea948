"""Sessions, prompts and the event stream against the real daemon and the scripted agent."""

from __future__ import annotations

import os
import sys
import urllib.parse
from typing import Any

import httpx
import trio

from tests.conftest import AUTH
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until, iter_events


async def new_session(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/session", json={"sessionScope": "thread", **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def until_pending(client: httpx.AsyncClient, sid: str, states: list[str]) -> None:
    """Until the session's prompts are in ``states`` (``running``, ``queued``), bounded."""
    with trio.fail_after(20):
        while True:
            r = await client.get(f"/session/{sid}/pending-prompts")
            if [p["state"] for p in r.json()["pending"]] == states:
                return
            await trio.sleep(0.02)


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


def is_terminal(event: dict[str, Any]) -> bool:
    return event["type"] in ("turn_complete", "turn_error")


async def test_create_prompt_blocking_then_replay_everything(client: httpx.AsyncClient) -> None:
    created = await new_session(client)
    sid = created["sessionId"]
    assert created["attached"] is False
    assert created["clientId"].startswith("client_")
    response = await client.post(f"/session/{sid}/prompt", json=text("hello [think hm] [plan a|b]"))
    assert response.status_code == 200
    assert response.json()["stopReason"] == "end_turn"
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        epoch = stream.headers["x-qwen-event-epoch"]
        events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    ids = [e["id"] for e in events if "id" in e]
    assert ids == list(range(1, len(ids) + 1))
    kinds = [e["data"]["update"]["sessionUpdate"] for e in events if e["type"] == "session_update"]
    assert "user_message_chunk" in kinds and "agent_thought_chunk" in kinds and "plan" in kinds
    echo = [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    assert "".join(echo).startswith("echo: hello")
    terminal = [e for e in events if is_terminal(e)]
    assert len(terminal) == 1 and terminal[0]["data"]["stopReason"] == "end_turn"
    assert all(e["data"]["sessionId"] == sid for e in events if "id" in e)
    assert epoch


async def test_async_prompt_returns_202_watermark_and_streams_the_turn(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["sessionId"]
    response = await client.post(
        f"/session/{sid}/prompt", json=text("[flood 50]"), headers={"Prefer": "respond-async"}
    )
    assert response.status_code == 202
    accepted = response.json()
    assert set(accepted) == {"promptId", "lastEventId", "eventEpoch"}
    async with client.stream(
        "GET",
        f"/session/{sid}/events",
        headers={"Last-Event-ID": str(accepted["lastEventId"])},
    ) as stream:
        events = await collect_until(stream, is_terminal)
    assert events[-1]["type"] == "turn_complete"
    assert events[-1]["promptId"] == accepted["promptId"]
    chunks = [e for e in events if e["type"] == "session_update"]
    assert len(chunks) >= 50
    assert all(e.get("promptId") == accepted["promptId"] for e in chunks)


async def test_prompts_queue_fifo_and_each_ends_exactly_once(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    prompt_ids = []
    for i in range(3):
        response = await client.post(
            f"/session/{sid}/prompt",
            json=text(f"[sleep 100] turn{i}"),
            headers={"Prefer": "respond-async"},
        )
        assert response.status_code == 202
        prompt_ids.append(response.json()["promptId"])
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        done: list[str] = []
        events = await collect_until(
            stream,
            lambda e: is_terminal(e) and done.append(e["promptId"]) is None and len(done) == 3,
        )
    assert done == prompt_ids
    assert [e["data"]["promptId"] for e in events if e["type"] == "pending_prompt_added"] == (
        prompt_ids[1:]
    )
    started = [e["data"]["promptId"] for e in events if e["type"] == "pending_prompt_started"]
    assert started == prompt_ids[1:]


async def test_prompt_queue_full_is_503(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    for _ in range(5):
        r = await client.post(
            f"/session/{sid}/prompt", json=text("[sleep 2000]"), headers={"Prefer": "respond-async"}
        )
        assert r.status_code == 202, r.text
    r = await client.post(
        f"/session/{sid}/prompt", json=text("x"), headers={"Prefer": "respond-async"}
    )
    assert r.status_code == 503
    assert r.headers["retry-after"] == "5"
    assert r.json()["code"] == "prompt_queue_full"
    assert r.json()["limit"] == 5
    assert (await client.delete(f"/session/{sid}")).status_code == 204


async def test_cancel_ends_the_running_prompt_cancelled(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    async with trio.open_nursery() as nursery:
        result: dict[str, Any] = {}

        async def blocking_prompt() -> None:
            r = await client.post(f"/session/{sid}/prompt", json=text("[sleep 20000]"))
            result.update(r.json())

        nursery.start_soon(blocking_prompt)
        await until_pending(client, sid, ["running"])
        r = await client.post(f"/session/{sid}/cancel")
        assert r.status_code == 204
    assert result["stopReason"] == "cancelled"


async def test_invalid_prompts_are_400_without_touching_the_session(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["sessionId"]
    for body in (
        {},
        {"prompt": []},
        {"prompt": "hi"},
        {"prompt": [1]},
        {"prompt": [{"text": "x"}]},
    ):
        r = await client.post(f"/session/{sid}/prompt", json=body)
        assert r.status_code == 400, body
        assert "prompt" in r.json()["error"]
    r = await client.post(
        f"/session/{sid}/prompt", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json() == {"error": "Invalid JSON in request body"}


async def test_unknown_session_is_404_with_the_reference_body(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("POST", "/session/nope/prompt"),
        ("POST", "/session/nope/cancel"),
        ("DELETE", "/session/nope"),
        ("GET", "/session/nope/events"),
        ("POST", "/session/nope/heartbeat"),
    ]:
        r = await client.request(method, path, json=text("x") if method == "POST" else None)
        assert r.status_code == 404, path
        assert r.json() == {
            "error": 'No session with id "nope"',
            "code": "session_not_found",
            "sessionId": "nope",
        }


async def test_agent_error_keeps_code_and_data(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    r = await client.post(f"/session/{sid}/prompt", json=text("[error]"))
    assert r.status_code == 500
    body = r.json()
    assert body["code"] == -32603 and "data" in body
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, is_terminal)
    assert events[-1]["type"] == "turn_error" and events[-1]["data"]["code"] == -32603


async def test_close_publishes_session_closed_ends_stream_then_404(
    client: httpx.AsyncClient,
) -> None:
    created = await new_session(client)
    sid = created["sessionId"]
    async with client.stream("GET", f"/session/{sid}/events") as stream:
        r = await client.delete(
            f"/session/{sid}", headers={"X-Qwen-Client-Id": created["clientId"]}
        )
        assert r.status_code == 204
        events = [e async for e in iter_events(stream) if "comment" not in e]
    assert events[-1]["type"] == "session_closed"
    assert events[-1]["data"] == {
        "sessionId": sid,
        "reason": "client_close",
        "closedBy": created["clientId"],
    }
    assert (await client.post(f"/session/{sid}/prompt", json=text("x"))).status_code == 404


async def test_crash_is_isolated_restarted_then_dies_past_the_intensity(
    client: httpx.AsyncClient,
) -> None:
    victim = (await new_session(client))["sessionId"]
    bystander = (await new_session(client))["sessionId"]
    async with client.stream("GET", f"/session/{victim}/events") as stream:
        # Three crashes are restarted in place (intensity 3 per 60 s)...
        for _ in range(3):
            r = await client.post(f"/session/{victim}/prompt", json=text("[crash]"))
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "agent_restarted"
        # ...the fourth ends the session for good.
        r = await client.post(f"/session/{victim}/prompt", json=text("[crash]"))
        assert r.status_code == 503 and r.json()["code"] == "channel_closed"
        events = [e async for e in iter_events(stream) if "comment" not in e]
    types = [e["type"] for e in events]
    assert [e["data"]["attempt"] for e in events if e["type"] == "session_restarted"] == [1, 2, 3]
    assert types[-2:] == ["turn_error", "session_died"]
    died = events[-1]["data"]
    assert died["reason"] == "channel_closed" and died["exitCode"] == 17
    assert (await client.post(f"/session/{victim}/prompt", json=text("x"))).status_code == 404
    r = await client.post(f"/session/{bystander}/prompt", json=text("still here"))
    assert r.status_code == 200 and r.json()["stopReason"] == "end_turn"


async def test_single_scope_attaches_and_concurrent_creates_coalesce(
    daemon_proc: DaemonProcess,
) -> None:
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30, headers=AUTH) as c:
        results: list[dict[str, Any]] = []

        async def create() -> None:
            r = await c.post("/session", json={})
            assert r.status_code == 200
            results.append(r.json())

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(create)
        assert len({r["sessionId"] for r in results}) == 1
        assert [r["attached"] for r in results].count(False) <= 1
        later = (await c.post("/session", json={})).json()
        assert later["sessionId"] == results[0]["sessionId"] and later["attached"] is True
        assert len({r["clientId"] for r in [*results, later]}) == 6


async def test_client_id_rules(client: httpx.AsyncClient) -> None:
    created = await new_session(client)
    sid, cid = created["sessionId"], created["clientId"]
    r = await client.post("/session", json={}, headers={"X-Qwen-Client-Id": "bad id!"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"
    r = await client.post(f"/session/{sid}/heartbeat", headers={"X-Qwen-Client-Id": "stranger"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"
    r = await client.post(f"/session/{sid}/heartbeat", headers={"X-Qwen-Client-Id": cid})
    assert r.status_code == 200
    assert r.json()["clientId"] == cid and isinstance(r.json()["lastSeenAt"], int)


async def test_workspace_mismatch_and_session_list(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    r = await client.post("/session", json={"cwd": "/"})
    assert r.status_code == 400
    assert r.json()["code"] == "workspace_mismatch"
    assert r.json()["requestedWorkspace"] == "/"
    r = await client.post("/session", json={"cwd": "relative/path"})
    assert r.status_code == 400
    sid = (await new_session(client, cwd=str(daemon_proc.workspace)))["sessionId"]
    encoded = urllib.parse.quote(str(daemon_proc.workspace.resolve()), safe="")
    listed = (await client.get(f"/workspace/{encoded}/sessions")).json()["sessions"]
    assert sid in [s["sessionId"] for s in listed]


async def test_metadata_model_and_approval_mode(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    r = await client.patch(f"/session/{sid}/metadata", json={"displayName": "Investigation"})
    assert r.json() == {"sessionId": sid, "displayName": "Investigation"}
    r = await client.patch(f"/session/{sid}/metadata", json={"displayName": ""})
    assert r.status_code == 400 and r.json()["code"] == "invalid_metadata"
    r = await client.post(f"/session/{sid}/model", json={"modelId": "scripted-slow"})
    assert r.status_code == 200 and r.json() == {"modelId": "scripted-slow"}
    r = await client.post(f"/session/{sid}/model", json={"modelId": "no-such-model"})
    assert r.status_code == 400 and r.json()["code"] == "model_switch_failed"
    r = await client.post(f"/session/{sid}/model", json={})
    assert r.status_code == 400
    r = await client.post(f"/session/{sid}/approval-mode", json={"mode": "plan"})
    assert r.status_code == 200
    assert r.json() == {"sessionId": sid, "mode": "plan", "previous": "default", "persisted": False}
    r = await client.post(f"/session/{sid}/approval-mode", json={"mode": "reckless"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_approval_mode"
    r = await client.post(f"/session/{sid}/approval-mode", json={"mode": "plan", "persist": "y"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_persist_flag"
    r = await client.post("/session", json={"sessionScope": "thread", "modelServiceId": 5})
    assert r.status_code == 400 and r.json()["code"] == "invalid_model_service_id"
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    types = [e["type"] for e in events]
    assert "session_metadata_updated" in types
    assert "model_switched" in types and "model_switch_failed" in types
    assert "approval_mode_changed" in types


async def test_max_queued_validation_and_epoch_header(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    for bad in ("15", "2049", "abc", "-1"):
        r = await client.get(f"/session/{sid}/events", params={"maxQueued": bad})
        assert r.status_code == 400 and r.json()["code"] == "invalid_max_queued"
    await client.post(f"/session/{sid}/prompt", json=text("one"))
    async with client.stream(
        "GET",
        f"/session/{sid}/events",
        params={"maxQueued": "16"},
        headers={"Last-Event-ID": "1", "X-Qwen-Event-Epoch": "some-other-epoch"},
    ) as stream:
        events = await collect_until(stream, lambda e: e["type"] == "replay_complete")
    assert events[0]["type"] == "state_resync_required"
    assert events[0]["data"]["reason"] == "epoch_reset"
    assert events[1]["id"] == 1


async def test_permission_first_responder_flow(client: httpx.AsyncClient) -> None:
    created = await new_session(client)
    sid = created["sessionId"]
    other = (await client.post(f"/session/{sid}/load", json={})).json()
    assert other["attached"] is True
    r = await client.post(
        f"/session/{sid}/prompt",
        json=text("[write notes.txt hello there]"),
        headers={"Prefer": "respond-async"},
    )
    assert r.status_code == 202
    events: list[dict[str, Any]] = []
    with trio.fail_after(30):
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            async for event in iter_events(stream):
                if "comment" in event:
                    continue
                events.append(event)
                if event["type"] == "permission_request":
                    request = event["data"]
                    assert {o["optionId"] for o in request["options"]} >= {"allow", "reject"}
                    assert request["toolCall"]["kind"] == "edit"
                    bad = await client.post(
                        f"/session/{sid}/permission/{request['requestId']}",
                        json={"outcome": {"outcome": "selected", "optionId": "nope"}},
                    )
                    assert bad.status_code == 400 and bad.json()["code"] == "invalid_option_id"
                    malformed = await client.post(
                        f"/session/{sid}/permission/{request['requestId']}", json={"outcome": "yes"}
                    )
                    assert malformed.status_code == 400
                    first = await client.post(
                        f"/session/{sid}/permission/{request['requestId']}",
                        json={"outcome": {"outcome": "selected", "optionId": "allow"}},
                        headers={"X-Qwen-Client-Id": created["clientId"]},
                    )
                    assert first.status_code == 200 and first.json() == {}
                    late = await client.post(
                        f"/permission/{request['requestId']}",
                        json={"outcome": {"outcome": "selected", "optionId": "reject"}},
                    )
                    assert late.status_code == 404
                # The late vote's event is published by the mediator, not by the turn: it may
                # land after the turn's end, so read on until both are in.
                types = [e["type"] for e in events]
                if "permission_already_resolved" in types and any(is_terminal(e) for e in events):
                    break
    types = [e["type"] for e in events]
    assert "permission_resolved" in types and "permission_already_resolved" in types
    resolved = next(e for e in events if e["type"] == "permission_resolved")
    assert resolved["data"]["outcome"] == {"outcome": "selected", "optionId": "allow"}
    assert resolved["data"]["voterClientId"] == created["clientId"]
    assert [e["type"] for e in events if is_terminal(e)] == ["turn_complete"]


async def test_cancel_resolves_pending_permissions_cancelled(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    await client.post(
        f"/session/{sid}/prompt",
        json=text("[write x.txt data]"),
        headers={"Prefer": "respond-async"},
    )
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = []
        async for event in iter_events(stream):
            if "comment" in event:
                continue
            events.append(event)
            if event["type"] == "permission_request":
                assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
            if is_terminal(event):
                break
    resolved = next(e for e in events if e["type"] == "permission_resolved")
    assert resolved["data"]["outcome"] == {"outcome": "cancelled"}
    assert "prompt_cancelled" in [e["type"] for e in events]


async def test_deep_health_counts(client: httpx.AsyncClient) -> None:
    await new_session(client)
    body = (await client.get("/health", params={"deep": "1"})).json()
    assert body["status"] == "ok"
    assert body["sessions"] >= 1
    assert {"pendingPermissions", "activePrompts", "connectedClients"} <= set(body)


async def test_killed_agent_is_restarted_in_place(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    """SIGKILL the agent child mid-prompt: same session id, ids continue, queue survives."""
    sid = (await new_session(client))["sessionId"]
    pid = await agent_pid(client, sid)
    assert pid in _children(daemon_proc.proc.pid)
    first = await client.post(
        f"/session/{sid}/prompt", json=text("[sleep 30000]"), headers={"Prefer": "respond-async"}
    )
    queued = await client.post(
        f"/session/{sid}/prompt", json=text("after restart"), headers={"Prefer": "respond-async"}
    )
    await until_pending(client, sid, ["running", "queued"])  # mid-prompt, one waiting
    os.kill(pid, 9)
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        done: list[dict[str, Any]] = []
        events = await collect_until(
            stream, lambda e: is_terminal(e) and done.append(e) is None and len(done) == 2
        )
    ids = [e["id"] for e in events if "id" in e]
    assert ids == list(range(1, len(ids) + 1))
    assert done[0]["promptId"] == first.json()["promptId"]
    assert done[0]["type"] == "turn_error"
    assert done[0]["data"]["errorKind"] == "agent_restarted"
    restarted = next(e for e in events if e["type"] == "session_restarted")
    assert restarted["data"]["attempt"] == 1 and restarted["data"]["signal"] == "SIGKILL"
    assert done[1]["promptId"] == queued.json()["promptId"]
    assert done[1]["type"] == "turn_complete"
    assert "session_died" not in [e["type"] for e in events]
    assert await agent_pid(client, sid) not in (pid, None)


async def agent_pid(client: httpx.AsyncClient, sid: str) -> int | None:
    """The pid of the session's agent child, as /daemon/status?detail=full reports it."""
    body = (await client.get("/daemon/status", params={"detail": "full"})).json()
    session = next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)
    return session["agentPid"]  # type: ignore[no-any-return]


def _children(parent: int) -> set[int]:
    """The live child processes of ``parent``."""
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            out.add(int(entry))
    return out


async def test_pending_prompts_listing_removal_and_idempotent_submission(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["sessionId"]
    running = await client.post(
        f"/session/{sid}/prompt", json=text("[sleep 3000]"), headers={"Prefer": "respond-async"}
    )
    body = {**text("queued one"), "promptId": "my-prompt-1"}
    first = await client.post(
        f"/session/{sid}/prompt", json=body, headers={"Prefer": "respond-async"}
    )
    again = await client.post(
        f"/session/{sid}/prompt", json=body, headers={"Prefer": "respond-async"}
    )
    assert first.json() == again.json()  # the same admission, not a second turn
    assert first.json()["promptId"] == "my-prompt-1"
    listed = (await client.get(f"/session/{sid}/pending-prompts")).json()["pending"]
    assert [(p["promptId"], p["state"]) for p in listed] == [
        (running.json()["promptId"], "running"),
        ("my-prompt-1", "queued"),
    ]
    r = await client.delete(f"/session/{sid}/pending-prompts/{running.json()['promptId']}")
    assert r.status_code == 409 and r.json()["code"] == "prompt_running"
    assert (await client.delete(f"/session/{sid}/pending-prompts/my-prompt-1")).status_code == 204
    assert (await client.delete(f"/session/{sid}/pending-prompts/my-prompt-1")).status_code == 404
    await client.post(f"/session/{sid}/cancel")
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        done: list[str] = []
        events = await collect_until(
            stream,
            lambda e: is_terminal(e) and done.append(e["promptId"]) is None and len(done) == 2,
        )
    removed = next(e for e in events if e["type"] == "pending_prompt_completed")
    assert removed["data"] == {"sessionId": sid, "promptId": "my-prompt-1", "state": "removed"}
    assert sorted(done) == sorted([running.json()["promptId"], "my-prompt-1"])


async def test_invalid_deadline_is_400(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    for bad in (0, -5, "10", 1.5, True):
        r = await client.post(f"/session/{sid}/prompt", json={**text("x"), "deadlineMs": bad})
        assert r.status_code == 400 and r.json()["code"] == "invalid_deadline_ms", bad


async def test_detach_of_the_last_client_closes_the_session(client: httpx.AsyncClient) -> None:
    created = await new_session(client)
    sid, cid = created["sessionId"], created["clientId"]
    r = await client.post(f"/session/{sid}/detach", headers={"X-Qwen-Client-Id": cid})
    assert r.status_code == 204
    assert (await client.post(f"/session/{sid}/heartbeat")).status_code == 404
    assert (await client.post("/session/unknown/detach")).status_code == 204


async def test_a_blocking_caller_that_goes_away_cancels_its_prompt(
    client: httpx.AsyncClient, daemon_proc: DaemonProcess
) -> None:
    """The seed: if the HTTP client disconnects mid-prompt, the agent gets session/cancel."""
    sid = (await new_session(client))["sessionId"]
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as other:
        with trio.move_on_after(0.5):
            await other.post(f"/session/{sid}/prompt", json=text("[sleep 30000]"))
    # The connection is gone; the turn ends cancelled instead of sleeping 30 s.
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, is_terminal)
    assert events[-1]["type"] == "turn_complete"
    assert events[-1]["data"]["stopReason"] == "cancelled"  # not end_turn after 30 s
    assert "prompt_cancelled" in [e["type"] for e in events]


async def test_snapshot_frame_follows_the_replay(client: httpx.AsyncClient) -> None:
    sid = (await new_session(client))["sessionId"]
    await client.post(f"/session/{sid}/model", json={"modelId": "scripted-slow"})
    async with client.stream(
        "GET", f"/session/{sid}/events", params={"snapshot": "1"}, headers={"Last-Event-ID": "0"}
    ) as stream:
        events = await collect_until(stream, lambda e: e["type"] == "session_snapshot")
    assert [e["type"] for e in events][-2:] == ["replay_complete", "session_snapshot"]
    assert "id" not in events[-1]
    assert events[-1]["data"] == {
        "sessionId": sid,
        "currentModelId": "scripted-slow",
        "currentApprovalMode": "default",
    }


async def test_concurrent_restores_coalesce_and_conflicting_ones_are_409(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["sessionId"]
    await client.post(f"/session/{sid}/prompt", json=text("persist me"))
    assert (await client.delete(f"/session/{sid}")).status_code == 204
    results: list[httpx.Response] = []

    async def restore(action: str) -> None:
        results.append(await client.post(f"/session/{sid}/{action}", json={}))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(restore, "load")
    assert [r.status_code for r in results] == [200, 200, 200]
    assert sorted(r.json()["attached"] for r in results) == [False, True, True]
    assert len({r.json()["sessionId"] for r in results}) == 1
    assert (await client.delete(f"/session/{sid}")).status_code == 204


async def test_a_resume_while_a_load_is_in_flight_is_409() -> None:
    """An agent that takes 0.5 s to start keeps the load in flight while resume arrives
    (no warm agent: the load spawns its own; no journal, which would answer the load at once
    without an agent: serve/sessions/journal_load.py)."""
    slow_agent = f"sh -c 'sleep 0.5; exec {sys.executable} -m acp.agents.scripted'"
    daemon = spawn_daemon(
        ["--agent", slow_agent, "--warm-agents", "0", "--no-journal"],
        env={"QWEN_SERVER_TOKEN": "restore-token-0123"},
    )
    auth = {"Authorization": "Bearer restore-token-0123"}
    try:
        async with httpx.AsyncClient(base_url=daemon.url, headers=auth, timeout=30) as client:
            sid = (await client.post("/session", json={})).json()["sessionId"]
            await client.post(f"/session/{sid}/prompt", json=text("persist me"))
            assert (await client.delete(f"/session/{sid}")).status_code == 204
            results: list[httpx.Response] = []
            before = _children(daemon.proc.pid)

            async def restore(action: str) -> None:
                results.append(await client.post(f"/session/{sid}/{action}", json={}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(restore, "load")
                # The load has spawned its agent, which takes 0.5 s to start: the resume
                # arrives while the load waits for it.
                with trio.fail_after(20):
                    while not _children(daemon.proc.pid) - before:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                nursery.start_soon(restore, "resume")
        assert sorted(r.status_code for r in results) == [200, 409], [r.text for r in results]
        conflict = next(r for r in results if r.status_code == 409)
        assert conflict.json()["code"] == "restore_in_progress"
        assert conflict.json()["activeAction"] == "load"
        assert conflict.json()["requestedAction"] == "resume"
        assert conflict.headers["retry-after"] == "5"
    finally:
        daemon.stop()
