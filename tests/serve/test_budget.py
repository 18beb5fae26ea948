"""Unit tests of the sans-IO budget meter (serve/sessions/budget.py)."""

from __future__ import annotations

from serve.sessions.budget import BudgetMeter, Limits


def _kinds(signals: list) -> list[tuple[str, str]]:
    return [(s.kind, s.dimension) for s in signals]


def test_an_agent_that_reports_nothing_is_unbudgeted() -> None:
    meter = BudgetMeter(Limits(max_tokens=10))
    meter.turn_started()
    assert meter.turn_ended(None) == []
    snap = meter.snapshot()
    assert snap["unbudgeted"] is True
    assert meter.exhausted is None


def test_turn_usage_settles_and_warns_then_exhausts_once() -> None:
    meter = BudgetMeter(Limits(max_tokens=100))
    meter.turn_started()
    assert _kinds(meter.turn_ended({"totalTokens": 85, "inputTokens": 80, "outputTokens": 5})) == [
        ("warn", "tokens")
    ]
    meter.turn_started()
    assert _kinds(meter.turn_ended({"totalTokens": 20, "inputTokens": 20, "outputTokens": 0})) == [
        ("exhausted", "tokens")
    ]
    assert meter.exhausted == "tokens"
    assert meter.check() == []  # once per limit
    assert meter.snapshot()["usage"]["totalTokens"] == 105


def test_context_growth_is_a_lower_bound_during_a_turn() -> None:
    meter = BudgetMeter(Limits(max_tokens=1000))
    meter.on_usage_update({"used": 500, "size": 200000})  # before the turn: no spending
    assert meter.tokens == 0
    meter.turn_started()
    meter.on_usage_update({"used": 900, "size": 200000})
    assert meter.tokens == 400
    signals = meter.on_usage_update({"used": 1600, "size": 200000})
    assert _kinds(signals) == [("exhausted", "tokens")]
    # the reported figure replaces the estimate at the end of the turn
    meter.turn_ended({"totalTokens": 3000, "inputTokens": 2900, "outputTokens": 100})
    assert meter.tokens == 3000


def test_raising_the_limit_clears_exhaustion_and_rearms_the_warning() -> None:
    meter = BudgetMeter(Limits(max_tokens=10))
    meter.turn_started()
    meter.turn_ended({"totalTokens": 12, "inputTokens": 12, "outputTokens": 0})
    assert meter.exhausted == "tokens"
    assert _kinds(meter.set_limits(Limits(max_tokens=14))) == [("warn", "tokens")]
    assert meter.exhausted is None
    assert meter.set_limits(Limits()) == []


def test_cost_is_cumulative_banks_a_reset_and_applies_in_its_currency() -> None:
    meter = BudgetMeter(Limits(max_cost=1.0, currency="USD"))
    meter.on_usage_update({"used": 1, "size": 10, "cost": {"amount": 0.5, "currency": "USD"}})
    # the agent restarted: its cumulative figure starts again; what was seen is kept
    signals = meter.on_usage_update(
        {"used": 1, "size": 10, "cost": {"amount": 0.35, "currency": "USD"}}
    )
    assert meter.cost == 0.85
    assert _kinds(signals) == [("warn", "cost")]
    eur = BudgetMeter(Limits(max_cost=1.0, currency="USD"))
    eur.on_usage_update({"used": 1, "size": 10, "cost": {"amount": 5.0, "currency": "EUR"}})
    assert eur.exhausted is None
    assert "EUR" in eur.snapshot()["costUnbudgetedReason"]


def test_malformed_usage_is_ignored() -> None:
    meter = BudgetMeter(Limits(max_tokens=1))
    for bad in (None, [], {"used": -1, "size": 1}, {"used": True, "size": 1}, {"size": 3}):
        assert meter.on_usage_update(bad) == []
    meter.turn_started()
    assert meter.turn_ended({"totalTokens": "9"}) == []
    assert meter.snapshot()["unbudgeted"] is True


def test_a_restored_meter_keeps_its_spending_and_own_limits_and_signals_nothing_again() -> None:
    meter = BudgetMeter(Limits(max_tokens=5000))
    meter.turn_started()
    meter.on_usage_update({"used": 10, "size": 1000, "cost": {"amount": 0.5, "currency": "USD"}})
    meter.turn_ended({"totalTokens": 85, "inputTokens": 80, "outputTokens": 5})
    defaults_only = meter.saved()
    assert _kinds(meter.set_limits(Limits(max_tokens=100, max_cost=1.0))) == [("warn", "tokens")]
    saved = meter.saved()

    back = BudgetMeter(Limits(max_tokens=7000))  # the restoring daemon's default
    assert back.restore(saved)
    assert back.snapshot() == meter.snapshot()
    assert back.tokens_here == 0 and back.cost_here == 0.0  # charged where it was spent
    back.turn_started()
    assert back.turn_ended({"totalTokens": 5}) == []  # warned in its earlier life
    back.turn_started()
    assert _kinds(back.turn_ended({"totalTokens": 10})) == [("exhausted", "tokens")]
    assert back.tokens_here == 15
    follows = BudgetMeter(Limits(max_tokens=7000))
    assert follows.restore(defaults_only)  # no limit of its own: the daemon's default
    assert follows.limits.max_tokens == 7000 and follows.tokens == 85
    assert not BudgetMeter().restore("{not json")
