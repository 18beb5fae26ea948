"""The permission decisions counted: daemon-wide, and per session for callers who may see
only some sessions (``GET /workspace/permissions`` with multi-user auth)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["KINDS", "MAX_SESSIONS", "DecisionCounters"]

KINDS = (
    "auto",
    "prompted",
    "denied",
    "allowedByCache",
    "allowedByAgentApproval",
    "rejected",
    "cancelled",
)
#: Sessions whose own counts are kept, at most (the least recently counted go first).
MAX_SESSIONS = 4096


class DecisionCounters(dict[str, int]):
    """The daemon-wide counts (the dict itself: ``dict(counters)`` is the table), and each
    session's (:meth:`of`). Owned by the effect gate's callers' one event loop."""

    def __init__(self) -> None:
        super().__init__(dict.fromkeys(KINDS, 0))
        self._by_session: OrderedDict[str, dict[str, int]] = OrderedDict()

    def count(self, session_id: str, kind: str) -> None:
        self[kind] = self.get(kind, 0) + 1
        mine = self._by_session.pop(session_id, None) or {}
        mine[kind] = mine.get(kind, 0) + 1
        self._by_session[session_id] = mine
        while len(self._by_session) > MAX_SESSIONS:
            self._by_session.popitem(last=False)

    def of(self, session_ids: Iterable[str]) -> dict[str, int]:
        """The counts of ``session_ids`` only (every kind, 0 when none)."""
        out = dict.fromkeys(KINDS, 0)
        for sid in session_ids:
            for kind, n in self._by_session.get(sid, {}).items():
                out[kind] = out.get(kind, 0) + n
        return out
