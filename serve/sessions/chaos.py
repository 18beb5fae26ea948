"""``--chaos-kill-rate N``: an in-daemon fault injector for people who chaos-test agents.

A root-supervised actor that, at random (exponentially distributed) intervals averaging
``60 / N`` seconds, picks a live session at random and SIGKILLs its agent's process group.
What follows is the product's normal crash path (``session_restarted`` or ``session_died``,
every prompt still ending with one terminal event), which is the point. Each kill is logged
and kept in a bounded history shown in ``/daemon/status``.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from serve.sessions.actor import SessionActor

log = logging.getLogger(__name__)


class ChaosMonkey:
    def __init__(
        self,
        live_sessions: Callable[[], Sequence[SessionActor]],
        kills_per_minute: float,
        *,
        seed: int | None = None,
    ) -> None:
        self._live = live_sessions
        self.rate = kills_per_minute
        self.random = random.Random(seed)
        self.kills: deque[dict[str, Any]] = deque(maxlen=100)
        self.total = 0
        self._stop = trio.Event()

    def close(self) -> None:
        self._stop.set()

    async def run(
        self, *, task_status: trio.TaskStatus[ChaosMonkey] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._stop = trio.Event()  # a new incarnation (its supervisor may be restarted)
        task_status.started(self)
        while not self._stop.is_set():
            with trio.move_on_after(self.random.expovariate(self.rate / 60.0)):
                await self._stop.wait()
            if not self._stop.is_set():
                self.strike()

    def strike(self) -> dict[str, Any] | None:
        """Kill one random live session's agent now; returns what was killed."""
        victims = [s for s in self._live() if s.conn is not None and not s.conn.closed]
        if not victims:
            return None
        session = self.random.choice(victims)
        assert session.conn is not None
        pgid = session.conn.process.pgid
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        self.total += 1
        record = {"at": time.time(), "sessionId": session.session_id, "pgid": pgid}
        self.kills.append(record)
        log.warning("chaos: SIGKILLed the agent of session %s (pgid %d)", session.session_id, pgid)
        return record

    def status(self) -> dict[str, Any]:
        return {"killsPerMinute": self.rate, "kills": self.total, "recent": list(self.kills)[-10:]}
