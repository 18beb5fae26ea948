"""``acp-serve attach URL [--token-file F] [--token-header NAME]``: a stdio ACP agent for a
remote ``/acp``.

An editor that only spawns local agent processes runs this; it speaks ACP (newline-delimited
JSON-RPC) on stdin/stdout and forwards every message to a remote daemon's ``/acp`` over
Streamable HTTP: one ``POST`` per message, the connection stream and one stream per session
read with ``GET`` (server→editor messages are written to stdout as they arrive).

Theory of operation
-------------------
* The first message must be ``initialize``; its params are kept, so a lost connection can
  be re-established. The reply (and the connection id) come from the ``POST``.
* A session stream is opened (headers received) before the first message naming that
  session is posted, and when a reply carries a ``sessionId`` (``session/new``, load,
  resume), so no event is missed.
* Each stream remembers the last event id it delivered. When a stream drops, it reconnects
  (backoff 0.2 s doubling to 5 s) with ``Last-Event-ID``, so the daemon replays what was
  missed from the session's ring; JSON-RPC replies queued meanwhile are kept by the daemon
  and delivered on the new stream. If the daemon no longer knows the connection (404: it
  expired or the daemon restarted), a new connection is initialised with the saved params
  and every session is taken back with ``session/resume`` before its stream reopens.
* stdin EOF: the connection is deleted and the process exits 0, at once, even while the
  daemon is still being reached.
* No daemon: ``initialize`` is tried for at most :data:`CONNECT_RETRY_S` (each failure named
  on stderr), then answered with a JSON-RPC error saying what was tried; every later request
  gets that error too (a later ``initialize`` tries again). No ACP endpoint at the URL (404,
  a wrong path): the JSON-RPC error, then exit 1. stdout only ever carries JSON-RPC.
* ``fs/*`` and ``terminal/*`` requests from the daemon are refused (``-32601``, answered to
  the daemon, never shown to the editor): the daemon serves an agent's files and terminals
  itself and never sends them, so one that arrives is not the editor's to run.
* Warnings (stderr, the bridge still runs): a plain ``http://`` URL to a host other than
  loopback (the token and the session travel unencrypted), and a token given on the
  command line (other local users can read argv): use ``$QWEN_SERVER_TOKEN`` or
  ``--token-file``.

Bounds: stdin lines up to :data:`MAX_LINE_BYTES`; at most :data:`MAX_SESSIONS` session
streams; POSTs are retried for at most :data:`POST_RETRY_S` before the editor gets a
JSON-RPC error for its request. Diagnostics go to stderr; stdout carries only ACP.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import msgspec
import trio

log = logging.getLogger("acp-serve.attach")

MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_SESSIONS = 64
POST_RETRY_S = 30.0
#: How long ``initialize`` keeps trying to reach a daemon that does not answer (seconds).
CONNECT_RETRY_S = 10.0
#: Editor messages read ahead of the one being handled (messages).
MAX_READ_AHEAD = 256
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0
#: How long a renewal waits for the daemon to answer one session/resume.
RESUME_TIMEOUT_S = 60.0
#: Request methods from the daemon that the bridge refuses instead of passing to the editor.
REFUSED_PREFIXES = ("fs/", "terminal/")
#: Largest token file read by ``--token-file`` (bytes).
MAX_TOKEN_FILE_BYTES = 64 * 1024

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class Gone(Exception):
    """The daemon does not know our connection any more (404)."""


class Unreachable(httpx.HTTPError):
    """``initialize`` could not reach the daemon within :data:`CONNECT_RETRY_S`."""


class NoEndpoint(Exception):
    """The URL has no ACP endpoint (404 to ``initialize``): a wrong path."""


class Bridge:
    def __init__(
        self,
        url: str,
        token: str | None,
        stdout: trio.abc.SendStream,
        token_header: str | None = None,
    ) -> None:
        base = url.rstrip("/")
        self.endpoint = base if base.endswith("/acp") else base + "/acp"
        self.headers = (
            {}
            if not token
            else {token_header: token}
            if token_header
            else {"Authorization": f"Bearer {token}"}
        )
        self.stdout = stdout
        self.write_lock = trio.Lock()
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        self.conn_id: str | None = None
        self.init_params: dict[str, Any] | None = None
        self.generation = 0  # bumped when a new connection replaces a lost one
        self.reconnecting: trio.Event | None = None
        self.resuming: trio.Event | None = None
        self.sessions: dict[str, SessionStream] = {}
        self.reply_sessions: dict[object, str] = {}  # id of a request we forwarded to the editor
        #: Our own requests (renewal resumes) awaiting their reply, which the editor never sees.
        self.internal: dict[object, trio.Event] = {}
        self.nursery: trio.Nursery | None = None
        self._internal = 0
        #: Why the daemon could not be reached at ``initialize`` (answered to every request).
        self.unreachable: str | None = None

    # ---- output --------------------------------------------------------------------------

    async def emit(self, payload: bytes) -> None:
        async with self.write_lock:
            await self.stdout.send_all(payload + b"\n")

    async def emit_obj(self, obj: object) -> None:
        await self.emit(_encoder.encode(obj))

    # ---- connection ----------------------------------------------------------------------

    async def initialize(self, message: dict[str, Any]) -> None:
        """Answer the editor's ``initialize``; raises :class:`NoEndpoint` after answering
        when the URL has no ACP endpoint."""
        self.init_params = dict(message.get("params") or {})
        try:
            reply = await self._post_initialize(message, retry_s=CONNECT_RETRY_S)
        except Unreachable as exc:
            self.unreachable = str(exc)
            log.warning("%s; every request is answered with this error until stdin closes", exc)
            await self.emit_obj(_error(message.get("id"), -32603, str(exc)))
            return
        except NoEndpoint as exc:
            log.warning("%s", exc)
            await self.emit_obj(_error(message.get("id"), -32601, str(exc)))
            raise
        self.unreachable = None
        await self.emit(reply)
        if self.conn_id is not None:
            assert self.nursery is not None
            self.nursery.start_soon(self._connection_stream)

    async def _post_initialize(
        self, message: dict[str, Any], retry_s: float = POST_RETRY_S
    ) -> bytes:
        delay = BACKOFF_START_S
        started = trio.current_time()
        attempts = 0
        while True:
            attempts += 1
            try:
                response = await self.http.post(
                    self.endpoint,
                    content=_encoder.encode(message),
                    headers={**self.headers, "Content-Type": "application/json"},
                )
            except httpx.HTTPError as exc:
                waited = trio.current_time() - started
                if waited + delay > retry_s:
                    raise Unreachable(
                        f"daemon unreachable: POST {self.endpoint} failed {attempts} times over "
                        f"{waited:.1f} s ({_why(exc)}); is acp-serve running there?"
                    ) from exc
                log.warning(
                    "cannot reach %s (%s); try %d, again in %.1f s",
                    self.endpoint,
                    _why(exc),
                    attempts,
                    delay,
                )
                await trio.sleep(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            if response.status_code == 404 and self.conn_id is None and self.generation == 0:
                raise NoEndpoint(
                    f"no ACP endpoint at {self.endpoint} (HTTP 404): give the daemon's base "
                    "URL (http://host:port) or its /acp URL"
                )
            if response.status_code != 200:
                return _encoder.encode(_http_error(message.get("id"), response, "initialize"))
            self.conn_id = response.headers.get("acp-connection-id")
            self.generation += 1
            return response.content

    async def _renew(self, generation: int, *, wait_resume: bool = True) -> None:
        """Replace a lost connection (once per loss, however many tasks noticed it).

        The connection stream is read again as soon as the new connection exists (the
        resumes are answered there); POSTs and session streams also wait for the resumes
        (``wait_resume``), since the sessions are the new connection's only after them."""
        if generation == self.generation and self.reconnecting is None:
            self.reconnecting = trio.Event()
            self.resuming = trio.Event()
            try:
                self._internal += 1
                message = {
                    "jsonrpc": "2.0",
                    "id": f"attach-init-{self._internal}",
                    "method": "initialize",
                    "params": self.init_params or {},
                }
                await self._post_initialize(message)
            finally:
                event, self.reconnecting = self.reconnecting, None
                event.set()
            assert self.nursery is not None
            self.nursery.start_soon(self._resume_all, self.resuming)
        elif self.reconnecting is not None:
            await self.reconnecting.wait()
        if wait_resume and self.resuming is not None:
            await self.resuming.wait()

    async def _resume_all(self, done: trio.Event) -> None:
        try:
            for sid, stream in list(self.sessions.items()):
                self._internal += 1
                resume = {
                    "jsonrpc": "2.0",
                    "id": f"attach-resume-{self._internal}",
                    "method": "session/resume",
                    "params": {"sessionId": sid, **({"cwd": stream.cwd} if stream.cwd else {})},
                }
                answered = self.internal[resume["id"]] = trio.Event()
                try:
                    await self._post(_encoder.encode(resume), None, renewing=True)
                except httpx.HTTPError:
                    continue
                # The session is ours again only once the resume is answered.
                with trio.move_on_after(RESUME_TIMEOUT_S):
                    await answered.wait()
                self.internal.pop(resume["id"], None)
        finally:
            done.set()

    def _conn_headers(self, session_id: str | None = None) -> dict[str, str]:
        headers = dict(self.headers)
        if self.conn_id:
            headers["Acp-Connection-Id"] = self.conn_id
        if session_id:
            headers["Acp-Session-Id"] = session_id
        return headers

    async def _post(
        self, body: bytes, session_id: str | None, *, renewing: bool = False
    ) -> httpx.Response:
        delay = BACKOFF_START_S
        deadline = trio.current_time() + POST_RETRY_S
        while True:
            generation = self.generation
            try:
                response = await self.http.post(
                    self.endpoint,
                    content=body,
                    headers={**self._conn_headers(session_id), "Content-Type": "application/json"},
                )
            except httpx.HTTPError as exc:
                if trio.current_time() > deadline:
                    raise
                log.warning("POST failed (%s); retrying", exc)
                await trio.sleep(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            if response.status_code == 404 and self.init_params is not None:
                await self._renew(generation, wait_resume=not renewing)
                if trio.current_time() > deadline:
                    return response
                continue
            return response

    async def forward(self, raw: bytes, message: dict[str, Any]) -> None:
        """Post one editor message; HTTP failures of a request become JSON-RPC errors."""
        params = message.get("params")
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        if not isinstance(session_id, str) and "method" not in message:
            session_id = self.reply_sessions.pop(message.get("id"), None)
        if isinstance(session_id, str) and session_id:
            await self.open_session(session_id, None)
        try:
            response = await self._post(raw, session_id if isinstance(session_id, str) else None)
        except httpx.HTTPError as exc:
            if "method" in message and message.get("id") is not None:
                await self.emit_obj(_error(message["id"], -32603, f"daemon unreachable: {exc}"))
            return
        if response.status_code >= 400 and "method" in message and message.get("id") is not None:
            await self.emit_obj(_http_error(message["id"], response, str(message["method"])))
        elif response.status_code == 200 and response.content:
            # The reply answered in the POST itself (the daemon does so for a connection
            # whose clientInfo names the qwen SDK): handled as the stream's would be.
            await self._deliver(response.content, None, None)

    # ---- streams -------------------------------------------------------------------------

    async def open_session(self, session_id: str, cwd: str | None) -> None:
        stream = self.sessions.get(session_id)
        if stream is None:
            if len(self.sessions) >= MAX_SESSIONS:
                return
            stream = SessionStream(self, session_id, cwd)
            self.sessions[session_id] = stream
            assert self.nursery is not None
            self.nursery.start_soon(stream.run)
        with trio.move_on_after(10):
            await stream.opened.wait()

    async def _connection_stream(self) -> None:
        await self._read_stream(None, None)

    async def _read_stream(self, session: SessionStream | None, _unused: None) -> None:
        """Read one stream for ever: reconnect on drops, renew a lost connection."""
        delay = BACKOFF_START_S
        while True:
            generation = self.generation
            headers = {**self._conn_headers(session.session_id if session else None)}
            headers["Accept"] = "text/event-stream"
            if session is not None and session.last_event_id is not None:
                headers["Last-Event-ID"] = str(session.last_event_id)
            try:
                async with self.http.stream("GET", self.endpoint, headers=headers) as response:
                    if response.status_code == 404:
                        await self._renew(generation, wait_resume=session is not None)
                        continue
                    if (
                        response.status_code == 403
                        and session is not None
                        and self.resuming is not None
                        and not self.resuming.is_set()
                    ):
                        await self.resuming.wait()  # ours again once resumed
                        continue
                    if response.status_code == 403 and session is not None:
                        session.opened.set()
                        self.sessions.pop(session.session_id, None)
                        return  # not ours (closed, or never owned)
                    if response.status_code != 200:
                        raise httpx.HTTPError(f"GET {response.status_code}")
                    if session is not None:
                        session.opened.set()
                    delay = BACKOFF_START_S
                    ended = await self._pump(response, session)
                    if ended and session is not None:
                        self.sessions.pop(session.session_id, None)
                        return
            except httpx.HTTPError as exc:
                log.warning("stream dropped (%s); reconnecting", exc)
            await trio.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    async def _pump(self, response: httpx.Response, session: SessionStream | None) -> bool:
        """Forward every message of an open stream; True when a session stream ended
        because its session did (session_closed / session_died seen)."""
        event_id: int | None = None
        data: list[str] = []
        finished = False
        async for line in response.aiter_lines():
            if line == "":
                if data:
                    payload = "\n".join(data).encode()
                    finished = await self._deliver(payload, session, event_id) or finished
                event_id, data = None, []
            elif line.startswith("id:"):
                value = line[3:].strip()
                event_id = int(value) if value.isdigit() else None
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        return finished

    async def _deliver(
        self, payload: bytes, session: SessionStream | None, event_id: int | None
    ) -> bool:
        try:
            message = _decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            return False
        if not isinstance(message, dict):
            return False
        if session is not None and event_id is not None:
            if session.last_event_id is not None and event_id <= session.last_event_id:
                return False  # already delivered before the drop
            session.last_event_id = event_id
        mid = message.get("id")
        if "method" not in message and isinstance(mid, str) and mid.startswith("attach-"):
            waiter = self.internal.get(mid)
            if waiter is not None:
                waiter.set()
            return False  # our own renewal's replies
        method = message.get("method")
        if isinstance(method, str) and method.startswith(REFUSED_PREFIXES):
            if mid is not None:
                assert self.nursery is not None
                self.nursery.start_soon(self._refuse, mid, method, session)
            return False
        if method is not None and mid is not None and session is not None:
            self.reply_sessions[mid] = session.session_id
            while len(self.reply_sessions) > 1024:
                self.reply_sessions.pop(next(iter(self.reply_sessions)))
        result = message.get("result")
        if isinstance(result, dict) and isinstance(result.get("sessionId"), str):
            cwd = result.get("workspaceCwd")
            assert self.nursery is not None
            self.nursery.start_soon(
                self.open_session, result["sessionId"], cwd if isinstance(cwd, str) else None
            )
        if method == "_qwen/notify":
            params = message.get("params") or {}
            kind = params.get("kind") if isinstance(params, dict) else None
            if kind in ("session_closed", "session_died"):
                await self.emit(payload)
                return True
        await self.emit(payload)
        return False

    async def _refuse(self, rid: object, method: str, session: SessionStream | None) -> None:
        log.warning("refused %s from the daemon (attach serves no files or terminals)", method)
        reply = _error(rid, -32601, f"{method} is not served through acp-serve attach")
        try:
            await self._post(_encoder.encode(reply), session.session_id if session else None)
        except httpx.HTTPError as exc:
            log.warning("could not answer %s: %s", method, exc)

    async def close(self) -> None:
        if self.conn_id:
            with trio.move_on_after(5):
                try:
                    await self.http.delete(self.endpoint, headers=self._conn_headers())
                except httpx.HTTPError:
                    pass
        await self.http.aclose()


class SessionStream:
    def __init__(self, bridge: Bridge, session_id: str, cwd: str | None) -> None:
        self.bridge = bridge
        self.session_id = session_id
        self.cwd = cwd
        self.last_event_id: int | None = None
        self.opened = trio.Event()

    async def run(self) -> None:
        await self.bridge._read_stream(self, None)


def _error(rid: object, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def _http_error(rid: object, response: httpx.Response, what: str) -> dict[str, Any]:
    """A JSON-RPC error for an HTTP error answer: the daemon's own JSON-RPC error when it
    sent one, else one naming the status and the daemon's message."""
    try:
        body = _decoder.decode(response.content)
    except (msgspec.DecodeError, RecursionError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return {**body, "jsonrpc": "2.0", "id": rid}
    detail = body.get("error") if isinstance(body, dict) else None
    text = f"{what}: HTTP {response.status_code}"
    if isinstance(detail, str) and detail:
        text += f": {detail[:200]}"
    return _error(rid, -32603, text)


def _why(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return f"connection refused or no route: {exc}" if str(exc) else "cannot connect"
    return str(exc) or type(exc).__name__


async def _lines(stdin: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    buffer = b""
    while True:
        chunk = await stdin.receive_some(65536)
        if not chunk:
            if buffer.strip():
                yield buffer
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
        if len(buffer) > MAX_LINE_BYTES:
            buffer = b""
            yield b"\x00"  # an over-long line: answered as a parse error


async def _read_stdin(
    stdin: trio.abc.ReceiveStream, send: trio.MemorySendChannel[bytes], scope: trio.CancelScope
) -> None:
    """Read the editor's lines ahead of their handling; at EOF stop everything at once (even
    an ``initialize`` still trying to reach the daemon)."""
    async with send:
        async for line in _lines(stdin):
            await send.send(line)
    scope.cancel()


async def run(url: str, token: str | None, token_header: str | None = None) -> int:
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    bridge = Bridge(url, token, stdout, token_header)
    status = 0
    try:
        async with trio.open_nursery() as nursery:
            bridge.nursery = nursery
            send, receive = trio.open_memory_channel[bytes](MAX_READ_AHEAD)
            nursery.start_soon(_read_stdin, stdin, send, nursery.cancel_scope)
            async for line in receive:
                try:
                    message = _decoder.decode(line)
                except (msgspec.DecodeError, RecursionError):
                    await bridge.emit_obj(_error(None, -32700, "Parse error"))
                    continue
                if not isinstance(message, dict):
                    await bridge.emit_obj(_error(None, -32600, "Invalid Request"))
                    continue
                if bridge.conn_id is None:
                    if message.get("method") != "initialize":
                        if message.get("id") is not None:
                            await bridge.emit_obj(
                                _error(
                                    message.get("id"),
                                    -32603 if bridge.unreachable else -32600,
                                    bridge.unreachable or "The first message must be initialize",
                                )
                            )
                        continue
                    try:
                        await bridge.initialize(message)
                    except NoEndpoint:
                        status = 1
                        break
                    continue
                nursery.start_soon(bridge.forward, line, message)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await bridge.close()
            await stdin.aclose()
            await stdout.aclose()
    return status


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="acp-serve attach",
        description="A stdio ACP agent that forwards to a remote acp-serve daemon's /acp.",
    )
    parser.add_argument("url", help="the daemon's base URL (http://host:port) or its /acp URL")
    parser.add_argument(
        "--token",
        default=None,
        help="bearer token (default: $QWEN_SERVER_TOKEN); visible to other local users in "
        "the process list, prefer the environment or --token-file",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="read the bearer token from FILE (its first line)",
    )
    parser.add_argument(
        "--token-header",
        default=None,
        metavar="NAME",
        help="send the token in this header instead of Authorization "
        "(default: $ACP_SERVE_TOKEN_HEADER; a daemon with --token-header)",
    )
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="attach: %(message)s")
    if args.token is not None and args.token_file is not None:
        parser.error("give --token or --token-file, not both")
    token = args.token
    if args.token is not None:
        log.warning(
            "--token on the command line is visible to other local users (ps, /proc); "
            "use $QWEN_SERVER_TOKEN or --token-file instead"
        )
    if args.token_file is not None:
        try:
            token = _read_token_file(args.token_file)
        except (OSError, ValueError) as exc:
            parser.error(f"--token-file: {exc}")
    token = token or os.environ.get("QWEN_SERVER_TOKEN") or None
    warning = insecure_url_warning(args.url)
    if warning:
        log.warning("%s", warning)
    token_header = args.token_header or os.environ.get("ACP_SERVE_TOKEN_HEADER") or None
    try:
        return trio.run(run, args.url, token, token_header)
    except KeyboardInterrupt:
        return 130


def _read_token_file(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_TOKEN_FILE_BYTES} bytes")
    lines = data.decode("utf-8", errors="strict").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"{path} holds no token")
    return token


def insecure_url_warning(url: str) -> str | None:
    """Why ``url`` is unsafe to send a token and a session over, or None: plain ``http://``
    to a host that is not loopback."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() != "http":
        return None
    host = (parts.hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return (
        f"{url} is plain http:// to a host that is not loopback: the token and the session's "
        "traffic travel unencrypted; use https:// (or an SSH tunnel to 127.0.0.1)"
    )
