"""``acp-serve-client``: the command-line client of an acp-serve / ``qwen serve`` daemon.

Usage::

    acp-serve-client [--url URL] [--token T] [--json] COMMAND ...

    status                      daemon status, health and capabilities
    caps                        the advertised feature tags
    sessions [--workspace W]    live and persisted sessions of a workspace
    chat [--session ID] [--new] [--replay]
                                interactive chat with live output (see serve.client._chat)
    tail SID [--from ID]        stream a session's events until it closes (Ctrl-C stops)
    prompt SID TEXT [--answer OPTION]
                                one prompt; streams its turn, exits when the turn ends
    read PATH [--line N] [--limit N]
    write PATH (--stdin | --text T) [--replace] [--expected-hash H]
    close SID                   close a session

The URL defaults to ``http://127.0.0.1:4170``; the token to ``$QWEN_SERVER_TOKEN``.
``--json`` prints one JSON object per line on stdout (events, list entries, results),
with the wire's field names, and no colours or spinners; errors go to stderr (as JSON
with ``--json``). Human output uses rich; slow calls show a spinner on stderr.

Exit codes: 0 success; 1 the daemon refused (an HTTP error, a failed turn, a dead
session); 2 usage; 3 the daemon could not be reached or the stream was lost; 130
interrupted. ``main(argv)`` returns the code instead of exiting, so ``acp-serve client``
can dispatch to it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import trio
from rich.console import Console
from rich.table import Table
from rich.text import Text

from serve.client._async import DEFAULT_URL, AcpServeClient
from serve.client._chat import CANCEL, choose_option, run_chat
from serve.client._render import EventRenderer
from serve.client.errors import (
    AcpServeClientError,
    DaemonHttpError,
    DaemonUnreachableError,
    EventStreamLostError,
    NotFoundError,
)
from serve.client.types import PermissionRequest

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class _Io:
    """Where output goes: stdout console, stderr console, JSON lines."""

    def __init__(self, json_mode: bool) -> None:
        self.json = json_mode
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    def emit(self, obj: object) -> None:
        sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")
        sys.stdout.flush()

    @contextlib.contextmanager
    def spinner(self, what: str) -> Iterator[None]:
        if self.json or not self.err.is_terminal:
            yield
            return
        with self.err.status(what, spinner="dots"):
            yield

    def error(self, message: str, **extra: object) -> None:
        if self.json:
            sys.stderr.write(msgspec.json.encode({"error": message, **extra}).decode() + "\n")
            sys.stderr.flush()
        else:
            self.err.print(Text("error: ", style="bold red") + Text(message))


# ---- commands ---------------------------------------------------------------------------------


async def cmd_status(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    with io.spinner("asking the daemon…"):
        status = await client.daemon_status("full" if args.full else "summary")
        health = await client.health(deep=True)
    if io.json:
        io.emit(status)
        return EXIT_OK
    style = {"ok": "green", "warning": "yellow", "error": "red"}.get(status.status, "white")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    table.add_row("daemon", client.base_url)
    table.add_row("status", Text(status.status, style=f"bold {style}"))
    daemon = status.daemon
    table.add_row("workspace", str(daemon.get("workspaceCwd", "?")))
    if "uptimeMs" in daemon:
        table.add_row("uptime", f"{int(daemon['uptimeMs']) // 1000} s")
    table.add_row("sessions", str(health.sessions))
    table.add_row("active prompts", str(health.active_prompts))
    table.add_row("pending permissions", str(health.pending_permissions))
    table.add_row("event streams", str(health.connected_clients))
    features = status.capabilities.get("features") or []
    table.add_row("features", str(len(features)))
    io.out.print(table)
    for issue in status.issues:
        io.out.print(f"  {issue.severity}: {issue.code} {issue.message}", markup=False)
    return EXIT_OK


async def cmd_caps(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    with io.spinner("asking the daemon…"):
        caps = await client.capabilities()
    if io.json:
        io.emit(caps)
        return EXIT_OK
    io.out.print(
        f"protocol {caps.protocol_version} · mode {caps.mode} · "
        f"permission policy {caps.permission_policy}",
        markup=False,
    )
    for tag in caps.features:
        modes = caps.modes(tag)
        io.out.print(f"  {tag}" + (f" ({', '.join(modes)})" if modes else ""), markup=False)
    return EXIT_OK


async def cmd_sessions(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    with io.spinner("listing sessions…"):
        listed = await client.list_sessions(args.workspace, persisted=True)
    if io.json:
        for summary in listed.sessions:
            io.emit(summary)
        return EXIT_OK
    if not listed.sessions:
        io.out.print("no sessions (none live, none persisted)", style="dim")
        return EXIT_OK
    table = Table("session", "name", "clients", "state", "waiting", "created")
    for s in listed.sessions:
        waiting = "permission" if s.is_waiting_for_permission else ""
        name = s.display_name if s.display_name != s.session_id else ""
        table.add_row(
            s.session_id, name, str(s.client_count), s.active_work_state, waiting, s.created_at
        )
    io.out.print(table)
    if any(s.active_work_state == "persisted" for s in listed.sessions):
        io.out.print(
            "persisted: on disk, not loaded; `chat --session ID` restores one",
            style="dim",
            markup=False,
        )
    return EXIT_OK


async def cmd_tail(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    renderer = EventRenderer(io.out, verbose=args.verbose)
    code = EXIT_OK
    async with client.events(args.session, last_event_id=args.from_id) as stream:
        async for event in stream:
            if io.json:
                io.emit(event)
            else:
                renderer.render(event)
            if event.type == "session_died":
                code = EXIT_REFUSED
    renderer.newline()
    return code


async def cmd_prompt(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    """Submit one prompt, follow its turn on the stream, answer permissions, exit."""
    renderer = EventRenderer(io.out)
    prompt_id = str(uuid.uuid4())
    renderer.hide_prompt_ids = {prompt_id}
    ask = not io.json and args.answer is None and sys.stdin.isatty()
    with io.spinner("submitting…"):
        accepted = await client.prompt_async(args.session, args.text, prompt_id=prompt_id)
    outcome: dict[str, Any] = {"promptId": prompt_id}
    requests: set[str] = set()  # permission requests of this prompt (resolutions carry no id)
    code = EXIT_OK
    async with trio.open_nursery() as nursery:
        await nursery.start(_cancel_on_interrupt, client, args.session, renderer, io)
        async with client.events(args.session, last_event_id=accepted.last_event_id) as stream:
            async for event in stream:
                ours = (
                    event.prompt_id == prompt_id
                    or event.is_synthetic
                    or event.is_terminal
                    or event.data.get("requestId") in requests
                )
                if not ours:
                    continue
                if io.json:
                    io.emit(event)
                else:
                    renderer.render(event)
                if event.type == "permission_request":
                    requests.add(event.data.get("requestId", ""))
                    await _answer_permission(client, args, io, renderer, event.payload, ask)
                elif event.type == "turn_complete":
                    outcome["stopReason"] = event.data.get("stopReason")
                    break
                elif event.type == "turn_error":
                    outcome["error"] = event.data.get("message")
                    outcome["code"] = event.data.get("code")
                    code = EXIT_REFUSED
                    break
                elif event.is_terminal:
                    outcome["error"] = event.type
                    code = EXIT_REFUSED
        nursery.cancel_scope.cancel()
    renderer.newline()
    if io.json:
        io.emit(outcome)
    return code


async def _cancel_on_interrupt(
    client: AcpServeClient,
    session_id: str,
    renderer: EventRenderer,
    io: _Io,
    *,
    task_status: trio.TaskStatus[None],
) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            if not io.json:
                renderer.note("^C cancelling the prompt…", "yellow")
            with contextlib.suppress(AcpServeClientError):
                await client.cancel(session_id)


async def _answer_permission(
    client: AcpServeClient,
    args: argparse.Namespace,
    io: _Io,
    renderer: EventRenderer,
    request: PermissionRequest,
    ask: bool,
) -> None:
    choice: str | None = None
    if args.answer is not None:
        choice = args.answer if args.answer != "cancel" else CANCEL
    elif ask:
        while choice is None:
            io.out.print(f"choice [1-{len(request.options)}/c]> ", end="", markup=False)
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:
                choice = CANCEL
                break
            choice = choose_option(request, line)
    else:
        if not io.json:
            renderer.note("· waiting for another client to answer (or use --answer)")
        return
    try:
        if choice == CANCEL:
            await client.vote(args.session, request.request_id, cancel=True)
        else:
            await client.vote(args.session, request.request_id, choice)
    except NotFoundError:
        if not io.json:
            renderer.note("· already resolved")


async def cmd_chat(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    if io.json:
        io.error("chat is interactive; use prompt/tail with --json")
        return EXIT_USAGE
    return await run_chat(client, io.out, session_id=args.session, new=args.new, replay=args.replay)


async def cmd_read(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    with io.spinner(f"reading {args.path}…"):
        content = await client.read_file(args.path, line=args.line, limit=args.limit)
    if io.json:
        io.emit(content)
        return EXIT_OK
    sys.stdout.write(content.content)
    sys.stdout.flush()
    more = " (truncated)" if content.truncated or content.has_more else ""
    io.err.print(
        f"{content.path} · {content.size_bytes} bytes · {content.hash}{more}",
        style="dim",
        markup=False,
    )
    return EXIT_OK


async def cmd_write(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.stdin else args.text
    with io.spinner(f"writing {args.path}…"):
        expected = args.expected_hash
        if args.replace and expected is None:
            expected = (await client.read_file(args.path, limit=1)).hash
        result = await client.write_file(
            args.path, text, expected, "replace" if args.replace else "create"
        )
    if io.json:
        io.emit(result)
    else:
        verb = "created" if result.created else "replaced"
        io.out.print(
            f"{verb} {result.path} ({result.size_bytes} bytes) {result.hash}", markup=False
        )
    return EXIT_OK


async def cmd_close(client: AcpServeClient, io: _Io, args: argparse.Namespace) -> int:
    await client.close_session(args.session)
    if io.json:
        io.emit({"sessionId": args.session, "closed": True})
    else:
        io.out.print(f"closed {args.session}", markup=False)
    return EXIT_OK


# ---- parsing and dispatch -----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="acp-serve-client", description="Client of an acp-serve / qwen serve daemon."
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"daemon URL (default {DEFAULT_URL})")
    parser.add_argument("--token", default=None, help="bearer token (default $QWEN_SERVER_TOKEN)")
    parser.add_argument(
        "--token-header",
        default=None,
        metavar="NAME",
        help="send the token in this header instead of Authorization "
        "(default $ACP_SERVE_TOKEN_HEADER; a daemon with --token-header)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable JSON lines")
    parser.add_argument("--client-id", default=None, help="client id to resume (advanced)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("status", help="daemon status")
    p.add_argument("--full", action="store_true", help="per-session detail")
    p.set_defaults(run=cmd_status)

    p = sub.add_parser("caps", help="advertised capabilities")
    p.set_defaults(run=cmd_caps)

    p = sub.add_parser("sessions", help="list live and persisted sessions")
    p.add_argument("--workspace", default=None, help="workspace path (default: primary)")
    p.set_defaults(run=cmd_sessions)

    p = sub.add_parser("chat", help="interactive chat")
    p.add_argument("--session", default=None, help="attach to this session id")
    p.add_argument("--new", action="store_true", help="always start a new (thread) session")
    p.add_argument("--replay", action="store_true", help="replay the retained history first")
    p.set_defaults(run=cmd_chat)

    p = sub.add_parser("tail", help="stream a session's events")
    p.add_argument("session", metavar="SID")
    p.add_argument("--from", dest="from_id", type=int, default=None, help="replay after ID")
    p.add_argument("-v", "--verbose", action="store_true", help="show lifecycle frames")
    p.set_defaults(run=cmd_tail)

    p = sub.add_parser("prompt", help="send one prompt and stream its turn")
    p.add_argument("session", metavar="SID")
    p.add_argument("text", metavar="TEXT")
    p.add_argument("--answer", default=None, help="answer permission requests with OPTION_ID")
    p.set_defaults(run=cmd_prompt)

    p = sub.add_parser("read", help="read a workspace file")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--line", type=int, default=None)
    p.add_argument("--limit", type=int, default=None)
    p.set_defaults(run=cmd_read)

    p = sub.add_parser("write", help="write a workspace file")
    p.add_argument("path", metavar="PATH")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--stdin", action="store_true", help="content from stdin")
    source.add_argument("--text", default=None, help="content")
    p.add_argument("--replace", action="store_true", help="replace an existing file")
    p.add_argument("--expected-hash", default=None, help="sha256:<hex> the file must have")
    p.set_defaults(run=cmd_write)

    p = sub.add_parser("close", help="close a session")
    p.add_argument("session", metavar="SID")
    p.set_defaults(run=cmd_close)
    return parser


async def _amain(args: argparse.Namespace, io: _Io) -> int:
    token = args.token if args.token is not None else os.environ.get("QWEN_SERVER_TOKEN")
    token_header = args.token_header or os.environ.get("ACP_SERVE_TOKEN_HEADER") or None
    async with AcpServeClient(
        args.url, token=token, client_id=args.client_id, token_header=token_header
    ) as client:
        try:
            code: int = await args.run(client, io, args)
            return code
        except DaemonHttpError as exc:
            io.error(str(exc), status=exc.status, code=exc.code)
            return EXIT_REFUSED
        except (DaemonUnreachableError, EventStreamLostError) as exc:
            io.error(str(exc))
            return EXIT_UNREACHABLE
        except AcpServeClientError as exc:
            io.error(str(exc))
            return EXIT_REFUSED


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    io = _Io(args.json)
    try:
        return trio.run(_amain, args, io)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
