"""Adaptive warm capacity: how many free slots the agent pool keeps ready ahead of need.

Pure logic (no trio, no processes), owned by one :class:`~serve.agents.pool.AgentPool`,
which feeds it what it observes and asks it what to keep:

* :meth:`WarmSizer.arrival` — a session asked for a slot (an ``Acquire``), at ``now``
  (seconds of any monotonic clock);
* :meth:`WarmSizer.spawned` — a child took ``seconds`` from spawn to its ``initialize``
  reply;
* :meth:`WarmSizer.wanted` — the free slots to keep ready at ``now``.

Sizing: while a taken spare is being replaced, the sessions that arrive meanwhile need
spares of their own. With an arrival rate ``r`` (sessions/s) and a spawn time ``T`` (s),
``r × T`` refills are in flight on average (Little's law), so keeping ``minimum + ceil(r ×
T)`` free slots leaves about ``minimum`` ready when the next session comes. The result is
clamped to ``[minimum, maximum]`` (``--warm-agents`` and ``--warm-agents-max``); the pool
also never spawns past its memory budget or the agents' memory ceiling.

The rate is the number of arrivals in the last :data:`WINDOW_S` divided by the time from the
oldest of them to ``now`` (at least :data:`MIN_SPAN_S`): a burst reads as a high rate at
once, and the rate decays by itself when arrivals stop (the span grows until the arrivals
leave the window), so the wanted capacity returns to ``minimum`` within :data:`WINDOW_S`
of the last arrival; spares beyond it are retired once arrivals paused :data:`QUIET_S`.
A single arrival is not a rate (0). The spawn time is the median of the last
:data:`MAX_SPAWN_SAMPLES` spawns (:data:`DEFAULT_SPAWN_S` before any).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Final

#: Arrivals older than this (seconds) no longer count towards the rate.
WINDOW_S: Final = 30.0
#: The shortest span (seconds) a rate is computed over (a burst: count / this).
MIN_SPAN_S: Final = 1.0
#: Arrival times remembered at most (a bound on the deque; more than a window's worth at
#: any rate the pool can serve).
MAX_ARRIVALS: Final = 256
#: Spawn durations remembered (the median of these is the spawn time).
MAX_SPAWN_SAMPLES: Final = 8
#: Assumed spawn time before any spawn was measured (seconds).
DEFAULT_SPAWN_S: Final = 1.0
#: Spares beyond the wanted capacity are retired only after this long without an arrival
#: (seconds): steady arrivals whose rate wobbles do not make the pool spawn and retire.
QUIET_S: Final = 10.0


def wanted_slots(rate_per_s: float, spawn_s: float, minimum: int, maximum: int) -> int:
    """Free slots to keep ready: ``minimum + ceil(rate × spawn time)`` within
    ``[minimum, maximum]`` (``maximum`` below ``minimum`` counts as ``minimum``)."""
    top = max(minimum, maximum)
    if rate_per_s <= 0 or spawn_s <= 0:
        return minimum
    extra = math.ceil(rate_per_s * spawn_s - 1e-9)
    return max(minimum, min(top, minimum + extra))


class WarmSizer:
    """Observed arrivals and spawn times → the warm capacity (see the module docstring)."""

    def __init__(self, minimum: int, maximum: int) -> None:
        self.minimum = minimum
        self.maximum = max(minimum, maximum)
        self._arrivals: deque[float] = deque(maxlen=MAX_ARRIVALS)
        self._spawns: deque[float] = deque(maxlen=MAX_SPAWN_SAMPLES)

    @property
    def adaptive(self) -> bool:
        return self.maximum > self.minimum

    def arrival(self, now: float) -> None:
        while self._arrivals and now - self._arrivals[0] > WINDOW_S:
            self._arrivals.popleft()
        self._arrivals.append(now)

    def _recent(self, now: float) -> list[float]:
        return [t for t in self._arrivals if now - t <= WINDOW_S]

    def spawned(self, seconds: float) -> None:
        if seconds >= 0:
            self._spawns.append(seconds)

    def spawn_s(self) -> float:
        return statistics.median(self._spawns) if self._spawns else DEFAULT_SPAWN_S

    def rate(self, now: float) -> float:
        """Arrivals per second over the recent window (0 with fewer than two)."""
        recent = self._recent(now)
        if len(recent) < 2:
            return 0.0
        return len(recent) / max(MIN_SPAN_S, now - recent[0])

    def wanted(self, now: float) -> int:
        if not self.adaptive:
            return self.minimum
        return wanted_slots(self.rate(now), self.spawn_s(), self.minimum, self.maximum)

    def quiet(self, now: float) -> bool:
        """No arrival in the last :data:`QUIET_S` (spares beyond the wanted may go)."""
        return not self._arrivals or now - self._arrivals[-1] >= QUIET_S

    def settled(self, now: float) -> bool:
        """True when nothing more can change by waiting (no arrival left in the window)."""
        return not self._recent(now)
