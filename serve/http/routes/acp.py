"""ACP over HTTP + SSE and over WebSocket at ``/acp`` (and ``/workspaces/:workspace/acp``).

The glue between the wire and :class:`serve.acpfront.AcpFront` (which holds connections,
their sessions and outboxes, and all routing). The front is not started here: it is built
by :func:`serve.runtime.build.build_host` (with this transport's policy, :func:`build_front`)
and runs as the supervised ``acp-front`` child beside ``http``; these routes find it on the
Host and only hand it connections and messages (503 while it is not running):

* ``POST`` (``application/json``, else 415): one JSON-RPC message. ``initialize`` needs no
  connection id and answers 200 with the result and ``Acp-Connection-Id``; every other
  message is 202 with an empty body and its reply comes on a stream, except on a connection
  of the published qwen SDK (``clientInfo.name`` ``qwen-code-sdk``), whose requests are
  answered 200 with their JSON-RPC reply (the one way it reads a reply that cannot race the
  202: :mod:`serve.acpfront.routing`). A batch is 501; a body
  that is not JSON-RPC is 400 with a JSON-RPC error (``id: null``); no connection id is
  400, an unknown one 404.
* ``GET`` (``Accept: text/event-stream``, else 406, checked first): the connection stream,
  or with ``Acp-Session-Id`` the stream of a session the connection owns (403 otherwise),
  resumable with ``Last-Event-ID``. ``retry: 3000`` first, then ``data:`` lines (session-bus
  messages with ``id: N``), a heartbeat comment every 15 s. One reader per stream.
* ``DELETE``: 202; both streams end, what the connection held is released; then 404.
* WebSocket: the first frame must be ``initialize`` (else a -32600 error and close 1002);
  then every message of every session flows on the socket.

The security front (bearer, Host, CORS) has already run for every request and upgrade; the
rate limiter applies per JSON-RPC method (HTTP: 429 on the POST, as on REST; WebSocket: a
JSON-RPC error; ``initialize`` is a mutation), keyed by the client's address (never
``X-Qwen-Client-Id``); on a daemon without a token the methods whose REST twin is a
strict-gate route, and every request that would change an approval mode, answer
``token_required``. A connection is bound to the transport and the caller (address and
credential digest) that created it: any other request naming its id gets the 404 of an
unknown connection.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import trio
from quart import Blueprint, Response, g, request, websocket
from quart.wrappers.base import ClientDisconnectedError
from werkzeug.datastructures import Headers

from serve.acpfront import AcpFront, Connection, jsonrpc
from serve.acpfront import access as acp_access
from serve.acpfront.connections import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_UNUSED_TIMEOUT_S, Policy
from serve.acpfront.jsonrpc import SERVER_ERROR, RpcError
from serve.acpfront.routing import Inline
from serve.events import HEARTBEAT_FRAME, RETRY_FRAME
from serve.host import Host
from serve.http.access import (
    LEASE_CHECK_S,
    Lease,
    audit,
    may_use_filter,
    principal,
    ws_may_use_filter,
    ws_principal,
)
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.daemon_status import daemon_status
from serve.http.security import (
    TOKEN_REQUIRED_BODY,
    Tier,
    client_key,
    is_loopback_address,
    is_strict,
)
from serve.http.security.peers import parse_trusted_proxies, scope_client_address
from serve.http.security.strict import approval_mode_change_allowed
from serve.http.wire import stream_response

log = logging.getLogger(__name__)

blueprint = Blueprint("acp", __name__)

HEARTBEAT_INTERVAL_S = 15.0
#: The first WebSocket frame must arrive within this many seconds.
WS_INIT_TIMEOUT_S = 30.0
MAX_SAFE_INTEGER = 2**53 - 1
_JSON = "application/json; charset=utf-8"

_ROUTES = ("/acp", "/workspaces/<path:workspace>/acp", "/workspaces//<path:workspace>/acp")

_ROUTES = ("/acp", "/workspaces/<path:workspace>/acp", "/workspaces//<path:workspace>/acp")


def acp_enabled(_daemon: Host | None = None) -> bool:
    """``/acp`` is on unless ``QWEN_SERVE_ACP_HTTP=0`` (as in the reference)."""
    return os.environ.get("QWEN_SERVE_ACP_HTTP", "1").strip().lower() not in ("0", "false")


def _idle_timeout_s() -> float:
    """``QWEN_SERVE_ACP_IDLE_TIMEOUT_MS`` (default 300000): HTTP connection expiry."""
    raw = os.environ.get("QWEN_SERVE_ACP_IDLE_TIMEOUT_MS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw) / 1000
    return DEFAULT_IDLE_TIMEOUT_S


def _unused_timeout_s() -> float:
    """``QWEN_SERVE_ACP_UNUSED_TIMEOUT_MS`` (default 10000): expiry of an HTTP connection
    that never opened a stream nor sent a request after ``initialize``."""
    raw = os.environ.get("QWEN_SERVE_ACP_UNUSED_TIMEOUT_MS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw) / 1000
    return DEFAULT_UNUSED_TIMEOUT_S


FEATURES: tuple[Feature, ...] = (
    Feature(
        "acp_http_transport",
        tuple((method, rule) for rule in _ROUTES for method in ("POST", "GET", "DELETE")),
        when=acp_enabled,
    ),
    # The WebSocket upgrade is a GET of the same rules (Quart registers it as one).
    Feature("acp_websocket_transport", tuple(("GET", rule) for rule in _ROUTES), when=acp_enabled),
)

#: JSON-RPC methods whose REST twin is a strict-gate route (see serve/http/security/strict);
#: approval-mode changes are gated by :func:`_changes_approval_mode` on every method.
_STRICT_TWINS = {
    "_qwen/session/update_metadata": ("PATCH", "/session/<id>/metadata"),
    "_qwen/file/write": ("POST", "/file/write"),
    "_qwen/file/edit": ("POST", "/file/edit"),
}
#: Rate-limit tiers per method; methods absent are exempt (as heartbeats and SSE are).
_TIERS = {
    "session/prompt": Tier.PROMPT,
    "_session/steering": Tier.PROMPT,  # a steer can become a prompt
    "session/list": Tier.READ,
    "_qwen/status": Tier.READ,
    "_qwen/session/context": Tier.READ,
    "_qwen/session/supported_commands": Tier.READ,
    "_qwen/file/read": Tier.READ,
    "_qwen/file/read_bytes": Tier.READ,
    "_qwen/file/stat": Tier.READ,
    "_qwen/file/list": Tier.READ,
    "_qwen/file/glob": Tier.READ,
    "_qwen/workspace/env": Tier.READ,
    "_qwen/workspace/preflight": Tier.READ,
    "_qwen/workspace/mcp": Tier.READ,
    "_qwen/workspace/skills": Tier.READ,
    "_qwen/workspace/providers": Tier.READ,
    "_qwen/session/heartbeat": None,
    "_qwen/health": None,
    "session/cancel": None,
}


def _tier(method: str) -> Tier | None:
    if method in _TIERS:
        return _TIERS[method]
    return Tier.MUTATION


class AcpDisabled(Exception):
    """``QWEN_SERVE_ACP_HTTP=0``: the routes answer 404 as if absent."""


@blueprint.errorhandler(AcpDisabled)
async def _disabled(_exc: AcpDisabled) -> Response:
    return Response(b'{"error":"Not found"}', status=404, content_type=_JSON)


@blueprint.before_request
async def _gate() -> None:
    if not acp_enabled():
        raise AcpDisabled()


def the_front() -> AcpFront:
    """The Host's /acp front, while its supervised child runs (else a 503)."""
    front = daemon().acp_front
    if not isinstance(front, AcpFront) or not front.running:
        raise RpcError(SERVER_ERROR, "ACP front is not running", {"httpStatus": 503})
    return front


def _changes_approval_mode(method: str, params: dict[str, Any]) -> bool:
    """Every /acp request that would change a session's approval mode."""
    if method == "session/set_mode":
        return True
    if method == "session/set_config_option":
        return params.get("configId") == "mode"
    if method == "session/new":
        return params.get("approvalMode") not in (None, "")
    return False


def _policy_for(d: Host) -> Policy:
    def policy(conn: Connection, method: str, params: dict[str, Any]) -> RpcError | None:
        """The strict gate (and, for WebSocket connections, the rate limit) per method;
        with multi-user auth first the method's access rule (its refusal is raised)."""
        if d.multi_user:
            acp_access.check(d, conn, method, params)
        token = d.settings.token is not None
        twin = _STRICT_TWINS.get(method)
        # authenticate/logout act on the agent's credentials, shared by every session.
        if (
            (twin is not None and not token and is_strict(*twin))
            or (method in ("authenticate", "logout") and not token)
            or (
                _changes_approval_mode(method, params)
                and not approval_mode_change_allowed(token_configured=token)
            )
        ):
            return RpcError(
                SERVER_ERROR,
                TOKEN_REQUIRED_BODY.error,
                {"httpStatus": 401, "code": TOKEN_REQUIRED_BODY.code},
            )
        if conn.transport == "ws":
            return _rate_limit(d, conn.client, method)
        return None

    return policy


def _rate_limit(d: Host, key: str, method: str) -> RpcError | None:
    limiter = d.front.rate_limiter
    if limiter is None or not d.settings.rate_limit.enabled or d.draining:
        return None
    tier = _tier(method)
    if tier is None:
        return None
    decision = limiter.check(key, tier)
    if decision.allowed:
        return None
    return RpcError(
        SERVER_ERROR,
        "Rate limit exceeded",
        {
            "httpStatus": 429,
            "code": "rate_limit_exceeded",
            "tier": str(tier),
            "retryAfterMs": decision.retry_after_ms,
        },
    )


def build_front(host: Host, all_features: Sequence[Feature]) -> AcpFront | None:
    """The /acp front over ``host`` with this transport's policy (strict gate, WebSocket
    rate limit) and expiry settings, or None when ``QWEN_SERVE_ACP_HTTP=0``. Called by
    :func:`serve.runtime.build.build_host`, which supervises it (``acp-front``)."""
    if not acp_enabled():
        return None
    try:
        ver = version("acp-serve")
    except PackageNotFoundError:
        ver = "0"
    return AcpFront(
        host,
        policy=_policy_for(host),
        idle_timeout_s=_idle_timeout_s(),
        unused_timeout_s=_unused_timeout_s(),
        version=ver,
        daemon_status=lambda detail: daemon_status(host, detail, all_features),
    )


# ---- helpers ------------------------------------------------------------------------------


def _rpc_response(
    status: int, rid: jsonrpc.Id | None, error: RpcError, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        jsonrpc.error_bytes(rid, error), status=status, headers=headers, content_type=_JSON
    )


def _invalid(status: int, message: str) -> Response:
    return _rpc_response(status, None, RpcError(jsonrpc.INVALID_REQUEST, message))


def _status_of(error: RpcError, default: int = 400) -> int:
    data = error.data if isinstance(error.data, dict) else {}
    status = data.get("httpStatus")
    return status if isinstance(status, int) and 400 <= status < 600 else default


def _workspace(ref: str | None, usable: Callable[[str], bool] | None) -> str | None:
    """The workspace a connection is opened on (None: not served, or one the caller may
    not use: both answer the same)."""
    d = daemon()
    if ref is None:
        return str(d.settings.primary_workspace)
    runtime = d.registry.by_ref(ref)
    if runtime is None or (usable is not None and not usable(str(runtime.path))):
        return None
    return str(runtime.path)


def _connection() -> Connection | Response:
    conn_id = request.headers.get("Acp-Connection-Id")
    if not conn_id:
        return _invalid(400, "Acp-Connection-Id header required")
    try:
        front = the_front()
    except RpcError as exc:
        return _rpc_response(503, None, exc)
    conn = front.get(conn_id.strip())
    # A connection answers only the transport and credentials that created it: a WebSocket
    # connection's id over HTTP, or another caller's, is as unknown as a made-up one.
    if conn is None or conn.transport != "http" or conn.owner != _request_owner():
        return _invalid(404, f'Unknown ACP connection "{conn_id}"')
    return conn


def _client(scope: Mapping[str, Any]) -> str:
    """The caller's address as the rate limiter keys it (``serve/http/security/peers.py``):
    the peer's, or a ``--trusted-proxy``'s forwarded one; never ``X-Qwen-Client-Id``."""
    trusted = parse_trusted_proxies(daemon().settings.trusted_proxies)
    return client_key(peer_ip=scope_client_address(scope, trusted))


def _owner(client: str, headers: Headers) -> str:
    """What a connection is bound to: its creator's address and credential (a digest of
    ``Authorization`` and the ``--token-header`` header, whichever carried it)."""
    name = daemon().settings.token_header
    presented = [headers.get("Authorization") or "", (headers.get(name) or "") if name else ""]
    if not any(presented):
        return f"{client} -"
    return f"{client} {hashlib.sha256(chr(10).join(presented).encode()).hexdigest()}"


def _request_owner() -> str:
    return _owner(_client(request.scope), request.headers)


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isdigit() or int(raw) > MAX_SAFE_INTEGER:
        return None
    return int(raw)


def _refused(rid: jsonrpc.Id | None, refusal: RpcError) -> Response:
    """A rate-limit refusal as the POST's 429."""
    data = refusal.data or {}
    retry = max(1, -(-int(data["retryAfterMs"]) // 1000))
    return _rpc_response(429, rid, refusal, {"Retry-After": str(retry)})


# ---- POST ---------------------------------------------------------------------------------


async def _post(workspace_ref: str | None) -> Response:
    mimetype = (request.mimetype or "").lower()
    if mimetype != "application/json":
        return _invalid(415, "Content-Type must be application/json")
    raw = await request.get_data(cache=False, as_text=False)
    assert isinstance(raw, bytes)
    message = jsonrpc.parse(raw)
    if isinstance(message, jsonrpc.Batch):
        return _invalid(501, "JSON-RPC batches are not supported")
    if isinstance(message, jsonrpc.Invalid):
        return _rpc_response(400, message.id, message.error)
    if isinstance(message, jsonrpc.Request) and message.method == "initialize":
        workspace = _workspace(workspace_ref, may_use_filter())
        if workspace is None:
            return _invalid(404, f"Workspace {workspace_ref} is not served by this daemon")
        client = _client(request.scope)
        refusal = _rate_limit(daemon(), client, message.method)
        if refusal is not None:
            return _refused(message.id, refusal)
        try:
            front = the_front()
            conn, reply = front.initialize(
                "http",
                workspace,
                message,
                loopback=is_loopback_address(request.remote_addr or ""),
                client=client,
                owner=_owner(client, request.headers),
            )
            conn.principal = principal()  # fixed for the connection's life
        except RpcError as exc:
            return _rpc_response(_status_of(exc), message.id, exc)
        return Response(
            reply, status=200, headers={"Acp-Connection-Id": conn.id}, content_type=_JSON
        )
    found = _connection()
    if isinstance(found, Response):
        return found
    conn = found
    if isinstance(message, jsonrpc.Request | jsonrpc.Notification):
        refusal = _rate_limit(daemon(), conn.client, message.method)
        if refusal is not None:
            return _refused(message.id if isinstance(message, jsonrpc.Request) else None, refusal)
    header_session = request.headers.get("Acp-Session-Id")
    # The qwen SDK's connection gets each reply as its POST's answer (serve/acpfront/routing.py).
    inline = Inline() if conn.inline_replies and isinstance(message, jsonrpc.Request) else None
    try:
        the_front().submit(
            conn, message, header_session.strip() if header_session else None, inline
        )
    except RpcError as exc:
        return _rpc_response(_status_of(exc, 503), None, exc)
    if inline is not None:
        await inline.done.wait()
        if inline.payload is not None:
            return Response(inline.payload, status=200, content_type=_JSON)
    return Response(b"", status=202)


@blueprint.post("/acp")
async def post_acp() -> Response:
    """Send one ACP JSON-RPC message (initialize answers inline; others 202)."""
    return await _post(None)


@blueprint.post("/workspaces/<path:workspace>/acp")
@blueprint.post("/workspaces//<path:workspace>/acp")
async def post_workspace_acp(workspace: str) -> Response:
    """Send one ACP JSON-RPC message to a workspace-bound connection."""
    return await _post(workspace)


# ---- GET (SSE) ----------------------------------------------------------------------------


async def _get(workspace_ref: str | None) -> Response:
    if "text/event-stream" not in request.headers.get("Accept", "").lower():
        return _invalid(406, "Accept must include text/event-stream")
    found = _connection()
    if isinstance(found, Response):
        return found
    conn = found
    front = the_front()
    d = daemon()
    limit = d.settings.max_connections
    if limit and d.front.sse_streams >= limit:
        return _rpc_response(
            503,
            None,
            RpcError(
                SERVER_ERROR,
                f"Connection limit reached ({limit} event streams)",
                {"httpStatus": 503, "code": "connection_limit_exceeded", "limit": limit},
            ),
        )
    session_id = request.headers.get("Acp-Session-Id")
    headers = {
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache, no-transform",
        "X-Accel-Buffering": "no",
        "Acp-Connection-Id": conn.id,
        "X-Qwen-SSE-Stream-Id": str(uuid.uuid4()),
    }
    if session_id:
        session_id = session_id.strip()
        try:
            found_outbox = await front.session_outbox(
                conn,
                session_id,
                last_event_id=_last_event_id(),
                epoch=request.headers.get("X-Qwen-Event-Epoch"),
            )
        except RpcError as exc:
            return _rpc_response(_status_of(exc, 503), None, exc)
        if found_outbox is None:
            return _rpc_response(
                403,
                None,
                RpcError(
                    jsonrpc.INVALID_REQUEST,
                    f'Session "{session_id}" is not owned by this connection',
                    {"code": "session_not_owned", "sessionId": session_id},
                ),
            )
        outbox, epoch = found_outbox
        headers["Acp-Session-Id"] = session_id
        headers["X-Qwen-Event-Epoch"] = epoch
    else:
        outbox = conn.outbox
    token = outbox.attach()
    conn.open_streams += 1
    d.front.sse_streams += 1
    # Multi-user auth: a revoked token ends the connection, a role gone the session's link
    # (serve/http/access.py Lease), within LEASE_CHECK_S.
    lease = Lease.of(d, request.scope)
    wait_s = HEARTBEAT_INTERVAL_S if lease is None else LEASE_CHECK_S

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield RETRY_FRAME
            beat_at = check_at = trio.current_time()
            while True:
                batch = await outbox.take(token, wait_s)
                if batch is None:
                    return
                if lease is not None:
                    now = trio.current_time()
                    if now - check_at >= LEASE_CHECK_S:
                        check_at = now
                        if not await lease.holds():
                            front.close(conn)
                            return
                        front.cut_links(conn, lease.reads)
                    if not batch and now - beat_at < HEARTBEAT_INTERVAL_S:
                        continue
                    beat_at = now
                if not batch:
                    yield HEARTBEAT_FRAME
                    continue
                parts: list[bytes] = []
                for event_id, payload in batch:
                    if event_id is not None:
                        parts.append(b"id: %d\n" % event_id)
                    parts.append(b"data: " + payload + b"\n\n")
                yield b"".join(parts)
        finally:
            outbox.detach(token)
            conn.open_streams -= 1
            d.front.sse_streams -= 1
            conn.touch()

    return await stream_response(stream(), headers)


@blueprint.get("/acp")
async def get_acp() -> Response:
    """The ACP connection stream, or with Acp-Session-Id a session stream (SSE)."""
    return await _get(None)


@blueprint.get("/workspaces/<path:workspace>/acp")
@blueprint.get("/workspaces//<path:workspace>/acp")
async def get_workspace_acp(workspace: str) -> Response:
    """The ACP streams of a workspace-bound connection (SSE)."""
    return await _get(workspace)


# ---- DELETE -------------------------------------------------------------------------------


async def _delete() -> Response:
    found = _connection()
    if isinstance(found, Response):
        return found
    held = list(found.sessions)
    the_front().close(found)
    d = daemon()
    # One line: the connection's end releases (closes or detaches) every session it held.
    audit(d, principal(), "ok", 202, sessions=held)
    g.audited = True
    return Response(b"", status=202)


@blueprint.delete("/acp")
async def delete_acp() -> Response:
    """End an ACP connection and release what it held."""
    return await _delete()


@blueprint.delete("/workspaces/<path:workspace>/acp")
@blueprint.delete("/workspaces//<path:workspace>/acp")
async def delete_workspace_acp(workspace: str) -> Response:
    """End a workspace-bound ACP connection."""
    return await _delete()


# ---- WebSocket ----------------------------------------------------------------------------


async def _websocket(workspace_ref: str | None) -> None:
    if not acp_enabled():
        await websocket.close(1008)
        return
    await websocket.accept()
    first: str | bytes | None = None
    with trio.move_on_after(WS_INIT_TIMEOUT_S):
        first = await websocket.receive()
    raw = first.encode() if isinstance(first, str) else first
    message = jsonrpc.parse(raw) if isinstance(raw, bytes) else None
    if not (isinstance(message, jsonrpc.Request) and message.method == "initialize"):
        with_id = jsonrpc.Request | jsonrpc.Response | jsonrpc.Invalid
        await websocket.send(
            jsonrpc.error_bytes(
                message.id if isinstance(message, with_id) else None,
                RpcError(jsonrpc.INVALID_REQUEST, "The first message must be initialize"),
            ).decode()
        )
        await websocket.close(1002)
        return
    workspace = _workspace(workspace_ref, ws_may_use_filter())
    client = _client(websocket.scope)
    try:
        if workspace is None:
            raise RpcError(
                jsonrpc.INVALID_PARAMS, f"Workspace {workspace_ref} is not served by this daemon"
            )
        refusal = _rate_limit(daemon(), client, message.method)
        if refusal is not None:
            raise refusal
        front = the_front()
        conn, reply = front.initialize(
            "ws",
            workspace,
            message,
            loopback=is_loopback_address(websocket.remote_addr or ""),
            client=client,
            owner=_owner(client, websocket.headers),
        )
        conn.principal = ws_principal()  # fixed at the handshake
    except RpcError as exc:
        await websocket.send(jsonrpc.error_bytes(message.id, exc).decode())
        await websocket.close(1013)
        return
    conn.open_streams += 1
    await websocket.send(reply.decode())
    lease = Lease.of(daemon(), websocket.scope)
    try:
        async with trio.open_nursery() as nursery:

            async def watcher(lease: Lease) -> None:
                """Multi-user auth: a revoked token closes the socket (1008), a role gone
                ends the session's link (serve/http/access.py Lease)."""
                while await lease.holds():
                    front.cut_links(conn, lease.reads)
                    await trio.sleep(LEASE_CHECK_S)
                with trio.move_on_after(1):
                    await websocket.close(1008)
                nursery.cancel_scope.cancel()

            async def sender() -> None:
                token = conn.outbox.attach()
                try:
                    while True:
                        batch = await conn.outbox.take(token, HEARTBEAT_INTERVAL_S)
                        if batch is None:
                            break
                        for _event_id, payload in batch:
                            await websocket.send(payload.decode())
                except ClientDisconnectedError:
                    pass
                nursery.cancel_scope.cancel()

            async def receiver() -> None:
                try:
                    while True:
                        data = await websocket.receive()
                        raw = data.encode() if isinstance(data, str) else data
                        front.submit(conn, jsonrpc.parse(raw), None)
                except ClientDisconnectedError:
                    pass  # a dropped socket: released below
                nursery.cancel_scope.cancel()

            nursery.start_soon(sender)
            nursery.start_soon(receiver)
            if lease is not None:
                nursery.start_soon(watcher, lease)
    finally:
        conn.open_streams -= 1
        held = list(conn.sessions)
        front.close(conn)
        if held:  # the socket's end released (closed or detached) these: one line
            audit(daemon(), conn.principal, "ok", 1000, ws=True, sessions=held)


@blueprint.websocket("/acp")
async def ws_acp() -> None:
    """ACP over one WebSocket (the first frame is initialize)."""
    await _websocket(None)


@blueprint.websocket("/workspaces/<path:workspace>/acp")
@blueprint.websocket("/workspaces//<path:workspace>/acp")
async def ws_workspace_acp(workspace: str) -> None:
    """ACP over one WebSocket, sessions default to the workspace."""
    await _websocket(workspace)
