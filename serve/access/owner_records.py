"""Who owns the sessions that are not live: a bounded record, in memory, pure.

A live session's access record is the session actor's own state; a session that left its
registry (closed, deleted, died, reaped) takes it along. :class:`OwnerRecords` keeps it
(:meth:`OwnerRecords.keep`, the registry's retire hook) so a later restore by the same id
goes by it even when no journal holds it (``--no-journal``, or a journal the retention or
``--journal-max-total-bytes`` deleted while the agent still has the session): the owner and
the members get the session back, anyone else is answered as for an unknown session. A
vendor branch the daemon did not load is recorded here too (:meth:`OwnerRecords.keep` from
the branch route), for its brancher.

At most :data:`MAX_RECORDS` sessions and :data:`MAX_BYTES` are kept (a record costs its
session id and its JSON form, plus :data:`RECORD_OVERHEAD_BYTES`), the least recently
closed forgotten first;
a forgotten session (or one closed before the daemon started, without a journal record)
has no owner on record, and only an ``admin`` may restore it (fail closed).
"""

from __future__ import annotations

from collections import OrderedDict

from serve.access.roles import SessionAccess, to_attr

__all__ = ["MAX_BYTES", "MAX_RECORDS", "OwnerRecords"]

#: Sessions whose owner is kept after they left their registry, at most.
MAX_RECORDS = 10_000
#: Bytes those records may take, at most (a record with 256 long member names is large).
MAX_BYTES = 16 * 1024 * 1024
#: What one record costs beyond its id and its JSON form (the dict slot, the objects).
RECORD_OVERHEAD_BYTES = 256


class OwnerRecords:
    """Session id → the access record it had when it was last live (see the module)."""

    def __init__(self, limit: int = MAX_RECORDS, max_bytes: int = MAX_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self._records: OrderedDict[str, tuple[SessionAccess, int]] = OrderedDict()

    def keep(self, session_id: str, access: SessionAccess) -> None:
        self._forget(session_id)
        cost = len(session_id) + len(to_attr(access)) + RECORD_OVERHEAD_BYTES
        self._records[session_id] = (access, cost)
        self.bytes += cost
        while self._records and (len(self._records) > self.limit or self.bytes > self.max_bytes):
            self._forget(next(iter(self._records)))

    def get(self, session_id: str) -> SessionAccess | None:
        found = self._records.get(session_id)
        return found[0] if found is not None else None

    def _forget(self, session_id: str) -> None:
        found = self._records.pop(session_id, None)
        if found is not None:
            self.bytes -= found[1]

    def __len__(self) -> int:
        return len(self._records)
