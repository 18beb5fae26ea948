"""When a journal's janitor sweeps (retention and the total-size bound): at start, every
``sweep_interval_ms``, and shortly after a journal closes, at most once a second. One
schedule for both backends (the files journal, ``serve.journal.pg``); the sweep itself is
theirs."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NoReturn

import trio

from serve.journal.types import JournalIOError

log = logging.getLogger("serve.journal")

#: The shortest pause between two sweeps (a burst of closes asks for one sweep).
SWEEP_MIN_GAP_S = 1.0


class SweepSchedule:
    """Requests for a sweep (``request``, never blocking) and the loop that runs them."""

    def __init__(self) -> None:
        self._wanted = trio.Event()

    def request(self) -> None:
        self._wanted.set()

    async def run(self, sweep: Callable[[], Awaitable[int]], interval_s: float) -> NoReturn:
        """Sweep now, then each time one is requested or ``interval_s`` passed; a sweep
        that fails is logged and the loop goes on."""
        while True:
            try:
                await sweep()
            except JournalIOError as exc:
                log.warning("journal sweep failed: %s", exc)
            with trio.move_on_after(interval_s):
                await self._wanted.wait()
            self._wanted = trio.Event()
            await trio.sleep(SWEEP_MIN_GAP_S)
