"""Session routes: create/attach, load/resume, list, prompt, cancel, close, events, votes.

Each handler is a translator over the session service (:mod:`serve.api`): it parses the
request (400s here, in the order the reference checks them; a prompt body is checked by
:func:`serve.api.parse_prompt`), calls the service (find the session, 404; create, restore,
submit, await the turn, list, vote) and renders its typed answers. Failures are domain
errors the app renders through the one table (``serve/errors``): no route reads or
changes a session's live state (clients, subscribers, prompts, its log).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import trio
from quart import Blueprint, Response, g, request

from actors import ActorStopped, InboxFull
from serve.access.roles import COLLABORATOR
from serve.api import ASK_TIMEOUT_S, SessionService, parse_prompt
from serve.events import (
    DEFAULT_MAX_QUEUED,
    HEARTBEAT_FRAME,
    MAX_MAX_QUEUED,
    MIN_MAX_QUEUED,
    RETRY_FRAME,
    SubscriberLimitExceeded,
)
from serve.http import forward, plural, prompt_steer
from serve.http.access import (
    LEASE_CHECK_S,
    Lease,
    may_use_filter,
    principal,
    session_role,
    visible,
)
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, service_unavailable, to_api_error
from serve.http.security.clientid import InvalidClientId, validate_client_id
from serve.http.security.hosts import is_loopback_address
from serve.http.security.strict import (
    TOKEN_REQUIRED_BODY,
    TOKEN_REQUIRED_CODE,
    approval_mode_change_allowed,
)
from serve.http.wire import json_body, json_response, stream_response
from serve.permissions.modes import MAX_MODE_ID_CHARS
from serve.sessions.errors import TurnFailed
from serve.sessions.messages import (
    APPROVAL_MODES,
    AgentUnavailable,
    CancelTurn,
    CloseSession,
    Detach,
    Heartbeat,
    ListPending,
    MetadataSet,
    ModelSet,
    ModeSet,
    PromptRunning,
    RemovePending,
    SessionGone,
    SessionView,
    SetApprovalMode,
    SetModel,
    StreamEnded,
    Subscribe,
    Subscription,
    UpdateMetadata,
)

if TYPE_CHECKING:
    from serve.sessions.actor import SessionActor
    from serve.sessions.messages import SessionMsg

blueprint = Blueprint("sessions", __name__)

HEARTBEAT_INTERVAL_S = 15.0
#: Largest body write of an SSE stream, in bytes (bigger frames are written in pieces).
SSE_WRITE_BYTES = 1024 * 1024
MAX_SAFE_INTEGER = 2**53 - 1
_EPOCH_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

PLURAL_ROUTES = plural.PluralRoutes(blueprint)
PLURAL_ROUTES.declare(
    ("GET", "/workspaces/<path:workspace>/sessions"),
    ("GET", "/workspaces//<path:workspace>/sessions"),
)
FEATURES: tuple[Feature, ...] = (
    Feature("session_create", (("POST", "/session"),)),
    Feature("session_scope_override", (("POST", "/session"),)),
    Feature("session_load", (("POST", "/session/<session_id>/load"),)),
    Feature("session_resume", (("POST", "/session/<session_id>/resume"),)),
    Feature("unstable_session_resume", (("POST", "/session/<session_id>/resume"),)),
    Feature("session_list", (("GET", "/workspace/<path:workspace>/sessions"),)),
    Feature("session_prompt", (("POST", "/session/<session_id>/prompt"),)),
    Feature("non_blocking_prompt", (("POST", "/session/<session_id>/prompt"),)),
    Feature("session_prompt_steer", (("POST", "/session/<session_id>/prompt"),)),
    Feature("session_cancel", (("POST", "/session/<session_id>/cancel"),)),
    Feature(
        "session_pending_prompts",
        (
            ("GET", "/session/<session_id>/pending-prompts"),
            ("DELETE", "/session/<session_id>/pending-prompts/<prompt_id>"),
        ),
    ),
    Feature(
        "prompt_absolute_deadline",
        (("POST", "/session/<session_id>/prompt"),),
        when=lambda d: d.settings.prompt_deadline_ms is not None,
    ),
    Feature("session_close", (("DELETE", "/session/<session_id>"),)),
    Feature("session_metadata", (("PATCH", "/session/<session_id>/metadata"),)),
    Feature("client_identity", (("POST", "/session"),)),
    Feature("client_heartbeat", (("POST", "/session/<session_id>/heartbeat"),)),
    Feature("session_set_model", (("POST", "/session/<session_id>/model"),)),
    Feature("session_approval_mode_control", (("POST", "/session/<session_id>/approval-mode"),)),
    Feature("session_events", (("GET", "/session/<session_id>/events"),)),
    Feature(
        "agent_idle_release",
        (("GET", "/session/<session_id>/events"),),
        when=lambda d: d.settings.agent_idle_release_ms > 0,
    ),
    Feature("slow_client_warning", (("GET", "/session/<session_id>/events"),)),
    Feature("typed_event_schema", (("GET", "/session/<session_id>/events"),)),
    Feature(
        "writer_idle_timeout",
        (("GET", "/session/<session_id>/events"),),
        when=lambda d: d.settings.writer_idle_timeout_ms is not None,
    ),
    Feature(
        "session_permission_vote",
        (("POST", "/session/<session_id>/permission/<request_id>"),),
    ),
    Feature("permission_vote", (("POST", "/permission/<request_id>"),)),
    Feature(
        "permission_mediation",
        (("POST", "/permission/<request_id>"),),
        modes=("first-responder", "designated", "consensus", "local-only"),
    ),
)


# ---- helpers ------------------------------------------------------------------------------


def sessions_api() -> SessionService:
    """The session service over this app's Host (serve/api)."""
    return SessionService(daemon())


def header_client_id() -> str | None:
    try:
        return validate_client_id(request.headers.get("X-Qwen-Client-Id"))
    except InvalidClientId:
        raise ApiError(
            400,
            {
                "error": "`X-Qwen-Client-Id` must be a non-empty token of 128 characters or fewer",
                "code": "invalid_client_id",
            },
        ) from None


def find_session(session_id: str) -> SessionActor:
    """The live session (``SessionNotFound``, 404, otherwise)."""
    return sessions_api().find(session_id)


async def require_registered(session: SessionActor, client_id: str) -> None:
    """400 ``invalid_client_id`` unless the caller's principal registered ``client_id`` on
    ``session`` (another principal's id is answered as an unknown one)."""
    await sessions_api().check_client(session, client_id, principal())


async def session_client(session: SessionActor) -> str | None:
    """The header's client id, which must be registered on ``session`` when present."""
    client_id = header_client_id()
    if client_id is not None:
        await require_registered(session, client_id)
    return client_id


async def ask[T](
    session: SessionActor, msg: SessionMsg, answer: type[T], timeout_s: float = ASK_TIMEOUT_S
) -> T:
    """Send ``msg`` to the session and await its (possibly deferred) answer of type
    ``answer``; the session's domain errors propagate to the one table."""
    return await sessions_api().ask(session, msg, answer, timeout_s=timeout_s)


def agent_unavailable() -> ApiError:
    """``503 acp_channel_unavailable`` (the session's :class:`AgentUnavailable`)."""
    mapped = to_api_error(AgentUnavailable())
    assert mapped is not None
    return mapped


async def publish(
    session: SessionActor, event_type: str, data: object, originator: str | None
) -> None:
    """Have the session write another party's event into its log (its only writer)."""
    await sessions_api().publish(session, event_type, data, originator)


def session_response(view: SessionView, *, attached: bool, client_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sessionId": view.session_id,
        "workspaceCwd": view.workspace,
        "attached": attached,
        "clientId": client_id,
        "createdAt": view.created_at,
    }
    if attached:
        out["hasActivePrompt"] = view.has_active_prompt
    return out


# ---- create / restore / list --------------------------------------------------------------


@blueprint.post("/session")
async def create_session() -> Response:
    api = sessions_api()
    api.check_accepting()
    body = await json_body()
    client_id = header_client_id()
    scope = body.get("sessionScope", "single")
    if scope not in ("single", "thread"):
        raise bad_request("`sessionScope` must be one of: single, thread", "invalid_session_scope")
    approval_mode = body.get("approvalMode")
    if approval_mode is not None and approval_mode not in APPROVAL_MODES:
        raise bad_request(
            "`approvalMode` must be one of: " + ", ".join(APPROVAL_MODES),
            "invalid_approval_mode",
            allowed=list(APPROVAL_MODES),
        )
    if body.get("sessionId") is not None:
        raise bad_request(
            "`sessionId` overrides are not supported by this daemon", "invalid_session_id"
        )
    if approval_mode is not None and not approval_mode_change_allowed(
        token_configured=daemon().settings.token is not None
    ):
        # The approval-mode route's gate, before anything is made (strict.py).
        raise ApiError(401, {"error": TOKEN_REQUIRED_BODY.error, "code": TOKEN_REQUIRED_CODE})
    model = body.get("modelServiceId")
    if model is not None and not isinstance(model, str):
        raise bad_request("`modelServiceId` must be a string", "invalid_model_service_id")
    workspace = api.workspace(body.get("cwd"), may_use_filter())
    created = await api.create(
        workspace, scope, client_id, request.remote_addr, principal=principal()
    )
    registered = created.attached.client_id
    g.audit_session = created.session.session_id  # (the audit line names what was made)
    out = session_response(created.attached.view, attached=created.joined, client_id=registered)
    if approval_mode is None and not created.joined:
        approval_mode = daemon().settings.approval_mode  # --approval-mode, the operator's
    applied = await api.apply_settings(created.session, registered, approval_mode, model)
    if applied is not None:
        out["modelApplied"] = applied
    return json_response(out)


async def _restore(session_id: str, action: str) -> Response:
    api = sessions_api()
    api.check_accepting()
    body = await json_body()
    client_id = header_client_id()
    workspace = api.workspace(body.get("cwd"), may_use_filter())
    restored = await api.restore(
        session_id,
        workspace,
        action,
        client_id,
        request.remote_addr,
        principal=principal(),
        group_roles=dict(daemon().config.access.session_groups),
    )
    view = restored.attached.view
    out = session_response(view, attached=restored.joined, client_id=restored.attached.client_id)
    out["state"] = view.state
    out["lastEventId"] = view.last_event_id
    out["eventEpoch"] = view.epoch
    return json_response(out)


@blueprint.post("/session/<session_id>/load")
async def load_session(session_id: str) -> Response:
    return await _restore(session_id, "load")


@blueprint.post("/session/<session_id>/resume")
async def resume_session(session_id: str) -> Response:
    return await _restore(session_id, "resume")


@blueprint.get("/workspace/<path:workspace>/sessions")
@blueprint.get("/workspace//<path:workspace>/sessions")  # a %2F-encoded absolute path
@blueprint.get("/workspaces/<path:workspace>/sessions")
@blueprint.get("/workspaces//<path:workspace>/sessions")
async def list_sessions(workspace: str) -> Response:
    api = sessions_api()
    path = api.listed(workspace, may_use_filter())
    sessions = await api.summaries(path, visible())
    if request.args.get("include") == "persisted":  # acp-serve's: journaled, not loaded
        groups = dict(daemon().config.access.session_groups)
        sessions += await api.persisted_summaries(path, principal(), groups)
    shared = forward.cluster()
    if shared is not None:  # many daemons on one journal: the other daemons' sessions too
        sessions = await shared.merged_list(sessions)
    return json_response({"sessions": sessions})


# ---- prompts ------------------------------------------------------------------------------


@blueprint.post("/session/<session_id>/prompt")
async def prompt(session_id: str) -> Response:
    api = sessions_api()
    api.check_accepting()
    body = await json_body(allow_empty=False)
    client_id = header_client_id()  # a malformed one is refused before the body is read
    parsed = parse_prompt(body)  # serve/api/prompts.py: the one validation
    session = api.find(session_id)
    if client_id is not None:
        await require_registered(session, client_id)
    submitted = await api.submit(session, parsed, client_id, principal())
    admission = submitted.admission
    _, steered = prompt_steer.unpack(submitted.steered if submitted.steered else admission)
    prefer = request.headers.get("Prefer", "")
    # --prompt-response async: 202 at admission without the header too (the reference's
    # behaviour); the turn then never depends on this connection.
    if "respond-async" in prefer.lower() or daemon().settings.prompt_response == "async":
        return json_response(
            {
                "promptId": admission.prompt_id,
                "lastEventId": admission.last_event_id,
                "eventEpoch": admission.epoch,
                **steered,
            },
            202,
        )
    try:
        done = await api.outcome(session, submitted, client_id)
    except TurnFailed as exc:  # its status and headers from the table (serve/errors)
        error = to_api_error(exc)
        assert error is not None
        error.body.update(steered)
        raise error from None
    out = {"stopReason": done.stop_reason, "promptId": done.prompt_id, **steered, **done.fields}
    return json_response(out)


@blueprint.get("/session/<session_id>/pending-prompts")
async def pending_prompts(session_id: str) -> Response:
    session = find_session(session_id)
    await session_client(session)
    return json_response(await ask(session, ListPending(), dict))


@blueprint.delete("/session/<session_id>/pending-prompts/<prompt_id>")
async def remove_pending_prompt(session_id: str, prompt_id: str) -> Response:
    session = find_session(session_id)
    client_id = await session_client(session)
    try:
        removed = await ask(session, RemovePending(prompt_id, client_id), bool)
    except PromptRunning:
        raise ApiError(
            409,
            {
                "error": "The prompt is running; cancel it with POST /session/:id/cancel",
                "code": "prompt_running",
                "sessionId": session_id,
                "promptId": prompt_id,
            },
        ) from None
    if not removed:
        raise ApiError(
            404,
            {
                "error": f'No pending prompt "{prompt_id}"',
                "code": "prompt_not_found",
                "sessionId": session_id,
                "promptId": prompt_id,
            },
        )
    return Response(b"", status=204)


@blueprint.post("/session/<session_id>/cancel")
async def cancel(session_id: str) -> Response:
    session = find_session(session_id)
    client_id = await session_client(session)
    await ask(session, CancelTurn(client_id), object)
    return Response(b"", status=204)


@blueprint.delete("/session/<session_id>")
async def close(session_id: str) -> Response:
    session = find_session(session_id)
    client_id = await session_client(session)
    await ask(session, CloseSession(reason="client_close", closed_by=client_id), object)
    return Response(b"", status=204)


@blueprint.post("/session/<session_id>/detach")
async def detach(session_id: str) -> Response:
    session = daemon().registry.get(session_id)
    if session is None:
        header_client_id()  # a malformed client id is a 400 even here
        return Response(b"", status=204)
    client_id = await session_client(session)
    # The session decides, in its inbox, whether this was its last client.
    try:
        await session.call(Detach(client_id), timeout_s=10)
    except (SessionGone, ActorStopped):
        pass
    return Response(b"", status=204)


@blueprint.patch("/session/<session_id>/metadata")
async def metadata(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    client_id = await session_client(session)
    name = body.get("displayName")
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise bad_request(
            "`displayName` must be a non-empty string of at most 256 characters",
            "invalid_metadata",
            field="displayName",
        )
    done = await ask(session, UpdateMetadata(name.strip(), client_id), MetadataSet)
    return json_response({"sessionId": done.session_id, "displayName": done.display_name})


@blueprint.post("/session/<session_id>/heartbeat")
async def heartbeat(session_id: str) -> Response:
    session = find_session(session_id)
    client_id = await session_client(session)
    last_seen = await ask(session, Heartbeat(client_id), int)
    out: dict[str, Any] = {"sessionId": session_id, "lastSeenAt": last_seen}
    if client_id is not None:
        out["clientId"] = client_id
    return json_response(out)


@blueprint.post("/session/<session_id>/model")
async def set_model(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    client_id = await session_client(session)
    model_id = body.get("modelId")
    if not isinstance(model_id, str) or not model_id.strip():
        raise bad_request("`modelId` must be a non-empty string")
    switched = await ask(session, SetModel(model_id, client_id, timeout_s=60.0), ModelSet)
    return json_response({"modelId": switched.model_id})


@blueprint.post("/session/<session_id>/approval-mode")
async def approval_mode(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    client_id = await session_client(session)
    mode = body.get("mode")
    # The agent's own mode ids or qwen's names; the session checks them (permissions/modes.py).
    if not isinstance(mode, str) or not 0 < len(mode) <= MAX_MODE_ID_CHARS:
        raise bad_request(
            f"`mode` must be a mode id of at most {MAX_MODE_ID_CHARS} characters "
            "(the agent's own, or one of: " + ", ".join(APPROVAL_MODES) + ")",
            "invalid_approval_mode",
            allowed=list(APPROVAL_MODES),
        )
    persist = body.get("persist", False)
    if not isinstance(persist, bool):
        raise bad_request("`persist` must be a boolean", "invalid_persist_flag")
    changed = await ask(session, SetApprovalMode(mode, persist, client_id), ModeSet)
    out: dict[str, Any] = {
        "sessionId": changed.session_id,
        "previous": changed.previous,
        "mode": changed.mode,
        "persisted": changed.persisted,
    }
    if changed.requested is not None:
        out["requested"] = changed.requested
    return json_response(out)


# ---- events -------------------------------------------------------------------------------


def _max_queued() -> int:
    raw = request.args.get("maxQueued")
    if raw is None:
        return DEFAULT_MAX_QUEUED
    if not raw.isdigit() or not MIN_MAX_QUEUED <= int(raw) <= MAX_MAX_QUEUED:
        raise bad_request(
            f"maxQueued must be an integer in [{MIN_MAX_QUEUED}, {MAX_MAX_QUEUED}]",
            "invalid_max_queued",
        )
    return int(raw)


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None:
        return None
    raw = raw.strip()
    if not raw.isdigit() or int(raw) > MAX_SAFE_INTEGER:
        return None
    return int(raw)


@blueprint.get("/session/<session_id>/events")
async def events(session_id: str) -> Response:
    session = find_session(session_id)
    max_queued = _max_queued()
    limit = daemon().settings.max_connections
    if limit and daemon().front.sse_streams >= limit:
        # Event streams are the connections that stay open; --max-connections caps them.
        raise service_unavailable(
            f"Connection limit reached ({limit} event streams)",
            "connection_limit_exceeded",
            limit=limit,
        )
    stream_client = header_client_id()
    epoch = request.headers.get("X-Qwen-Event-Epoch")
    if epoch is not None and not _EPOCH_RE.match(epoch):
        epoch = None
    try:
        subscription = await ask(
            session,
            Subscribe(
                last_event_id=_last_event_id(),
                epoch=epoch,
                max_queued=max_queued,
                snapshot=request.args.get("snapshot") in ("1", "true"),
                client_id=stream_client,
                principal=principal().id,
            ),
            Subscription,
        )
    except SubscriberLimitExceeded as exc:
        raise ApiError(
            429,
            {"error": str(exc), "code": "subscriber_limit_exceeded", "limit": exc.limit},
            {"Retry-After": "5"},
        ) from None
    sub = subscription.subscriber
    d = daemon()
    d.front.sse_streams += 1

    def ended() -> None:
        """The stream is over for the daemon: ended, or evicted while its write blocks."""
        d.front.sse_streams -= 1
        try:  # the session counts the stream's end as being seen
            session.tell_nowait(StreamEnded())
        except (InboxFull, ActorStopped):
            pass

    sub.on_close = ended
    # Multi-user auth: the stream ends once its principal's token is revoked or its role on
    # the session is gone (a member or a role removed), within LEASE_CHECK_S.
    lease = Lease.of(d, request.scope)
    wait_s = HEARTBEAT_INTERVAL_S if lease is None else LEASE_CHECK_S

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield RETRY_FRAME
            beat_at = check_at = trio.current_time()
            while True:
                chunk = await sub.next_chunk(wait_s)
                if chunk is None:
                    return
                if lease is not None:
                    now = trio.current_time()
                    if now - check_at >= LEASE_CHECK_S:
                        check_at = now
                        if not (await lease.holds() and lease.reads(session)):
                            return
                    if not chunk and now - beat_at < HEARTBEAT_INTERVAL_S:
                        continue
                    beat_at = now
                if len(chunk) <= SSE_WRITE_BYTES:
                    yield chunk or HEARTBEAT_FRAME
                    continue
                # A multi-MiB frame goes out in 1 MiB writes: the server copies each body
                # write once more on the loop, so one big write would be one long stall.
                view = memoryview(chunk)
                for start in range(0, len(chunk), SSE_WRITE_BYTES):
                    yield bytes(view[start : start + SSE_WRITE_BYTES])
        finally:
            sub.close()  # runs ended() unless an eviction already did

    return await stream_response(
        stream(),
        {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache, no-transform",
            "X-Accel-Buffering": "no",
            "X-Qwen-Event-Epoch": subscription.epoch,
            "X-Qwen-SSE-Stream-Id": str(uuid.uuid4()),
        },
    )


# ---- permission votes ---------------------------------------------------------------------


def from_loopback() -> bool:
    """Whether the request comes from this host (a vote's ``local-only`` policy)."""
    return is_loopback_address(request.remote_addr or "")


async def _vote(request_id: str, session_id: str | None, client_id: str | None) -> Response:
    body = await json_body(allow_empty=False)
    vote = await sessions_api().vote(request_id, session_id, body, client_id, from_loopback())
    return json_response(vote.body, vote.status)


@blueprint.post("/session/<session_id>/permission/<request_id>")
async def vote_session(session_id: str, request_id: str) -> Response:
    session = find_session(session_id)
    client_id = await session_client(session)
    return await _vote(request_id, session_id, client_id)


@blueprint.post("/permission/<request_id>")
async def vote_legacy(request_id: str) -> Response:
    client_id = header_client_id()
    shared = forward.cluster()
    if shared is not None and await sessions_api().vote_owner(request_id) is None:
        elsewhere = await shared.vote_elsewhere()  # another daemon's session asked
        if elsewhere is not None:
            return elsewhere
    guarded = daemon().multi_user and not principal().admin
    if client_id is not None or guarded:
        session = await sessions_api().vote_owner(request_id)
        if guarded:  # collaborator on the request's session; else as for an unknown id
            if session is None or not session_role(session, COLLABORATOR):
                return json_response(
                    {"error": "No pending permission request", "requestId": request_id}, 404
                )
        if session is not None and client_id is not None:
            await require_registered(session, client_id)
    return await _vote(request_id, None, client_id)
