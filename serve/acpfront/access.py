"""The ``/acp`` side of the access rules: every method's rule (``serve/access/rules.py``).

Only with multi-user auth (``host.multi_user``). A connection's principal is fixed when it
is opened (``initialize``: the HTTP POST's or the WebSocket handshake's, as the security
front resolved it) and every message is checked against :data:`ACP_RULES` by :func:`check`
(the transport policy, before the handler): ``admin`` methods need the daemon role; the
connection's workspace must be usable; a method naming a live session needs the role on it
(none: ``session_not_found``, too weak: ``forbidden`` with ``need``). The handlers add what
needs more than the params: :func:`owner_of` (whose a new session, restore or fork is),
:func:`check_workspace` (a ``cwd`` in the params), :func:`check_restore` (the journaled
owner of a session that is not live), :func:`check_vote` (a vote by request id) and
:func:`visible` (``session/list``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from serve.access import COLLABORATOR, OPERATOR, Principal, at_least
from serve.access.config import may_use as may_use_config
from serve.access.config import role_in
from serve.access.errors import Forbidden, WorkspaceDenied
from serve.access.quotas import session_quota
from serve.access.roles import can_vote
from serve.access.rules import ACP_READS, ACP_RULES, ADMIN, SESSION_RULES, VOTE
from serve.acpfront.errors import not_found, not_owned, unserved
from serve.acpfront.jsonrpc import RpcError
from serve.api import ASK_TIMEOUT_S, SessionService
from serve.permissions.mediator import SessionOf
from serve.sessions.errors import SessionNotFound

if TYPE_CHECKING:
    from serve.acpfront.connections import Connection
    from serve.host import Host
    from serve.sessions.actor import SessionActor

__all__ = [
    "audit",
    "audit_cancelled",
    "audit_outcome",
    "check",
    "check_restore",
    "check_vote",
    "check_workspace",
    "may_use",
    "may_vote",
    "owner_of",
    "visible",
]


#: Methods that restore a session that is not live: an unknown id and someone else's live
#: session are both ``session_not_found`` there (the journaled owner decides, check_restore).
_RESTORES = frozenset({"session/load", "session/resume"})


def _who(host: Host, conn: Connection) -> Principal | None:
    """The connection's principal when its rules apply (None: operator, admin, no auth)."""
    who: Principal = getattr(conn, "principal", OPERATOR)
    return None if not host.multi_user or who.admin else who


def audit(
    host: Host, conn: Connection, method: str, sid: object, status: int, outcome: str = "denied"
) -> None:
    """One audit line for an ``/acp`` message (its method, not a route): a refusal, or
    the outcome of a mutation (:func:`audit_outcome`)."""
    if host.audit is not None:
        who: Principal = getattr(conn, "principal", OPERATOR)
        host.audit.record(
            principal=who.id,
            peer=conn.client,
            method=method,
            session=sid if isinstance(sid, str) else None,
            outcome=outcome,
            status=status,
        )


def audit_outcome(
    host: Host, conn: Connection, method: str, sid: str | None, error: RpcError | None
) -> None:
    """The audit line of a message its handler ran: every method but :data:`ACP_READS`,
    ``ok`` (200) or, from the error's ``httpStatus`` (500 without), ``denied`` (401, 403,
    404) or ``error``. Refusals of the rules were audited where they were raised."""
    if host.audit is None or method in ACP_READS:
        return
    if error is None:
        audit(host, conn, method, sid, 200, "ok")
        return
    data = error.data if isinstance(error.data, dict) else {}
    status = data.get("httpStatus")
    status = status if isinstance(status, int) else 500
    audit(host, conn, method, sid, status, "denied" if status in (401, 403, 404) else "error")


def audit_cancelled(host: Host, conn: Connection, method: str, sid: str | None) -> None:
    """The audit line of a mutation whose handler was cancelled before it answered (what it
    did so far stays done: ``cancelled``, 499)."""
    if method not in ACP_READS:
        audit(host, conn, method, sid, 499, "cancelled")


def check(host: Host, conn: Connection, method: str, params: dict[str, Any]) -> None:
    """The method's rule for the connection's principal (its refusal raised, audited)."""
    try:
        _check(host, conn, method, params)
    except (Forbidden, SessionNotFound, WorkspaceDenied) as exc:
        sid = params.get("sessionId")
        audit(host, conn, method, sid, 403 if isinstance(exc, Forbidden) else 404)
        if isinstance(exc, SessionNotFound) and isinstance(sid, str) and method not in _RESTORES:
            # Someone else's live session answers as an unknown id does on this method: a
            # connection owns only what it loaded, made or forked.
            raise (not_found(sid) if method == "session/fork" else not_owned(sid)) from None
        raise


def _check(host: Host, conn: Connection, method: str, params: dict[str, Any]) -> None:
    who = _who(host, conn)
    if who is None:
        return
    need = ACP_RULES.get(method, ADMIN)
    if need == ADMIN:
        raise Forbidden(ADMIN)
    config = host.config.access
    if not may_use_config(config, who, conn.workspace):
        raise WorkspaceDenied(conn.workspace)
    sid = params.get("sessionId")
    if (need in SESSION_RULES or need == VOTE) and isinstance(sid, str):
        session = host.registry.get(sid)
        if session is None:
            return  # the handler's own 404, or a restore (check_restore)
        role = role_in(config, who, session.access, session.workspace)
        if role is None:
            raise SessionNotFound(sid)
        want = COLLABORATOR if need == VOTE else need
        if not at_least(role, want):
            raise Forbidden(want, sessionId=sid)


def owner_of(host: Host, conn: Connection) -> tuple[str, int]:
    """Who a session made by this connection belongs to, and that principal's quota."""
    who: Principal = getattr(conn, "principal", OPERATOR)
    return who.id, session_quota(host.quotas, who)


def may_use(host: Host, conn: Connection, workspace: str) -> bool:
    """Whether the connection's principal may use ``workspace`` (always: no multi-user
    auth, an admin)."""
    who = _who(host, conn)
    return who is None or may_use_config(host.config.access, who, workspace)


def check_workspace(host: Host, conn: Connection, workspace: str) -> None:
    """A workspace the caller may not use is answered as one not served."""
    if not may_use(host, conn, workspace):
        raise unserved(workspace)


async def check_restore(host: Host, conn: Connection, session_id: str) -> None:
    who = _who(host, conn)
    if who is not None:
        groups = dict(host.config.access.session_groups)
        # (a refusal is audited with the message's outcome, dispatch.py)
        await SessionService(host).check_journaled(session_id, who, groups)


async def check_vote(host: Host, conn: Connection, request_id: str) -> bool:
    """Whether the connection may vote on ``request_id`` (collaborator on its session)."""
    who = _who(host, conn)
    if who is None:
        return True
    owner = await host.mediator.ask(SessionOf(request_id), timeout_s=ASK_TIMEOUT_S)
    session = host.registry.get(owner) if isinstance(owner, str) and owner else None
    if session is not None and at_least(
        role_in(host.config.access, who, session.access, session.workspace), COLLABORATOR
    ):
        return True
    return False  # (audited with the message's outcome, dispatch.py)


def may_vote(host: Host, conn: Connection, session: SessionActor) -> bool:
    """Whether the connection's votes count on ``session``: its principal's role, the
    config's group rules (``sessionGroups``) included, as at the gates."""
    who: Principal = getattr(conn, "principal", OPERATOR)
    return who.admin or can_vote(session.access, who, host.config.access.session_groups)


def visible(host: Host, conn: Connection) -> Callable[[SessionActor], bool] | None:
    who = _who(host, conn)
    if who is None:
        return None
    config = host.config.access
    return lambda session: role_in(config, who, session.access, session.workspace) is not None
