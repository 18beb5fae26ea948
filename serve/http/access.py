"""The REST access gate: every route's rule (``serve/access/rules.py``), enforced once.

Installed by the app only with multi-user auth (``--auth-*``): without it no hook runs and
every request is the operator's. The principal is what the security front left in the
ASGI scope (:func:`principal`; absent: the operator token). ``gate`` runs before any
handler: it looks up the matched ``(METHOD, rule)`` in the app's rules, resolved once at
install (:func:`needs`; a route without a rule is refused to everyone but admins: fail
closed), then

* ``admin`` → 403 ``forbidden`` ``need: admin`` for a ``user``;
* a ``<workspace>`` in the route, or the primary workspace of a ``workspace`` route →
  ``404 workspace_not_found`` when the principal may not use it;
* ``observer`` / ``collaborator`` / ``owner`` → the live session's access record: no role
  at all (or its workspace not usable) is ``404 session_not_found``, a weaker role ``403
  forbidden`` with ``need`` (a session that is not live is left to the route: a load or
  resume checks the journaled owner before restoring it).

``any``, ``listing``, ``vote`` and ``connection`` pass here; their routes filter or check
what they reach (the service takes the principal). Every denial here and every mutation
(its status) goes to the audit log (``host.audit``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from quart import Response, g, request, websocket
from quart_trio import QuartTrio

from serve.access import OPERATOR, Principal, at_least
from serve.access.config import may_use, role_in
from serve.access.errors import Forbidden, WorkspaceDenied
from serve.access.rules import (
    ADMIN,
    CONNECTION,
    LISTING,
    PUBLIC,
    ROUTE_RULES,
    SESSION_RULES,
    WORKSPACE,
    canonical,
)
from serve.http.context import daemon
from serve.http.security.principals import PRINCIPAL_KEY, REVALIDATE_KEY
from serve.sessions.errors import SessionNotFound

if TYPE_CHECKING:
    from serve.host import Host
    from serve.sessions.actor import SessionActor

__all__ = [
    "LEASE_CHECK_S",
    "Lease",
    "audit",
    "check",
    "install",
    "may_use_filter",
    "need_of",
    "needs",
    "principal",
    "session_allows",
    "session_role",
    "session_visible",
    "usable",
    "visible",
    "ws_may_use_filter",
    "ws_principal",
]


#: A (method, rule) that was not in the app's map when the gate was installed.
_UNKNOWN = "?"
#: Rules whose routes answer a workspace the caller may not use exactly as one not served
#: (their own answer: a listing's ``workspace_mismatch``, ``/acp``'s JSON-RPC error), so the
#: gate leaves it to them (:func:`may_use_filter`).
_AS_UNSERVED = frozenset({LISTING, CONNECTION})
#: Session routes whose answer for an unknown id is not ``404 session_not_found``: someone
#: else's live session gets that same answer (detach of a missing session is a 204 no-op).
_UNKNOWN_SESSION: dict[tuple[str, str], int] = {("POST", "/session/<session_id>/detach"): 204}


def principal() -> Principal:
    """The principal of the request being handled (the operator without auth)."""
    found = request.scope.get(PRINCIPAL_KEY)
    return found if isinstance(found, Principal) else OPERATOR


def ws_principal() -> Principal:
    """The principal of the WebSocket being handled, fixed at its handshake."""
    found = websocket.scope.get(PRINCIPAL_KEY)
    return found if isinstance(found, Principal) else OPERATOR


def audit(
    host: Host,
    who: Principal,
    outcome: str,
    status: int,
    session: str | None = None,
    *,
    ws: bool = False,
    sessions: list[str] | None = None,
) -> None:
    """One audit line for the current request (``ws``: the current WebSocket); ``sessions``:
    every session it released (an ``/acp`` connection's end; ``session`` when one)."""
    log = host.audit
    if log is None:
        return
    req = websocket if ws else request
    rule = req.url_rule
    log.record(
        principal=who.id,
        peer=req.remote_addr,
        route=f"{'WS' if ws else req.method} {rule.rule if rule is not None else req.path}",
        session=session
        if session is not None or not sessions or len(sessions) > 1
        else sessions[0],
        sessions=sessions if sessions and len(sessions) > 1 else None,
        outcome=outcome,
        status=status,
        requestId=req.headers.get("X-Request-Id"),
        traceparent=req.headers.get("traceparent"),
    )


def need_of(method: str, rule: str) -> str | None:
    """The rule of a matched ``(METHOD, Quart rule)`` (``WS`` for a WebSocket; ``HEAD`` is
    its ``GET``'s), None when the table has none."""
    return ROUTE_RULES.get(("GET" if method == "HEAD" else method, canonical(rule)))


def needs(app: QuartTrio) -> dict[tuple[str, str], str | None]:
    """:func:`need_of` of every route of ``app``, built once so a request costs one lookup."""
    return {
        (kind, rule.rule): need_of(kind, rule.rule)
        for rule in app.url_map.iter_rules()
        for kind in (("WS",) if rule.websocket else (rule.methods or ()))
    }


def check(host: Host, who: Principal, need: str | None, rule: str, args: dict[str, object]) -> None:
    """Raise the refusal of ``need`` (the matched ``rule``'s) for ``who`` (see the module
    docstring)."""
    if need == PUBLIC or who.admin:
        return
    if need is None or need == ADMIN:
        raise Forbidden(ADMIN)
    config = host.config.access
    ref = args.get("workspace")
    if isinstance(ref, str) and rule.startswith("/workspace"):
        runtime = host.registry.by_ref(ref)
        if (
            runtime is not None
            and not may_use(config, who, runtime.path)
            # (the primary workspace is named in every mismatch: nothing to hide there)
            and (need not in _AS_UNSERVED or runtime.path == host.settings.primary_workspace)
        ):
            raise WorkspaceDenied(ref)
    elif need == WORKSPACE and not may_use(config, who, host.settings.primary_workspace):
        raise WorkspaceDenied(host.settings.primary_workspace)
    if need in SESSION_RULES:
        sid = args.get("session_id")
        session = host.registry.get(sid) if isinstance(sid, str) else None
        if session is None:
            return
        role = role_in(config, who, session.access, session.workspace)
        if role is None:
            raise SessionNotFound(session.session_id)
        if not at_least(role, need):
            raise Forbidden(need, sessionId=session.session_id)


def install(app: QuartTrio, host: Host) -> None:
    """The gate (first ``before_request`` / ``before_websocket`` hook) when multi-user auth
    is configured, and the audit of mutations whenever the audit log is on (``--auth-*``,
    or ``--audit-log`` alone)."""
    if host.multi_user:
        _install_gate(app, host)
    if host.audit is not None:
        _install_audit(app, host)


def _install_gate(app: QuartTrio, host: Host) -> None:
    known = needs(app)

    def need(method: str, rule: str) -> str | None:
        found = known.get((method, rule), _UNKNOWN)
        return need_of(method, rule) if found is _UNKNOWN else found  # added after install

    async def gate() -> Response | None:
        rule = request.url_rule
        if rule is None:
            return None
        who = principal()
        try:
            check(host, who, need(request.method, rule.rule), rule.rule, request.view_args or {})
        except (Forbidden, SessionNotFound, WorkspaceDenied) as exc:
            status = 403 if isinstance(exc, Forbidden) else 404
            sid = (request.view_args or {}).get("session_id")
            unknown = _UNKNOWN_SESSION.get((request.method, canonical(rule.rule)))
            answered = unknown if isinstance(exc, SessionNotFound) and unknown else status
            audit(host, who, "denied", answered, sid if isinstance(sid, str) else None)
            g.audited = True
            if answered != status:
                return Response(b"", status=answered)  # as for an unknown id (a no-op)
            raise
        return None

    async def ws_gate() -> None:
        rule = websocket.url_rule
        if rule is None:
            return
        who = ws_principal()
        args = websocket.view_args or {}
        try:
            check(host, who, need("WS", rule.rule), rule.rule, args)
        except (Forbidden, SessionNotFound, WorkspaceDenied) as exc:
            status = 403 if isinstance(exc, Forbidden) else 404
            audit(host, who, "denied", status, ws=True)
            raise

    app.before_request_funcs.setdefault(None, []).insert(0, gate)
    app.before_websocket_funcs.setdefault(None, []).insert(0, ws_gate)


def _install_audit(app: QuartTrio, host: Host) -> None:
    known = needs(app)  # (the /acp transport routes, once: not per request)

    async def after(response: Response) -> Response:
        if getattr(g, "audited", False):
            return response
        status = response.status_code
        if request.method in ("GET", "HEAD") and status not in (401, 403):
            return response
        rule = request.url_rule
        if (
            status < 400
            and rule is not None
            and known.get((request.method, rule.rule)) == CONNECTION
        ):
            return response  # an /acp POST: each message is audited by its method
        sid = (request.view_args or {}).get("session_id", getattr(g, "audit_session", None))
        outcome = "ok" if status < 400 else "denied" if status in (401, 403, 404) else "error"
        audit(host, principal(), outcome, status, sid if isinstance(sid, str) else None)
        return response

    app.after_request_funcs.setdefault(None, []).append(after)


def session_visible(host: Host, who: Principal, session: SessionActor) -> bool:
    """Whether ``who`` holds any role on ``session`` (a listing shows only those)."""
    return session_allows(host, who, session, None)


def session_allows(host: Host, who: Principal, session: SessionActor, need: str | None) -> bool:
    """Whether ``who`` holds ``need`` (None: any role) on ``session``, in a workspace it
    may use."""
    if who.admin:
        return True
    role = role_in(host.config.access, who, session.access, session.workspace)
    return role is not None and (need is None or at_least(role, need))


# ---- for the routes: no-ops without multi-user auth -----------------------------------------


def usable(workspace: str) -> str:
    """``workspace`` (a served path) when the caller may use it, else ``404``."""
    host = daemon()
    if host.multi_user and not may_use(host.config.access, principal(), workspace):
        raise WorkspaceDenied(workspace)
    return workspace


def may_use_filter() -> Callable[[str], bool] | None:
    """Whether the caller may use a served workspace (None: every one, without multi-user
    auth or for an admin): the routes answer one he may not as one not served."""
    return _may_use(principal())


def ws_may_use_filter() -> Callable[[str], bool] | None:
    """:func:`may_use_filter` for the WebSocket being handled."""
    return _may_use(ws_principal())


def _may_use(who: Principal) -> Callable[[str], bool] | None:
    host = daemon()
    if not host.multi_user or who.admin:
        return None
    config = host.config.access
    return lambda workspace: may_use(config, who, workspace)


def visible() -> Callable[[SessionActor], bool] | None:
    """The filter of a session listing (None: everything, as for the operator)."""
    host = daemon()
    who = principal()
    if not host.multi_user or who.admin:
        return None
    return lambda session: session_visible(host, who, session)


def session_role(session: SessionActor, need: str) -> bool:
    """Whether the caller holds ``need`` on ``session`` (always, without multi-user auth)."""
    host = daemon()
    return not host.multi_user or session_allows(host, principal(), session, need)


# ---- long-lived streams: a lease on the principal ---------------------------------------

#: How often a long-lived stream (REST SSE, ``/acp`` WebSocket and SSE) asks again whether
#: its principal still holds its credential and its role (seconds): a member removed, a
#: role removed or a token revoked ends it within this (plus the tokens file's own
#: look-at interval when that is how it was revoked).
LEASE_CHECK_S = 0.5


class Lease:
    """Whether the principal that opened a long-lived stream still may read it.

    Made only with multi-user auth for a credential the security front resolved (a JWT or
    a scoped token: the operator token is not revoked this way). :meth:`holds` resolves
    the same credential again (a cached JWT or a tokens-file lookup: a dict lookup, the
    file looked at for changes at most once a second) and answers False once it names no
    principal or another one (its roles or groups changed); :meth:`reads` is the
    principal's role on a session, from the session's access record now."""

    def __init__(
        self,
        host: Host,
        who: Principal,
        revalidate: Callable[[], Awaitable[Principal | None]],
    ) -> None:
        self.host = host
        self.who = who
        self._revalidate = revalidate

    @classmethod
    def of(cls, host: Host, scope: Mapping[str, Any]) -> Lease | None:
        """The lease of the request or WebSocket of ``scope`` (None: nothing to revoke)."""
        who = scope.get(PRINCIPAL_KEY)
        again = scope.get(REVALIDATE_KEY)
        if not host.multi_user or not isinstance(who, Principal) or again is None:
            return None
        return cls(host, who, again)

    async def holds(self) -> bool:
        try:
            now = await self._revalidate()
        except Exception:  # the key set could not be fetched: not proof of revocation
            return True
        return now == self.who

    def reads(self, session: SessionActor) -> bool:
        return session_allows(self.host, self.who, session, None)
