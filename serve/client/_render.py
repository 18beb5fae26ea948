"""Human rendering of session events with rich (used by ``chat``, ``tail`` and ``prompt``).

Theory of operation
-------------------
:class:`EventRenderer` turns one :class:`~serve.client.types.Event` at a time into
terminal output on a rich ``Console``. Message and thought chunks are streamed as they
arrive (no newline, soft-wrapped by the terminal); every other kind of output is a block
that starts on a fresh line, so the renderer remembers whether the cursor is mid-line.
Tool calls and their updates are one line each, a plan is a checklist, a permission
request is a panel with numbered options (the caller reads the answer), lifecycle frames
are dim notes. Markup in agent text is never interpreted (``markup=False``).

``hide_prompt_ids`` lets the chat skip the echo of its own prompts
(``user_message_chunk`` stamped with a prompt id it submitted). Nothing here does I/O
besides printing, and nothing blocks.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any, Final

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from serve.client.errors import ProtocolError
from serve.client.types import Event, PermissionRequest

__all__ = ["EventRenderer", "permission_panel"]

_PLAN_MARK: Final = {"completed": "[x]", "in_progress": "[~]", "pending": "[ ]"}
_TOOL_MARK: Final = {
    "pending": "…",
    "in_progress": "…",
    "completed": "✓",
    "failed": "✗",
}
_QUIET_UPDATES: Final = frozenset({"available_commands_update"})


def permission_panel(request: PermissionRequest) -> Panel:
    """The numbered choice shown for a permission request."""
    title = request.tool_call.get("title") or request.tool_call.get("kind") or "tool call"
    body = Text()
    body.append(f"{title}\n", style="bold")
    raw = request.tool_call.get("rawInput")
    if isinstance(raw, dict):
        for key, value in list(raw.items())[:6]:
            shown = value if isinstance(value, str) else repr(value)
            if len(shown) > 120:
                shown = shown[:117] + "..."
            body.append(f"  {key}: {shown}\n", style="dim")
    for index, option in enumerate(request.options, 1):
        label = option.name or option.option_id
        body.append(f"  [{index}] {label}", style="cyan")
        body.append(f"  ({option.option_id})\n", style="dim")
    body.append("answer with a number or option id, c to cancel", style="dim")
    return Panel(body, title="permission requested", border_style="yellow", expand=False)


class EventRenderer:
    """Stateful printer of events (see the module docstring)."""

    def __init__(
        self,
        console: Console,
        *,
        hide_prompt_ids: Container[str] = (),
        verbose: bool = False,
    ) -> None:
        self.console = console
        self.hide_prompt_ids = hide_prompt_ids
        self.verbose = verbose
        self.midline = False
        self._stream_style: str | None = None

    # ---- primitives ----------------------------------------------------------------------

    def stream(self, text: str, style: str | None = None) -> None:
        """Append streamed text; a change of style (message → thought) starts a new line."""
        if self.midline and style != self._stream_style:
            self.newline()
        self.console.print(text, end="", style=style, markup=False, highlight=False, soft_wrap=True)
        self._stream_style = style
        self.midline = not text.endswith("\n")

    def after_prompt(self) -> None:
        """An input prompt was printed: the next output of any kind starts a new line."""
        self.midline = True
        self._stream_style = "\0prompt"

    def newline(self) -> None:
        if self.midline:
            self.console.print()
            self.midline = False
        self._stream_style = None

    def line(self, text: str | Text, style: str | None = None) -> None:
        self.newline()
        self.console.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    def note(self, text: str, style: str = "dim") -> None:
        self.line(text, style)

    # ---- events --------------------------------------------------------------------------

    def render(self, event: Event) -> None:
        try:
            self._render(event)
        except ProtocolError as exc:
            self.note(f"[{event.type}] malformed payload: {exc}", "red")

    def _render(self, event: Event) -> None:
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            handler(event)
        elif self.verbose or not event.is_synthetic:
            self.note(f"· {event.type} {_short(event.data)}")

    def _on_session_update(self, event: Event) -> None:
        update = event.payload
        kind = update.kind
        data: dict[str, Any] = update.update
        if kind == "agent_message_chunk":
            if update.text is not None:
                self.stream(update.text)
        elif kind == "agent_thought_chunk":
            if update.text is not None:
                self.stream(update.text, "dim italic")
        elif kind == "user_message_chunk":
            if event.prompt_id is not None and event.prompt_id in self.hide_prompt_ids:
                return
            if update.text is not None:
                self.line(Text("› " + update.text, style="cyan"))
        elif kind == "tool_call":
            status = str(data.get("status", "pending"))
            title = data.get("title") or data.get("toolCallId", "tool")
            line = Text("⚙ ", style="magenta")
            line.append(str(title), style="bold")
            if data.get("kind"):
                line.append(f" [{data['kind']}]", style="dim")
            line.append(f" {_TOOL_MARK.get(status, status)} {status}", style="dim")
            self.line(line)
        elif kind == "tool_call_update":
            status = str(data.get("status", "updated"))
            style = {"completed": "green", "failed": "red"}.get(status, "dim")
            mark = _TOOL_MARK.get(status, "·")
            self.line(Text(f"  {mark} {data.get('toolCallId', 'tool')} {status}", style=style))
        elif kind == "plan":
            entries = data.get("entries") or []
            text = Text("plan:\n", style="bold blue")
            for entry in entries:
                if not isinstance(entry, dict):
                    continue
                status = str(entry.get("status", "pending"))
                mark = _PLAN_MARK.get(status, "[?]")
                text.append(f"  {mark} {entry.get('content', '')}\n")
            text.rstrip()
            self.line(text)
        elif kind in _QUIET_UPDATES and not self.verbose:
            return
        elif kind == "current_mode_update":
            self.note(f"· mode: {data.get('currentModeId')}")
        else:
            self.note(f"· {kind or 'update'} {_short(data)}")

    def _on_permission_request(self, event: Event) -> None:
        self.newline()
        self.console.print(permission_panel(event.payload))

    def _on_permission_resolved(self, event: Event) -> None:
        resolved = event.payload
        choice = resolved.option_id or "cancelled"
        by = f" by {resolved.voter_client_id}" if resolved.voter_client_id else ""
        self.note(f"· permission {choice}{by}")

    def _on_turn_complete(self, event: Event) -> None:
        self.note(f"· turn complete ({event.payload.stop_reason})")

    def _on_turn_error(self, event: Event) -> None:
        error = event.payload
        code = f" [{error.code}]" if error.code is not None else ""
        self.note(f"✗ turn failed{code}: {error.message}", "bold red")

    def _on_prompt_cancelled(self, event: Event) -> None:
        self.note("· prompt cancelled", "yellow")

    def _on_session_closed(self, event: Event) -> None:
        self.note(f"· session closed ({event.payload.reason})", "yellow")

    def _on_session_died(self, event: Event) -> None:
        died = event.payload
        code = f", exit {died.exit_code}" if died.exit_code is not None else ""
        self.note(f"✗ session died ({died.reason}{code})", "bold red")

    def _on_state_resync_required(self, event: Event) -> None:
        resync = event.payload
        self.note(f"! events were missed ({resync.reason}); history may be incomplete", "yellow")

    def _on_replay_complete(self, event: Event) -> None:
        if self.verbose:
            self.note(f"· replayed {event.payload.replayed_count} events")

    def _on_slow_client_warning(self, event: Event) -> None:
        if self.verbose:
            self.note("· the daemon says this client is falling behind")

    def _on_client_evicted(self, event: Event) -> None:
        if self.verbose:
            self.note("· evicted by the daemon; resuming")

    def _on_pending_prompt_added(self, event: Event) -> None:
        if self.verbose:
            self.note("· prompt queued")

    def _on_pending_prompt_started(self, event: Event) -> None:
        return

    def _on_pending_prompt_completed(self, event: Event) -> None:
        return


def _short(data: object, limit: int = 160) -> str:
    text = repr(data)
    return text if len(text) <= limit else text[: limit - 3] + "..."
