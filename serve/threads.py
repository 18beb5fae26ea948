"""Worker-thread budgets: one ``trio.CapacityLimiter`` per kind of blocking work.

trio runs ``to_thread.run_sync`` calls under one default limiter of 40 threads. Shared, a
burst of slow calls of one kind (40 reads of a file on a stalled network mount, an agent
reading a FIFO) holds every token and the others wait behind them: a journal flush would
then wait for a file route, and every session's durability with it. So each kind has its
own limiter (and its own bound, in threads):

=============  =======  ==============================================================
kind           threads  used by
=============  =======  ==============================================================
journal        8        the event journal (``serve.journal``): writes, fsyncs, scans
file routes    8        the workspace file and settings routes (``serve.http.routes``)
                        and the ``/acp`` ``_qwen/file/*`` methods (``serve.acpfront``)
agent fs       8        an agent's ``fs/*`` effects (``serve.permissions.effects``)
database       8        the PostgreSQL journal (``serve.journal.pg``): its pool's
                        connections (``--journal-url``); as many as the pool holds
webhooks       2        the webhooks outbox: writes, fsyncs, removals (``serve.webhooks``)
process scans  2        ``/proc`` scans: a stopped agent's leftovers, the reaper
                        (``acp.children``; its limiter lives there, ``acp`` does not
                        import ``serve``)
=============  =======  ==============================================================

Limiters are per ``trio.run`` (a ``RunVar``), created on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import trio
import trio.lowlevel

JOURNAL_THREADS: Final = 8
FILE_ROUTE_THREADS: Final = 8
AGENT_FS_THREADS: Final = 8
#: Also the PostgreSQL journal's pool size: a thread never waits for a connection.
DATABASE_THREADS: Final = 8

_journal: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("journal_threads")
_files: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("file_route_threads")
_agent_fs: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("agent_fs_threads")
_database: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("database_threads")


def _get(var: trio.lowlevel.RunVar[trio.CapacityLimiter], total: int) -> trio.CapacityLimiter:
    try:
        return var.get()
    except LookupError:
        limiter = trio.CapacityLimiter(total)
        var.set(limiter)
        return limiter


def journal_limiter() -> trio.CapacityLimiter:
    return _get(_journal, JOURNAL_THREADS)


def file_routes_limiter() -> trio.CapacityLimiter:
    return _get(_files, FILE_ROUTE_THREADS)


def agent_fs_limiter() -> trio.CapacityLimiter:
    return _get(_agent_fs, AGENT_FS_THREADS)


def database_limiter() -> trio.CapacityLimiter:
    return _get(_database, DATABASE_THREADS)


async def run_sync[T, *Ts](limiter: trio.CapacityLimiter, fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """``trio.to_thread.run_sync(fn, *args)`` under ``limiter``."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter)


WEBHOOK_THREADS: Final = 2
_webhooks: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("webhook_threads")


def webhooks_limiter() -> trio.CapacityLimiter:
    """The webhooks outbox's writes, fsyncs and removals (``serve.webhooks``)."""
    return _get(_webhooks, WEBHOOK_THREADS)
