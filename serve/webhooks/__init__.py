"""Signed webhooks: push a session's turn ends, permission requests, endings and budget
stops to receivers the operator (``webhooks:`` in the config file) or a principal
(``POST /webhooks``) subscribed, following the Standard Webhooks convention.

Modules: :mod:`.model` (the config section, subscriptions, event names, pure),
:mod:`.signing` (secrets and the ``webhook-signature`` HMAC, pure), :mod:`.targets` (the
allow-list of receiver addresses), :mod:`.disk` (the durable outbox on disk, blocking
functions run in worker threads), :mod:`.service` (the ``webhooks`` actor: the tap, the
subscriptions, one delivery task per subscription). ``docs/webhooks.md`` is the user guide.
"""

from serve.webhooks.model import (
    EVENT_TYPES,
    Subscription,
    WebhookError,
    WebhooksConfig,
)
from serve.webhooks.service import SessionFacts, WebhookService
from serve.webhooks.signing import new_secret, sign, verify

__all__ = [
    "EVENT_TYPES",
    "SessionFacts",
    "Subscription",
    "WebhookError",
    "WebhookService",
    "WebhooksConfig",
    "new_secret",
    "sign",
    "verify",
]
