"""Talking to an OAuth 2.0 device-authorization server (RFC 8628), and wrapping secrets.

Two requests, both ``application/x-www-form-urlencoded`` POSTs with a JSON answer:

* :func:`request_device_code` → the device authorization endpoint
  (``client_id``, ``scope``, and with PKCE ``code_challenge`` + ``S256``); the answer is
  parsed by :func:`parse_device_authorization` into the public
  :class:`~serve.deviceflow.machine.DeviceAuthorization` plus the secret device code;
* :func:`poll_token` → the token endpoint (``grant_type=urn:ietf:params:oauth:grant-type:
  device_code``, ``device_code``, ``client_id``, and ``code_verifier`` with PKCE); the
  answer is classified by :func:`classify_token_response` (pure) into a poll outcome.

Classification: 2xx with ``access_token`` → granted (the token set is returned wrapped
in :class:`Secret`); ``error`` = ``authorization_pending`` / ``slow_down`` /
``expired_token`` / ``access_denied`` / ``invalid_grant`` map to themselves; any other
``error`` is a terminal ``upstream_error`` naming it; 429 without a body is ``slow_down``;
5xx, timeouts and connection failures are transient (:class:`PollFailed`).

:class:`Secret` holds device codes, PKCE verifiers and tokens: its ``str``/``repr`` is
``[redacted]`` and msgspec refuses to encode it, so a secret cannot leak into a log line,
an event or a response by accident. Hints never quote response bodies beyond the
IdP's ``error`` code and a bounded ``error_description``.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import TYPE_CHECKING, Any, Final

import msgspec

from serve.deviceflow.machine import (
    DeviceAuthorization,
    PollFailed,
    PollOutcome,
    SlowDown,
    TokenGranted,
    TokenPending,
    TokenRejected,
)
from serve.deviceflow.providers import ProviderConfig

if TYPE_CHECKING:
    import httpx

DEVICE_GRANT: Final = "urn:ietf:params:oauth:grant-type:device_code"
MAX_RESPONSE_BYTES: Final = 256 * 1024
MAX_DESCRIPTION_CHARS: Final = 200
_TERMINAL_ERRORS: Final = frozenset({"expired_token", "access_denied", "invalid_grant"})


class Secret[T]:
    """A value that prints as ``[redacted]``; :meth:`reveal` returns it."""

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def reveal(self) -> T:
        return self._value

    def __repr__(self) -> str:
        return "[redacted]"

    __str__ = __repr__


class IdpError(Exception):
    """The IdP could not start a flow (bad answer, HTTP error, unreachable)."""


class DeviceCode(msgspec.Struct, frozen=True):
    """A parsed device authorization answer: the public part and the secret device code."""

    public: DeviceAuthorization
    device_code: Secret[str]  # (not encodable on purpose)


class Pkce(msgspec.Struct, frozen=True):
    verifier: Secret[str]
    challenge: str


def new_pkce() -> Pkce:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    challenge = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return Pkce(Secret(verifier), challenge)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _describe(doc: dict[str, Any]) -> str:
    error = doc.get("error")
    text = f"the IdP answered {error}" if isinstance(error, str) else "the IdP refused"
    description = doc.get("error_description")
    if isinstance(description, str) and description:
        text += f": {description[:MAX_DESCRIPTION_CHARS]}"
    return text


def parse_device_authorization(status: int, body: bytes) -> DeviceCode:
    """Parse the device authorization response; raises :class:`IdpError`."""
    doc = _json_object(body)
    if not 200 <= status < 300:
        detail = _describe(doc) if doc is not None else f"HTTP {status}"
        raise IdpError(f"device authorization failed: {detail}")
    if doc is None:
        raise IdpError("device authorization answer is not a JSON object")
    device_code = doc.get("device_code")
    user_code = doc.get("user_code")
    uri = doc.get("verification_uri", doc.get("verification_url"))
    complete = doc.get("verification_uri_complete")
    expires_in = doc.get("expires_in")
    interval = doc.get("interval")
    if not isinstance(device_code, str) or not device_code:
        raise IdpError("device authorization answer has no device_code")
    if not isinstance(user_code, str) or not user_code:
        raise IdpError("device authorization answer has no user_code")
    if not isinstance(uri, str) or not uri.startswith(("http://", "https://")):
        raise IdpError("device authorization answer has no http(s) verification_uri")
    if not isinstance(expires_in, int | float) or isinstance(expires_in, bool):
        raise IdpError("device authorization answer has no numeric expires_in")
    if complete is not None and not (
        isinstance(complete, str) and complete.startswith(("http://", "https://"))
    ):
        complete = None
    if not isinstance(interval, int | float) or isinstance(interval, bool):
        interval = None
    public = DeviceAuthorization(
        user_code=user_code,
        verification_uri=uri,
        verification_uri_complete=complete,
        expires_in_s=float(expires_in),
        interval_s=float(interval) if interval is not None else None,
    )
    return DeviceCode(public, Secret(device_code))


def classify_token_response(status: int, body: bytes) -> tuple[PollOutcome, dict[str, Any] | None]:
    """Classify a token endpoint answer; the second item is the token set on a grant."""
    doc = _json_object(body)
    if 200 <= status < 300:
        if doc is not None and isinstance(doc.get("access_token"), str) and doc["access_token"]:
            expires_in = doc.get("expires_in")
            seconds = float(expires_in) if isinstance(expires_in, int | float) else None
            return TokenGranted(seconds), doc
        if doc is not None and isinstance(doc.get("error"), str):
            return _error_outcome(doc), None
        return TokenRejected("upstream_error", "the token answer has no access_token"), None
    if doc is not None and isinstance(doc.get("error"), str):
        return _error_outcome(doc), None
    if status == 429:
        return SlowDown(), None
    if status >= 500:
        return PollFailed(f"the token endpoint answered HTTP {status}"), None
    return TokenRejected("upstream_error", f"the token endpoint answered HTTP {status}"), None


def _error_outcome(doc: dict[str, Any]) -> PollOutcome:
    error = doc["error"]
    if error == "authorization_pending":
        return TokenPending()
    if error == "slow_down":
        return SlowDown()
    if error in _TERMINAL_ERRORS:
        return TokenRejected(error, _describe(doc))
    return TokenRejected("upstream_error", _describe(doc))


def _http_error() -> type[Exception]:
    import httpx

    return httpx.HTTPError


async def _post(client: httpx.AsyncClient, url: str, form: dict[str, str]) -> tuple[int, bytes]:
    headers = {"Accept": "application/json"}
    async with client.stream("POST", url, data=form, headers=headers) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise IdpError(f"the IdP answer is larger than {MAX_RESPONSE_BYTES} bytes")
        return response.status_code, bytes(body)


async def request_device_code(
    client: httpx.AsyncClient, provider: ProviderConfig, pkce: Pkce | None
) -> DeviceCode:
    """POST the device authorization request; raises :class:`IdpError`."""
    form = {"client_id": provider.client_id}
    if provider.scope:
        form["scope"] = provider.scope
    if pkce is not None:
        form["code_challenge"] = pkce.challenge
        form["code_challenge_method"] = "S256"
    try:
        status, body = await _post(client, provider.device_authorization_endpoint, form)
    except _http_error() as exc:
        raise IdpError(f"device authorization request failed: {type(exc).__name__}") from None
    return parse_device_authorization(status, body)


async def poll_token(
    client: httpx.AsyncClient,
    provider: ProviderConfig,
    device_code: Secret[str],
    pkce: Pkce | None,
) -> tuple[PollOutcome, dict[str, Any] | None]:
    """POST one token request; never raises for IdP or network trouble."""
    form = {
        "grant_type": DEVICE_GRANT,
        "device_code": device_code.reveal(),
        "client_id": provider.client_id,
    }
    if pkce is not None:
        form["code_verifier"] = pkce.verifier.reveal()
    try:
        status, body = await _post(client, provider.token_endpoint, form)
    except _http_error() as exc:
        return PollFailed(f"token request failed: {type(exc).__name__}"), None
    except IdpError as exc:
        return PollFailed(str(exc)), None
    return classify_token_response(status, body)
