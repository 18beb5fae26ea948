"""Steering a running turn and the editable queue (issue 27.2), against real daemons.

The scripted agent advertises ``_meta.steering.supported`` and answers ``_session/steering``
(``acp/agents/scripted/steering.py``); the ``--legacy`` one does not, so the daemon falls
back to cancel and re-prompt. ``[steer-late]`` makes the scripted agent answer ``end_turn``
while steered work still streams: the turn must end only once that work is done.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import iter_events

#: Long enough that the 200 ms pauses inside steered work never end a turn early.
SETTLE_MS = "1500"
ASYNC = {"Prefer": "respond-async"}


@pytest.fixture(scope="module")
def steer_daemon() -> Iterator[DaemonProcess]:
    with running_daemon(["--turn-settle-ms", SETTLE_MS], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        yield d


@pytest.fixture(scope="module")
def legacy_daemon() -> Iterator[DaemonProcess]:
    agent = shlex.join([sys.executable, "-m", "acp.agents.scripted", "--legacy"])
    with running_daemon(["--agent", agent], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        yield d


def text(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}], **extra}


class Recorder:
    """Every event of a session, read by a task; ``wait`` polls within a bound."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def wait(self, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with trio.fail_after(30):
            while True:
                for event in self.events:
                    if pred(event):
                        return event
                await trio.sleep(0.02)

    def index(self, pred: Callable[[dict[str, Any]], bool]) -> int:
        found = [i for i, e in enumerate(self.events) if pred(e)]
        assert found, f"no such event in {[e['type'] for e in self.events]}"
        return found[0]


def said(words: str, prompt_id: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def pred(e: dict[str, Any]) -> bool:
        if e["type"] != "session_update":
            return False
        update = e["data"]["update"]
        if update.get("sessionUpdate") != "agent_message_chunk":
            return False
        if prompt_id is not None and e.get("promptId") != prompt_id:
            return False
        return bool(update["content"].get("text") == "echo: " + words)

    return pred


def terminal(prompt_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] in ("turn_complete", "turn_error") and e["promptId"] == prompt_id


def of_type(kind: str, prompt_id: str | None = None) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] == kind and (prompt_id is None or e.get("promptId") == prompt_id)


@asynccontextmanager
async def session(d: DaemonProcess) -> AsyncIterator[tuple[httpx.AsyncClient, str, Recorder]]:
    async with httpx.AsyncClient(base_url=d.url, timeout=30, headers=AUTH) as http:
        r = await http.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 200, r.text
        sid, cid = r.json()["sessionId"], r.json()["clientId"]
        http.headers["X-Qwen-Client-Id"] = cid
        recorder = Recorder()
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                async with httpx.AsyncClient(base_url=d.url, timeout=60, headers=AUTH) as sse:
                    headers = {"Last-Event-ID": "0"}
                    async with sse.stream("GET", f"/session/{sid}/events", headers=headers) as s:
                        async for event in iter_events(s):
                            if "id" in event:
                                recorder.events.append(event)

            nursery.start_soon(read)
            try:
                yield http, sid, recorder
            finally:
                await http.delete(f"/session/{sid}")
                nursery.cancel_scope.cancel()


async def prompt(http: httpx.AsyncClient, sid: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(f"/session/{sid}/prompt", json=body, headers=ASYNC)
    assert r.status_code == 202, r.text
    return dict(r.json())


async def test_native_steer_joins_the_running_turn(steer_daemon: DaemonProcess) -> None:
    async with session(steer_daemon) as (http, sid, rec):
        first = await prompt(http, sid, text("first [sleep 1000] second"))
        p1 = first["promptId"]
        await rec.wait(said("first", p1))  # the agent is inside the turn
        r = await http.post(f"/session/{sid}/prompt", json=text("steered", steer=True))
        assert r.status_code == 200, r.text
        answer = r.json()
        # A blocking steer answers with the end of the turn it joined.
        assert answer["promptId"] == p1
        assert answer["stopReason"] == "end_turn"
        assert answer["steer"] == {"via": "native", "outcome": "injected"}
        await rec.wait(terminal(p1))
        ev = rec.events
        steered = rec.index(of_type("prompt_steered"))
        assert ev[steered]["data"] == {
            "sessionId": sid,
            "promptId": p1,
            "via": "native",
            "text": "steered",
            "outcome": "injected",
        }
        # The steer ran inside the running turn, after its own work, before its one end.
        assert rec.index(said("second", p1)) < rec.index(said("steered", p1))
        assert rec.index(said("steered", p1)) < rec.index(terminal(p1))
        terminals = [e for e in ev if e["type"] in ("turn_complete", "turn_error")]
        assert [e["promptId"] for e in terminals] == [p1]


async def test_a_turn_ends_when_steered_work_stops_streaming_not_at_end_turn(
    steer_daemon: DaemonProcess,
) -> None:
    async with session(steer_daemon) as (http, sid, rec):
        # [steer-late]: the agent answers end_turn after "done" while the steer still streams.
        p1 = (await prompt(http, sid, text("[steer-late] go [sleep 600] done")))["promptId"]
        p2 = (await prompt(http, sid, text("after")))["promptId"]
        await rec.wait(said("go", p1))
        r = await http.post(
            f"/session/{sid}/prompt",
            json=text("[sleep 1000] late-a [sleep 200] late-b", steer=True),
            headers=ASYNC,
        )
        assert r.status_code == 202, r.text
        assert r.json()["promptId"] == p1
        assert r.json()["steer"]["via"] == "native"
        await rec.wait(terminal(p2))
        done, late_a, late_b = (
            rec.index(said("done", p1)),
            rec.index(said("late-a", p1)),
            rec.index(said("late-b", p1)),
        )
        end = rec.index(terminal(p1))
        assert rec.events[end]["type"] == "turn_complete"
        # The turn is over when the agent stopped streaming for it: after late-b, not
        # when its prompt response (after "done") arrived; the next prompt starts after.
        assert done < late_a < late_b < end
        assert end < rec.index(of_type("pending_prompt_started", p2))
        assert end < rec.index(said("after", p2))


async def test_without_native_steering_the_turn_is_cancelled_and_the_steer_runs_next(
    legacy_daemon: DaemonProcess,
) -> None:
    async with session(legacy_daemon) as (http, sid, rec):
        p1 = (await prompt(http, sid, text("first [sleep 20000] never")))["promptId"]
        p2 = (await prompt(http, sid, text("queued-one")))["promptId"]
        await rec.wait(said("first", p1))
        steer = await prompt(http, sid, text("new direction", steer=True))
        s = steer["promptId"]
        assert s not in (p1, p2)
        assert steer["steer"] == {
            "via": "cancel",
            "reason": "not_supported_by_agent",
            "cancelledPromptId": p1,
        }
        await rec.wait(terminal(p2))
        cancelled = rec.events[rec.index(terminal(p1))]
        assert cancelled["type"] == "turn_complete"
        assert cancelled["data"]["stopReason"] == "cancelled"
        reason = rec.events[rec.index(of_type("prompt_cancelled", p1))]["data"]["reason"]
        assert reason == "steered"
        # The steer's text is the very next prompt, ahead of what already waited.
        assert rec.index(terminal(p1)) < rec.index(said("new direction", s))
        assert rec.index(terminal(s)) < rec.index(said("queued-one", p2))
        assert not any(said("never")(e) for e in rec.events)


async def test_a_failed_native_steer_falls_back_to_cancel_and_reprompt(
    steer_daemon: DaemonProcess,
) -> None:
    async with session(steer_daemon) as (http, sid, rec):
        # [steer-fail]: the agent advertises steering but answers this turn's steers "failed".
        p1 = (await prompt(http, sid, text("[steer-fail] first [sleep 20000] never")))["promptId"]
        await rec.wait(said("first", p1))
        steer = await prompt(http, sid, text("instead", steer=True))
        assert steer["steer"] == {
            "via": "cancel",
            "reason": "steering_failed",
            "cancelledPromptId": p1,
        }
        await rec.wait(terminal(steer["promptId"]))
        assert rec.events[rec.index(terminal(p1))]["data"]["stopReason"] == "cancelled"
        assert rec.index(terminal(p1)) < rec.index(said("instead", steer["promptId"]))
        assert not any(said("never")(e) for e in rec.events)


async def test_a_turn_that_settled_under_the_steer_makes_it_the_next_prompt(
    steer_daemon: DaemonProcess,
) -> None:
    async with session(steer_daemon) as (http, sid, rec):
        # [steer-closed]: the agent answers promptRequired, as for a turn that is ending.
        p1 = (await prompt(http, sid, text("[steer-closed] first [sleep 800] done")))["promptId"]
        p2 = (await prompt(http, sid, text("queued")))["promptId"]
        await rec.wait(said("first", p1))
        steer = await prompt(http, sid, text("next", steer=True))
        assert steer["steer"] == {"via": "prompt", "reason": "prompt_required"}
        s = steer["promptId"]
        await rec.wait(terminal(p2))
        # Not cancelled: the turn ran to its end; the steer runs next, ahead of the queue.
        assert rec.events[rec.index(terminal(p1))]["data"]["stopReason"] == "end_turn"
        assert rec.index(said("done", p1)) < rec.index(said("next", s))
        assert rec.index(terminal(s)) < rec.index(said("queued", p2))


async def test_a_resent_steer_is_the_same_steer_not_a_second_cancel(
    legacy_daemon: DaemonProcess,
) -> None:
    async with session(legacy_daemon) as (http, sid, rec):
        p1 = (await prompt(http, sid, text("first [sleep 20000]")))["promptId"]
        await rec.wait(said("first", p1))
        body = text("redirected [sleep 1500] done", steer=True, promptId="steer-1")
        first = await prompt(http, sid, body)
        await rec.wait(said("redirected", "steer-1"))  # the steer's own turn runs now
        again = await prompt(http, sid, body)  # e.g. a client retrying after a timeout
        assert again["promptId"] == first["promptId"] == "steer-1"
        assert again["steer"] == first["steer"]
        await rec.wait(terminal("steer-1"))
        end = rec.events[rec.index(terminal("steer-1"))]
        assert end["type"] == "turn_complete" and end["data"]["stopReason"] == "end_turn"
        assert len([e for e in rec.events if e["type"] == "prompt_steered"]) == 1


async def test_a_steer_with_no_running_turn_is_a_prompt(steer_daemon: DaemonProcess) -> None:
    async with session(steer_daemon) as (http, sid, rec):
        r = await http.post(f"/session/{sid}/prompt", json=text("hello", steer=True))
        assert r.status_code == 200, r.text
        assert r.json()["stopReason"] == "end_turn"
        assert r.json()["steer"] == {"via": "prompt", "reason": "no_running_turn"}
        await rec.wait(said("hello", r.json()["promptId"]))


@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
async def test_steer_must_be_a_boolean(steer_daemon: DaemonProcess, value: Any) -> None:
    async with httpx.AsyncClient(base_url=steer_daemon.url, timeout=30, headers=AUTH) as http:
        r = await http.post("/session", json={"sessionScope": "thread"})
        sid = r.json()["sessionId"]
        r = await http.post(f"/session/{sid}/prompt", json=text("x", steer=value))
        assert r.status_code == 400
        assert r.json() == {"error": "`steer` must be a boolean", "code": "invalid_steer"}
        await http.delete(f"/session/{sid}")


async def test_queued_prompts_can_be_listed_replaced_and_withdrawn(
    steer_daemon: DaemonProcess,
) -> None:
    async with session(steer_daemon) as (http, sid, rec):
        p1 = (await prompt(http, sid, text("[sleep 20000]")))["promptId"]
        p2 = (await prompt(http, sid, text("old text")))["promptId"]
        p3 = (await prompt(http, sid, text("withdraw me")))["promptId"]
        base = f"/session/{sid}/pending-prompts"

        r = await http.put(f"{base}/{p2}", json=text("new text"))
        assert r.status_code == 200, r.text
        assert r.json()["promptId"] == p2 and r.json()["text"] == "new text"
        assert r.json()["state"] == "queued"
        listed = (await http.get(base)).json()["pending"]
        assert [(e["promptId"], e["state"], e["text"]) for e in listed] == [
            (p1, "running", "[sleep 20000]"),
            (p2, "queued", "new text"),
            (p3, "queued", "withdraw me"),
        ]
        updated = await rec.wait(of_type("pending_prompt_updated", p2))
        assert updated["data"]["text"] == "new text"

        # Strict: the running prompt, unknown ids, other fields and bad prompts are refused.
        r = await http.put(f"{base}/{p1}", json=text("no"))
        assert r.status_code == 409 and r.json()["code"] == "prompt_running"
        r = await http.put(f"{base}/nope", json=text("no"))
        assert r.status_code == 404 and r.json()["code"] == "prompt_not_found"
        r = await http.put(f"{base}/{p2}", json=text("no", promptId="x"))
        assert r.status_code == 400 and r.json()["code"] == "invalid_pending_prompt"
        r = await http.put(f"{base}/{p2}", json={"prompt": []})
        assert r.status_code == 400 and "prompt" in r.json()["error"]
        r = await http.put(f"{base}/{p2}", content=b"[1]")
        assert r.status_code == 400

        r = await http.delete(f"{base}/{p3}")
        assert r.status_code == 204
        listed = (await http.get(base)).json()["pending"]
        assert [e["promptId"] for e in listed] == [p1, p2]

        r = await http.post(f"/session/{sid}/cancel")
        assert r.status_code == 204
        await rec.wait(terminal(p2))
        # The replacement is what reached the agent.
        assert any(said("new text", p2)(e) for e in rec.events)
        assert not any(said("old text")(e) for e in rec.events)
        assert not any(said("withdraw me")(e) for e in rec.events)


async def test_capabilities_list_steer_and_queue_edit(steer_daemon: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=steer_daemon.url, timeout=30, headers=AUTH) as http:
        features = (await http.get("/capabilities")).json()["features"]
    assert "session_prompt_steer" in features
    assert "session_pending_prompt_edit" in features
