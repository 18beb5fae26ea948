"""Webhook subscriptions over HTTP (the service is serve/webhooks; docs/webhooks.md).

==============================  =============================================================
route                           answer
==============================  =============================================================
``POST   /webhooks`` (strict)   ``201`` the new subscription with its ``secret`` (shown once)
``GET    /webhooks``            ``{webhooks: [...]}``: the caller's (an admin's: every one)
``DELETE /webhooks/<id>``       ``204``; someone else's or unknown: ``404 webhook_not_found``
==============================  =============================================================

The body of ``POST`` is ``{url, events?, sessionId?, secret?}``: ``url`` an http(s) URL the
allow-list admits (else ``403 webhook_target_forbidden``); ``events`` a list of
:data:`~serve.webhooks.EVENT_TYPES` (absent: all); ``sessionId`` a live session the caller
owns (absent: every session the caller owns, every session for an admin; someone else's:
``404 session_not_found``); ``secret`` ``whsec_<base64 of 24-64 bytes>`` (absent: made).
Any other key or a bad value is ``400 invalid_webhook`` with ``field``.
"""

from __future__ import annotations

from typing import Any, Final

from quart import Blueprint, Response

from serve.access.roles import OWNER
from serve.http.access import principal, session_allows
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request, service_unavailable, session_not_found
from serve.http.routes.sessions import find_session
from serve.http.wire import json_body, json_response
from serve.webhooks import EVENT_TYPES, WebhookError, WebhookService

blueprint = Blueprint("webhooks", __name__)

_KEYS: Final = frozenset({"url", "events", "sessionId", "secret"})
_STATUS: Final = {
    "webhook_target_forbidden": 403,
    "webhook_not_found": 404,
    "webhook_limit": 409,
    "webhook_from_config": 409,
}

FEATURES: tuple[Feature, ...] = (
    Feature(
        "webhooks",
        (("POST", "/webhooks"), ("GET", "/webhooks"), ("DELETE", "/webhooks/<webhook_id>")),
    ),
)


def _service() -> WebhookService:
    service = daemon().webhooks
    if service is None:
        raise service_unavailable("webhooks are not running", "webhooks_unavailable")
    return service


def _refusal(exc: WebhookError) -> ApiError:
    body: dict[str, Any] = {"error": exc.message, "code": exc.code}
    if exc.field is not None:
        body["field"] = exc.field
    return ApiError(_STATUS.get(exc.code, 400), body)


def _invalid(message: str, field: str) -> ApiError:
    return bad_request(message, "invalid_webhook", field=field)


@blueprint.post("/webhooks")
async def create_webhook() -> Response:
    """Subscribe to webhook events (tag `webhooks`)."""
    body = await json_body(allow_empty=False)
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise _invalid(
            f"unknown field `{unknown[0]}` (allowed: {', '.join(sorted(_KEYS))})", unknown[0]
        )
    url = body.get("url")
    if not isinstance(url, str) or not url:
        raise _invalid("`url` must be a non-empty string", "url")
    events = body.get("events")
    if events is None:
        events = []
    if (
        not isinstance(events, list)
        or len(events) > len(EVENT_TYPES)
        or any(not isinstance(e, str) or e not in EVENT_TYPES for e in events)
    ):
        raise _invalid(f"`events` must be a list of: {', '.join(EVENT_TYPES)}", "events")
    session_id = body.get("sessionId")
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise _invalid("`sessionId` must be a session id", "sessionId")
    secret = body.get("secret")
    if secret is not None and not isinstance(secret, str):
        raise _invalid("`secret` must be a string `whsec_<base64>`", "secret")
    who = principal()
    host = daemon()
    if session_id is not None:
        session = find_session(session_id)  # SessionNotFound: 404 session_not_found
        if host.multi_user and not session_allows(host, who, session, OWNER):
            raise session_not_found(session_id)
    service = _service()
    try:
        sub = await service.subscribe(
            owner=who.id,
            admin=who.admin,
            url=url,
            events=tuple(dict.fromkeys(events)),
            session_id=session_id,
            secret=secret,
        )
    except WebhookError as exc:
        raise _refusal(exc) from None
    return json_response({**sub.public(), "secret": sub.secret}, status=201)


@blueprint.get("/webhooks")
async def list_webhooks() -> Response:
    """The caller's webhook subscriptions (an admin's: all), without secrets."""
    who = principal()
    subs = _service().visible(who.id, who.admin)
    return json_response(
        {"webhooks": [s.public() for s in subs]}, headers={"Cache-Control": "no-store"}
    )


@blueprint.delete("/webhooks/<webhook_id>")
async def delete_webhook(webhook_id: str) -> Response:
    """Remove one of the caller's webhook subscriptions and what it is owed."""
    who = principal()
    try:
        await _service().unsubscribe(webhook_id, who.id, who.admin)
    except WebhookError as exc:
        raise _refusal(exc) from None
    return Response(status=204)
