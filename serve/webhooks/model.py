"""The webhooks config section, the subscription record and the event names. Pure.

``webhooks:`` in the daemon config file (camelCase keys; every bound with its unit)::

    webhooks:
      allow: ["127.0.0.1", "10.1.0.0/16", "hooks.example.com"]  # as --webhook-allow
      maxAttempts: 20          # deliveries of one message at most
      maxAgeS: 86400           # a message older than this is dropped (seconds)
      initialBackoffMs: 1000   # first retry delay, doubled each attempt ...
      maxBackoffMs: 300000     # ... up to this (milliseconds)
      timeoutS: 10             # one attempt: connect + send + response head (seconds)
      outboxMaxEntries: 10000  # messages owed, all subscriptions (entries)
      outboxMaxBytes: 67108864 # their bodies (bytes)
      subscriptions:
        - url: https://hooks.example.com/acp
          secret: whsec_...    # required here (the operator keeps it)
          events: [turn.completed, permission.requested]   # absent: every type
          sessionId: null      # absent: every session
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

__all__ = [
    "EVENT_TYPES",
    "FROM_LOG",
    "ConfigSubscription",
    "Subscription",
    "WebhookError",
    "WebhooksConfig",
]

#: Event log type → webhook event type.
FROM_LOG: Final[dict[str, str]] = {
    "turn_complete": "turn.completed",
    "turn_error": "turn.failed",
    "permission_request": "permission.requested",
    "session_closed": "session.closed",
    "session_died": "session.failed",
    "budget_exhausted": "budget.exhausted",
}
#: Every webhook event type (``quota.exceeded`` comes from the quota check, not a log).
EVENT_TYPES: Final[tuple[str, ...]] = (*FROM_LOG.values(), "quota.exceeded")

EventType = Literal[
    "turn.completed",
    "turn.failed",
    "permission.requested",
    "session.closed",
    "session.failed",
    "budget.exhausted",
    "quota.exceeded",
]


class WebhookError(Exception):
    """A subscription refused: ``code`` (``invalid_webhook``, ``webhook_target_forbidden``,
    ``webhook_not_found``, ``webhook_limit``, ``webhook_from_config``), ``field``."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


class ConfigSubscription(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    secret: str
    events: Annotated[tuple[EventType, ...], msgspec.Meta(max_length=16)] = ()
    session_id: str | None = None


class WebhooksConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    allow: Annotated[tuple[str, ...], msgspec.Meta(max_length=256)] = ()
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20
    max_age_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)] = 86400.0
    initial_backoff_ms: Annotated[int, msgspec.Meta(ge=10, le=3_600_000)] = 1000
    max_backoff_ms: Annotated[int, msgspec.Meta(ge=10, le=86_400_000)] = 300_000
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=120)] = 10.0
    outbox_max_entries: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 10_000
    outbox_max_bytes: Annotated[int, msgspec.Meta(ge=4096, le=1 << 34)] = 64 * 1024 * 1024
    subscriptions: Annotated[tuple[ConfigSubscription, ...], msgspec.Meta(max_length=256)] = ()


class Subscription(msgspec.Struct, frozen=True, rename="camel"):
    """One subscription. ``owner``: the principal id that made it (None: the operator's
    config file); ``admin``: it sees every session (the config file's, an admin's)."""

    id: str
    url: str
    secret: str
    events: tuple[str, ...]
    session_id: str | None
    owner: str | None
    admin: bool
    source: Literal["config", "api"]
    created_at: str

    def wants(self, event_type: str, session_id: str, owner: str | None) -> bool:
        if self.events and event_type not in self.events:
            return False
        if self.session_id is not None:
            return self.session_id == session_id
        return self.admin or (owner is not None and owner == self.owner)

    def public(self) -> dict[str, object]:
        """The wire shape without the secret."""
        return {
            "id": self.id,
            "url": self.url,
            "events": list(self.events) or list(EVENT_TYPES),
            "sessionId": self.session_id,
            "owner": self.owner,
            "source": self.source,
            "createdAt": self.created_at,
        }


# ---- wire shapes (the OpenAPI document's; the route validates by hand for precise errors) --


class WebhookRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """``POST /webhooks``: ``events`` absent = every type; ``session_id`` absent = every
    session the caller owns; ``secret`` absent = one is made."""

    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048, pattern="^https?://")]
    events: tuple[EventType, ...] | None = None
    session_id: str | None = None
    secret: str | None = None


class WebhookView(msgspec.Struct, frozen=True, rename="camel"):
    """A subscription as listed (never its secret)."""

    id: str
    url: str
    events: list[EventType]
    session_id: str | None
    owner: str | None
    source: Literal["config", "api"]
    created_at: str


class WebhookCreated(WebhookView, frozen=True):
    """The new subscription with its secret (answered once)."""

    secret: str


class WebhookList(msgspec.Struct, frozen=True):
    webhooks: list[WebhookView]
