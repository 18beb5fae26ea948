"""Third-party ACP agents behind the real daemon, offline: one flow, every agent.

Each agent of :data:`tests.interop.agents.MATRIX` (qwen-code, claude-agent-acp, codex-acp,
opencode, gemini-cli, kimi-cli, pi-acp, the Python SDK's echo agent) runs behind its own
``acp-serve`` process, against its own :class:`~tests.support.fake_models.FakeModels` server on
127.0.0.1, with a private HOME. The flow is one session taken through ten steps, one test
each, in order:

create → streamed reply → permission request answered → file on disk → cancel → the agent's own
mode → fork (or the agent's 501) → SIGKILL of the agent and restart in place → delete → no
process left.

A class-scoped fixture parametrized by agent holds the daemon and the session, so pytest runs
each agent's steps together and starts each agent once. A step whose predecessor failed skips
("needs step X"); a step an agent cannot do offline for a reason of its own skips with that
reason (``AgentSpec.skips``); nothing is faked as a pass. Permissions ask
because of the agents' own configuration (qwen ``tools.approvalMode: default``, claude
``defaultMode: default``, codex
``approval_policy = "untrusted"``, opencode ``permission.edit: ask``; gemini and kimi ask by
default): no approval-mode change is needed.

Only the HTTP API and the daemon's process tree (``/proc``) are used.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.interop.agents import MATRIX, RUNS, AgentSpec, Run, base_env, ensure_installed
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.fake_models import FakeModels, chat_turn
from tests.support.sse import iter_events

#: A guard against a wedged agent (a failure, not a timed assertion): one turn's events.
TURN_GUARD_S = 120.0
#: How long the processes of a deleted session may take to go (stop escalation is ~5 s).
EXIT_GUARD_S = 20.0


@dataclass
class Flow:
    spec: AgentSpec
    daemon: DaemonProcess
    model: FakeModels
    workspace: Path
    session_id: str = ""
    client_id: str = ""
    last_event_id: int = 0
    passed: set[str] = field(default_factory=set)
    #: (pid, start time) of every process of the session seen before delete.
    processes: set[tuple[int, str]] = field(default_factory=set)
    #: The credentials the steps send (the operator token; a principal's in
    #: tests/interop/test_agent_tenants.py).
    auth: dict[str, str] = field(default_factory=lambda: dict(AUTH))

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Qwen-Client-Id": self.client_id}


@pytest.fixture(scope="session")
def install_error() -> str | None:
    """Run scripts/install-agents unless its stamp is there (scripts/test runs it first; this
    covers a bare pytest). Its error, if any, fails the rows of the agents it did not install."""
    return ensure_installed()


@contextmanager
def started(spec: AgentSpec, install_error: str | None, *extra: str) -> Iterator[Flow]:
    """The agent behind its own daemon (``extra``: more daemon flags), its run removed after."""
    if reason := spec.missing():
        if install_error:
            pytest.fail(f"{reason}: {install_error}")
        pytest.skip(reason)  # e.g. no node on PATH, no bwrap and not root
    RUNS.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=RUNS))
    run = Run(root=root, home=root / "home", workspace=root / "ws")
    run.home.mkdir()
    run.workspace.mkdir()
    try:
        with FakeModels(workdir=str(run.workspace)) as model:
            env = base_env(run)
            env.update(spec.setup(run, model.base_url))
            env["QWEN_SERVER_TOKEN"] = TOKEN
            argv = spec.argv()
            if trace_dir := os.environ.get("ACP_MATRIX_STRACE"):
                # Every file call of the agent's tree (docs/agent-sandbox.md: how the
                # sandbox's per-agent table was made), kept after the run.
                argv = [
                    "strace",
                    "-f",
                    "-qq",
                    "-e",
                    "trace=%file,bind",
                    "-o",
                    str(run.home / ".strace"),
                    *argv,
                ]
            daemon = spawn_daemon(
                [
                    "--agent",
                    shlex.join(argv),
                    "--initialize-timeout-ms",
                    "60000",
                    "--session-restore-timeout-ms",
                    "60000",
                    # One child per session and no warm spare: the steps count the session's
                    # processes (create: exactly one agent; after delete: none left).
                    "--warm-agents",
                    "0",
                    # Nor the compile-cache probe child a node agent's daemon runs at start
                    # (tests/serve/test_compile_cache.py covers it).
                    "--agent-compile-cache-mb",
                    "0",
                    *extra,
                ],
                workspace=run.workspace,
                state_dir=root / "state",
                env=env,
            )
            try:
                yield Flow(spec=spec, daemon=daemon, model=model, workspace=run.workspace)
            finally:
                daemon.stop()
                if trace_dir and (run.home / ".strace").exists():
                    name = f"{spec.name}{'-'.join(('', *extra))}-{root.name}.strace"
                    shutil.copy(run.home / ".strace", Path(trace_dir) / name)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="class", params=MATRIX, ids=lambda spec: spec.name)
def flow(request: pytest.FixtureRequest, install_error: str | None) -> Iterator[Flow]:
    """The agent under the default sandbox (``--agent-sandbox auto``)."""
    with started(request.param, install_error) as flow:
        yield flow


@pytest.fixture(scope="class", params=MATRIX, ids=lambda spec: spec.name)
def flow_unsandboxed(request: pytest.FixtureRequest, install_error: str | None) -> Iterator[Flow]:
    """The agent with ``--agent-sandbox off`` (the shell step's other half)."""
    with started(request.param, install_error, "--agent-sandbox", "off") as flow:
        yield flow


@pytest.fixture(autouse=True)
def _step_gate(request: pytest.FixtureRequest) -> None:
    """Skip a step the agent cannot do (its reason) or whose predecessor did not pass.

    A sync fixture on purpose: pytest-trio drops the reason of a skip raised in an async test.
    """
    marker = request.node.get_closest_marker("step")
    if marker is None:
        return
    name = "flow_unsandboxed" if "flow_unsandboxed" in request.fixturenames else "flow"
    flow: Flow = request.getfixturevalue(name)
    step = marker.args[0]
    if reason := flow.spec.skips.get(step):
        pytest.skip(reason)
    for needed in marker.kwargs.get("needs", ()):
        if needed == "write_turn" and not flow.spec.asks_permission:
            continue  # the file step runs the write turn itself
        if needed not in flow.passed:
            pytest.skip(f"needs step {needed!r}, which did not pass")


# -- helpers ----------------------------------------------------------------------------------


@asynccontextmanager
async def http(flow: Flow) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=flow.daemon.url, timeout=TURN_GUARD_S, headers=flow.auth
    ) as client:
        yield client


async def read_events(
    client: httpx.AsyncClient,
    flow: Flow,
    stop: Callable[[dict[str, Any]], bool],
    on_event: Callable[[dict[str, Any]], Any] | None = None,
) -> list[dict[str, Any]]:
    """Events after ``flow.last_event_id`` until ``stop(event)`` (included)."""
    events: list[dict[str, Any]] = []
    with trio.fail_after(TURN_GUARD_S):
        async with client.stream(
            "GET",
            f"/session/{flow.session_id}/events",
            headers={"Last-Event-ID": str(flow.last_event_id)},
        ) as stream:
            async for event in iter_events(stream):
                if "comment" in event:
                    continue
                if isinstance(event.get("id"), int):
                    flow.last_event_id = event["id"]
                events.append(event)
                if on_event is not None:
                    await on_event(event)
                if stop(event):
                    return events
    raise AssertionError(f"event stream ended before the stop event: {events[-5:]}")


async def submit(client: httpx.AsyncClient, flow: Flow, text: str) -> str:
    r = await client.post(
        f"/session/{flow.session_id}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={**flow.headers, "Prefer": "respond-async"},
    )
    assert r.status_code == 202, r.text
    return str(r.json()["promptId"])


def terminal_of(prompt_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["type"] in ("turn_complete", "turn_error") and e.get("promptId") == prompt_id


def message_text(events: list[dict[str, Any]], prompt_id: str) -> tuple[str, int]:
    """The agent_message_chunk text of one prompt, and how many chunks carried text."""
    texts = []
    for e in events:
        if e["type"] != "session_update" or e.get("promptId") != prompt_id:
            continue
        update = e["data"]["update"]
        content = update.get("content") or {}
        if update.get("sessionUpdate") == "agent_message_chunk" and content.get("text"):
            texts.append(content["text"])
    return "".join(texts), len(texts)


async def allowed_turn(
    flow: Flow,
    text: str,
    *,
    mode: str = "",
    on_ask: Callable[[dict[str, Any]], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Send ``text`` (first switching the session to approval ``mode`` when one is given),
    answer ``allow_once`` to whatever the agent asks (``on_ask`` sees each request first) and
    return the turn's events, which must end ``turn_complete``."""
    async with http(flow) as client:
        if mode:
            r = await client.post(
                f"/session/{flow.session_id}/approval-mode",
                json={"mode": mode},
                headers=flow.headers,
            )
            assert r.status_code == 200, r.text

        async def vote(event: dict[str, Any]) -> None:
            if event["type"] != "permission_request":
                return
            on_ask(event)
            options = {o["kind"]: o["optionId"] for o in event["data"]["options"]}
            assert "allow_once" in options, options
            r = await client.post(
                f"/session/{flow.session_id}/permission/{event['data']['requestId']}",
                json={"outcome": {"outcome": "selected", "optionId": options["allow_once"]}},
                headers=flow.headers,
            )
            assert r.status_code == 200, r.text

        prompt_id = await submit(client, flow, text)
        events = await read_events(client, flow, terminal_of(prompt_id), vote)
    assert events[-1]["type"] == "turn_complete", f"{events[-1]}\n{diagnostics(flow)}"
    return events


async def write_turn(flow: Flow) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Ask the agent to write ``matrix-<agent>.txt``; allow once whatever it asks, checking that
    nothing is written before the answer. Returns the turn's events and the permission requests.
    """
    target = flow.workspace / f"matrix-{flow.spec.name}.txt"
    if flow.spec.overwrite_reason:
        target.write_text("placeholder\n")  # see AgentSpec.overwrite_reason
    before = target.read_text() if target.exists() else None
    asked: list[dict[str, Any]] = []

    def unwritten(event: dict[str, Any]) -> None:
        now = target.read_text() if target.exists() else None
        assert now == before, "written before the permission was answered"
        asked.append(event)

    text = f"please write {target.name} hello from {flow.spec.name}"
    events = await allowed_turn(flow, text, on_ask=unwritten)
    flow.passed.add("write_turn")
    return events, asked


async def shell_turn(flow: Flow) -> None:
    """Ask the agent to write ``matrix-shell-<agent>.txt`` through its shell tool (in
    ``spec.shell_mode`` when it has one); allow once whatever it asks; the file must be on disk
    afterwards: the turn's end alone proves nothing (an agent whose command the sandbox
    refused may still end its turn ``end_turn``)."""
    target = flow.workspace / f"matrix-shell-{flow.spec.name}.txt"
    target.unlink(missing_ok=True)
    text = f"please run {target.name} shell from {flow.spec.name}"
    events = await allowed_turn(flow, text, mode=flow.spec.shell_mode)
    tools = [
        e["data"]["update"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"].get("sessionUpdate") in ("tool_call", "tool_call_update")
    ]
    assert target.is_file(), f"no {target.name}; tool calls: {tools[-4:]}\n{diagnostics(flow)}"
    assert target.read_text() == f"shell from {flow.spec.name}"


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, start time) of a live, non-zombie pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), fields[19]


def session_processes(flow: Flow) -> set[tuple[int, str]]:
    """Every live descendant of the daemon (its only session's agent and that agent's children),
    plus any process left in their process groups, as (pid, start time)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            table[int(entry)] = st
    found: set[int] = set()
    frontier = {flow.daemon.proc.pid}
    while frontier:
        children = {p for p, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= children
        frontier = children
    groups = {table[p][1] for p in found} - {flow.daemon.proc.pid}
    found |= {p for p, (_, pgid, _) in table.items() if pgid in groups}
    return {(p, table[p][2]) for p in found}


def agent_pid(flow: Flow) -> int:
    """The agent child: the daemon's direct child leading its own process group (one session
    per daemon here; an orphan re-parented to the daemon keeps its old group)."""
    children = [
        pid
        for pid, _ in session_processes(flow)
        if (st := _stat(pid)) is not None and st[0] == flow.daemon.proc.pid and st[1] == pid
    ]
    assert len(children) == 1, f"expected one agent child, found {children}"
    return children[0]


def alive(process: tuple[int, str]) -> bool:
    st = _stat(process[0])
    return st is not None and st[2] == process[1]


def diagnostics(flow: Flow) -> str:
    stderr = flow.daemon.stderr()[-3000:]
    calls = [(api, path) for api, path, _ in flow.model.requests][-10:]
    # What each chat call asked (the fake model's reply follows from it: fake_models.plan).
    asked = [
        (t.user_text[:60], t.after_tool_result, len(t.tools))
        for t in map(chat_turn, flow.model.requests_of("chat")[-6:])
    ]
    return (
        f"model calls: {calls}\nchat turns (last user text, after a tool result, tools): "
        f"{asked}\ndaemon stderr tail:\n{stderr}"
    )


# -- the flow ---------------------------------------------------------------------------------


class TestAgentFlow:
    @pytest.mark.step("create")
    async def test_1_create(self, flow: Flow) -> None:
        async with http(flow) as client:
            r = await client.post("/session", json={"sessionScope": "thread"})
            assert r.status_code == 200, f"{r.text}\n{diagnostics(flow)}"
            body = r.json()
        flow.session_id, flow.client_id = body["sessionId"], body["clientId"]
        assert flow.session_id
        flow.processes |= session_processes(flow)
        agent_pid(flow)  # exactly one agent child runs for the session
        flow.passed.add("create")

    @pytest.mark.step("streamed_reply", needs=("create",))
    async def test_2_streamed_reply(self, flow: Flow) -> None:
        words = f"matrix hello from {flow.spec.name}"
        async with http(flow) as client:
            prompt_id = await submit(client, flow, words)
            events = await read_events(client, flow, terminal_of(prompt_id))
        last = events[-1]
        assert last["type"] == "turn_complete", f"{last}\n{diagnostics(flow)}"
        assert last["data"]["stopReason"] == "end_turn"
        text, chunks = message_text(events, prompt_id)
        # The fake model echoes the user text in three pieces; the agent relays them.
        assert words in text, f"{text!r}\n{diagnostics(flow)}"
        assert chunks >= (2 if flow.spec.streams_chunks else 1), (chunks, text)
        # The chunks arrived as the turn ran, before its terminal event.
        first_chunk = next(
            i
            for i, e in enumerate(events)
            if e["type"] == "session_update"
            and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
        )
        assert first_chunk < len(events) - 1
        flow.passed.add("streamed_reply")

    @pytest.mark.step("permission", needs=("streamed_reply",))
    async def test_3_permission(self, flow: Flow) -> None:
        events, asked = await write_turn(flow)
        seen = [(a["id"], a["data"]["toolCall"]) for a in asked]
        assert len(asked) == 1, f"asked {len(asked)} times: {seen}\n{diagnostics(flow)}"
        resolved = [e for e in events if e["type"] == "permission_resolved"]
        assert resolved and resolved[0]["data"]["requestId"] == asked[0]["data"]["requestId"]
        assert resolved[0]["data"]["outcome"]["outcome"] == "selected"
        # The asked tool call ran to completion.
        call_id = asked[0]["data"]["toolCall"]["toolCallId"]
        statuses = [
            e["data"]["update"].get("status")
            for e in events
            if e["type"] == "session_update"
            and e["data"]["update"].get("sessionUpdate") in ("tool_call", "tool_call_update")
            and e["data"]["update"].get("toolCallId") == call_id
        ]
        if "completed" not in statuses and flow.spec.completion_note:
            # See AgentSpec.completion_note: the approved call's effect is the proof.
            target = flow.workspace / f"matrix-{flow.spec.name}.txt"
            assert target.read_text().rstrip("\n") == f"hello from {flow.spec.name}"
        else:
            assert "completed" in statuses, f"{call_id}: {statuses}\n{diagnostics(flow)}"
        flow.passed.add("permission")

    @pytest.mark.step("file_on_disk", needs=("write_turn",))
    async def test_4_file_on_disk(self, flow: Flow) -> None:
        if "write_turn" not in flow.passed:  # an agent that writes without asking (the gate)
            await write_turn(flow)
        target = flow.workspace / f"matrix-{flow.spec.name}.txt"
        assert target.is_file(), diagnostics(flow)
        assert target.read_text().rstrip("\n") == f"hello from {flow.spec.name}"
        flow.passed.add("file_on_disk")

    @pytest.mark.step("shell", needs=("streamed_reply",))
    async def test_4b_shell(self, flow: Flow) -> None:
        """The agent's shell tool has its effect under the default sandbox."""
        await shell_turn(flow)
        flow.passed.add("shell")

    @pytest.mark.step("cancel", needs=("streamed_reply",))
    async def test_5_cancel(self, flow: Flow) -> None:
        async with http(flow) as client:
            prompt_id = await submit(client, flow, "please stall")

            def streaming(e: dict[str, Any]) -> bool:
                return (
                    e["type"] == "session_update"
                    and e.get("promptId") == prompt_id
                    and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
                    and bool((e["data"]["update"].get("content") or {}).get("text"))
                ) or terminal_of(prompt_id)(e)

            # The model has started streaming and now holds the reply open.
            started = await read_events(client, flow, streaming)
            assert started[-1]["type"] == "session_update", f"{started[-1]}\n{diagnostics(flow)}"
            r = await client.post(f"/session/{flow.session_id}/cancel", headers=flow.headers)
            assert r.status_code == 204, r.text
            events = await read_events(client, flow, terminal_of(prompt_id))
        last = events[-1]
        assert last["type"] == "turn_complete", f"{last}\n{diagnostics(flow)}"
        assert last["data"]["stopReason"] == "cancelled", last
        assert [e["type"] for e in events].count("prompt_cancelled") == 1
        flow.passed.add("cancel")

    @pytest.mark.step("own_mode", needs=("streamed_reply",))
    async def test_6_own_mode(self, flow: Flow) -> None:
        """The agent's own mode ids are listed by /context and accepted by /approval-mode
        (issue 18 items 1 and 2), whether the agent advertises ACP modes or a mode option."""
        mode = flow.spec.own_mode
        async with http(flow) as client:
            r = await client.get(f"/session/{flow.session_id}/context", headers=flow.headers)
            assert r.status_code == 200, r.text
            modes = r.json()["state"]["modes"]
            ids = [m.get("id") for m in modes.get("availableModes") or []]
            assert mode in ids, f"{mode!r} not among the listed modes {ids}"
            r = await client.post(
                f"/session/{flow.session_id}/approval-mode",
                json={"mode": mode},
                headers=flow.headers,
            )
            assert r.status_code == 200, r.text
            events = await read_events(client, flow, lambda e: e["type"] == "approval_mode_changed")
        assert events[-1]["data"]["next"] == mode, events[-1]
        flow.passed.add("own_mode")

    @pytest.mark.step("fork", needs=("streamed_reply",))
    async def test_6b_fork(self, flow: Flow) -> None:
        """A fork of the session (issue 27 item 1): the daemon reports whether the agent can
        fork; one that advertises ``sessionCapabilities.fork`` gets a new daemon session whose
        stream starts with ``session_forked``, with the parent's model and mode (and, in the
        agent, its conversation: the fork's model request carries the parent's words) and its
        own turn; deleting it leaves the parent and no process of it. Others answer 501."""
        parent_words = f"matrix hello from {flow.spec.name}"
        async with http(flow) as client:
            r = await client.get(f"/session/{flow.session_id}/context", headers=flow.headers)
            assert r.status_code == 200, r.text
            parent = r.json()
            via = flow.spec.fork_via
            assert parent["agent"]["fork"] == {"supported": via is not None, "via": via}
            if via is None:
                r = await client.post(
                    f"/session/{flow.session_id}/branch", json={}, headers=flow.headers
                )
                assert r.status_code == 501, r.text
                assert r.json()["code"] == "not_supported_by_agent"
                flow.passed.add("fork")
                return
            before = session_processes(flow)
            r = await client.post(
                f"/session/{flow.session_id}/branch", json={}, headers=flow.headers
            )
            assert r.status_code == 201, f"{r.text}\n{diagnostics(flow)}"
            body = r.json()
            fork_id = body["sessionId"]
            assert fork_id != flow.session_id and body["via"] == "session/fork"
            fork = Flow(
                spec=flow.spec,
                daemon=flow.daemon,
                model=flow.model,
                workspace=flow.workspace,
                session_id=fork_id,
                client_id=body["clientId"],
            )
            fork_processes = session_processes(flow) - before
            flow.processes |= fork_processes
            first = await read_events(client, fork, lambda e: True)
            assert first[-1]["type"] == "session_forked", first
            assert first[-1]["data"]["parentSessionId"] == flow.session_id
            # The parent's model and mode, as the daemon sees them.
            r = await client.get(f"/session/{fork_id}/context", headers=fork.headers)
            state, was = r.json()["state"], parent["state"]
            for key, current in (("models", "currentModelId"), ("modes", "currentModeId")):
                if (was.get(key) or {}).get(current) is not None:
                    assert state[key][current] == was[key][current], (key, state[key])
            # Its own turn, with the parent's conversation in the agent's context.
            words = f"matrix fork {flow.spec.name}"
            prompt_id = await submit(client, fork, words)
            events = await read_events(client, fork, terminal_of(prompt_id))
            assert events[-1]["type"] == "turn_complete", f"{events[-1]}\n{diagnostics(flow)}"
            assert words in message_text(events, prompt_id)[0]
            asked = [json.dumps(b) for _, _, b in flow.model.requests if words in json.dumps(b)]
            assert asked and parent_words in asked[-1], f"{asked[-1:]}"[:2000]
            r = await client.delete(f"/session/{fork_id}", headers=fork.headers)
            assert r.status_code == 204, r.text
        deadline = time.monotonic() + EXIT_GUARD_S
        while left := [p for p in fork_processes if alive(p)]:
            if time.monotonic() > deadline:
                raise AssertionError(f"processes of the deleted fork left: {left}")
            await trio.sleep(0.1)
        agent_pid(flow)  # the parent's agent alone again
        flow.passed.add("fork")

    @pytest.mark.step("sigkill_restart", needs=("streamed_reply",))
    async def test_7_sigkill_restart(self, flow: Flow) -> None:
        victim = agent_pid(flow)
        flow.processes |= session_processes(flow)
        os.kill(victim, signal.SIGKILL)
        async with http(flow) as client:
            events = await read_events(
                client, flow, lambda e: e["type"] in ("session_restarted", "session_died")
            )
            assert events[-1]["type"] == "session_restarted", f"{events[-1]}\n{diagnostics(flow)}"
            # Same session id, a new agent child, and the session answers again.
            words = f"matrix after restart {flow.spec.name}"
            prompt_id = await submit(client, flow, words)
            events = await read_events(client, flow, terminal_of(prompt_id))
        assert events[-1]["type"] == "turn_complete", f"{events[-1]}\n{diagnostics(flow)}"
        assert words in message_text(events, prompt_id)[0]
        assert agent_pid(flow) != victim
        flow.processes |= session_processes(flow)
        flow.passed.add("sigkill_restart")

    @pytest.mark.step("delete", needs=("create",))
    async def test_8_delete(self, flow: Flow) -> None:
        flow.processes |= session_processes(flow)
        async with http(flow) as client:
            r = await client.delete(f"/session/{flow.session_id}", headers=flow.headers)
            assert r.status_code == 204, r.text
            r = await client.post(f"/session/{flow.session_id}/heartbeat", headers=flow.headers)
            assert r.status_code == 404, r.text
        flow.passed.add("delete")

    @pytest.mark.step("no_process_left", needs=("delete",))
    async def test_9_no_process_left(self, flow: Flow) -> None:
        assert flow.processes, "no agent process was ever seen"
        deadline = time.monotonic() + EXIT_GUARD_S
        while left := [p for p in flow.processes if alive(p)]:
            if time.monotonic() > deadline:
                raise AssertionError(f"processes left after delete: {left}")
            await trio.sleep(0.1)
        assert not session_processes(flow)
        flow.passed.add("no_process_left")


class TestShellUnsandboxed:
    """The shell step again with ``--agent-sandbox off``: the effect does not depend on the
    sandbox either way."""

    @pytest.mark.step("create")
    async def test_1_create(self, flow_unsandboxed: Flow) -> None:
        await TestAgentFlow().test_1_create(flow_unsandboxed)

    @pytest.mark.step("shell", needs=("create",))
    async def test_2_shell(self, flow_unsandboxed: Flow) -> None:
        await shell_turn(flow_unsandboxed)
