"""Quotas per principal: live sessions owned and prompts per sliding minute. Pure, in memory.

:class:`Quotas` is owned by the Host and asked by the fronts before they create a session
or submit a prompt (``--quota-sessions``, ``--quota-prompts-per-minute``; 0: no limit).
Admins are exempt. Live sessions are counted by the registries (``CreateSession.quota``:
the sessions' own access records and the spawns in flight), so nothing here can drift;
the prompt windows keep at most ``limit`` timestamps per principal and at most
:data:`MAX_PRINCIPALS` principals (the least recently seen is forgotten first). A refusal
is a :class:`QuotaExceeded` (``429 quota_exceeded`` with ``Retry-After``). Token and cost budgets
(``--quota-token-budget``, ``--quota-cost-budget``) are checked before a prompt against
what the principal's sessions spent: the live ones, summed by the session service, plus
what each ended session actor had spent (:meth:`Quotas.retired`, called when a session
leaves its registry: closing or deleting a session and opening a new one does not reset a
principal's spending). A refusal is :class:`~serve.access.errors.PrincipalBudgetExhausted`
(``402 budget_exhausted`` with ``scope: "principal"``). The ended sessions' sums are kept in
memory for at most :data:`MAX_PRINCIPALS` principals (the least recently charged is
forgotten first) and start at zero when the daemon starts; a session restored from its
journal brings its own budget back, but is charged here only what it spends from then on
(``BudgetMeter.tokens_here``), so closing and loading a session never counts it twice.
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
        #: Principal → (tokens, cost) its ended session actors had spent.
        self._retired: OrderedDict[str, tuple[int, float]] = OrderedDict()

    @property
    def budgets(self) -> bool:
        return bool(self.tokens or self.cost)

    def retired(self, owner: str, tokens: int, cost: float) -> None:
        """A session of ``owner`` left its registry having spent ``tokens`` / ``cost``."""
        if not self.budgets or not (tokens or cost):
            return
        before = self._retired.pop(owner, (0, 0.0))
        self._retired[owner] = (before[0] + tokens, before[1] + cost)
        if len(self._retired) > MAX_PRINCIPALS:
            self._retired.popitem(last=False)

    def check_budget(self, principal: Principal, tokens: int, cost: float) -> None:
        """``tokens`` / ``cost``: what the principal's live sessions spent, summed (the
        ended ones' are added here)."""
        if principal.admin:
            return
        ended_tokens, ended_cost = self._retired.get(principal.id, (0, 0.0))
        tokens, cost = tokens + ended_tokens, cost + ended_cost
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
