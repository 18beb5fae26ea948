"""The interactive ``chat`` command: prompts from the terminal, the session's events live.

Theory of operation
-------------------
:func:`run_chat` creates (or attaches to) a session, opens its event stream *before*
the first prompt (so nothing of the turn can be missed), then runs four tasks in one
nursery, all owned by :meth:`Chat.run`:

* the stdin reader: ``readline`` in a worker thread (abandoned on cancel), each line into
  a bounded channel, ``None`` at EOF;
* the event pump: renders every event (:class:`~serve.client._render.EventRenderer`),
  tracks this client's running prompts and the pending permission requests, and ends the
  chat when the session is closed or dies;
* the SIGINT watcher: Ctrl-C cancels the running prompt (``POST /cancel``); with nothing
  running it prints a hint, and a second Ctrl-C within 2 s quits (exit 130);
* the main loop: a line answers the oldest pending permission request when there is one
  (a number, an option id, ``y``/``n``, or ``c`` to cancel), is a ``/command``, or is sent
  as a non-blocking prompt with a client-chosen prompt id (so its events are recognised
  even when they arrive before the ``202``).

EOF (Ctrl-D, or the end of piped input) stops reading, cancels permission requests that
nobody can answer any more, waits for this client's running prompts to end, and exits 0.
A spinner runs from a prompt's submission until its first output. With piped (not a
terminal) input no input prompts are printed.

Exit codes: 0 normal end (EOF, ``/quit``, session closed), 1 the session died or was gone,
3 the event stream was lost, 130 interrupted.
"""

from __future__ import annotations

import collections
import signal
import sys
import uuid
from typing import Final

import trio
from rich.console import Console
from rich.status import Status

from serve.client._async import AcpServeClient
from serve.client._events import EventStream
from serve.client._render import EventRenderer
from serve.client.errors import AcpServeClientError, NotFoundError
from serve.client.types import Event, PermissionRequest

__all__ = ["Chat", "choose_option", "run_chat"]

CANCEL: Final = "__cancel__"
_HELP: Final = (
    "type a message and press Enter to prompt the agent\n"
    "  /cancel          cancel the running prompt (or Ctrl-C)\n"
    "  /model ID        switch the session's model\n"
    "  /mode MODE       approval mode: plan, default, auto-edit, auto, yolo\n"
    "  /session         show the session and client ids\n"
    "  /quit            leave (or Ctrl-D); the session stays on the daemon"
)
_REMEMBERED_PROMPTS: Final = 256
_DOUBLE_INTERRUPT_S: Final = 2.0


def choose_option(request: PermissionRequest, answer: str) -> str | None:
    """The option id an answer selects, :data:`CANCEL`, or None when it is not valid."""
    text = answer.strip()
    if not text:
        return None
    if text.lower() in ("c", "cancel"):
        return CANCEL
    ids = [o.option_id for o in request.options]
    if text.isdigit() and 1 <= int(text) <= len(ids):
        return ids[int(text) - 1]
    if text in ids:
        return text
    wanted = {"y": "allow_once", "yes": "allow_once", "n": "reject_once", "no": "reject_once"}
    kind = wanted.get(text.lower())
    if kind is not None:
        for option in request.options:
            if option.kind == kind:
                return option.option_id
    return None


class _Recent:
    """A bounded set of recent prompt ids (oldest forgotten first)."""

    def __init__(self, limit: int = _REMEMBERED_PROMPTS) -> None:
        self._items: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._limit = limit

    def add(self, item: str) -> None:
        self._items[item] = None
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def __contains__(self, item: object) -> bool:
        return item in self._items


class Chat:
    """One interactive chat on one session; see the module docstring."""

    def __init__(
        self,
        client: AcpServeClient,
        console: Console,
        session_id: str,
        *,
        quiet_until: int | None = None,
    ) -> None:
        self.client = client
        #: Attached to a session waiting for a permission: its stream is read from the
        #: start, and events up to this id only recover the pending requests (not shown).
        self.quiet_until = quiet_until
        #: Requests asked for a prompt of this client (only those are cancelled at EOF).
        self.asked_mine: set[str] = set()
        self.console = console
        self.session_id = session_id
        self.mine = _Recent()
        self.ended = _Recent()
        self.active: set[str] = set()
        self.pending: collections.OrderedDict[str, PermissionRequest] = collections.OrderedDict()
        self.renderer = EventRenderer(console, hide_prompt_ids=self.mine)
        self.eof = False
        self.interactive = sys.stdin.isatty()  # piped input: no input prompts to print
        self.exit_code = 0
        self._changed = trio.Event()
        self._status: Status | None = None
        self._last_interrupt: float | None = None
        self._pending_events: dict[str, Event] = {}

    # ---- small helpers -------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _spin(self) -> None:
        if self._status is None and self.console.is_terminal:
            self._status = self.console.status("thinking…", spinner="dots")
            self._status.start()

    def _unspin(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _show_prompt(self) -> None:
        if self.eof or not self.interactive:
            return
        self.renderer.newline()
        if self.pending:
            request = next(iter(self.pending.values()))
            self.console.print(f"choice [1-{len(request.options)}/c]> ", end="", markup=False)
        elif not self.active:
            self.console.print("you> ", end="", style="bold green", markup=False)
        else:
            return
        self.renderer.after_prompt()

    # ---- tasks ---------------------------------------------------------------------------

    async def run(self, stream: EventStream) -> int:
        send, receive = trio.open_memory_channel[str | None](64)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stdin, send)
            nursery.start_soon(self._pump, stream, nursery.cancel_scope)
            await nursery.start(self._watch_interrupts, nursery.cancel_scope)
            self._show_prompt()
            async with receive:
                async for line in receive:
                    if line is None:
                        await self._finish()
                        break
                    self.renderer.midline = False
                    if await self._handle(line):
                        break
            nursery.cancel_scope.cancel()
        self._unspin()
        self.renderer.newline()
        return self.exit_code

    async def _read_stdin(self, send: trio.MemorySendChannel[str | None]) -> None:
        async with send:
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                if not line:
                    await send.send(None)
                    return
                await send.send(line.rstrip("\r\n"))

    async def _pump(self, stream: EventStream, scope: trio.CancelScope) -> None:
        try:
            async for event in stream:
                await self._on_event(event)
        except NotFoundError:
            self._unspin()
            self.renderer.note("✗ the session is gone", "bold red")
            self.exit_code = 1
        except AcpServeClientError as exc:
            self._unspin()
            self.renderer.note(f"✗ event stream lost: {exc}", "bold red")
            self.exit_code = 3
        scope.cancel()

    async def _watch_interrupts(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()  # Ctrl-C is ours before the first input prompt shows
            async for _ in signals:
                if self.active:
                    self._unspin()
                    self.renderer.note("^C cancelling the running prompt…", "yellow")
                    try:
                        await self.client.cancel(self.session_id)
                    except AcpServeClientError as exc:
                        self.renderer.note(f"✗ cancel failed: {exc}", "red")
                    continue
                now = trio.current_time()
                if (
                    self._last_interrupt is not None
                    and now - self._last_interrupt < _DOUBLE_INTERRUPT_S
                ):
                    self.exit_code = 130
                    scope.cancel()
                    return
                self._last_interrupt = now
                self.renderer.note("(Ctrl-C again to quit, or Ctrl-D / /quit)")
                self._show_prompt()

    # ---- events --------------------------------------------------------------------------

    async def _catch_up(self, event: Event) -> bool:
        """While replaying what came before the attach: keep the permission requests still
        unanswered, show nothing; at the last replayed event show those. True while
        replaying."""
        if self.quiet_until is None or event.id is None:
            return False  # a synthetic frame (no id) is shown as it comes
        if event.id > self.quiet_until:
            self.quiet_until = None
            self._show_pending()
            return False
        if event.type == "permission_request":
            request: PermissionRequest = event.payload
            self.pending[request.request_id] = request
            self._pending_events[request.request_id] = event
        elif event.type == "permission_resolved":
            rid = event.data.get("requestId", "")
            self.pending.pop(rid, None)
            self._pending_events.pop(rid, None)
        if event.id == self.quiet_until:
            self.quiet_until = None
            self._show_pending()
        return True

    def _show_pending(self) -> None:
        for event in self._pending_events.values():
            self.renderer.note("· a permission is waiting for an answer:")
            self.renderer.render(event)
        if self._pending_events:
            self._show_prompt()
        self._pending_events.clear()

    async def _on_event(self, event: Event) -> None:
        if await self._catch_up(event):
            return
        self._unspin()
        self.renderer.render(event)
        if event.type == "permission_request":
            request: PermissionRequest = event.payload
            self.pending[request.request_id] = request
            if event.prompt_id is not None and event.prompt_id in self.mine:
                self.asked_mine.add(request.request_id)
            if self.eof and request.request_id in self.asked_mine:
                await self._answer(request, CANCEL)
            elif not self.eof:
                self._show_prompt()
        elif event.type == "permission_resolved":
            if self.pending.pop(event.data.get("requestId", ""), None) is not None:
                self._show_prompt()
        elif event.type in ("turn_complete", "turn_error"):
            prompt_id = event.prompt_id or event.data.get("promptId")
            if isinstance(prompt_id, str):
                self.ended.add(prompt_id)
                if prompt_id in self.active:
                    self.active.discard(prompt_id)
                    self._notify()
                    self._show_prompt()
        elif event.is_terminal:
            self.exit_code = 1 if event.type == "session_died" else 0

    # ---- input ---------------------------------------------------------------------------

    async def _handle(self, line: str) -> bool:
        """Act on one input line; True to leave the chat."""
        if self.pending:
            request = next(iter(self.pending.values()))
            choice = choose_option(request, line)
            if choice is None:
                self.renderer.note("answer with a listed number or option id, or c to cancel")
                self._show_prompt()
                return False
            await self._answer(request, choice)
            self._show_prompt()
            return False
        text = line.strip()
        if not text:
            self._show_prompt()
            return False
        if text.startswith("/"):
            return await self._command(text)
        await self._prompt(line)
        return False

    async def _answer(self, request: PermissionRequest, choice: str) -> None:
        self.pending.pop(request.request_id, None)
        try:
            if choice == CANCEL:
                await self.client.vote(self.session_id, request.request_id, cancel=True)
            else:
                await self.client.vote(self.session_id, request.request_id, choice)
        except NotFoundError:
            self.renderer.note("· that request was already resolved")
        except AcpServeClientError as exc:
            self.renderer.note(f"✗ vote failed: {exc}", "red")

    async def _prompt(self, text: str) -> None:
        prompt_id = str(uuid.uuid4())
        self.mine.add(prompt_id)
        self.active.add(prompt_id)
        self._spin()
        try:
            await self.client.prompt_async(self.session_id, text, prompt_id=prompt_id)
        except AcpServeClientError as exc:
            self.active.discard(prompt_id)
            self._unspin()
            self.renderer.note(f"✗ prompt refused: {exc}", "red")
            self._show_prompt()
            return
        if prompt_id in self.ended:
            self.active.discard(prompt_id)
            self._unspin()
            self._show_prompt()

    async def _command(self, text: str) -> bool:
        name, _, arg = text.partition(" ")
        arg = arg.strip()
        try:
            if name in ("/quit", "/exit"):
                return True
            if name == "/help":
                self.renderer.line(_HELP)
            elif name == "/cancel":
                await self.client.cancel(self.session_id)
            elif name == "/session":
                client_id = self.client.client_id_for(self.session_id)
                self.renderer.line(f"session {self.session_id}, client {client_id}")
            elif name == "/model" and arg:
                result = await self.client.set_model(self.session_id, arg)
                self.renderer.note(f"· model: {result.model_id or arg}")
            elif name == "/mode" and arg:
                # The user's word as typed: the daemon checks it (the agent's modes or qwen's).
                mode = await self.client.set_approval_mode(self.session_id, arg)  # type: ignore[arg-type]
                self.renderer.note(f"· approval mode: {mode.previous} → {mode.mode}")
            else:
                self.renderer.note(f"unknown command {text!r}; /help lists them")
        except AcpServeClientError as exc:
            self.renderer.note(f"✗ {exc}", "red")
        self._show_prompt()
        return False

    async def _finish(self) -> None:
        """EOF: nobody can answer any more here: cancel what this client's prompts asked
        (a request found waiting at the attach is left to its other clients), and wait for
        this client's prompts to end."""
        self.eof = True
        for request in list(self.pending.values()):
            if request.request_id in self.asked_mine:
                await self._answer(request, CANCEL)
        while self.active:
            await self._changed.wait()


async def run_chat(
    client: AcpServeClient,
    console: Console,
    *,
    session_id: str | None = None,
    new: bool = False,
    replay: bool = False,
) -> int:
    """Create or attach, open the stream, chat until EOF. Returns the exit code."""
    quiet_until: int | None = None
    with console.status("connecting…", spinner="dots"):
        if session_id is not None:
            restored = await client.load_session(session_id)
            sid, attached, workspace = (
                restored.session_id,
                restored.attached,
                restored.workspace_cwd,
            )
            start = 0 if replay else restored.last_event_id
            how = "attached" if attached else "restored"
            if not replay and await _waiting_for_permission(client, sid, workspace):
                quiet_until, start = restored.last_event_id, 0
        else:
            created = await client.create_session(scope="thread" if new else "single")
            sid, attached = created.session_id, created.attached
            workspace = created.workspace_cwd
            start = 0 if replay else None
            how = "attached" if attached else "new"
        stream = client.events(sid, last_event_id=start)
        await stream.open()
    async with stream:
        console.print(
            f"session {sid} ({how}) in {workspace}",
            style="bold",
            markup=False,
            highlight=False,
        )
        console.print(
            "Enter sends; Ctrl-C cancels the running prompt; Ctrl-D exits; /help",
            style="dim",
            markup=False,
        )
        return await Chat(client, console, sid, quiet_until=quiet_until).run(stream)


async def _waiting_for_permission(client: AcpServeClient, session_id: str, workspace: str) -> bool:
    """Whether the session has a permission request nobody answered yet (its list entry)."""
    try:
        listed = await client.list_sessions(workspace or None)
    except AcpServeClientError:
        return False
    return any(s.session_id == session_id and s.is_waiting_for_permission for s in listed.sessions)
