"""Multi-user routes: a session's members, and the audit log.

``GET /session/:id/members`` (observer) answers ``{sessionId, owner, members}``;
``PUT /session/:id/members`` (owner) replaces the members with ``{members: {<principal id>
| group:<name>: observer | collaborator}}`` (the owner stays the owner; at most
:data:`serve.access.roles.MAX_MEMBERS`). The record is the session actor's own
(``SetAccess``), journaled so it survives a restart. ``GET /daemon/audit?limit=&before=``
(admin) pages the audit log newest first (``{entries, nextBefore, dropped, refused}``:
``refused`` counts the unauthenticated refusals by reason, which are only sampled). The access
gate (``serve/http/access.py``) checks the roles; without multi-user auth the routes still
answer (the operator owns every session) and the audit log is off (``404``).
"""

from __future__ import annotations

from quart import Blueprint, Response, request

from serve.access.roles import COLLABORATOR, MAX_MEMBERS, OBSERVER, SessionAccess
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request
from serve.http.routes.sessions import ask, find_session
from serve.http.wire import json_body, json_response
from serve.sessions.messages import SetAccess

blueprint = Blueprint("members", __name__)

_P = "/session/<session_id>/members"

FEATURES: tuple[Feature, ...] = (
    Feature(
        "multi_user_auth",
        (("GET", _P), ("PUT", _P), ("GET", "/daemon/audit")),
        modes=("jwt", "tokens"),
        when=lambda d: d.settings.auth.configured,
    ),
)


def _view(session_id: str, access: SessionAccess) -> dict[str, object]:
    return {"sessionId": session_id, "owner": access.owner, "members": dict(access.members)}


@blueprint.get(_P)
async def get_members(session_id: str) -> Response:
    session = find_session(session_id)
    return json_response(_view(session.session_id, session.access))


@blueprint.put(_P)
async def put_members(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    members = body.get("members")
    if (
        not isinstance(members, dict)
        or len(members) > MAX_MEMBERS
        or not all(
            isinstance(k, str) and 0 < len(k) <= 256 and v in (OBSERVER, COLLABORATOR)
            for k, v in members.items()
        )
    ):
        raise bad_request(
            f"`members` must map at most {MAX_MEMBERS} principal ids (or group:<name>) to "
            f"{OBSERVER} or {COLLABORATOR}",
            "invalid_members",
        )
    access = SessionAccess(owner=session.access.owner, members=dict(members))
    done = await ask(session, SetAccess(access), SessionAccess)
    return json_response(_view(session.session_id, done))


@blueprint.get("/daemon/audit")
async def get_audit() -> Response:
    audit = daemon().audit
    if audit is None:
        raise ApiError(404, {"error": "The audit log is off", "code": "audit_log_off"})
    raw_limit, raw_before = request.args.get("limit", "100"), request.args.get("before")
    if not raw_limit.isdigit() or (raw_before is not None and not raw_before.isdigit()):
        raise bad_request("`limit` and `before` must be non-negative integers", "invalid_page")
    page = await audit.page(int(raw_limit), int(raw_before) if raw_before else None)
    return json_response(
        {
            "entries": page.entries,
            "nextBefore": page.next_before,
            "dropped": audit.dropped,
            "refused": dict(audit.refused_total),
        }
    )
