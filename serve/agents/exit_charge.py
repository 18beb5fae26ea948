"""A shared child's exit, charged once to the restart window its sessions share.

When a packed child (``--sessions-per-agent`` > 1) exits, each of its sessions restores
itself in place and asks whether that restart is allowed. Charging every session's own
window would count one crash ``M`` times and refuse the restart of a healthy pool after a
single crash of a full child; charging none would let a child that crashes on every start
loop for ever. So the pool charges the exit once, to one window for its shared children
(the sessions' ``--agent-restart-*`` intensity and period, from the first that asks), and
gives every session of that child the same answer. Pure bookkeeping, owned by the pool.
"""

from __future__ import annotations

from typing import Final

from actors import RestartWindow

__all__ = ["MAX_CHARGED", "ExitCharges"]

#: Exited shared children whose answer is remembered (for their other sessions), at most.
MAX_CHARGED: Final = 64


class ExitCharges:
    """The answers given per exited child, and the window they were charged to."""

    def __init__(self) -> None:
        self.window: RestartWindow | None = None
        self._answers: dict[str, bool] = {}

    def charge(
        self, child_id: str, intensity: int, period_s: float, now: float | None = None
    ) -> bool:
        """Whether the exit of ``child_id`` may be restarted: counted in the window the first
        time it is asked, the same answer for every later session of that child."""
        if child_id not in self._answers:
            if self.window is None:
                self.window = RestartWindow(intensity, period_s)
            allowed = self.window.allows(now)
            if allowed:
                self.window.count(now)
            self._answers[child_id] = allowed
            while len(self._answers) > MAX_CHARGED:
                del self._answers[next(iter(self._answers))]
        return self._answers[child_id]
