"""Session routes that forward to the agent's vendor extension methods (spec §4.2, §4.8, §7.8).

qwen-code answers ``qwen/status/session/<x>`` and ``qwen/control/session/<x>``; these
routes forward to them through the session's inbox (an :class:`AgentCall` the session runs
off its inbox, so the call never holds up cancel, close or admissions):

===========================================  =========================  ======================
route                                        tag                        agent method
===========================================  =========================  ======================
``GET  /session/<id>/context-usage``         ``session_context_usage``  ``.../context_usage``
``GET  /session/<id>/stats``                 ``session_stats``          ``.../stats``
``GET  /session/<id>/tasks``                 ``session_tasks``          ``.../tasks``
``GET  /session/<id>/lsp``                   ``session_lsp``            ``.../lsp``
``GET  /session/<id>/hooks``                 ``session_hooks``          ``.../hooks``
``POST /session/<id>/recap``                 ``session_recap``          ``.../recap``
``POST /session/<id>/btw``                   ``session_btw``            ``.../btw``
``POST /session/<id>/language``              ``session_language``       ``.../language``
``POST /session/<id>/rewind``                ``session_rewind``         ``.../rewind``
``GET  /session/<id>/rewind/snapshots``      ``session_rewind``         ``.../rewind_snapshots``
``POST /session/<id>/branch``                ``session_branch``         ``.../branch``
===========================================  =========================  ======================

Status reads, recap, btw and language relay the agent's JSON unchanged (``GET`` answers
carry ``Cache-Control: no-store``). Rewind answers the reference's shape ``{sessionId,
rewound, targetTurnIndex, filesChanged, filesFailed}`` (not the agent's internal history)
and publishes ``session_rewound``. Branch forks the conversation in the agent and then
loads the new session into the daemon (``201`` with the usual session response plus
``branchedFrom``, ``title``, ``displayName``; with ``atRecordId`` the fork is only
persisted, as in the reference). Rewind and branch refuse while a prompt runs or waits
(``409 session_busy``); the session decides that in its inbox and starts no prompt until
the call returns (a prompt admitted meanwhile waits its turn).

Support and tags (:mod:`serve.workspaces.state.agent_ext`): a tag is advertised only when
some live session's agent is known (qwen-code) or was seen to answer the method; no live
session → no tag. A call to an agent kind that answered ``-32601`` before is refused at
once; a call answered ``-32601`` is remembered. Both are ``501 {code:
"not_supported_by_agent"}``. Agent errors map to the wire here: ``session_busy`` → 409,
``invalid_rewind_target``/``branch_point_invalid`` and other ``-32602`` → 400, an unknown
session → 404, anything else → ``502 agent_error``; timeouts → 504, a closed channel → 503.

Every route finds the session (404) and checks a present ``X-Qwen-Client-Id`` against it
(400 ``invalid_client_id``) before anything is forwarded.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

import msgspec
from quart import Blueprint, Response, request

from acp.errors import METHOD_NOT_FOUND, AcpError, RemoteError
from actors import ActorStopped
from serve.access.quotas import session_quota
from serve.api import SessionService
from serve.http.access import principal
from serve.http.capabilities import Feature, SharedPredicate
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, session_not_found, to_api_error
from serve.http.forks import known_info
from serve.http.routes.sessions import (
    agent_unavailable,
    ask,
    find_session,
    publish,
    session_client,
    session_response,
    sessions_api,
)
from serve.http.wire import JSON_TYPE, json_body, json_response
from serve.sessions.fork import NATIVE as NATIVE_FORK
from serve.sessions.fork import current_state, fork_path, fork_session
from serve.sessions.messages import AgentCall, Attach, Attached, SessionGone
from serve.workspaces.state import agent_ext

if TYPE_CHECKING:
    from serve.host import Host
    from serve.sessions.actor import SessionActor

blueprint = Blueprint("session_extensions", __name__)

#: Bound on a status read from the agent.
STATUS_TIMEOUT_S: Final = 30.0
#: Bound on calls that run a model side query (recap, btw) or mutate history.
MODEL_CALL_TIMEOUT_S: Final = 65.0
#: ``btw`` questions, as in qwen-code.
MAX_QUESTION_CHARS: Final = 4096
MAX_BRANCH_NAME_CHARS: Final = 200
MAX_LANGUAGE_CHARS: Final = 64
MAX_PROMPT_ID_CHARS: Final = 512
NO_STORE: Final = {"Cache-Control": "no-store"}
_CONTROL_CHARS: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")

_P = "/session/<session_id>"
_TAGS: Final = (
    ("session_context_usage", agent_ext.CONTEXT_USAGE, (("GET", f"{_P}/context-usage"),)),
    ("session_stats", agent_ext.STATS, (("GET", f"{_P}/stats"),)),
    ("session_tasks", agent_ext.TASKS, (("GET", f"{_P}/tasks"),)),
    ("session_lsp", agent_ext.LSP, (("GET", f"{_P}/lsp"),)),
    ("session_hooks", agent_ext.HOOKS, (("GET", f"{_P}/hooks"),)),
    ("session_recap", agent_ext.RECAP, (("POST", f"{_P}/recap"),)),
    ("session_btw", agent_ext.BTW, (("POST", f"{_P}/btw"),)),
    ("session_language", agent_ext.LANGUAGE, (("POST", f"{_P}/language"),)),
    (
        "session_rewind",
        agent_ext.REWIND,
        (("POST", f"{_P}/rewind"), ("GET", f"{_P}/rewind/snapshots")),
    ),
    ("session_branch", agent_ext.BRANCH, (("POST", f"{_P}/branch"),)),
)


def _agent_methods(d: Host) -> frozenset[str]:
    """The methods of :data:`_TAGS` some live session's agent is known (or was seen) to
    answer; ``branch`` also when one forks natively (ACP ``session/fork``). One walk over
    the live sessions for all the tags."""
    live = d.registry.live()
    if not live:
        return frozenset()
    found = agent_ext.live_supported(d, live, (method for _, method, _ in _TAGS))
    if agent_ext.BRANCH not in found and any(_native_fork(s, d) for s in live):
        found.add(agent_ext.BRANCH)  # native session/fork
    return frozenset(found)


FEATURES: tuple[Feature, ...] = tuple(
    Feature(tag, routes, when=SharedPredicate(_agent_methods, method))
    for tag, method, routes in _TAGS
)


# ---- forwarding ---------------------------------------------------------------------------


def _not_supported(method: str, name: str | None) -> ApiError:
    who = name or "the agent"
    return ApiError(
        501,
        {
            "error": f"{who} does not support {method}",
            "code": "not_supported_by_agent",
            "method": method,
            "agent": name,
        },
    )


def _agent_error(err: RemoteError, session_id: str, invalid_code: str) -> ApiError:
    data = err.data if isinstance(err.data, dict) else {}
    kind = data.get("errorKind")
    body: dict[str, Any] = {"error": err.message, "agentCode": err.code}
    if kind == "session_busy":
        return ApiError(409, {**body, "code": "session_busy", "sessionId": session_id})
    if kind == "session_not_found" or err.code in (-32004, -32002):
        return session_not_found(session_id)
    if isinstance(kind, str) and kind in ("invalid_rewind_target", "branch_point_invalid"):
        return ApiError(400, {**body, "code": kind})
    if err.code == -32602:
        return ApiError(400, {**body, "code": invalid_code})
    if err.data is not None:
        body["data"] = err.data
    return ApiError(502, {**body, "code": "agent_error"})


async def forward(
    session: SessionActor,
    method: str,
    params: dict[str, Any],
    *,
    timeout_s: float = STATUS_TIMEOUT_S,
    invalid_code: str = "invalid_params",
    exclusive: str | None = None,
) -> bytes:
    """Call ``method`` on the session's agent; the raw JSON result, or an :class:`ApiError`.

    ``exclusive`` (``"rewind"``, ``"branch"``): 409 ``session_busy`` while a prompt runs or
    waits, decided by the session."""
    support = agent_ext.support_for(daemon())
    kind = agent_ext.agent_kind(session)
    if support.verdict(kind, method) is False:
        raise _not_supported(method, agent_ext.agent_name(session))
    conn = session.conn
    # No agent yet (an agent without agentInfo is asked; a released one is rebound by the
    # call).
    if kind is None and not session.agent_released and (conn is None or conn.info is None):
        raise agent_unavailable()
    try:
        raw = await ask(
            session,
            AgentCall(method, params, timeout_s, exclusive),
            bytes,
            timeout_s=STATUS_TIMEOUT_S,
        )
    except RemoteError as err:
        if err.code == METHOD_NOT_FOUND:
            support.observe(kind, method, False)
            raise _not_supported(method, agent_ext.agent_name(session)) from None
        support.observe(kind, method, True)
        raise _agent_error(err, session.session_id, invalid_code) from None
    except AcpError as err:
        mapped = to_api_error(err)
        if mapped is None:  # pragma: no cover - every AcpError the client raises is mapped
            raise
        raise mapped from None
    support.observe(kind, method, True)
    return raw


def _relay(raw: bytes, *, status: int = 200, cache: bool = True) -> Response:
    return Response(raw, status=status, content_type=JSON_TYPE, headers=None if cache else NO_STORE)


def _decode_object(raw: bytes, method: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise ApiError(
            502, {"error": f"the agent sent a malformed {method} result", "code": "agent_error"}
        )
    return value


def _query_flag(name: str) -> bool:
    return request.args.get(name, "").lower() == "true"


# ---- status reads -------------------------------------------------------------------------


async def _status(session_id: str, method: str, params: dict[str, Any] | None = None) -> Response:
    session = find_session(session_id)
    await session_client(session)
    raw = await forward(session, method, params or {})
    return _relay(raw, cache=False)


@blueprint.get(f"{_P}/context-usage")
async def context_usage(session_id: str) -> Response:
    return await _status(session_id, agent_ext.CONTEXT_USAGE, {"detail": _query_flag("detail")})


@blueprint.get(f"{_P}/stats")
async def stats(session_id: str) -> Response:
    return await _status(session_id, agent_ext.STATS)


@blueprint.get(f"{_P}/tasks")
async def tasks(session_id: str) -> Response:
    trusted = find_session(session_id).workspace in daemon().settings.workspaces
    include = trusted and _query_flag("includeWorkflows")
    return await _status(session_id, agent_ext.TASKS, {"includeWorkflows": include})


@blueprint.get(f"{_P}/lsp")
async def lsp(session_id: str) -> Response:
    return await _status(session_id, agent_ext.LSP)


@blueprint.get(f"{_P}/hooks")
async def hooks(session_id: str) -> Response:
    return await _status(session_id, agent_ext.HOOKS)


@blueprint.get(f"{_P}/rewind/snapshots")
async def rewind_snapshots(session_id: str) -> Response:
    return await _status(session_id, agent_ext.REWIND_SNAPSHOTS)


# ---- side queries and language ------------------------------------------------------------


@blueprint.post(f"{_P}/recap")
async def recap(session_id: str) -> Response:
    await json_body()
    session = find_session(session_id)
    await session_client(session)
    sessions_api().check_prompt_quota(principal())  # a model query: charged as a prompt
    raw = await forward(session, agent_ext.RECAP, {}, timeout_s=MODEL_CALL_TIMEOUT_S)
    return _relay(raw)


@blueprint.post(f"{_P}/btw")
async def btw(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    question = body.get("question")
    if not isinstance(question, str) or not question.strip() or len(question) > MAX_QUESTION_CHARS:
        raise bad_request(
            "`question` is required, must be a non-empty string, and at most "
            f"{MAX_QUESTION_CHARS} characters",
            "invalid_question",
        )
    await session_client(session)
    sessions_api().check_prompt_quota(principal())  # a model query: charged as a prompt
    raw = await forward(
        session, agent_ext.BTW, {"question": question.strip()}, timeout_s=MODEL_CALL_TIMEOUT_S
    )
    return _relay(raw)


@blueprint.post(f"{_P}/language")
async def language(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    code = body.get("language")
    if not isinstance(code, str) or not code or len(code) > MAX_LANGUAGE_CHARS:
        raise bad_request("`language` is required and must be a language code", "invalid_language")
    sync = body.get("syncOutputLanguage")
    if sync is not None and not isinstance(sync, bool):
        raise bad_request(
            "`syncOutputLanguage` must be a boolean when provided", "invalid_sync_flag"
        )
    await session_client(session)
    raw = await forward(
        session,
        agent_ext.LANGUAGE,
        {"language": code, "syncOutputLanguage": sync is True},
        invalid_code="invalid_language",
    )
    return _relay(raw)


# ---- history mutations --------------------------------------------------------------------


@blueprint.post(f"{_P}/rewind")
async def rewind(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    prompt_id = body.get("promptId")
    turn = body.get("targetTurnIndex")
    if prompt_id is not None and (
        not isinstance(prompt_id, str) or not prompt_id or len(prompt_id) > MAX_PROMPT_ID_CHARS
    ):
        raise bad_request("`promptId` must be a non-empty string", "missing_prompt_id")
    if turn is not None and (isinstance(turn, bool) or not isinstance(turn, int) or turn < 0):
        raise bad_request(
            "`targetTurnIndex` must be a non-negative integer", "invalid_rewind_target"
        )
    if prompt_id is None and turn is None:
        raise bad_request(
            "`promptId` (from GET /session/:id/rewind/snapshots) or `targetTurnIndex` is required",
            "missing_prompt_id",
        )
    rewind_files = body.get("rewindFiles", True)
    if not isinstance(rewind_files, bool):
        raise bad_request(
            "`rewindFiles` must be a boolean when provided", "invalid_rewind_files_flag"
        )
    client_id = await session_client(session)
    params: dict[str, Any] = {"rewindFiles": rewind_files}
    if prompt_id is not None:
        params["promptId"] = prompt_id
    if turn is not None:
        params["targetTurnIndex"] = turn
    raw = await forward(
        session,
        agent_ext.REWIND,
        params,
        timeout_s=MODEL_CALL_TIMEOUT_S,
        invalid_code="invalid_rewind_target",
        exclusive="rewind",
    )
    result = _decode_object(raw, agent_ext.REWIND)
    files_changed = result.get("filesChanged")
    files_failed = result.get("filesFailed")
    files_changed = files_changed if isinstance(files_changed, list) else []
    files_failed = files_failed if isinstance(files_failed, list) else []
    target = result.get("targetTurnIndex", turn if turn is not None else 0)
    event = {
        "sessionId": session.session_id,
        "promptId": prompt_id,
        "targetTurnIndex": target,
        "filesChanged": files_changed,
        "filesFailed": files_failed,
    }
    await publish(session, "session_rewound", event, client_id)
    return json_response(
        {
            "sessionId": session.session_id,
            "rewound": not files_failed,
            "targetTurnIndex": target,
            "filesChanged": files_changed,
            "filesFailed": files_failed,
        }
    )


async def _load_branch(session: SessionActor, new_id: str, client_id: str | None) -> dict[str, Any]:
    """Load the forked session into the daemon, owned by who branched it (its owner on
    record first, so a failed load leaves it the brancher's); its session response, or why
    not."""
    d = daemon()
    if d.draining:
        return {"restored": False, "restoreError": {"code": "daemon_draining"}}
    who = principal()
    api = SessionService(d)
    try:
        await api.claim(new_id, session.workspace, who, durable=False)
        opened = await api.open_restored(
            new_id,
            session.workspace,
            "load",
            principal=who,
            group_roles=dict(d.config.access.session_groups),
        )
        attach = Attach(client_id, request.remote_addr, principal=who.id)
        attached = await ask(opened.session, attach, Attached)
    except Exception as exc:
        mapped = to_api_error(exc)
        error = mapped.body if mapped is not None else {"error": str(exc)}
        return {"restored": False, "restoreError": error}
    out = session_response(attached.view, attached=opened.joined, client_id=attached.client_id)
    out["state"] = attached.view.state
    out["restored"] = True
    return out


def _native_fork(session: SessionActor, d: Host) -> bool:
    """ACP ``session/fork`` for an agent that advertises ``sessionCapabilities.fork``,
    unless it is known to answer qwen's vendor branch method (qwen keeps its path); a
    session released while idle is judged by its workspace's agent (``known_info``)."""
    info = known_info(d, session)
    if info is None:
        return False
    vendor = agent_ext.support_for(d).verdict(agent_ext.agent_kind(session), agent_ext.BRANCH)
    return fork_path(info.supports_fork, vendor) == NATIVE_FORK


async def _fork(session: SessionActor, client_id: str | None, name: str | None) -> Response:
    """A new daemon session from the parent's context, with its model, mode and MCP servers
    (the use case :func:`serve.sessions.fork.fork_session`, shared with ``/acp``)."""
    try:
        who = principal()
        quota = session_quota(daemon().quotas, who)
        forked = await fork_session(daemon().registry, session, who.id, quota)
    except (SessionGone, ActorStopped):
        raise session_not_found(session.session_id) from None
    except Exception as exc:
        mapped = to_api_error(exc)
        if mapped is None:
            raise
        raise mapped from None
    fork = forked.session
    attached = await ask(fork, Attach(client_id, principal=who.id), Attached)
    out = session_response(attached.view, attached=False, client_id=attached.client_id)
    out["state"] = current_state(attached.view.state, attached.view)
    out.update(
        branchedFrom=session.session_id,
        newSessionId=fork.session_id,
        via="session/fork",
        restored=True,
        inherited=forked.inherited,
    )
    if name is not None:
        out["displayName"] = name
    await publish(
        session,
        "session_branched",
        {
            "sourceSessionId": session.session_id,
            "newSessionId": fork.session_id,
            "displayName": name,
        },
        client_id,
    )
    return json_response(out, 201)


@blueprint.post(f"{_P}/branch")
async def branch(session_id: str) -> Response:
    body = await json_body()
    session = find_session(session_id)
    name = body.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request("`name` must be a string", "invalid_branch_name")
        name = _CONTROL_CHARS.sub("", name)[:MAX_BRANCH_NAME_CHARS] or None
    record = body.get("atRecordId")
    if record is not None and not isinstance(record, str):
        raise bad_request("`atRecordId` must be a string", "branch_point_invalid")
    client_id = await session_client(session)
    if record is None and _native_fork(session, daemon()):
        return await _fork(session, client_id, name)
    params: dict[str, Any] = {"cwd": session.workspace}
    if name is not None:
        params["name"] = name
    if record is not None:
        params["atRecordId"] = record
    raw = await forward(
        session,
        agent_ext.BRANCH,
        params,
        timeout_s=MODEL_CALL_TIMEOUT_S,
        invalid_code="branch_point_invalid",
        exclusive="branch",
    )
    result = _decode_object(raw, agent_ext.BRANCH)
    new_id = result.get("newSessionId")
    if not isinstance(new_id, str) or not new_id:
        raise ApiError(
            502, {"error": "the agent's branch result names no newSessionId", "code": "agent_error"}
        )
    out: dict[str, Any] = {**result, "sessionId": new_id, "branchedFrom": session.session_id}
    if record is None:
        out.update(await _load_branch(session, new_id, client_id))
    else:  # persisted by the agent only: its owner on record, for a later load
        await SessionService(daemon()).claim(new_id, session.workspace, principal())
        out["restored"] = False
    return json_response(out, 201)
