"""Isolation between packed sessions (issue 22, items 1 and 3-6): --sessions-per-agent > 1.

One session's ignored cancel ends only its own turn (the shared child is killed only when
it answers nobody); a session rebound onto another child is not hit by its old child's
exit; a session leaving a child takes its terminals with it; an oversized agent line is
reported to the session it names only; an agent without ``session/close`` gets its
children recycled. Real daemon, real agent children (the scripted agent, or it with knobs:
``tests/support/packing_agent.py``); waits are bounded, nothing asserts a duration.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

PACKING_AGENT = Path(__file__).resolve().parents[1] / "support" / "packing_agent.py"
GRACE_MS = 300


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


def is_terminal(event: dict[str, Any]) -> bool:
    return event.get("type") in ("turn_complete", "turn_error")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def daemon(args: list[str], agent_flags: str | None = None) -> Iterator[DaemonProcess]:
    extra: list[str] = []
    home = Path(tempfile.mkdtemp(prefix="packing-home-"))
    if agent_flags is not None:
        # The agent's own store in its HOME: writable under the file sandbox.
        state = home / "packing-agent"
        agent = f"{sys.executable} {PACKING_AGENT} --state-dir {state} {agent_flags}"
        extra = ["--agent", agent]
    d = spawn_daemon([*args, *extra], env={"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(home)})
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(home, ignore_errors=True)


async def open_client(d: DaemonProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30)


async def create(client: httpx.AsyncClient) -> str:
    response = await client.post("/session", json={"sessionScope": "thread"})
    assert response.status_code == 200, response.text
    return str(response.json()["sessionId"])


async def pids(client: httpx.AsyncClient) -> dict[str, int | None]:
    body = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return {s["sessionId"]: s["agentPid"] for s in body["full"]["sessions"]}


async def submit(client: httpx.AsyncClient, sid: str, prompt: str) -> str:
    response = await client.post(
        f"/session/{sid}/prompt", json=text(prompt), headers={"Prefer": "respond-async"}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["promptId"])


async def history(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        return await collect_until(stream, lambda e: e["type"] == "replay_complete")


async def wait_event(
    client: httpx.AsyncClient, sid: str, stop: Any, after: int = 0
) -> list[dict[str, Any]]:
    """The session's events after ``after`` up to the first that ``stop`` accepts."""
    with trio.fail_after(60):
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(after)}
        ) as stream:
            return await collect_until(stream, stop)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if "id" in e]


# ---- item 1: an ignored cancel ends only that session's turn -----------------------------


@pytest.fixture
def deaf() -> Iterator[DaemonProcess]:
    yield from daemon(
        ["--sessions-per-agent", "2", "--warm-agents", "0", "--cancel-grace-ms", str(GRACE_MS)],
        "--deaf",
    )


@pytest.fixture
async def deaf_client(deaf: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with await open_client(deaf) as c:
        yield c


def in_agent(prompt_id: str) -> Callable[[dict[str, Any]], bool]:
    """Accepts the agent's own first update of the turn ``prompt_id`` (not the daemon's
    echo of the prompt, published before the agent has read it)."""
    return lambda e: (
        e.get("type") == "session_update"
        and e.get("promptId") == prompt_id
        and e["data"]["update"]["sessionUpdate"] != "user_message_chunk"
    )


async def cancel_until_terminal(client: httpx.AsyncClient, sid: str, prompt_id: str) -> Any:
    """Wait for the turn to be in the agent, cancel it, return its terminal event. The
    agent's own first update says so: the daemon's echo of the prompt
    (``user_message_chunk``) comes before the agent has read the prompt, and a cancel sent
    then ends the turn normally (``stopReason: cancelled``) instead of finding it running."""
    await wait_event(client, sid, in_agent(prompt_id))
    assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
    done = await wait_event(client, sid, lambda e: is_terminal(e) and e["promptId"] == prompt_id)
    return done[-1]


async def test_an_ignored_cancel_on_a_shared_child_ends_only_that_sessions_turn(
    deaf_client: httpx.AsyncClient,
) -> None:
    client = deaf_client
    a, b = await create(client), await create(client)
    owner = await pids(client)
    shared = owner[b]
    assert shared is not None and owner[a] == shared  # packed on one child

    # Four ignored cancels in a minute (more than the restart intensity of 3).
    for _ in range(4):
        prompt_id = await submit(client, a, "[think in the turn] [sleep 30000]")
        terminal = await cancel_until_terminal(client, a, prompt_id)
        assert terminal["type"] == "turn_error"
        assert terminal["data"]["errorKind"] == "cancel_timeout"

    # B never noticed: same child, no restart, and it works.
    b_types = types(await history(client, b))
    assert "session_restarted" not in b_types and "session_died" not in b_types
    assert "turn_error" not in b_types
    assert (await pids(client))[b] == shared and alive(shared)
    reply = await client.post(f"/session/{b}/prompt", json=text("b still here"))
    assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"

    # A lives on too: its next prompt binds it to a child again and completes.
    reply = await client.post(f"/session/{a}/prompt", json=text("a goes on"))
    assert reply.status_code == 200, reply.text
    assert reply.json()["stopReason"] == "end_turn"
    a_types = types(await history(client, a))
    assert "session_died" not in a_types and "session_restarted" not in a_types
    assert a_types.count("agent_released") == 4


@pytest.fixture
def deaf_unloadable() -> Iterator[DaemonProcess]:
    yield from daemon(
        ["--sessions-per-agent", "2", "--warm-agents", "0", "--cancel-grace-ms", str(GRACE_MS)],
        "--deaf --no-load",
    )


async def test_an_ignored_cancel_ends_a_session_the_agent_cannot_restore_and_only_it(
    deaf_unloadable: DaemonProcess,
) -> None:
    async with await open_client(deaf_unloadable) as client:
        a, b = await create(client), await create(client)
        shared = (await pids(client))[b]
        assert shared is not None and (await pids(client))[a] == shared
        async with client.stream(
            "GET", f"/session/{a}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            prompt_id = await submit(client, a, "[think in the turn] [sleep 30000]")
            await wait_event(client, a, in_agent(prompt_id))
            assert (await client.post(f"/session/{a}/cancel")).status_code == 204
            with trio.fail_after(30):
                events = await collect_until(stream, lambda e: e["type"] == "session_died")
        [terminal] = [e for e in events if is_terminal(e)]
        assert terminal["data"]["errorKind"] == "cancel_timeout"
        assert events[-1]["data"]["reason"] == "cancel_timeout"
        # B, on the same child, never noticed.
        assert (await pids(client))[b] == shared
        assert "session_died" not in types(await history(client, b))
        reply = await client.post(f"/session/{b}/prompt", json=text("b still here"))
        assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"


@pytest.fixture
def hanging() -> Iterator[DaemonProcess]:
    yield from daemon(
        ["--sessions-per-agent", "2", "--warm-agents", "0", "--cancel-grace-ms", str(GRACE_MS)]
    )


async def test_a_shared_child_that_answers_nobody_is_restarted_and_charged_to_itself(
    hanging: DaemonProcess,
) -> None:
    async with await open_client(hanging) as client:
        a, b = await create(client), await create(client)
        owner = await pids(client)
        assert owner[a] == owner[b] is not None
        # [hang]: the whole agent stops reading and writing; the child is killed each time.
        # (Its thought and the hang are one step: a cancel sent once the thought is seen
        # finds the agent hung; with [think] [hang] a busy agent could end the turn first.)
        for round_ in range(1, 5):
            prompt_id = await submit(client, a, "[hang going down]")
            terminal = await cancel_until_terminal(client, a, prompt_id)
            assert terminal["data"].get("errorKind") == "cancel_timeout", (round_, terminal)
            await wait_event(  # B restored in place once more
                client,
                b,
                lambda e, n=round_: e["type"] == "session_restarted" and e["data"]["attempt"] == n,
            )
            if round_ < 4:
                await wait_event(
                    client,
                    a,
                    lambda e: e["type"] in ("session_restarted", "session_died"),
                    after=terminal["id"],
                )
        # A ignored the cancels: each restart was charged to it, and the fourth within the
        # minute (past the intensity of 3) ends it.
        with trio.fail_after(30):
            while (await client.get(f"/session/{a}/pending-prompts")).status_code != 404:  # noqa: ASYNC110 - polling the daemon
                await trio.sleep(0.05)
        # B, idle each time, was restored in place every time, charged to the child (whose
        # window allows 3) and then to itself (1 of its 3): it is alive and working.
        b_types = types(await history(client, b))
        assert b_types.count("session_restarted") == 4
        assert "session_died" not in b_types
        reply = await client.post(f"/session/{b}/prompt", json=text("b survived"))
        assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"


# ---- item 3: a session rebound elsewhere is not hit by its old child's exit ---------------


#: The idle release of the rebound test (ms): the test's setup (two creates, a prompt, a
#: status read; then a create and a prompt) must run inside it, on a busy machine too
#: (at 1 s a stalled test process saw a session released before it read its pid).
RELEASE_MS = 3000


@pytest.fixture
def releasing() -> Iterator[DaemonProcess]:
    yield from daemon(
        [
            "--sessions-per-agent",
            "2",
            "--warm-agents",
            "0",
            "--agent-idle-release-ms",
            str(RELEASE_MS),
        ]
    )


async def test_a_session_rebound_on_another_child_survives_its_old_childs_clean_exit(
    releasing: DaemonProcess,
) -> None:
    async with await open_client(releasing) as client:
        a, b = await create(client), await create(client)
        old = (await pids(client))[a]
        assert old is not None and (await pids(client))[b] == old
        busy = await submit(client, b, "[sleep 30000]")  # B keeps the old child
        await wait_event(client, a, lambda e: e["type"] == "agent_released")
        assert (await pids(client))[a] is None  # released: no pid of a child it left
        c = await create(client)  # takes the old child's free slot
        assert (await pids(client))[c] == old

        running = await submit(client, a, "[sleep 1500] rebound turn")
        rebound = await wait_event(client, a, lambda e: e["type"] == "agent_rebound")
        new = (await pids(client))[a]
        assert new not in (None, old)

        # The old child exits cleanly (its last sessions go), while A's turn runs.
        assert (await client.post(f"/session/{b}/cancel")).status_code == 204
        await wait_event(client, b, lambda e: is_terminal(e) and e["promptId"] == busy)
        assert (await client.delete(f"/session/{b}")).status_code in (200, 204)
        assert (await client.delete(f"/session/{c}")).status_code in (200, 204)
        with trio.fail_after(20):
            while alive(old):  # noqa: ASYNC110 - polling another process
                await trio.sleep(0.05)

        done = await wait_event(
            client, a, lambda e: is_terminal(e) and e["promptId"] == running, rebound[-1]["id"]
        )
        assert done[-1]["type"] == "turn_complete", done[-1]
        # A stayed on its new child for the whole turn (read from its events, not from the
        # status afterwards: once idle again it is rightly released within RELEASE_MS).
        moved = {"agent_released", "agent_rebound", "session_restarted"}
        assert not moved & set(types(done)), types(done)
        assert "session_restarted" not in types(await history(client, a))


# ---- item 4: a session leaving a shared child takes its terminals with it ----------------


def processes_running(argv: list[str]) -> list[int]:
    want = "\0".join(argv).encode() + b"\0"
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f.read() == want and alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def packed() -> Iterator[DaemonProcess]:
    yield from daemon(["--sessions-per-agent", "2", "--warm-agents", "0"])


async def test_a_deleted_sessions_terminals_die_on_a_shared_child(packed: DaemonProcess) -> None:
    async with await open_client(packed) as client:
        a, b = await create(client), await create(client)
        child = (await pids(client))[a]
        assert child is not None and (await pids(client))[b] == child
        marker = str(300 + os.getpid() % 600)  # a sleep nobody else runs
        mode = await client.post(f"/session/{a}/approval-mode", json={"mode": "yolo"})
        assert mode.status_code == 200, mode.text  # the agent runs it without asking
        await submit(client, a, f"[shell sleep {marker}]")
        with trio.fail_after(30):
            while not (found := processes_running(["sleep", marker])):  # noqa: ASYNC110 - polling another process
                await trio.sleep(0.05)
        assert (await client.delete(f"/session/{a}")).status_code in (200, 204)
        with trio.fail_after(20):
            while any(alive(pid) for pid in found):  # noqa: ASYNC110 - polling another process
                await trio.sleep(0.05)
        assert alive(child)  # B's child lives on, and B works
        reply = await client.post(f"/session/{b}/prompt", json=text("b here"))
        assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"


# ---- item 5: an oversized agent line is reported to its own session only -----------------


@pytest.fixture
def small_lines() -> Iterator[DaemonProcess]:
    yield from daemon(
        ["--sessions-per-agent", "2", "--warm-agents", "0", "--max-agent-line-bytes", "4096"]
    )


async def test_an_oversized_line_is_reported_only_to_the_session_it_belongs_to(
    small_lines: DaemonProcess,
) -> None:
    async with await open_client(small_lines) as client:
        a, b = await create(client), await create(client)
        assert (await pids(client))[a] == (await pids(client))[b] is not None
        busy = await submit(client, b, "[think waiting] [sleep 30000]")  # B's turn runs too
        await wait_event(client, b, in_agent(busy))
        reply = await client.post(f"/session/{a}/prompt", json=text("w" * 6000 + " [think ok]"))
        assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"
        assert (await client.post(f"/session/{b}/cancel")).status_code == 204
        await wait_event(client, b, lambda e: is_terminal(e) and e["promptId"] == busy)

        a_dropped = [e for e in await history(client, a) if e["type"] == "agent_output_dropped"]
        assert len(a_dropped) == 1 and a_dropped[0]["promptId"] == reply.json()["promptId"]
        assert a_dropped[0]["data"]["sizeBytes"] > 6000
        b_types = types(await history(client, b))
        assert "agent_output_dropped" not in b_types


# ---- item 6: an agent without session/close gets its children recycled -----------------


@pytest.fixture
def unclosable() -> Iterator[DaemonProcess]:
    yield from daemon(["--sessions-per-agent", "2", "--warm-agents", "1"], "--no-close")


async def pool_status(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/daemon/status")).json()["runtime"]["agents"][0]  # type: ignore[no-any-return]


async def test_sessions_an_agent_cannot_close_are_not_piled_up_in_a_shared_child(
    unclosable: DaemonProcess,
) -> None:
    async with await open_client(unclosable) as client:
        a, b = await create(client), await create(client)
        first = (await pids(client))[a]
        assert first is not None and (await pids(client))[b] == first
        assert (await client.delete(f"/session/{a}")).status_code in (200, 204)

        pool = await pool_status(client)
        assert pool["withoutSessionClose"] == "recycle"
        child = next(c for c in pool["children"] if c["pid"] == first)
        assert child["closesSessions"] is False
        assert child["deadSessions"] == 1 and child["sessions"] == 1
        assert child["state"] == "full"  # A's slot is not handed out again

        c = await create(client)
        assert (await pids(client))[c] not in (first, None)  # not into the child holding A

        # B goes too: the first child holds only sessions it cannot close, and is recycled
        # although a warm child is wanted.
        assert (await client.delete(f"/session/{b}")).status_code in (200, 204)
        with trio.fail_after(20):
            while alive(first):  # noqa: ASYNC110 - polling another process
                await trio.sleep(0.05)
        reply = await client.post(f"/session/{c}/prompt", json=text("c works"))
        assert reply.status_code == 200 and reply.json()["stopReason"] == "end_turn"
