"""Standard Webhooks signatures (https://www.standardwebhooks.com/), pure.

A secret is ``whsec_`` + base64 of 24 to 64 random bytes; the key is the decoded bytes.
``webhook-signature`` is ``v1,`` + base64(HMAC-SHA256(key, "{id}.{timestamp}.{body}")).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

__all__ = ["PREFIX", "key_of", "new_secret", "sign", "verify"]

PREFIX = "whsec_"
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


def new_secret() -> str:
    """A fresh secret (32 random bytes)."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def key_of(secret: str) -> bytes:
    """The HMAC key of ``secret``; ``ValueError`` says what is wrong with it."""
    if not secret.startswith(PREFIX):
        raise ValueError(f"a secret starts with `{PREFIX}`")
    try:
        key = base64.b64decode(secret[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"a secret is `{PREFIX}` followed by base64") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a secret holds {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one delivery."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: str, msg_id: str, timestamp: int, body: bytes, header: str) -> bool:
    """Whether any ``v1`` signature in ``header`` (space-separated) matches."""
    expected = sign(secret, msg_id, timestamp, body)
    return any(hmac.compare_digest(expected, part) for part in header.split())
