"""Quotas per principal: live sessions owned and prompts per sliding minute. Pure, in memory.

:class:`Quotas` is owned by the Host and asked by the fronts before they create a session
or submit a prompt (``--quota-sessions``, ``--quota-prompts-per-minute``; 0: no limit).
Admins are exempt. Live sessions are counted from the registries (the sessions' own
access records), so nothing here can drift; the prompt windows keep at most
``limit`` timestamps per principal and at most :data:`MAX_PRINCIPALS` principals (the
least recently seen is forgotten first). A refusal is a :class:`QuotaExceeded`
(``429 quota_exceeded`` with ``Retry-After``). Token and cost budgets summed over a
principal's sessions are read from the sessions' budgets the same way.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

from serve.access.errors import QuotaExceeded
from serve.access.principal import Principal

__all__ = ["MAX_PRINCIPALS", "QuotaExceeded", "Quotas"]

MAX_PRINCIPALS = 10_000
WINDOW_S = 60.0


class Quotas:
    def __init__(self, sessions: int, prompts_per_minute: int) -> None:
        self.sessions = sessions
        self.prompts_per_minute = prompts_per_minute
        self._prompts: OrderedDict[str, deque[float]] = OrderedDict()

    def check_sessions(self, principal: Principal, owned: int) -> None:
        if self.sessions and not principal.admin and owned >= self.sessions:
            raise QuotaExceeded("sessions", self.sessions, 5)

    def take_prompt(self, principal: Principal, now: float | None = None) -> None:
        limit = self.prompts_per_minute
        if not limit or principal.admin:
            return
        now = time.monotonic() if now is None else now
        window = self._prompts.pop(principal.id, None) or deque()
        while window and now - window[0] >= WINDOW_S:
            window.popleft()
        self._prompts[principal.id] = window
        if len(self._prompts) > MAX_PRINCIPALS:
            self._prompts.popitem(last=False)
        if len(window) >= limit:
            raise QuotaExceeded(
                "prompts_per_minute", limit, max(1, math.ceil(WINDOW_S - (now - window[0])))
            )
        window.append(now)
