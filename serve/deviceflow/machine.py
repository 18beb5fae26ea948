"""Device-flow registry: the RFC 8628 polling state machine of every flow (sans-IO).

Theory of operation
-------------------
A :class:`FlowTable` holds every device-authorization flow of the daemon. It does no I/O
and reads no clock: every method takes ``now_ms`` (epoch milliseconds) and returns the
events to publish; the DeviceFlowPoller actor does the HTTP, the timers and the disk.

States (``starting`` is internal; clients see it as ``pending`` without a user code)::

    starting ──started──▶ pending ──granted──▶ (persisting) ──ok──▶ authorized
       │                   │  ▲                     └──fail──▶ error (persist_failed)
       └─start_failed─▶ ✗  │  └─ authorization_pending / slow_down (+5 s, throttled)
                           ├──▶ expired   (IdP expired_token, or expiresAt passed)
                           ├──▶ error     (access_denied, invalid_grant, upstream_error)
                           └──▶ cancelled (DELETE)

* One live flow per provider: :meth:`FlowTable.begin` attaches a second caller to a
  ``starting``/``pending`` flow of the same provider; at most :data:`MAX_ACTIVE_FLOWS`
  live flows in all.
* Polling: :meth:`FlowTable.due` hands out flows whose ``next_poll_ms`` has come (one
  request in flight per flow); :meth:`FlowTable.poll_result` applies the IdP's answer:
  ``authorization_pending`` waits ``interval``; ``slow_down`` adds
  :data:`SLOW_DOWN_BUMP_MS` (capped at :data:`MAX_INTERVAL_MS`) and emits
  ``auth_device_flow_throttled``; a grant asks the caller to persist (:class:`Persist`);
  ``expired_token``/``access_denied``/``invalid_grant``/other errors are terminal;
  transport failures are retried until :data:`MAX_POLL_FAILURES` in a row.
* :meth:`FlowTable.expire` ends pending flows whose ``expiresAt`` passed and evicts
  terminal entries :data:`TERMINAL_RETENTION_MS` after they ended (then GET is 404).
* :meth:`FlowTable.next_deadline_ms` is when the actor must call ``due``/``expire`` next.

Events never carry the user code, the verification URI or any token: ``started``
``{deviceFlowId, providerId, expiresAt}``, ``throttled`` ``{deviceFlowId, intervalMs}``,
``authorized`` ``{deviceFlowId, providerId, expiresAt?}``, ``failed``
``{deviceFlowId, errorKind, hint?}``, ``cancelled`` ``{deviceFlowId}``. The user code and
URIs appear only in :meth:`FlowTable.view` for the initiating client.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import msgspec

DEFAULT_INTERVAL_MS: Final = 5_000
SLOW_DOWN_BUMP_MS: Final = 5_000
MIN_INTERVAL_MS: Final = 50
MAX_INTERVAL_MS: Final = 60_000
MIN_EXPIRES_MS: Final = 30_000
MAX_EXPIRES_MS: Final = 3_600_000
TERMINAL_RETENTION_MS: Final = 300_000
MAX_ACTIVE_FLOWS: Final = 4
MAX_POLL_FAILURES: Final = 3
MAX_HINT_CHARS: Final = 300


class FlowStatus(enum.StrEnum):
    STARTING = "starting"
    PENDING = "pending"
    AUTHORIZED = "authorized"
    EXPIRED = "expired"
    ERROR = "error"
    CANCELLED = "cancelled"


LIVE: Final = frozenset({FlowStatus.STARTING, FlowStatus.PENDING})


class Event(msgspec.Struct, frozen=True):
    type: str
    data: dict[str, Any]


# ---- inputs -------------------------------------------------------------------------------


class DeviceAuthorization(msgspec.Struct, frozen=True):
    """The public part of the IdP's device authorization response (no device code)."""

    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in_s: float
    interval_s: float | None = None


class TokenPending(msgspec.Struct, frozen=True):
    pass


class SlowDown(msgspec.Struct, frozen=True):
    pass


class TokenGranted(msgspec.Struct, frozen=True):
    expires_in_s: float | None = None


class TokenRejected(msgspec.Struct, frozen=True):
    """Terminal: ``error_kind`` is expired_token, access_denied, invalid_grant or upstream_error."""

    error_kind: str
    hint: str | None = None


class PollFailed(msgspec.Struct, frozen=True):
    """Transient (network, timeout, 5xx): retried at the interval, a few times in a row."""

    hint: str


PollOutcome = TokenPending | SlowDown | TokenGranted | TokenRejected | PollFailed


# ---- begin results ------------------------------------------------------------------------


class Attach(msgspec.Struct, frozen=True):
    flow_id: str


class Create(msgspec.Struct, frozen=True):
    flow_id: str


class TooMany(msgspec.Struct, frozen=True):
    limit: int


class Persist(msgspec.Struct, frozen=True):
    """The grant must be written to disk; answer with :meth:`FlowTable.persisted`."""

    flow_id: str
    provider_id: str


# ---- the flow -----------------------------------------------------------------------------


class Flow:
    """One flow's state (mutable; owned by its table)."""

    __slots__ = (
        "created_ms",
        "ended_ms",
        "error_kind",
        "expires_at_ms",
        "failures",
        "flow_id",
        "hint",
        "initiator",
        "interval_ms",
        "last_polled_ms",
        "next_poll_ms",
        "polling",
        "provider_id",
        "status",
        "token_expires_at_ms",
        "user_code",
        "verification_uri",
        "verification_uri_complete",
    )

    def __init__(self, flow_id: str, provider_id: str, initiator: str | None, now_ms: int) -> None:
        self.flow_id = flow_id
        self.provider_id = provider_id
        self.initiator = initiator
        self.created_ms = now_ms
        self.status = FlowStatus.STARTING
        self.user_code: str | None = None
        self.verification_uri: str | None = None
        self.verification_uri_complete: str | None = None
        self.expires_at_ms = 0
        self.interval_ms = DEFAULT_INTERVAL_MS
        self.next_poll_ms = 0
        self.last_polled_ms: int | None = None
        self.polling = False
        self.failures = 0
        self.error_kind: str | None = None
        self.hint: str | None = None
        self.ended_ms: int | None = None
        self.token_expires_at_ms: int | None = None

    @property
    def live(self) -> bool:
        return self.status in LIVE


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _hint(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_HINT_CHARS else text[: MAX_HINT_CHARS - 1] + "…"


class FlowTable:
    """Every device flow of the daemon; see the module docstring."""

    def __init__(self, *, max_active: int = MAX_ACTIVE_FLOWS) -> None:
        self.max_active = max_active
        self.flows: dict[str, Flow] = {}

    # ---- queries -------------------------------------------------------------------------

    def get(self, flow_id: str) -> Flow | None:
        return self.flows.get(flow_id)

    @property
    def active_count(self) -> int:
        return sum(1 for f in self.flows.values() if f.live)

    def pending(self) -> list[Flow]:
        return [f for f in self.flows.values() if f.status is FlowStatus.PENDING]

    def next_deadline_ms(self) -> int | None:
        """The earliest time something is due (a poll, an expiry, an eviction)."""
        deadlines: list[int] = []
        for flow in self.flows.values():
            if flow.status is FlowStatus.PENDING:
                deadlines.append(flow.expires_at_ms)
                if not flow.polling:
                    deadlines.append(flow.next_poll_ms)
            elif flow.ended_ms is not None:
                deadlines.append(flow.ended_ms + TERMINAL_RETENTION_MS)
        return min(deadlines) if deadlines else None

    # ---- starting ------------------------------------------------------------------------

    def begin(
        self, provider_id: str, client_id: str | None, now_ms: int, new_id: str
    ) -> Attach | Create | TooMany:
        for flow in self.flows.values():
            if flow.provider_id == provider_id and flow.live:
                return Attach(flow.flow_id)
        if self.active_count >= self.max_active:
            return TooMany(self.max_active)
        self.flows[new_id] = Flow(new_id, provider_id, client_id, now_ms)
        return Create(new_id)

    def started(self, flow_id: str, auth: DeviceAuthorization, now_ms: int) -> list[Event]:
        flow = self.flows.get(flow_id)
        if flow is None or flow.status is not FlowStatus.STARTING:
            return []
        flow.status = FlowStatus.PENDING
        flow.user_code = auth.user_code
        flow.verification_uri = auth.verification_uri
        flow.verification_uri_complete = auth.verification_uri_complete
        expires_ms = _clamp(round(auth.expires_in_s * 1000), MIN_EXPIRES_MS, MAX_EXPIRES_MS)
        flow.expires_at_ms = now_ms + expires_ms
        if auth.interval_s is not None and auth.interval_s > 0:
            interval = round(auth.interval_s * 1000)
            flow.interval_ms = _clamp(interval, MIN_INTERVAL_MS, MAX_INTERVAL_MS)
        flow.next_poll_ms = now_ms + flow.interval_ms
        return [
            Event(
                "auth_device_flow_started",
                {
                    "deviceFlowId": flow_id,
                    "providerId": flow.provider_id,
                    "expiresAt": flow.expires_at_ms,
                },
            )
        ]

    def start_failed(self, flow_id: str) -> None:
        """The device authorization request failed: the flow never existed for clients."""
        flow = self.flows.get(flow_id)
        if flow is not None and flow.status is FlowStatus.STARTING:
            del self.flows[flow_id]

    # ---- polling -------------------------------------------------------------------------

    def due(self, now_ms: int) -> list[Flow]:
        """Pending flows whose poll time has come; each is marked in flight."""
        out: list[Flow] = []
        for flow in self.flows.values():
            if (
                flow.status is FlowStatus.PENDING
                and not flow.polling
                and flow.next_poll_ms <= now_ms < flow.expires_at_ms
            ):
                flow.polling = True
                flow.last_polled_ms = now_ms
                out.append(flow)
        return out

    def poll_result(
        self, flow_id: str, outcome: PollOutcome, now_ms: int
    ) -> tuple[list[Event], Persist | None]:
        flow = self.flows.get(flow_id)
        if flow is None or flow.status is not FlowStatus.PENDING:
            return [], None  # cancelled or expired while the request was in flight
        match outcome:
            case TokenPending():
                flow.polling = False
                flow.failures = 0
                flow.next_poll_ms = now_ms + flow.interval_ms
                return [], None
            case SlowDown():
                flow.polling = False
                flow.failures = 0
                flow.interval_ms = min(flow.interval_ms + SLOW_DOWN_BUMP_MS, MAX_INTERVAL_MS)
                flow.next_poll_ms = now_ms + flow.interval_ms
                data = {"deviceFlowId": flow_id, "intervalMs": flow.interval_ms}
                return [Event("auth_device_flow_throttled", data)], None
            case TokenGranted(expires_in_s=expires_in_s):
                if expires_in_s is not None and expires_in_s > 0:
                    flow.token_expires_at_ms = now_ms + round(expires_in_s * 1000)
                return [], Persist(flow_id, flow.provider_id)  # stays polling: no more polls
            case TokenRejected(error_kind=kind, hint=hint):
                status = FlowStatus.EXPIRED if kind == "expired_token" else FlowStatus.ERROR
                return [self._end(flow, status, now_ms, kind, hint)], None
            case PollFailed(hint=hint):
                flow.polling = False
                flow.failures += 1
                if flow.failures >= MAX_POLL_FAILURES:
                    return [self._end(flow, FlowStatus.ERROR, now_ms, "upstream_error", hint)], None
                flow.next_poll_ms = now_ms + flow.interval_ms
                return [], None
        return [], None

    def persisted(
        self, flow_id: str, now_ms: int, *, ok: bool, hint: str | None = None
    ) -> list[Event]:
        flow = self.flows.get(flow_id)
        if flow is None or flow.status is not FlowStatus.PENDING:
            return []
        if not ok:
            return [self._end(flow, FlowStatus.ERROR, now_ms, "persist_failed", hint)]
        flow.status = FlowStatus.AUTHORIZED
        flow.polling = False
        flow.ended_ms = now_ms
        data: dict[str, Any] = {"deviceFlowId": flow_id, "providerId": flow.provider_id}
        if flow.token_expires_at_ms is not None:
            data["expiresAt"] = flow.token_expires_at_ms
        return [Event("auth_device_flow_authorized", data)]

    def _end(
        self, flow: Flow, status: FlowStatus, now_ms: int, kind: str, hint: str | None
    ) -> Event:
        flow.status = status
        flow.polling = False
        flow.ended_ms = now_ms
        flow.error_kind = kind
        flow.hint = _hint(hint)
        data: dict[str, Any] = {"deviceFlowId": flow.flow_id, "errorKind": kind}
        if flow.hint is not None:
            data["hint"] = flow.hint
        return Event("auth_device_flow_failed", data)

    # ---- time and cancellation -----------------------------------------------------------

    def expire(self, now_ms: int) -> list[Event]:
        """End pending flows past ``expiresAt``; evict terminal entries past retention."""
        events: list[Event] = []
        for flow_id, flow in list(self.flows.items()):
            if flow.status is FlowStatus.PENDING and now_ms >= flow.expires_at_ms:
                hint = "The device code expired before it was authorized; start a new flow."
                events.append(self._end(flow, FlowStatus.EXPIRED, now_ms, "expired_token", hint))
            elif flow.ended_ms is not None and now_ms >= flow.ended_ms + TERMINAL_RETENTION_MS:
                del self.flows[flow_id]
        return events

    def cancel(self, flow_id: str, now_ms: int) -> tuple[bool, list[Event]]:
        """``(found, events)``: a live flow ends ``cancelled`` (an event); a terminal one is
        left as it is (no event); an unknown id is not found."""
        flow = self.flows.get(flow_id)
        if flow is None:
            return False, []
        if not flow.live:
            return True, []
        flow.status = FlowStatus.CANCELLED
        flow.polling = False
        flow.ended_ms = now_ms
        return True, [Event("auth_device_flow_cancelled", {"deviceFlowId": flow_id})]

    # ---- views ---------------------------------------------------------------------------

    def view(
        self, flow_id: str, caller: str | None, *, attached: bool | None = None
    ) -> dict[str, Any]:
        """The HTTP body for ``caller``; user code and URIs only for the initiator of a
        pending flow; ``attached`` only in POST answers. ``KeyError`` for an unknown id."""
        flow = self.flows[flow_id]
        status = FlowStatus.PENDING if flow.status is FlowStatus.STARTING else flow.status
        out: dict[str, Any] = {
            "deviceFlowId": flow.flow_id,
            "providerId": flow.provider_id,
            "status": str(status),
            "createdAt": flow.created_ms,
        }
        if attached is not None:
            out["attached"] = attached
        if flow.live:
            out["expiresAt"] = flow.expires_at_ms
            out["intervalMs"] = flow.interval_ms
            if flow.last_polled_ms is not None:
                out["lastPolledAt"] = flow.last_polled_ms
            if caller == flow.initiator:
                if flow.user_code is not None:
                    out["userCode"] = flow.user_code
                if flow.verification_uri is not None:
                    out["verificationUri"] = flow.verification_uri
                if flow.verification_uri_complete is not None:
                    out["verificationUriComplete"] = flow.verification_uri_complete
                if flow.initiator is not None:
                    out["initiatorClientId"] = flow.initiator
        else:
            if flow.error_kind is not None:
                out["errorKind"] = flow.error_kind
            if flow.hint is not None:
                out["hint"] = flow.hint
            if flow.status is FlowStatus.AUTHORIZED and flow.token_expires_at_ms is not None:
                out["expiresAt"] = flow.token_expires_at_ms
        return out

    def pending_summary(self) -> list[dict[str, Any]]:
        return [
            {"deviceFlowId": f.flow_id, "providerId": f.provider_id, "expiresAt": f.expires_at_ms}
            for f in self.flows.values()
            if f.live
        ]
