"""A session's token and cost budget: what the agent reported, the limits, the verdicts (sans-IO).

Theory of operation
-------------------
What counts (ACP schema v1, ``schema.unstable.json``; RFDs ``session-usage`` and
``end-turn-token-usage``):

* **tokens**: the prompt response's ``usage`` (``Usage {totalTokens, inputTokens,
  outputTokens, thoughtTokens?, cachedReadTokens?, cachedWriteTokens?}``) is read as the
  turn's consumption (the ``PromptResponse.usage`` field says "token usage for this turn";
  the draft RFD leaves per-turn vs cumulative open, and per-turn is what the agents that send
  it report). Settled tokens are the sum of ``totalTokens`` over finished turns.
* **during a turn** only ``usage_update {used, size, cost?}`` arrives. ``used`` is the
  context's size, not consumption; its growth since the turn began is a *lower bound* of
  what the turn consumed (every token that entered the context was processed at least once),
  so a runaway turn is stopped without ever stopping one early. When the turn ends, its
  reported ``totalTokens`` replaces the estimate (the estimate stays when none is reported).
* **cost**: ``usage_update.cost {amount, currency}`` is the agent's *cumulative* session
  cost. A drop (a new agent-side session after a restart) banks what was seen before, so the
  figure only grows. A cost limit applies in its own currency only (default ``USD``); a
  report in another currency leaves the cost unbudgeted (said in the snapshot).

An agent that reported nothing yet is **unbudgeted**: limits are kept but nothing can be
measured (``unbudgeted: true`` in the snapshot).

**Across a restore** (a load or resume from the journal, after a restart or on another
daemon): :meth:`BudgetMeter.saved` is what the session keeps in its journal meta
(``session.budget``, JSON: the spending settled by finished turns, the cost figures, and the
limits when a ``PATCH`` set them; written within a second of each turn or ``PATCH``,
coalesced: ``JournalLink.remember_soon``), and :meth:`BudgetMeter.restore` takes it back, so
a spent budget stays spent. Limits never set on the session follow the restoring daemon's
``--session-*-budget`` defaults. A crash loses at most the spending of the turn it cut and
of the second before it. What the principal quotas charge (:attr:`BudgetMeter.tokens_here`,
:attr:`BudgetMeter.cost_here`) is what was spent since the restore: the restored part was
charged where it was spent.

Verdicts: :meth:`BudgetMeter.check` compares each dimension's spending with its limit and
returns the new :class:`Signal`\\ s once each: ``warn`` when spending reaches
:data:`WARN_FRACTION` of a limit, ``exhausted`` at the limit. Changing the limits
(:meth:`BudgetMeter.set_limits`) re-arms both; a raise above the spending clears
``exhausted``. While exhausted, :attr:`BudgetMeter.exhausted` names the dimension and the
session refuses new prompts (``402 budget_exhausted``) and cancels a running turn
(``turn_error {code: "budget_exhausted"}``) — that part is the actor's.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

import msgspec

#: A warning once spending reaches this share of a limit.
WARN_FRACTION: Final = 0.8
#: The largest token limit accepted (2**53: exact in JSON numbers).
MAX_TOKEN_LIMIT: Final = 2**53
#: The largest cost limit accepted (in the limit's currency).
MAX_COST_LIMIT: Final = 1e12
DEFAULT_CURRENCY: Final = "USD"
#: The journal meta attribute that keeps a session's budget across a restore.
ATTR: Final = "session.budget"

Dimension = Literal["tokens", "cost"]


class Limits(msgspec.Struct, frozen=True):
    """``None``: no limit on that dimension."""

    max_tokens: int | None = None
    max_cost: float | None = None
    currency: str = DEFAULT_CURRENCY


class Saved(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A meter's state as kept in the journal meta (:meth:`BudgetMeter.saved`)."""

    tokens: int = 0  # settled: finished turns
    input_tokens: int = 0
    output_tokens: int = 0
    turns_reported: int = 0
    reported: bool = False
    context_used: int | None = None
    context_size: int | None = None
    cost_banked: float = 0.0
    cost_seen: float = 0.0
    cost_currency: str | None = None
    limits: Limits | None = None  # set on the session (PATCH); None: the daemon's defaults


_saved_decoder = msgspec.json.Decoder(Saved)


class Signal(msgspec.Struct, frozen=True):
    kind: Literal["warn", "exhausted"]
    dimension: Dimension
    spent: float
    limit: float


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class BudgetMeter:
    """One session's usage and limits; see the module docstring."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.settled_tokens = 0
        self.turn_estimate = 0
        self.turns_reported = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.context_used: int | None = None
        self.context_size: int | None = None
        self._turn_base: int | None = None
        self._in_turn = False
        self.cost_banked = 0.0
        self.cost_seen = 0.0
        self.cost_currency: str | None = None
        self.reported = False
        self._warned: set[str] = set()
        self._exhausted: set[str] = set()
        #: The limits were set on the session (``PATCH``), not the daemon's defaults.
        self.own_limits = False
        #: Spending brought back by :meth:`restore` (charged where it was spent).
        self._restored_tokens = 0
        self._restored_cost = 0.0

    # ---- spending ----------------------------------------------------------------------

    @property
    def tokens(self) -> int:
        return self.settled_tokens + self.turn_estimate

    @property
    def cost(self) -> float | None:
        if self.cost_currency is None:
            return None
        return self.cost_banked + self.cost_seen

    @property
    def tokens_here(self) -> int:
        """Tokens spent since this meter was restored (all of them when it never was)."""
        return max(0, self.tokens - self._restored_tokens)

    @property
    def cost_here(self) -> float:
        """Cost incurred since this meter was restored (0.0 when none is reported)."""
        return max(0.0, (self.cost or 0.0) - self._restored_cost)

    def turn_started(self) -> None:
        self._in_turn = True
        self.turn_estimate = 0
        self._turn_base = self.context_used

    def on_usage_update(self, update: object) -> list[Signal]:
        """A ``usage_update`` session update (decoded JSON object)."""
        if not isinstance(update, dict):
            return []
        used, size = _int(update.get("used")), _int(update.get("size"))
        if used is None:
            return []
        self.reported = True
        self.context_used, self.context_size = used, size
        if self._in_turn:
            if self._turn_base is None:
                self._turn_base = used
            self.turn_estimate = max(self.turn_estimate, used - self._turn_base)
        cost = update.get("cost")
        if isinstance(cost, dict):
            amount, currency = cost.get("amount"), cost.get("currency")
            if (
                isinstance(amount, int | float)
                and not isinstance(amount, bool)
                and math.isfinite(amount)
                and amount >= 0
                and isinstance(currency, str)
            ):
                if self.cost_currency is not None and currency != self.cost_currency:
                    self.cost_banked, self.cost_seen = 0.0, 0.0  # a new currency: start over
                if amount < self.cost_seen:
                    self.cost_banked += self.cost_seen
                self.cost_seen = float(amount)
                self.cost_currency = currency
        return self.check()

    def turn_ended(self, usage: object) -> list[Signal]:
        """The prompt response's ``usage`` (decoded JSON, or None when absent)."""
        total = _int(usage.get("totalTokens")) if isinstance(usage, dict) else None
        if total is not None:
            assert isinstance(usage, dict)
            self.reported = True
            self.turns_reported += 1
            self.settled_tokens += total
            self.input_tokens += _int(usage.get("inputTokens")) or 0
            self.output_tokens += _int(usage.get("outputTokens")) or 0
        else:
            self.settled_tokens += self.turn_estimate
        self.turn_estimate = 0
        self._in_turn = False
        self._turn_base = None
        return self.check()

    # ---- limits and verdicts -----------------------------------------------------------

    def set_limits(self, limits: Limits) -> list[Signal]:
        self.limits = limits
        self.own_limits = True
        self._warned.clear()
        self._exhausted.clear()
        return self.check()

    def _dimensions(self) -> list[tuple[Dimension, float, float]]:
        out: list[tuple[Dimension, float, float]] = []
        if self.limits.max_tokens is not None and self.reported:
            out.append(("tokens", float(self.tokens), float(self.limits.max_tokens)))
        cost = self.cost
        if (
            self.limits.max_cost is not None
            and cost is not None
            and self.cost_currency == self.limits.currency
        ):
            out.append(("cost", cost, self.limits.max_cost))
        return out

    def check(self) -> list[Signal]:
        """New warnings and exhaustions since the last check (each once per limit)."""
        signals: list[Signal] = []
        for dim, spent, limit in self._dimensions():
            if spent >= limit and dim not in self._exhausted:
                self._exhausted.add(dim)
                self._warned.add(dim)
                signals.append(Signal("exhausted", dim, spent, limit))
            elif spent >= WARN_FRACTION * limit and dim not in self._warned:
                self._warned.add(dim)
                signals.append(Signal("warn", dim, spent, limit))
        return signals

    @property
    def exhausted(self) -> Dimension | None:
        for dim, spent, limit in self._dimensions():
            if spent >= limit:
                return dim
        return None

    # ---- across a restore --------------------------------------------------------------

    def saved(self) -> str:
        """What :meth:`restore` takes back (JSON; the settled spending, not a running
        turn's estimate)."""
        state = Saved(
            tokens=self.settled_tokens,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            turns_reported=self.turns_reported,
            reported=self.reported,
            context_used=self.context_used,
            context_size=self.context_size,
            cost_banked=self.cost_banked,
            cost_seen=self.cost_seen,
            cost_currency=self.cost_currency,
            limits=self.limits if self.own_limits else None,
        )
        return msgspec.json.encode(state).decode()

    def restore(self, saved: str) -> bool:
        """Take back what :meth:`saved` wrote (False, nothing changed: unreadable).
        Warnings and exhaustion already signalled before are not signalled again."""
        try:
            state = _saved_decoder.decode(saved)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        self.settled_tokens = max(0, state.tokens)
        self.input_tokens = max(0, state.input_tokens)
        self.output_tokens = max(0, state.output_tokens)
        self.turns_reported = max(0, state.turns_reported)
        self.reported = state.reported
        self.context_used, self.context_size = state.context_used, state.context_size
        finite = math.isfinite(state.cost_banked) and math.isfinite(state.cost_seen)
        if finite and state.cost_currency is not None:
            self.cost_banked = max(0.0, state.cost_banked)
            self.cost_seen = max(0.0, state.cost_seen)
            self.cost_currency = state.cost_currency
        if state.limits is not None:
            self.limits, self.own_limits = state.limits, True
        self._restored_tokens = self.tokens
        self._restored_cost = self.cost or 0.0
        self._warned.clear()
        self._exhausted.clear()
        self.check()  # signalled in the session's earlier life
        return True

    # ---- read model --------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        limits = self.limits
        cost_applies = (
            limits.max_cost is not None
            and self.cost_currency is not None
            and self.cost_currency == limits.currency
        )
        out: dict[str, Any] = {
            "unbudgeted": not self.reported,
            "usage": {
                "totalTokens": self.tokens,
                "inputTokens": self.input_tokens,
                "outputTokens": self.output_tokens,
                "turnsReported": self.turns_reported,
                "inTurnEstimate": self.turn_estimate,
                "contextUsed": self.context_used,
                "contextSize": self.context_size,
                "cost": None
                if self.cost is None
                else {"amount": self.cost, "currency": self.cost_currency},
            },
            "budget": {
                "maxTokens": limits.max_tokens,
                "maxCost": limits.max_cost,
                "currency": limits.currency,
            },
            "exhausted": self.exhausted,
            "warnAt": WARN_FRACTION,
        }
        if not self.reported:
            out["unbudgetedReason"] = "the agent has reported no usage"
        elif limits.max_cost is not None and not cost_applies:
            out["costUnbudgetedReason"] = (
                "the agent reports no cost"
                if self.cost_currency is None
                else f"the agent reports cost in {self.cost_currency}, the limit is in "
                f"{limits.currency}"
            )
        return out
