"""The durable event journal: every session's published SSE frames, on disk, replayable.

Why append-only segment files and not SQLite
--------------------------------------------
The journal is a per-session append-only log read back only sequentially, after a
restart. Plain segment files do exactly that with one ``write`` + one ``fdatasync`` per
batch, rotation is "delete the oldest file" (space returned at once; SQLite needs
``DELETE`` + vacuum and keeps a WAL beside it), a torn tail is found by a length and a
CRC32 per record and cut with ``ftruncate``, and there is no connection/thread affinity
to manage from trio's worker threads. SQLite would buy queries and transactions we do
not need, and its failure mode on a damaged file ("database disk image is malformed")
is all-or-nothing, where ours is "keep the valid prefix".

Backends: this package's files journal is the default; ``pg/`` keeps the same contract in
PostgreSQL (``--journal-url``, with fenced session leases; docs/postgres-journal.md). The
rest of the daemon sees only :class:`JournalBackend` and :class:`JournalWriter`
(``backend.py``).

Layout and format: ``store.py`` (directories, ``meta.json``, segments) and ``format.py``
(records). Writer, flusher, overload policy and shutdown: ``writer.py``; the directory
(open, reopen, read, delete, the janitor): ``journal.py``; errors and limits: ``types.py``.

Durability guarantee
--------------------
When ``SessionJournal.flush()`` or ``aclose()`` returns, every event the sink accepted
before the call is written and fsynced; between flushes an event is on disk within
about ``flush_interval_ms`` (50 ms) plus one write, and a crash loses at most that
unsynced suffix: what survives is always a gap-free prefix of the ids. Events are
dropped only when the disk falls behind by ``max_buffer_bytes`` (``degraded``).

Disk bound
----------
Each session's journal is bounded (``max_session_bytes``, oldest segments rotated out); the
daemon-wide janitor (:meth:`Journal.run_janitor`, a service under the daemon's services
supervisor) bounds the rest: journals of closed sessions (no writer in any process) idle
longer than ``retention_ms`` (``--journal-retention-ms``) are deleted, and while all
journals together exceed ``max_total_bytes`` (``--journal-max-total-bytes``) the closed
ones go, oldest activity first. It sweeps at start, every ``sweep_interval_ms`` and just
after a journal is closed; a journal with a writer is never touched.

Use (the session actor)::

    journal = Journal(settings.state_dir)                       # daemon-wide
    replay = await journal.read(sid, tail=settings.event_ring_size)
    epoch = replay.meta.epoch if replay.clean else None         # None: EventLog mints one
    first = replay.records[0].event_id if replay.records else replay.next_id
    log = EventLog(sid, ring_size=settings.event_ring_size, epoch=epoch, next_id=first)
    for event_id, _type, frame in replay:
        log.restore(event_id, frame)                            # log.next_id == replay.next_id
    writer = await journal.open_writer(msgspec.structs.replace(replay.meta, epoch=log.epoch))
    log.sink = writer.sink
    await nursery.start(writer.run)
    ...
    await writer.aclose()                                       # on session end or drain

A new session: ``open_writer(JournalMeta(...), fresh=True)`` with the new log's epoch.
Errors: :class:`JournalNotFound` (nothing to restore), :class:`JournalBusy` (another
writer holds it), :class:`JournalIOError` (the file system; journaling that session
is then off, the session itself need not fail).
"""

from serve.journal.backend import JournalBackend, JournalWriter, SharedJournal
from serve.journal.format import JournalRecord
from serve.journal.journal import (
    Journal,
    JournalBusy,
    JournalError,
    JournalIOError,
    JournalLimits,
    JournalNotFound,
    Replay,
    SessionJournal,
)
from serve.journal.store import JournalMeta
from serve.journal.types import FINAL_EVENTS, Ownership

__all__ = [
    "FINAL_EVENTS",
    "Journal",
    "JournalBackend",
    "JournalBusy",
    "JournalError",
    "JournalIOError",
    "JournalLimits",
    "JournalMeta",
    "JournalNotFound",
    "JournalRecord",
    "JournalWriter",
    "Ownership",
    "Replay",
    "SessionJournal",
    "SharedJournal",
]
