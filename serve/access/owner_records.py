"""Who owns the sessions that are not live: a bounded record, in memory, pure.

A live session's access record is the session actor's own state; a session that left its
registry (closed, deleted, died, reaped) takes it along. :class:`OwnerRecords` keeps it
(:meth:`OwnerRecords.keep`, the registry's retire hook) so a later restore by the same id
goes by it even when no journal holds it (``--no-journal``, or a journal the retention or
``--journal-max-total-bytes`` deleted while the agent still has the session): the owner and
the members get the session back, anyone else is answered as for an unknown session. A
vendor branch the daemon did not load is recorded here too (:meth:`OwnerRecords.keep` from
the branch route), for its brancher.

At most :data:`MAX_RECORDS` sessions are kept, the least recently closed forgotten first;
a forgotten session (or one closed before the daemon started, without a journal record)
has no owner on record, and only an ``admin`` may restore it (fail closed).
"""

from __future__ import annotations

from collections import OrderedDict

from serve.access.roles import SessionAccess

__all__ = ["MAX_RECORDS", "OwnerRecords"]

#: Sessions whose owner is kept after they left their registry, at most.
MAX_RECORDS = 10_000


class OwnerRecords:
    """Session id → the access record it had when it was last live (see the module)."""

    def __init__(self, limit: int = MAX_RECORDS) -> None:
        self.limit = limit
        self._records: OrderedDict[str, SessionAccess] = OrderedDict()

    def keep(self, session_id: str, access: SessionAccess) -> None:
        self._records.pop(session_id, None)
        self._records[session_id] = access
        while len(self._records) > self.limit:
            self._records.popitem(last=False)

    def get(self, session_id: str) -> SessionAccess | None:
        return self._records.get(session_id)

    def __len__(self) -> int:
        return len(self._records)
