"""The audit log: one JSON line per mutation and per denial, written by its own actor.

:class:`AuditLog` is an actor under the services supervisor. The fronts call
:meth:`AuditLog.record` (``tell_nowait``: a request never waits; a full inbox drops the
entry and counts it in ``dropped``). The actor batches what its inbox holds and appends it
in a worker thread to the file (``--audit-log``, default ``<state-dir>/audit.jsonl``); past
``--audit-max-bytes`` the file is rotated (``audit.jsonl.1`` … ``.3``, the oldest removed),
so the log takes at most 4 × that bound on disk. :meth:`AuditLog.page` reads entries back,
newest first, for ``GET /daemon/audit`` (``limit`` ≤ :data:`MAX_PAGE`, ``before`` = a
``seq``), in a worker thread too.

An entry: ``seq`` (monotonic per daemon run, then continued from the file), ``ts`` (ISO 8601
UTC), ``principal``, ``peer``, ``route`` (``METHOD rule``) or ``method`` (ACP), ``session``,
``outcome`` (``ok`` | ``denied`` | ``error`` | ``cancelled``), ``status``, ``requestId``,
``traceparent`` (the last three when known); a string longer than :data:`MAX_FIELD`
characters is cut there (``…``), so no caller sizes a line.

Unauthenticated refusals (401: no principal, so nobody to attribute them to) are not
written one by one: :meth:`AuditLog.refused` counts them per reason (``no_credential`` |
``bad_credential``, ``refused_total``) and writes at most one sampled line per reason per
:data:`REFUSED_INTERVAL_S`, whose ``count`` is how many refusals it stands for (itself and
those unwritten since the previous line of that reason). A flood of bad requests thus adds
at most two short lines a minute, and cannot rotate the authenticated entries away; the
totals are in ``GET /daemon/audit`` (``refused``) and ``/metrics``
(``acp_serve_auth_refused_total``).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
from typing import Any

import msgspec
import trio

from actors import Actor, ActorError

__all__ = [
    "INBOX",
    "KEEP_FILES",
    "MAX_FIELD",
    "MAX_PAGE",
    "REFUSED_INTERVAL_S",
    "AuditLog",
    "AuditPage",
]

log = logging.getLogger(__name__)

#: Entries waiting to be written, at most.
INBOX = 4096
#: Rotated files kept beside the live one.
KEEP_FILES = 3
#: Most entries one ``GET /daemon/audit`` answers.
MAX_PAGE = 500
#: Longest string field of an entry, in characters (a longer one is cut, ``…`` appended).
MAX_FIELD = 256
#: Seconds between two sampled lines of unauthenticated refusals of one reason.
REFUSED_INTERVAL_S = 60.0


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return value[:MAX_FIELD] + "…"
    return value


class AuditPage(msgspec.Struct, frozen=True):
    entries: list[dict[str, Any]]
    next_before: int | None


class AuditLog(Actor[dict[str, Any]]):
    def __init__(self, path: str, max_bytes: int) -> None:
        super().__init__("audit-log", inbox_size=INBOX)
        self.path = path
        self.max_bytes = max_bytes
        self.dropped = 0
        self.written = 0
        self._seq = 0
        self._lock = trio.Lock()
        #: Unauthenticated refusals by reason, since the daemon started.
        self.refused_total: dict[str, int] = {}
        self._refused_unwritten: dict[str, int] = {}
        self._refused_next: dict[str, float] = {}

    def record(self, **entry: Any) -> None:
        """Queue one entry (never blocks; a full inbox drops it and counts)."""
        self._seq += 1
        now = datetime.datetime.now(datetime.UTC)
        line = {"seq": self._seq, "ts": now.isoformat(timespec="milliseconds"), **entry}
        try:
            self.tell_nowait({k: _cut(v) for k, v in line.items() if v is not None})
        except ActorError:
            self.dropped += 1

    def refused(self, reason: str, peer: str | None, route: str) -> None:
        """An unauthenticated refusal: counted; a sampled line at most once per
        :data:`REFUSED_INTERVAL_S` per ``reason`` (see the module docstring)."""
        self.refused_total[reason] = self.refused_total.get(reason, 0) + 1
        unwritten = self._refused_unwritten.get(reason, 0) + 1
        now = trio.current_time()
        if now < self._refused_next.get(reason, -math.inf):
            self._refused_unwritten[reason] = unwritten
            return
        self._refused_unwritten[reason] = 0
        self._refused_next[reason] = now + REFUSED_INTERVAL_S
        self.record(
            principal=None,
            peer=peer,
            route=route,
            outcome="denied",
            status=401,
            reason=reason,
            count=unwritten,
        )

    async def on_start(self) -> None:
        def last_seq() -> int:
            try:
                with open(self.path, "rb") as f:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                    tail = f.read().splitlines()
                return int(json.loads(tail[-1])["seq"]) if tail else 0
            except (OSError, ValueError, KeyError, IndexError):
                return 0

        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._seq = max(self._seq, await trio.to_thread.run_sync(last_seq))

    async def handle(self, msg: dict[str, Any]) -> None:
        batch = [msg]
        while len(batch) < 512:
            try:
                envelope = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            batch.append(envelope.msg)
        lines = [msgspec.json.encode(e) + b"\n" for e in batch]
        async with self._lock:
            try:
                await trio.to_thread.run_sync(self._append, lines)
                self.written += len(batch)
            except OSError as exc:
                self.dropped += len(batch)
                log.warning("audit log %s not written: %s", self.path, exc.strerror)

    def _append(self, lines: list[bytes]) -> None:
        """Append ``lines``, rotating before a line would take the file past the bound."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            size = 0
        start = 0
        while start < len(lines):
            end, grown = start, size
            while end < len(lines) and (grown == 0 or grown + len(lines[end]) <= self.max_bytes):
                grown += len(lines[end])
                end += 1
            if end > start:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, b"".join(lines[start:end]))
                finally:
                    os.close(fd)
            if end < len(lines):
                self._rotate()
                grown = 0
            start, size = end, grown

    def _rotate(self) -> None:
        for n in range(KEEP_FILES, 0, -1):
            older = f"{self.path}.{n}"
            newer = f"{self.path}.{n - 1}" if n > 1 else self.path
            if os.path.exists(newer):
                os.replace(newer, older)

    async def page(self, limit: int, before: int | None) -> AuditPage:
        """Entries newest first, ``seq < before`` when given (the files in order)."""
        limit = max(1, min(limit, MAX_PAGE))

        def read() -> AuditPage:
            out: list[dict[str, Any]] = []
            for name in [self.path, *(f"{self.path}.{n}" for n in range(1, KEEP_FILES + 1))]:
                try:
                    with open(name, "rb") as f:
                        lines = f.read().splitlines()
                except OSError:
                    continue
                for raw in reversed(lines):
                    try:
                        entry = json.loads(raw)
                    except ValueError:
                        continue
                    if before is not None and entry.get("seq", 0) >= before:
                        continue
                    out.append(entry)
                    if len(out) > limit:
                        return AuditPage(out[:limit], out[limit - 1]["seq"])
            return AuditPage(out, None)

        async with self._lock:
            return await trio.to_thread.run_sync(read)
