"""The device-flow table: RFC 8628 polling, limits, expiry, retention, views (fake clock)."""

from __future__ import annotations

import json

import pytest

from serve.deviceflow.machine import (
    DEFAULT_INTERVAL_MS,
    MAX_ACTIVE_FLOWS,
    MAX_INTERVAL_MS,
    MAX_POLL_FAILURES,
    SLOW_DOWN_BUMP_MS,
    TERMINAL_RETENTION_MS,
    Attach,
    Create,
    DeviceAuthorization,
    Event,
    FlowStatus,
    FlowTable,
    PollFailed,
    PollOutcome,
    SlowDown,
    TokenGranted,
    TokenPending,
    TokenRejected,
    TooMany,
)

T0 = 1_700_000_000_000
AUTH = DeviceAuthorization(
    user_code="USER-1",
    verification_uri="https://idp.example/device",
    verification_uri_complete="https://idp.example/device?user_code=USER-1",
    expires_in_s=600,
    interval_s=5,
)


def started(
    table: FlowTable, flow_id: str = "f1", provider: str = "p", client: str | None = "c1"
) -> list[Event]:
    assert table.begin(provider, client, T0, flow_id) == Create(flow_id)
    return table.started(flow_id, AUTH, T0)


def test_start_emits_started_without_secrets() -> None:
    table = FlowTable()
    (event,) = started(table)
    assert event == Event(
        "auth_device_flow_started",
        {"deviceFlowId": "f1", "providerId": "p", "expiresAt": T0 + 600_000},
    )
    flow = table.get("f1")
    assert flow is not None and flow.status is FlowStatus.PENDING
    assert flow.next_poll_ms == T0 + 5_000


def test_one_live_flow_per_provider_and_a_global_limit() -> None:
    table = FlowTable()
    assert table.begin("p", "c1", T0, "f1") == Create("f1")
    assert table.begin("p", "c2", T0, "f2") == Attach("f1")  # still starting
    table.started("f1", AUTH, T0)
    assert table.begin("p", None, T0, "f3") == Attach("f1")  # pending
    for i in range(1, MAX_ACTIVE_FLOWS):
        assert table.begin(f"q{i}", None, T0, f"g{i}") == Create(f"g{i}")
    assert table.begin("other", None, T0, "x") == TooMany(MAX_ACTIVE_FLOWS)
    table.cancel("f1", T0)
    assert table.begin("other", None, T0, "y") == Create("y")  # a slot was freed


def test_failed_start_leaves_no_trace() -> None:
    table = FlowTable()
    table.begin("p", None, T0, "f1")
    table.start_failed("f1")
    assert table.get("f1") is None
    assert table.begin("p", None, T0, "f2") == Create("f2")


@pytest.mark.parametrize(
    ("expires_in_s", "interval_s", "expires_ms", "interval_ms"),
    [
        (600, 5, 600_000, 5_000),
        (1, None, 30_000, DEFAULT_INTERVAL_MS),  # expires_in clamped up to 30 s
        (99_999, 0, 3_600_000, DEFAULT_INTERVAL_MS),  # clamped down to 1 h; 0 → default
        (600, 120, 600_000, MAX_INTERVAL_MS),
        (600, 0.001, 600_000, 50),
        (600, 0.25, 600_000, 250),
    ],
)
def test_upstream_values_are_clamped(
    expires_in_s: float, interval_s: float | None, expires_ms: int, interval_ms: int
) -> None:
    table = FlowTable()
    table.begin("p", None, T0, "f")
    auth = DeviceAuthorization("U", "https://i/d", None, expires_in_s, interval_s)
    table.started("f", auth, T0)
    flow = table.get("f")
    assert flow is not None
    assert (flow.expires_at_ms - T0, flow.interval_ms) == (expires_ms, interval_ms)


def test_polls_are_due_at_the_interval_one_at_a_time() -> None:
    table = FlowTable()
    started(table)
    assert table.next_deadline_ms() == T0 + 5_000
    assert table.due(T0 + 4_999) == []
    (flow,) = table.due(T0 + 5_000)
    assert flow.flow_id == "f1" and flow.last_polled_ms == T0 + 5_000
    assert table.due(T0 + 9_000) == []  # one request in flight per flow
    assert table.next_deadline_ms() == T0 + 600_000  # only the expiry is left to wake for
    assert table.poll_result("f1", TokenPending(), T0 + 5_100) == ([], None)
    assert table.next_deadline_ms() == T0 + 10_100


def poll(table: FlowTable, now: int, outcome: PollOutcome) -> list[Event]:
    assert [f.flow_id for f in table.due(now)] == ["f1"]
    events, _ = table.poll_result("f1", outcome, now)
    return events


def test_pending_then_slow_down_then_success() -> None:
    table = FlowTable()
    started(table)
    now = T0 + 5_000
    assert poll(table, now, TokenPending()) == []
    now += 5_000
    (throttled,) = poll(table, now, SlowDown())
    assert throttled == Event(
        "auth_device_flow_throttled", {"deviceFlowId": "f1", "intervalMs": 5_000 + 5_000}
    )
    assert table.next_deadline_ms() == now + 10_000
    assert table.due(now + 9_999) == []
    now += 10_000
    assert [f.flow_id for f in table.due(now)] == ["f1"]
    events, persist = table.poll_result("f1", TokenGranted(expires_in_s=3600), now)
    assert events == [] and persist is not None and persist.provider_id == "p"
    assert table.get("f1").status is FlowStatus.PENDING  # type: ignore[union-attr]
    assert table.due(now + 60_000) == []  # no polling while persisting
    (authorized,) = table.persisted("f1", now + 10, ok=True)
    assert authorized == Event(
        "auth_device_flow_authorized",
        {"deviceFlowId": "f1", "providerId": "p", "expiresAt": now + 3_600_000},
    )
    assert table.get("f1").status is FlowStatus.AUTHORIZED  # type: ignore[union-attr]


def test_slow_down_is_capped() -> None:
    table = FlowTable()
    table.begin("p", None, T0, "f1")
    table.started("f1", DeviceAuthorization("U", "https://i/d", None, 3600, 5), T0)
    now = T0
    for _ in range(14):
        now += MAX_INTERVAL_MS
        poll(table, now, SlowDown())
    assert table.get("f1").interval_ms == MAX_INTERVAL_MS  # type: ignore[union-attr]
    assert SLOW_DOWN_BUMP_MS == 5_000


@pytest.mark.parametrize(
    ("outcome", "status", "kind"),
    [
        (TokenRejected("expired_token", "gone"), FlowStatus.EXPIRED, "expired_token"),
        (TokenRejected("access_denied", "no"), FlowStatus.ERROR, "access_denied"),
        (TokenRejected("invalid_grant", None), FlowStatus.ERROR, "invalid_grant"),
        (TokenRejected("upstream_error", "odd"), FlowStatus.ERROR, "upstream_error"),
    ],
)
def test_terminal_answers(outcome: TokenRejected, status: FlowStatus, kind: str) -> None:
    table = FlowTable()
    started(table)
    (failed,) = poll(table, T0 + 5_000, outcome)
    assert failed.type == "auth_device_flow_failed"
    assert failed.data["deviceFlowId"] == "f1" and failed.data["errorKind"] == kind
    assert failed.data.get("hint") == outcome.hint
    flow = table.get("f1")
    assert flow is not None and flow.status is status
    assert table.due(T0 + 60_000) == []


def test_transient_failures_are_retried_then_give_up() -> None:
    table = FlowTable()
    started(table)
    now = T0
    for _ in range(MAX_POLL_FAILURES - 1):
        now += 5_000
        assert poll(table, now, PollFailed("HTTP 503")) == []
    now += 5_000
    assert poll(table, now, TokenPending()) == []  # a good answer resets the count
    for _ in range(MAX_POLL_FAILURES - 1):
        now += 5_000
        assert poll(table, now, PollFailed("HTTP 503")) == []
    now += 5_000
    (failed,) = poll(table, now, PollFailed("HTTP 503"))
    assert failed.data == {"deviceFlowId": "f1", "errorKind": "upstream_error", "hint": "HTTP 503"}


def test_persist_failure_is_terminal() -> None:
    table = FlowTable()
    started(table)
    table.due(T0 + 5_000)
    table.poll_result("f1", TokenGranted(None), T0 + 5_000)
    (failed,) = table.persisted("f1", T0 + 5_001, ok=False, hint="disk full")
    assert failed.data == {"deviceFlowId": "f1", "errorKind": "persist_failed", "hint": "disk full"}
    assert table.get("f1").status is FlowStatus.ERROR  # type: ignore[union-attr]


def test_local_expiry_and_terminal_retention() -> None:
    table = FlowTable()
    started(table)
    expires = T0 + 600_000
    assert table.expire(expires - 1) == []
    (failed,) = table.expire(expires)
    assert failed.data["errorKind"] == "expired_token"
    assert table.get("f1").status is FlowStatus.EXPIRED  # type: ignore[union-attr]
    assert table.next_deadline_ms() == expires + TERMINAL_RETENTION_MS
    assert table.expire(expires + TERMINAL_RETENTION_MS - 1) == []
    assert table.get("f1") is not None
    table.expire(expires + TERMINAL_RETENTION_MS)
    assert table.get("f1") is None
    assert table.next_deadline_ms() is None


def test_results_after_cancel_or_expiry_are_ignored() -> None:
    table = FlowTable()
    started(table)
    table.due(T0 + 5_000)
    assert table.cancel("f1", T0 + 5_001) == (
        True,
        [Event("auth_device_flow_cancelled", {"deviceFlowId": "f1"})],
    )
    assert table.poll_result("f1", TokenGranted(60), T0 + 5_002) == ([], None)
    assert table.persisted("f1", T0 + 5_003, ok=True) == []
    assert table.get("f1").status is FlowStatus.CANCELLED  # type: ignore[union-attr]


def test_cancel_is_idempotent_and_knows_unknown_ids() -> None:
    table = FlowTable()
    started(table)
    found, events = table.cancel("f1", T0)
    assert found and len(events) == 1
    assert table.cancel("f1", T0) == (True, [])  # terminal: no second event
    assert table.cancel("nope", T0) == (False, [])


def test_view_shows_the_user_code_only_to_the_initiator_of_a_live_flow() -> None:
    table = FlowTable()
    started(table, client="c1")
    mine = table.view("f1", "c1", attached=False)
    assert mine["userCode"] == "USER-1"
    assert mine["verificationUri"] == "https://idp.example/device"
    assert mine["verificationUriComplete"].endswith("USER-1")
    assert mine["initiatorClientId"] == "c1"
    assert (mine["status"], mine["intervalMs"], mine["attached"]) == ("pending", 5_000, False)
    for caller in ("c2", None):
        theirs = table.view("f1", caller, attached=True)
        assert "userCode" not in theirs and "verificationUri" not in theirs
        assert "initiatorClientId" not in theirs
    assert "attached" not in table.view("f1", "c1")


def test_anonymous_initiator_sees_its_code_when_anonymous() -> None:
    table = FlowTable()
    started(table, client=None)
    assert table.view("f1", None)["userCode"] == "USER-1"
    assert "userCode" not in table.view("f1", "c1")


def test_terminal_views_drop_the_codes_and_carry_the_error() -> None:
    table = FlowTable()
    started(table, client="c1")
    poll(table, T0 + 5_000, TokenRejected("access_denied", "the user said no"))
    view = table.view("f1", "c1")
    assert view["status"] == "error" and view["errorKind"] == "access_denied"
    assert view["hint"] == "the user said no"
    assert "userCode" not in view and "intervalMs" not in view
    with pytest.raises(KeyError):
        table.view("nope", None)


def test_starting_flows_look_pending_without_a_code() -> None:
    table = FlowTable()
    table.begin("p", "c1", T0, "f1")
    view = table.view("f1", "c1")
    assert view["status"] == "pending" and view["expiresAt"] == 0
    assert "userCode" not in view
    assert table.pending_summary() == [{"deviceFlowId": "f1", "providerId": "p", "expiresAt": 0}]


def test_no_event_ever_carries_a_code_or_uri() -> None:
    table = FlowTable()
    events = started(table)
    events += poll(table, T0 + 5_000, SlowDown())
    table.due(T0 + 20_000)
    table.poll_result("f1", TokenGranted(10), T0 + 20_000)
    events += table.persisted("f1", T0 + 20_001, ok=True)
    text = json.dumps([e.data for e in events])
    assert "USER-1" not in text and "idp.example" not in text
    assert [e.type for e in events] == [
        "auth_device_flow_started",
        "auth_device_flow_throttled",
        "auth_device_flow_authorized",
    ]
