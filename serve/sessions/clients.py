"""The clients registered on one session, and their expiry.

Theory of operation
-------------------
A client registers by attaching (``POST /session``, ``/load``, ``/resume``, ``/branch``)
and gets a daemon-issued id. It stays *active* while it shows signs of life: an attach, a
``POST /session/:id/heartbeat`` with its id, or an open ``GET /session/:id/events`` stream
that names it in ``X-Qwen-Client-Id`` (a client streaming never expires; when its last
stream ends, the idle clock starts then). A client idle for longer than
``--client-idle-timeout-ms`` (default 5 min; ``0`` = never) is dropped: it no longer
counts in ``clientCount``, is not part of a consensus electorate and its id is no longer
accepted on the session's routes (400 ``invalid_client_id``; attaching again mints a
new one). So 300 anonymous attaches that never come back leave the table within the
timeout and consensus can be reached by the clients that are really there.

A client id belongs to the principal that registered it (``docs/multi-user.md``): every
check of an id presented by a caller names the caller's principal (:meth:`owned_by`), so
another principal presenting it is answered as for an unknown id, and an attach naming it
mints a fresh id (:func:`serve.sessions.attachments.register_client`).

:class:`ClientTable` is pure (the clock is passed in or injected) and is owned by the
session actor; expiry is lazy: every query first drops the clients idle past the timeout,
so no timer task is needed and a read always sees the current membership. It behaves as a
read-only mapping ``client id -> attach count`` (``in``, ``len``, iteration, ``get``) for
the code that used the plain dict before.

Bounds: :data:`MAX_CLIENTS` per session, and :data:`MAX_CLIENTS_PER_PEER` per attaching
peer (its address): past the peer's bound, that peer's own idlest client is dropped; past
the table's, the idlest client overall. A client with an open stream is never dropped (a
flood of anonymous attaches cannot push a streaming client out); streams are bounded by
the event log's subscriber bound, so the table holds at most its bound plus those.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Final

__all__ = ["DEFAULT_CLIENT_IDLE_TIMEOUT_MS", "MAX_CLIENTS", "MAX_CLIENTS_PER_PEER", "ClientTable"]

#: The principal of a daemon without multi-user auth (``serve.access.OPERATOR``'s id).
OPERATOR_ID: Final = "operator"

#: Default ``--client-idle-timeout-ms``.
DEFAULT_CLIENT_IDLE_TIMEOUT_MS: Final = 300_000
#: Clients remembered per session (the idlest is dropped beyond it).
MAX_CLIENTS: Final = 4096
#: Clients one peer (address) may hold per session (its own idlest is dropped beyond it).
MAX_CLIENTS_PER_PEER: Final = 1024


def _wall_ms() -> int:
    return int(time.time() * 1000)


class _Client:
    __slots__ = ("attaches", "last_seen_ms", "peer", "principal", "streams", "voter")

    def __init__(self, now_ms: int, peer: str | None, principal: str) -> None:
        self.principal = principal
        self.voter = True
        self.attaches = 0
        self.streams = 0
        self.last_seen_ms = now_ms
        self.peer = peer


class ClientTable:
    """Registered clients of one session with lazy idle expiry (see the module docstring)."""

    def __init__(
        self,
        idle_timeout_ms: int = DEFAULT_CLIENT_IDLE_TIMEOUT_MS,
        *,
        clock_ms: Callable[[], int] = _wall_ms,
        max_clients: int = MAX_CLIENTS,
        max_per_peer: int = MAX_CLIENTS_PER_PEER,
    ) -> None:
        if idle_timeout_ms < 0 or max_clients <= 0 or max_per_peer <= 0:
            raise ValueError("ClientTable bounds must be non-negative / positive")
        self.idle_timeout_ms = idle_timeout_ms
        self._clock = clock_ms
        self._max = max_clients
        self._max_per_peer = max_per_peer
        self._clients: dict[str, _Client] = {}
        self._per_peer: dict[str, int] = {}
        self.expired = 0  # clients dropped for idleness, for status pages

    # ---- changes -----------------------------------------------------------------------

    def register(
        self,
        client_id: str,
        peer: str | None = None,
        voter: bool = True,
        principal: str = OPERATOR_ID,
    ) -> None:
        """One more attach of ``client_id`` (new or known) from ``peer`` (its address, None
        when unknown) by ``principal`` (who registered it keeps it: a known id is
        re-registered by its own principal only, see :meth:`owned_by`); it is active now. A
        new client past a bound drops the idlest client without an open stream: the peer's
        own past its bound, anyone's past the table's."""
        now = self._clock()
        self._expire(now)
        entry = self._clients.get(client_id)
        if entry is None:
            if peer is not None and self._per_peer.get(peer, 0) >= self._max_per_peer:
                self._drop_idlest(peer)
            if len(self._clients) >= self._max:
                self._drop_idlest(None)
            entry = self._clients[client_id] = _Client(now, peer, principal)
            if peer is not None:
                self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        elif entry.principal != principal:
            raise ValueError(f"client {client_id} belongs to another principal")
        entry.attaches += 1
        entry.last_seen_ms = now
        entry.voter = voter  # the latest attach's role decides

    def _drop_idlest(self, peer: str | None) -> None:
        """Drop the idlest client without an open stream (of ``peer`` when given)."""
        candidates = [
            (entry.last_seen_ms, cid)
            for cid, entry in self._clients.items()
            if entry.streams == 0 and (peer is None or entry.peer == peer)
        ]
        if candidates:
            self._remove(min(candidates)[1])

    def _remove(self, client_id: str) -> None:
        entry = self._clients.pop(client_id)
        if entry.peer is not None:
            left = self._per_peer[entry.peer] - 1
            if left:
                self._per_peer[entry.peer] = left
            else:
                del self._per_peer[entry.peer]

    def release(self, client_id: str) -> None:
        """One attach fewer (``POST /detach``); the last one removes the client."""
        entry = self._clients.get(client_id)
        if entry is None:
            return
        entry.attaches -= 1
        if entry.attaches <= 0:
            self._remove(client_id)

    def touch(self, client_id: str) -> bool:
        """A heartbeat: ``client_id`` is active now (False when it is not registered)."""
        now = self._clock()
        self._expire(now)
        entry = self._clients.get(client_id)
        if entry is None:
            return False
        entry.last_seen_ms = now
        return True

    def stream_opened(self, client_id: str, principal: str = OPERATOR_ID) -> bool:
        """An events stream of ``principal`` names ``client_id``: it cannot expire while the
        stream is open (another principal's stream naming it does nothing)."""
        if not self.owned_by(client_id, principal) or not self.touch(client_id):
            return False
        self._clients[client_id].streams += 1
        return True

    def stream_closed(self, client_id: str) -> None:
        """The stream ended; the idle clock starts now."""
        entry = self._clients.get(client_id)
        if entry is not None:
            entry.streams = max(0, entry.streams - 1)
            entry.last_seen_ms = self._clock()

    # ---- queries (each drops idle clients first) ---------------------------------------

    def active(self) -> frozenset[str]:
        """The clients active within the idle timeout (the consensus electorate)."""
        self._expire(self._clock())
        return frozenset(self._clients)

    def voters(self) -> frozenset[str]:
        """The active clients whose votes count (an observer's do not): the electorate."""
        self._expire(self._clock())
        return frozenset(cid for cid, entry in self._clients.items() if entry.voter)

    def owned_by(self, client_id: str, principal: str) -> bool:
        """Whether ``client_id`` is registered here by ``principal`` (another principal's id
        is, to that principal, an unknown one)."""
        self._expire(self._clock())
        entry = self._clients.get(client_id)
        return entry is not None and entry.principal == principal

    def of(self, principal: str) -> frozenset[str]:
        """The active clients ``principal`` registered."""
        self._expire(self._clock())
        return frozenset(cid for cid, e in self._clients.items() if e.principal == principal)

    def last_seen_ms(self, client_id: str) -> int | None:
        entry = self._clients.get(client_id)
        return entry.last_seen_ms if entry is not None else None

    def get(self, client_id: str, default: int | None = None) -> int | None:
        self._expire(self._clock())
        entry = self._clients.get(client_id)
        return entry.attaches if entry is not None else default

    def __contains__(self, client_id: object) -> bool:
        self._expire(self._clock())
        return client_id in self._clients

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._clients)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[str]:
        return iter(self.active())

    def _expire(self, now_ms: int) -> None:
        timeout = self.idle_timeout_ms
        if timeout == 0:
            return
        idle = [
            cid
            for cid, entry in self._clients.items()
            if entry.streams == 0 and now_ms - entry.last_seen_ms > timeout
        ]
        for cid in idle:
            self._remove(cid)
        self.expired += len(idle)
