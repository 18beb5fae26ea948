"""Quotas per principal: live sessions owned and prompts per sliding minute. Pure, in memory.

:class:`Quotas` is owned by the Host and asked by the fronts before they create a session
or submit a prompt (``--quota-sessions``, ``--quota-prompts-per-minute``; 0: no limit).
Admins are exempt. Live sessions are counted by the registries (``CreateSession.quota``:
the sessions' own access records and the spawns in flight), so nothing here can drift;
the prompt windows keep at most ``limit`` timestamps per principal and at most
:data:`MAX_PRINCIPALS` principals (the least recently seen is forgotten first). A refusal
is a :class:`QuotaExceeded` (``429 quota_exceeded`` with ``Retry-After``). Token and cost budgets
(``--quota-token-budget``, ``--quota-cost-budget``) are checked before a prompt against
what the principal's live sessions spent, summed by the session service
(:class:`~serve.access.errors.PrincipalBudgetExhausted`: ``402 budget_exhausted`` with
``scope: "principal"``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

from serve.access.errors import PrincipalBudgetExhausted, QuotaExceeded
from serve.access.principal import Principal

__all__ = ["MAX_PRINCIPALS", "QuotaExceeded", "Quotas", "session_quota"]

MAX_PRINCIPALS = 10_000
WINDOW_S = 60.0


def session_quota(quotas: Quotas | None, principal: Principal) -> int:
    """The live sessions ``principal`` may own, for ``CreateSession.quota`` and its
    siblings (0: no limit; without quotas, and for admins)."""
    return quotas.sessions if quotas is not None and not principal.admin else 0


class Quotas:
    def __init__(
        self, sessions: int, prompts_per_minute: int, tokens: int = 0, cost: float = 0.0
    ) -> None:
        self.sessions = sessions
        self.prompts_per_minute = prompts_per_minute
        self.tokens = tokens
        self.cost = cost
        self._prompts: OrderedDict[str, deque[float]] = OrderedDict()

    @property
    def budgets(self) -> bool:
        return bool(self.tokens or self.cost)

    def check_budget(self, principal: Principal, tokens: int, cost: float) -> None:
        """``tokens`` / ``cost``: what the principal's live sessions spent, summed."""
        if principal.admin:
            return
        if self.tokens and tokens >= self.tokens:
            raise PrincipalBudgetExhausted(principal.id, "token", tokens, self.tokens)
        if self.cost and cost >= self.cost:
            raise PrincipalBudgetExhausted(principal.id, "cost", cost, self.cost)

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
