"""``always_allow_for_session`` cache and in-flight decision sharing (pure, fake-clock).

Theory of operation
-------------------
``ApprovalCache`` remembers that a principal answered an ``allow_always`` option, so later
effects of the same class in the same session run without asking again. An entry is keyed
by ``CacheKey(session_id, principal, fingerprint, rule)``:

* ``principal`` is the daemon-issued client id that answered; a cached allow of one client
  never authorises another (anonymous voters are never cached: ``cache_key`` → ``None``);
* ``fingerprint`` is ``approval.policy_fingerprint`` of the effective policy (grants,
  approval config, approval mode): any policy change simply stops matching old entries;
* ``rule`` is ``Decision.cache_rule`` (capability | decisive rule | subject).

Entries live ``ttl_ms`` (8 hours) from when they were remembered, are dropped by
``invalidate_session`` when the session is closed or replaced and by ``invalidate_principal``
on revocation, and are **never** created for ``secret.bind`` (a secret needs a one-time
approval every time) or for a decision that is not ``cacheable``. The table is bounded
(oldest entry evicted first).

``InflightTable`` lets concurrent identical requests share one decision: the first caller
for a key becomes the ``Leader`` (it opens the permission request / computes the decision);
later callers ``Existing``-join as waiters; ``finish(key)`` returns every waiter (leader
first) so the owner can hand each the same result. It is bounded in keys and waiters per
key (``Full``: the caller decides on its own, typically by refusing). Time is passed in as
``now_ms``; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from serve.permissions.approval import Decision
from serve.permissions.grants import SECRET_PREFIX

__all__ = [
    "ALWAYS_ALLOW_TTL_MS",
    "ApprovalCache",
    "CacheKey",
    "DecisionKey",
    "Existing",
    "Full",
    "InflightTable",
    "Leader",
    "cache_key",
]

ALWAYS_ALLOW_TTL_MS = 8 * 60 * 60 * 1000  # 8 hours


class CacheKey(msgspec.Struct, frozen=True):
    session_id: str
    principal: str
    fingerprint: str
    rule: str


def cache_key(
    session_id: str, principal: str | None, fingerprint: str, decision: Decision
) -> CacheKey | None:
    """The key an ``allow_always`` answer to ``decision`` is bound to, or ``None`` when it
    must not be cached (anonymous principal, not cacheable, a secret binding)."""
    if not principal or not decision.cacheable or decision.capability.startswith(SECRET_PREFIX):
        return None
    return CacheKey(session_id, principal, fingerprint, decision.cache_rule)


class ApprovalCache:
    """Session-bound allow-always entries with expiry. Pure; owned by one actor."""

    def __init__(self, *, ttl_ms: int = ALWAYS_ALLOW_TTL_MS, max_entries: int = 4096) -> None:
        if ttl_ms <= 0 or max_entries <= 0:
            raise ValueError("ApprovalCache needs ttl_ms > 0 and max_entries > 0")
        self._ttl_ms = ttl_ms
        self._max = max_entries
        self._entries: dict[CacheKey, int] = {}  # key -> expires_at_ms, oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def count_of(self, session_ids: set[str]) -> int:
        """The entries of ``session_ids`` (a caller's own view of the table's size)."""
        return sum(1 for k in self._entries if k.session_id.split("#", 1)[0] in session_ids)

    def remember(self, key: CacheKey | None, *, now_ms: int) -> bool:
        """Cache an allow-always for ``key`` (``None`` or a secret rule: refused → False)."""
        if key is None or not key.principal or SECRET_PREFIX in key.rule:
            return False
        self._entries.pop(key, None)
        self._entries[key] = now_ms + self._ttl_ms
        while len(self._entries) > self._max:
            del self._entries[next(iter(self._entries))]
        return True

    def allowed(self, key: CacheKey | None, *, now_ms: int) -> bool:
        """Is there a live allow-always for ``key``? (An expired entry is dropped.)"""
        if key is None:
            return False
        expires = self._entries.get(key)
        if expires is None:
            return False
        if now_ms >= expires:
            del self._entries[key]
            return False
        return True

    def invalidate_session(self, session_id: str) -> int:
        """Session closed or replaced: drop its entries; returns how many."""
        return self._drop(lambda k: k.session_id == session_id)

    def invalidate_principal(self, principal: str) -> int:
        """Principal revoked: drop its entries in every session."""
        return self._drop(lambda k: k.principal == principal)

    def expire(self, now_ms: int) -> int:
        """Drop every entry expired at ``now_ms``."""
        dead = [k for k, exp in self._entries.items() if now_ms >= exp]
        for k in dead:
            del self._entries[k]
        return len(dead)

    def clear(self) -> None:
        self._entries.clear()

    def _drop(self, pred: Callable[[CacheKey], bool]) -> int:
        dead = [k for k in self._entries if pred(k)]
        for k in dead:
            del self._entries[k]
        return len(dead)


# -- in-flight decision sharing ------------------------------------------------------------


class DecisionKey(msgspec.Struct, frozen=True):
    """What makes two requests "identical": same session, principal, policy and effect."""

    session_id: str
    principal: str | None
    fingerprint: str  # approval.policy_fingerprint(...)
    effect: str  # approval.effect_fingerprint(effect)


class Leader[K](msgspec.Struct, frozen=True):
    """You are first: decide, then call ``finish(key)`` and answer every waiter."""

    key: K


class Existing[K](msgspec.Struct, frozen=True):
    """A decision for this key is in flight; you were added as waiter number ``position``."""

    key: K
    position: int


class Full[K](msgspec.Struct, frozen=True):
    """The table is at a bound; decide on your own (typically refuse)."""

    key: K
    reason: Literal["too_many_keys", "too_many_waiters"]


class InflightTable[K, W]:
    """Keys with a decision in flight and their waiters. Pure; owned by one actor."""

    def __init__(self, *, max_keys: int = 1024, max_waiters: int = 256) -> None:
        self._max_keys = max_keys
        self._max_waiters = max_waiters
        self._waiters: dict[K, list[W]] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, key: object) -> bool:
        return key in self._waiters

    def lookup_or_join(self, key: K, waiter: W) -> Leader[K] | Existing[K] | Full[K]:
        """Register ``waiter`` for ``key``: the first becomes ``Leader``, others join."""
        waiters = self._waiters.get(key)
        if waiters is None:
            if len(self._waiters) >= self._max_keys:
                return Full(key, "too_many_keys")
            self._waiters[key] = [waiter]
            return Leader(key)
        if len(waiters) >= self._max_waiters:
            return Full(key, "too_many_waiters")
        waiters.append(waiter)
        return Existing(key, len(waiters) - 1)

    def finish(self, key: K) -> list[W]:
        """The decision for ``key`` is made (or abandoned): every waiter, leader first."""
        return self._waiters.pop(key, [])

    def leave(self, key: K, waiter: W) -> None:
        """A waiter gave up (cancelled). If the leader leaves, the next waiter leads: the
        caller must check ``leader_of(key)`` and hand it the work."""
        waiters = self._waiters.get(key)
        if waiters is None:
            return
        try:
            waiters.remove(waiter)
        except ValueError:
            return
        if not waiters:
            del self._waiters[key]

    def leader_of(self, key: K) -> W | None:
        waiters = self._waiters.get(key)
        return waiters[0] if waiters else None
