"""Any daemon answers any request: a session route for a session another daemon of the
shared journal owns is proxied there, one whose owner is gone is taken over here.

Installed only with a shared journal (``--journal-url``); :mod:`serve.cluster` has the
design and the decision (:func:`serve.cluster.route`), this module applies it as the last
``before_request`` hook (after the access gate: the caller is known), for every route with a
``<session_id>``, when that session is not live on this daemon:

* **forward**: the request (method, path and query, body, headers but the hop-by-hop ones
  and ``Host``) goes to the owner's ``--advertise-url`` with ``X-Acp-Serve-Forwarded-By``;
  its answer comes back as it is, streamed (an event stream stays open as long as both
  ends do). The owner must answer with its status line within :data:`HEADERS_TIMEOUT_S`
  (all the request's tries together) and before its lease ends; an owner that refuses the
  connection (just killed) or stays silent past its lease (frozen) is asked about again
  and, gone, taken over here; one still holding its lease at the end of the wait is
  ``503 session_owner_unreachable`` with ``Retry-After``.
* **take over**: :meth:`SessionService.open_restored` (``load``) as the caller, so only a
  caller with a role on the session restores it (anyone else gets the route's own 404);
  with an ``X-Qwen-Client-Id`` the caller's client id is registered again on the restored
  session (the dead owner's clients are not known here otherwise). The route then runs on
  the live session.

A vote by request id alone (``POST /permission/:requestId``) that this daemon does not know
is sent to the other live daemons (:meth:`Cluster.vote_elsewhere`): only the daemon whose
session asked knows the id.

A list of a workspace's sessions (``GET /workspace/:path/sessions``) is the cluster's:
the daemon asks every other live daemon that owns sessions (:meth:`SharedJournal.peers`) for
its own list, as the caller, and merges them with its own (a live entry wins over a
``persisted`` one of the same session); a daemon that does not answer within
:data:`PEER_LIST_TIMEOUT_S` is left out (logged).

Bounds: one ``httpx.AsyncClient`` per app, at most :data:`MAX_CONNECTIONS` connections to
other daemons; a forwarded request body is the one the security front already bounded
(``--max-body-bytes``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import httpx
import trio
from quart import Response, current_app, make_response, request
from quart_trio import QuartTrio

from serve.api import SessionService
from serve.cluster import Route, route
from serve.http.access import principal
from serve.http.context import daemon
from serve.http.errors import ApiError, to_api_error
from serve.journal import JournalError, Ownership, SharedJournal
from serve.sessions.errors import SessionNotFound, SessionOwnedElsewhere

log = logging.getLogger(__name__)

#: The header that marks a request another daemon forwarded (it is never forwarded again).
FORWARDED_BY: Final = "X-Acp-Serve-Forwarded-By"
#: Longest wait, in seconds, for a forwarded request's status line.
HEADERS_TIMEOUT_S: Final = 10.0
#: Longest wait, in seconds, to connect to another daemon.
CONNECT_TIMEOUT_S: Final = 2.0
#: Connections kept to other daemons (streams included).
MAX_CONNECTIONS: Final = 256
#: Longest wait, in seconds, for another daemon's list of sessions.
PEER_LIST_TIMEOUT_S: Final = 2.0
#: The app extension holding the :class:`Cluster` (absent without a shared journal).
CLUSTER_KEY: Final = "acp_serve.cluster"
#: Seconds a client is told to wait when the owner did not answer.
RETRY_AFTER_S: Final = "2"

_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_RESPONSE_DROP: Final = _HOP_BY_HOP | {"date", "server"}
#: The restore routes restore by themselves (they are forwarded, never taken over here).
_RESTORE_SUFFIXES: Final = ("/load", "/resume")


class Cluster:
    """The HTTP side of a daemon on a shared journal: its client to the other daemons."""

    def __init__(self, journal: SharedJournal) -> None:
        self.journal = journal
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S, pool=CONNECT_TIMEOUT_S),
                limits=httpx.Limits(max_connections=MAX_CONNECTIONS),
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            with trio.CancelScope(shield=True):
                await self._client.aclose()

    async def _peers(self, what: str) -> list[str]:
        """The other live daemons to ask ``what`` (none when this request was itself
        forwarded: it is never sent on, or when the journal cannot say)."""
        if FORWARDED_BY in request.headers:
            return []
        try:
            return await self.journal.peers()
        except JournalError as exc:
            log.warning("%s not sent to the other daemons: %s", what, exc)
            return []

    async def merged_list(self, own: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``own`` (this daemon's list entries) with the other live daemons' lists for the
        same request (not when this request was itself forwarded)."""
        peers = await self._peers("sessions list")
        lists: list[list[dict[str, Any]]] = [own]
        if peers:
            answers: list[list[dict[str, Any]]] = [[] for _ in peers]
            headers = _outgoing_headers(self.journal.owner_id or "")
            async with trio.open_nursery() as nursery:
                for i, address in enumerate(peers):
                    nursery.start_soon(self._peer_list, address, headers, answers, i)
            lists.extend(answers)
        return _merge(lists)

    async def _peer_list(
        self,
        address: str,
        headers: list[tuple[str, str]],
        answers: list[list[dict[str, Any]]],
        i: int,
    ) -> None:
        url = _target(address)
        with trio.move_on_after(PEER_LIST_TIMEOUT_S):
            try:
                r = await self.client().get(url, headers=headers)
                found = r.json().get("sessions") if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.info("sessions of %s not listed: %r", address, exc)
                return
            if isinstance(found, list):
                answers[i] = [e for e in found if isinstance(e, dict)]
            return
        log.info("sessions of %s not listed: no answer in %g s", address, PEER_LIST_TIMEOUT_S)

    async def vote_elsewhere(self) -> Response | None:
        """``POST /permission/:requestId`` for a request this daemon does not know: sent to
        the other live daemons (only the one whose session asked knows the id; the others
        answer 404 and change nothing); the first answer that is not a 404, or None."""
        peers = await self._peers("vote")
        if not peers:
            return None
        headers = _outgoing_headers(self.journal.owner_id or "")
        body = await request.get_data()
        found: list[httpx.Response] = []
        async with trio.open_nursery() as nursery:

            async def ask(address: str) -> None:
                with trio.move_on_after(PEER_LIST_TIMEOUT_S):
                    try:
                        r = await self.client().post(
                            _target(address), headers=headers, content=body
                        )
                    except httpx.HTTPError as exc:
                        log.info("vote not sent to %s: %r", address, exc)
                        return
                    if r.status_code != 404:
                        found.append(r)
                        nursery.cancel_scope.cancel()

            for address in peers:
                nursery.start_soon(ask, address)
        if not found:
            return None
        answer = found[0]
        return Response(answer.content, answer.status_code, _answer_headers(answer))


def _merge(lists: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per session, in order; a live entry replaces a ``persisted`` one."""
    merged: dict[str, dict[str, Any]] = {}
    for entries in lists:
        for entry in entries:
            sid = entry.get("sessionId")
            if not isinstance(sid, str):
                continue
            known = merged.get(sid)
            if known is None or (
                known.get("activeWorkState") == "persisted"
                and entry.get("activeWorkState") != "persisted"
            ):
                merged[sid] = entry
    return list(merged.values())


def cluster() -> Cluster | None:
    """The app's :class:`Cluster` (None without a shared journal)."""
    found = current_app.extensions.get(CLUSTER_KEY)
    return found if isinstance(found, Cluster) else None


def install(app: QuartTrio, journal: SharedJournal) -> None:
    """Route session requests through the cluster (the last ``before_request`` hook)."""
    front = Cluster(journal)
    app.extensions[CLUSTER_KEY] = front

    async def hook() -> Response | None:
        session_id = (request.view_args or {}).get("session_id")
        if not isinstance(session_id, str) or not session_id:
            return None
        if daemon().registry.get(session_id) is not None:
            return None
        return await _route(journal, session_id, front.client)

    app.before_request_funcs.setdefault(None, []).append(hook)
    app.after_serving(front.aclose)


async def _owner(journal: SharedJournal, session_id: str) -> Ownership | None:
    try:
        return await journal.owner_of(session_id)
    except JournalError as exc:
        log.warning("session %s: owner not known (%s); answered here", session_id, exc)
        return None


async def _route(
    journal: SharedJournal, session_id: str, peer: Callable[[], httpx.AsyncClient]
) -> Response | None:
    forwarded = FORWARDED_BY in request.headers
    deadline = trio.current_time() + HEADERS_TIMEOUT_S  # for the owners' status lines
    owner = await _owner(journal, session_id)
    for _ in range(2):  # a second look after an owner found dead or a lost race
        decision = route(owner, forwarded=forwarded)
        if decision is Route.LOCAL:
            return None
        if decision is Route.UNREACHABLE:
            raise _unreachable(session_id, "its owner moved while this request was forwarded")
        assert owner is not None
        if decision is Route.FORWARD:
            answer = await _forward(peer(), owner, journal.owner_id or "", deadline)
            if answer is not None:
                return answer
        elif _restores_itself():
            return None
        else:
            try:
                await _take_over(owner)
                return None
            except SessionOwnedElsewhere:
                pass  # another daemon took it first: forward there
        owner = await _owner(journal, session_id)
    raise _unreachable(session_id, "its owner did not answer")


def _restores_itself() -> bool:
    rule = request.url_rule.rule if request.url_rule is not None else ""
    return rule.rstrip("/").endswith(_RESTORE_SUFFIXES)


def _unreachable(session_id: str, why: str) -> ApiError:
    return ApiError(
        503,
        {
            "error": f'Session "{session_id}" cannot be reached now: {why}; retry',
            "code": "session_owner_unreachable",
            "sessionId": session_id,
            "retryable": True,
        },
        {"Retry-After": RETRY_AFTER_S},
    )


async def _take_over(owner: Ownership) -> None:
    """Restore the session here as the caller (its lease is taken with a new epoch)."""
    host = daemon()
    api = SessionService(host)
    groups = dict(host.config.access.session_groups)
    client_id = request.headers.get("X-Qwen-Client-Id")
    log.info(
        "session %s: taking it over from %s (its lease %s)",
        owner.session_id,
        owner.owner_id,
        "expired" if owner.owner_id and not owner.mine else "is this daemon's",
    )
    try:
        workspace = api.workspace(owner.workspace or None)
        if client_id:
            await api.restore(
                owner.session_id,
                workspace,
                "load",
                client_id,
                request.remote_addr,
                principal=principal(),
                group_roles=groups,
            )
        else:
            await api.open_restored(
                owner.session_id, workspace, "load", principal=principal(), group_roles=groups
            )
    except SessionOwnedElsewhere:
        raise
    except SessionNotFound:
        return  # no role on it, or nothing to restore: the route answers its own 404
    except Exception as exc:
        mapped = to_api_error(exc)
        if mapped is None:
            raise
        raise mapped from None


async def _forward(
    client: httpx.AsyncClient, owner: Ownership, me: str, deadline: float
) -> Response | None:
    """Proxy the request to the owner; None when it could not be reached (refused, or no
    status line by ``deadline`` or its lease's end)."""
    url = _target(owner.address)
    headers = _outgoing_headers(me)
    body = await request.get_data()
    outgoing = client.build_request(request.method, url, headers=headers, content=body)
    upstream: httpx.Response | None = None
    # No longer than the owner's lease lasts (plus a renewal's worth): an owner that froze
    # is taken over as soon as its lease expires, not a whole wait later.
    wait_s = min(deadline - trio.current_time(), owner.lease_left_ms / 1000 + 1.0)
    with trio.move_on_after(wait_s):
        try:
            upstream = await client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            log.info("session %s: owner %s not reached: %r", owner.session_id, url, exc)
            return None
    if upstream is None:
        log.info("session %s: owner %s did not answer in %.1f s", owner.session_id, url, wait_s)
        return None  # asked about again: taken over once its lease expired
    response = await make_response(
        _relay(upstream), upstream.status_code, _answer_headers(upstream)
    )
    assert isinstance(response, Response)
    response.timeout = None
    return response


def _target(address: str) -> str:
    """This request's path and query on the daemon at ``address``."""
    raw_path = request.scope.get("raw_path") or request.path.encode()
    url = address.rstrip("/") + bytes(raw_path).decode("ascii", "replace")
    if request.query_string:
        url += "?" + request.query_string.decode("ascii", "replace")
    return url


def _answer_headers(answer: httpx.Response) -> dict[str, str]:
    """Another daemon's response headers to pass on (not the hop-by-hop ones, not its
    ``Date`` / ``Server``: ours are sent)."""
    return {k: v for k, v in answer.headers.items() if k.lower() not in _RESPONSE_DROP}


def _outgoing_headers(me: str) -> list[tuple[str, str]]:
    """This request's headers for another daemon (not the hop-by-hop ones, not ``Host``),
    marked forwarded by ``me``."""
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
    headers.append((FORWARDED_BY, me or "?"))
    if request.remote_addr:
        prior = request.headers.get("X-Forwarded-For")
        headers.append(
            ("X-Forwarded-For", f"{prior}, {request.remote_addr}" if prior else request.remote_addr)
        )
    return headers


async def _relay(upstream: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.TransportError:
        return  # the owner went away mid-stream: the client reconnects (Last-Event-ID)
    finally:
        with trio.CancelScope(shield=True):
            await upstream.aclose()
