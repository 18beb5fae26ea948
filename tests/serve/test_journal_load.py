"""Loads answered from the journal (issue 26, item 4): a load of a journaled session wakes no
agent; the first prompt, model or mode change binds one (the idle-release rebind path).

Real daemons on one state directory (a first life makes the history, a second one loads
it), the real scripted agent, agent processes counted as the daemon's children in /proc.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.acpfront.helpers import Ws
from tests.conftest import AUTH, TOKEN
from tests.serve.test_agent_pool import children_of
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

NO_SPARE = ["--warm-agents", "0"]


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


def daemon(tmp_path: Path, *args: str) -> DaemonProcess:
    return spawn_daemon(
        list(args),
        workspace=tmp_path / "ws",
        state_dir=tmp_path / "state",
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )


async def events_from(client: httpx.AsyncClient, sid: str, after: int, until: str) -> list[Any]:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(after)}
    ) as stream:
        return await collect_until(stream, lambda e: e["type"] == until)


async def session_diag(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    body = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return next(s for s in body["full"]["sessions"] if s["sessionId"] == sid)  # type: ignore[no-any-return]


async def first_life(
    tmp_path: Path, prompts: list[str], *, model: str | None = None, args: tuple[str, ...] = ()
) -> str:
    """One session with ``prompts`` answered (and ``model`` switched to), then SIGTERM."""
    d = daemon(tmp_path, *NO_SPARE, *args)
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"
            ]
            for prompt in prompts:
                assert (await client.post(f"/session/{sid}/prompt", json=text(prompt))).is_success
            if model is not None:
                switched = await client.post(f"/session/{sid}/model", json={"modelId": model})
                assert switched.status_code == 200, switched.text
    finally:
        assert d.stop() == 0
    return str(sid)


def updates(events: list[Any], kind: str) -> list[dict[str, Any]]:
    return [
        e["data"]["update"]
        for e in events
        if e["type"] == "session_update" and e["data"]["update"]["sessionUpdate"] == kind
    ]


def said(events: list[Any]) -> list[str]:
    """What the agent said, chunk by chunk."""
    return [u["content"]["text"] for u in updates(events, "agent_message_chunk")]


def used_of(events: list[Any]) -> int:
    return int(updates(events, "usage_update")[-1]["used"])


async def test_a_load_after_a_restart_answers_from_the_journal_and_a_prompt_binds_an_agent(
    tmp_path: Path, journal_args: list[str]
) -> None:
    """On the files journal and on PostgreSQL (``--journal-url``)."""
    history = ["[usage] alpha bravo charlie", "delta echo foxtrot golf"]
    sid = await first_life(tmp_path, history, model="scripted-slow", args=tuple(journal_args))
    d = daemon(tmp_path, *NO_SPARE, *journal_args)
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            body = loaded.json()
            assert children_of(d.proc.pid) == set()  # the load woke no agent
            # It answers with the agent's setup, the model switched in the first life current.
            assert body["state"]["models"]["currentModelId"] == "scripted-slow"
            assert {m["id"] for m in body["state"]["modes"]["availableModes"]} >= {"default"}
            diag = await session_diag(client, sid)
            assert diag["agentReleased"] is True and diag["agentPid"] is None
            # The history is there for the client, from the first event on.
            replayed = await events_from(client, sid, 0, "replay_complete")
            assert said(replayed) == ["echo: alpha bravo charlie", "echo: delta echo foxtrot golf"]
            assert replayed[-2]["id"] == body["lastEventId"]

            # The first prompt binds an agent; it has the session's history (its context
            # counts the earlier turns' words) and ids continue.
            answered = await client.post(f"/session/{sid}/prompt", json=text("[usage] again"))
            assert answered.status_code == 200, answered.text
            assert len(children_of(d.proc.pid)) == 1
            turn = await events_from(client, sid, body["lastEventId"], "turn_complete")
            assert turn[0]["id"] == body["lastEventId"] + 1
            rebound = next(e for e in turn if e["type"] == "agent_rebound")
            assert rebound["data"] == {"sessionId": sid, "via": "resume", "trigger": "prompt"}
            assert said(turn) == ["echo: again"]
            fresh = (await client.post("/session", json={"sessionScope": "thread"})).json()
            assert (
                await client.post(
                    f"/session/{fresh['sessionId']}/prompt", json=text("[usage] again")
                )
            ).is_success
            alone = await events_from(client, fresh["sessionId"], 0, "turn_complete")
            words = len(" ".join(history).split())
            assert used_of(turn) >= used_of(alone) + words
            diag = await session_diag(client, sid)
            assert diag["agentReleased"] is False and diag["agentPid"] is not None
    finally:
        assert d.stop() == 0


async def test_a_mode_change_binds_a_lazily_loaded_session(tmp_path: Path) -> None:
    sid = await first_life(tmp_path, ["hello"])
    d = daemon(tmp_path, *NO_SPARE)
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            assert (await client.post(f"/session/{sid}/load", json={})).status_code == 200
            assert children_of(d.proc.pid) == set()
            changed = await client.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"})
            assert changed.status_code == 200, changed.text
            events = await events_from(client, sid, 0, "approval_mode_changed")
            rebound = next(e for e in events if e["type"] == "agent_rebound")
            assert rebound["data"]["trigger"] == "mode"
            assert len(children_of(d.proc.pid)) == 1
    finally:
        d.stop()


async def test_32_sessions_loaded_at_once_after_a_restart_spawn_no_agent(tmp_path: Path) -> None:
    first = daemon(tmp_path, "--sessions-per-agent", "32", *NO_SPARE)
    try:
        async with httpx.AsyncClient(base_url=first.url, headers=AUTH, timeout=60) as client:

            async def one(out: list[str]) -> None:
                made = await client.post("/session", json={"sessionScope": "thread"})
                sid = made.json()["sessionId"]
                assert (await client.post(f"/session/{sid}/prompt", json=text(sid))).is_success
                out.append(sid)

            sids: list[str] = []
            async with trio.open_nursery() as nursery:
                for _ in range(32):
                    nursery.start_soon(one, sids)
    finally:
        assert first.stop() == 0
    d = daemon(tmp_path, *NO_SPARE)
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=60) as client:
            statuses: list[int] = []

            async def load(sid: str) -> None:
                statuses.append((await client.post(f"/session/{sid}/load", json={})).status_code)

            async with trio.open_nursery() as nursery:
                for sid in sids:
                    nursery.start_soon(load, sid)
            assert statuses == [200] * 32
            status = (await client.get("/daemon/status", params={"detail": "full"})).json()
            listed = {s["sessionId"]: s for s in status["full"]["sessions"]}
            bound = {s: listed[s] for s in sids if not listed.get(s, {}).get("agentReleased")}
            # Which loads went to an agent, and what the daemon said of journals meanwhile.
            said = [line for line in d.stderr().splitlines() if "journal" in line.lower()]
            assert children_of(d.proc.pid) == set(), (bound, said[-20:])
            assert set(sids) <= set(listed) and all(listed[s]["agentReleased"] for s in sids)
            # One of them prompted: one agent, that session's own history intact.
            answered = await client.post(f"/session/{sids[0]}/prompt", json=text("next"))
            assert answered.status_code == 200, answered.text
            assert len(children_of(d.proc.pid)) == 1
    finally:
        assert d.stop() == 0


async def test_acp_load_over_a_websocket_replays_the_journal_then_prompts(tmp_path: Path) -> None:
    sid = await first_life(tmp_path, ["remember me"])
    d = daemon(tmp_path, *NO_SPARE)
    try:
        ws = await Ws.connect(d.port, headers=AUTH)
        await ws.send(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
        )
        await ws.until(lambda m: m.get("id") == 1)
        cwd = str(d.workspace.resolve())
        await ws.send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/load",
                "params": {"sessionId": sid, "cwd": cwd, "mcpServers": []},
            }
        )
        got = await ws.until(lambda m: m.get("id") == 2)
        assert got[-1]["result"]["sessionId"] == sid, got[-1]
        assert children_of(d.proc.pid) == set()
        await ws.send(
            {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "and now"}]},
            }
        )
        frames = got + await ws.until(lambda m: m.get("id") == 3)
        assert frames[-1]["result"]["stopReason"] == "end_turn"
        texts = [
            f["params"]["update"].get("content", {}).get("text")
            for f in frames
            if f.get("method") == "session/update"
        ]
        # The history replayed from the journal, then the new turn, each once.
        assert texts.count("echo: remember me") == 1 and texts.count("echo: and now") == 1
        assert texts.index("echo: remember me") < texts.index("echo: and now")
        assert len(children_of(d.proc.pid)) == 1
        await ws.abort()
    finally:
        assert d.stop() == 0


async def test_a_journal_without_the_agent_attributes_loads_through_the_agent(
    tmp_path: Path,
) -> None:
    """A journal written before the attributes (or behind another agent command) is loaded
    the old way, and keeps the attributes from then on: the next load is lazy."""
    sid = await first_life(tmp_path, ["old journal"])
    meta_path = tmp_path / "state" / "journal" / sid / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["meta"]["attrs"]["agent.restore"] == "resume"
    meta["meta"]["attrs"] = {}
    meta_path.write_text(json.dumps(meta))
    for life, agents_after_load in (("eager", 1), ("lazy", 0)):
        d = daemon(tmp_path, *NO_SPARE)
        try:
            async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
                loaded = await client.post(f"/session/{sid}/load", json={})
                assert loaded.status_code == 200, (life, loaded.text)
                assert len(children_of(d.proc.pid)) == agents_after_load, life
                replayed = await events_from(client, sid, 0, "replay_complete")
                assert said(replayed) == ["echo: old journal"], life  # the agent's replay dropped
        finally:
            assert d.stop() == 0  # (its log written out)
        # The daemon says why a load woke an agent.
        why = f"journal of session {sid}: its load goes through the agent"
        assert (f"{why} (no agent setup kept in its meta)" in d.stderr()) == (life == "eager")


async def test_a_lazily_loaded_session_its_agent_forgot_ends_on_the_first_prompt(
    tmp_path: Path,
) -> None:
    sid = await first_life(tmp_path, ["soon forgotten"])
    stored = list((tmp_path / "state" / "scripted").rglob(f"{sid}.json"))
    assert stored
    for path in stored:
        path.unlink()  # the agent's own record of the session is gone
    d = daemon(tmp_path, *NO_SPARE)
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            last = str(loaded.json()["lastEventId"])  # (the first life's session_died)
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": last}
            ) as stream:
                prompt = await client.post(f"/session/{sid}/prompt", json=text("hello?"))
                assert prompt.status_code == 404, prompt.text
                events = await collect_until(stream, lambda e: e["type"] == "session_died")
            assert events[-1]["data"]["reason"] == "agent_session_not_found"
    finally:
        d.stop()
