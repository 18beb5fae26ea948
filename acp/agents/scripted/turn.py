"""The scripted agent's prompt thread: one turn's script, run directive by directive.

The seam: :mod:`.agent` is the main thread, the protocol endpoint (it reads stdin, answers
the quick methods, owns the open sessions and the store, resolves the answers to the requests
the agent sent). Each ``session/prompt`` starts a prompt thread that runs a
:class:`TurnRunner` over the prompt's script (:mod:`.script`): text is echoed, each
``[directive]`` is a ``do_<name>`` method that emits ``session/update`` notifications and
calls the client (``session/request_permission``, ``fs/*``, ``terminal/*``,
``elicitation/create``), waiting for its answer. A new directive is a new ``do_`` method here.

The state a turn shares with the main thread is :class:`Session` (under its lock) and
:class:`Turn` (the cancel event and the steers inbox); the runner reaches the agent only
through :class:`Agent` (a Protocol: :mod:`.agent` imports this module).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import IO, Any, Final, Protocol

from acp import jsonrpc
from acp.agents.scripted import acp121, elicit, script, steering
from acp.agents.scripted.store import SessionRecord
from acp.errors import INTERNAL_ERROR, INVALID_PARAMS
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentToolCallContent,
    DiffToolCallContent,
    Plan,
    PlanEntry,
    SessionNotification,
    SessionUpdate,
    TerminalToolCallContent,
    TextContent,
    ToolCall,
    ToolCallLocation,
    ToolCallUpdate,
    UsageUpdate,
)

SLOW_DELAY_S: Final = 0.05
FLOOD_MAX: Final = 10_000_000
FLOOD_BATCH: Final = 1024
#: The context window the scripted agent reports in usage_update (tokens).
CONTEXT_SIZE: Final = 200_000


class RpcFailure(Exception):
    """Answer the current request with this JSON-RPC error."""

    def __init__(self, code: int, message: str, data: object = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Cancelled(Exception):
    """The turn was cancelled by the client."""


class Turn:
    def __init__(self, request_id: jsonrpc.RequestId) -> None:
        self.request_id = request_id
        self.cancel = threading.Event()
        self.steers = steering.SteerInbox()


class Session:
    def __init__(self, record: SessionRecord) -> None:
        self.record = record
        self.lock = threading.Lock()
        self.turn: Turn | None = None
        self.always_allow_write = False
        self.context_used = len(" ".join(e.text for e in record.history).split())
        self.cost = 0.0
        self.reports_context = False  # usage_update only once a [usage] asked for it


class Agent(Protocol):
    """What a turn uses of :class:`~acp.agents.scripted.agent.ScriptedAgent`."""

    legacy: bool
    out: IO[bytes]
    write_lock: threading.Lock
    hung: threading.Event
    client_capabilities: object

    def _write(self, data: bytes) -> None: ...

    def update(self, session_id: str, update: SessionUpdate) -> None: ...

    def call(self, method: str, params: object, turn: Turn | None = None) -> dict[str, Any]: ...


class TurnRunner:
    """Executes one prompt's script in a prompt thread."""

    def __init__(self, agent: Agent, session: Session, turn: Turn) -> None:
        self.agent = agent
        self.session = session
        self.record = session.record
        self.sid = session.record.session_id
        self.turn = turn
        self.updates = 0
        self.tool_ids = itertools.count(1)
        self.extra_tokens = 0  # added by [usage N]
        self.output_words = 0
        #: ACP 1.21 message id of the turn's agent message (its chunks share it).
        self.message_id = None if agent.legacy else "msg_" + os.urandom(6).hex()

    # helpers

    def check_cancel(self) -> None:
        if self.turn.cancel.is_set():
            raise Cancelled()

    def emit(self, update: SessionUpdate) -> None:
        if self.record.model_id == "scripted-slow" and self.turn.cancel.wait(SLOW_DELAY_S):
            raise Cancelled()
        self.agent.update(self.sid, update)
        self.updates += 1

    def say(self, text: str) -> None:
        self.emit(AgentMessageChunk(content=TextContent(text=text), message_id=self.message_id))
        self.record.add("agent", text)
        self.output_words += len(text.split())

    def usage_update(self) -> UsageUpdate:
        cost = {"amount": self.session.cost, "currency": "USD"} if self.session.cost else None
        return UsageUpdate(used=self.session.context_used, size=CONTEXT_SIZE, cost=cost)

    def do_usage(self, arg: str) -> None:
        parts = arg.split()
        try:
            tokens = max(0, int(parts[0])) if parts else 0
            cost = max(0.0, float(parts[1])) if len(parts) > 1 else 0.0
        except ValueError:
            tokens, cost = 0, 0.0
        self.extra_tokens += tokens
        self.session.context_used += tokens
        self.session.cost += cost
        self.session.reports_context = True
        if not self.agent.legacy:
            self.emit(self.usage_update())

    def abs_path(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.record.cwd, path))

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.agent.call(method, {"sessionId": self.sid, **params}, self.turn)

    # the script

    def execute(self, steps: list[script.Step]) -> str:
        try:
            self.run_steps(steps)
            while (steered := self.turn.steers.next()) is not None:  # steering.py
                self.record.add("user", steered)
                self.run_steps(script.parse(steered))
            return "end_turn"
        except Cancelled:
            return "cancelled"
        finally:
            self.turn.steers.close()

    def run_steps(self, steps: list[script.Step]) -> None:
        for step in steps:
            self.check_cancel()
            if isinstance(step, script.Text):
                self.say("echo: " + step.text)
            else:
                getattr(self, "do_" + step.name.replace("-", "_"))(step.arg)

    def do_steer_late(self, arg: str) -> None:
        """Steers of this turn run in their own thread (acp/agents/scripted/steering.py)."""

        def late(text: str) -> None:
            def run() -> None:
                try:
                    self.run_steps(script.parse(text))
                except Cancelled:
                    pass

            threading.Thread(target=run, name="steer-late", daemon=True).start()

        self.turn.steers.late = late

    def do_steer_closed(self, arg: str) -> None:
        """This turn takes no more steers, as one that is ending (``promptRequired``)."""
        self.turn.steers.close()

    def do_steer_fail(self, arg: str) -> None:
        """Steers of this turn are answered ``failed`` (acp/agents/scripted/steering.py)."""
        self.turn.steers.fail = True

    def do_touch(self, arg: str) -> None:
        self.say(acp121.touch(arg))

    def do_think(self, arg: str) -> None:
        self.emit(AgentThoughtChunk(content=TextContent(text=arg)))
        self.record.add("thought", arg)

    def do_plan(self, arg: str) -> None:
        entries = [e.strip() for e in arg.split("|") if e.strip()]
        self.emit(
            Plan(
                entries=[PlanEntry(content=e, priority="medium", status="pending") for e in entries]
            )
        )

    def do_sleep(self, arg: str) -> None:
        try:
            ms = max(0, int(arg or "0"))
        except ValueError:
            ms = 0
        if self.turn.cancel.wait(ms / 1000):
            raise Cancelled()

    def do_flood(self, arg: str) -> None:
        try:
            n = min(FLOOD_MAX, max(0, int(arg or "0")))
        except ValueError:
            n = 0
        batch: list[bytes] = []
        for i in range(n):
            note = SessionNotification(
                session_id=self.sid, update=AgentMessageChunk(content=TextContent(text=f"{i} "))
            )
            batch.append(jsonrpc.encode_notification("session/update", note))
            if len(batch) >= FLOOD_BATCH:
                self.agent._write(b"".join(batch))
                batch.clear()
                self.check_cancel()
        if batch:
            self.agent._write(b"".join(batch))
        self.updates += n
        self.record.add("agent", f"[flood {n}]")

    def do_error(self, arg: str) -> None:
        raise RpcFailure(
            INTERNAL_ERROR,
            "Internal error: scripted failure",
            {"directive": "error", "sessionId": self.sid, "detail": arg or None},
        )

    def do_crash(self, arg: str) -> None:
        with self.agent.write_lock:
            self.agent.out.flush()
        print("scripted agent: [crash] directive, exiting with status 17", file=sys.stderr)
        sys.stderr.flush()
        os._exit(17)

    def do_hang(self, arg: str) -> None:
        """``[hang]``: stop answering for good. ``[hang TEXT]`` first says TEXT as a thought,
        with no cancel check between the two: a test that waits for TEXT knows the agent
        is hung (``[think TEXT] [hang]`` leaves a step boundary where a cancel that arrived
        meanwhile ends the turn normally instead)."""
        if arg:
            self.do_think(arg)
        self.agent.hung.set()
        threading.Event().wait()

    def do_spawn_grandchild(self, arg: str) -> None:
        import subprocess

        child = subprocess.Popen(["sleep", "1000"])
        self.say(f"grandchild: {child.pid}")

    def do_write(self, arg: str) -> None:
        path, text = script.split_path_arg(arg)
        if not path:
            raise RpcFailure(INVALID_PARAMS, "[write PATH TEXT] needs a path")
        target = self.abs_path(path)
        tool_id = f"write_{next(self.tool_ids)}"
        self.emit(
            ToolCall(
                tool_call_id=tool_id,
                title=f"Write {path}",
                kind="edit",
                status="pending",
                locations=[ToolCallLocation(path=target)],
                raw_input={"path": target, "content": text},
                content=[DiffToolCallContent(path=target, new_text=text)],
            )
        )
        allowed = self.session.always_allow_write or self.record.mode_id in ("auto-edit", "yolo")
        if not allowed:
            try:
                answer = self.call(
                    "session/request_permission",
                    {
                        "toolCall": {
                            "toolCallId": tool_id,
                            "title": f"Write {path}",
                            "kind": "edit",
                            "status": "pending",
                            "locations": [{"path": target}],
                            "rawInput": {"path": target, "content": text},
                        },
                        "options": [
                            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                            {
                                "optionId": "allow_always",
                                "name": "Always allow",
                                "kind": "allow_always",
                            },
                            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                        ],
                    },
                )
            except RpcFailure as exc:
                self._tool_failed(tool_id, f"permission request failed: {exc.message}")
                return
            outcome = (answer or {}).get("outcome") or {}
            if outcome.get("outcome") != "selected":
                self._tool_failed(tool_id, "cancelled")
                raise Cancelled()
            option = outcome.get("optionId")
            if option == "allow_always":
                self.session.always_allow_write = True
            elif option != "allow":
                self._tool_failed(tool_id, "rejected")
                return
        self.emit(ToolCallUpdate(tool_call_id=tool_id, status="in_progress"))
        try:
            self.call("fs/write_text_file", {"path": target, "content": text})
        except RpcFailure as exc:
            self._tool_failed(tool_id, f"write failed: {exc.message}")
            return
        self.emit(
            ToolCallUpdate(
                tool_call_id=tool_id,
                status="completed",
                content=[
                    ContentToolCallContent(content=TextContent(text=f"wrote {len(text)} chars"))
                ],
            )
        )

    def _tool_failed(self, tool_id: str, why: str) -> None:
        self.emit(
            ToolCallUpdate(
                tool_call_id=tool_id,
                status="failed",
                content=[ContentToolCallContent(content=TextContent(text=why))],
            )
        )

    def do_elicit(self, arg: str) -> None:
        """``[elicit form|url ...]``: ask the client (:mod:`.elicit`)."""
        try:
            elicit.run(
                self,
                arg,
                self.agent.client_capabilities,
                lambda method, params: self.agent._write(
                    jsonrpc.encode_notification(method, params)
                ),
            )
        except RpcFailure as exc:
            self.say(f"elicitation failed: {exc.message}")

    def do_read(self, arg: str) -> None:
        path = arg.strip()
        target = self.abs_path(path)
        tool_id = f"read_{next(self.tool_ids)}"
        self.emit(
            ToolCall(
                tool_call_id=tool_id,
                title=f"Read {path}",
                kind="read",
                status="in_progress",
                locations=[ToolCallLocation(path=target)],
                raw_input={"path": target},
            )
        )
        try:
            result = self.call("fs/read_text_file", {"path": target})
        except RpcFailure as exc:
            self._tool_failed(tool_id, f"read failed: {exc.message}")
            self.say(f"read failed: {exc.message}")
            return
        content = str((result or {}).get("content", ""))
        self.emit(ToolCallUpdate(tool_call_id=tool_id, status="completed"))
        self.say(content)

    def do_shell(self, arg: str) -> None:
        tool_id = f"shell_{next(self.tool_ids)}"
        self.emit(
            ToolCall(
                tool_call_id=tool_id,
                title=arg,
                kind="execute",
                status="in_progress",
                raw_input={"command": arg},
            )
        )
        try:
            created = self.call(
                "terminal/create",
                {"command": "/bin/sh", "args": ["-c", arg], "cwd": self.record.cwd},
            )
        except RpcFailure as exc:
            self._tool_failed(tool_id, f"terminal failed: {exc.message}")
            self.say(f"shell failed: {exc.message}")
            return
        tid = created["terminalId"]
        self.emit(
            ToolCallUpdate(tool_call_id=tool_id, content=[TerminalToolCallContent(terminal_id=tid)])
        )
        try:
            status = self.call("terminal/wait_for_exit", {"terminalId": tid})
            output = self.call("terminal/output", {"terminalId": tid})
        except Cancelled:
            self.agent.call("terminal/kill", {"sessionId": self.sid, "terminalId": tid})
            self.agent.call("terminal/release", {"sessionId": self.sid, "terminalId": tid})
            self._tool_failed(tool_id, "cancelled")
            raise
        self.call("terminal/release", {"terminalId": tid})
        self.emit(ToolCallUpdate(tool_call_id=tool_id, status="completed", raw_output=status))
        self.say(str(output.get("output", "")))
