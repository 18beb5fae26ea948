"""``X-Qwen-Client-Id`` syntax and the ``invalid_client_id`` error bodies (spec §3.7).

Theory of operation
-------------------
A client id is an opaque, daemon-issued token: 1–128 characters of ``[A-Za-z0-9._:-]``
(ASCII only; the check never lower-cases or normalises, so look-alike Unicode letters are
simply invalid). An absent or empty header means "anonymous". Anything else that does not
match is a client error: ``400 {"error": ..., "code": "invalid_client_id"}``, raised here as
:class:`InvalidClientId` and mapped to the wire by the middleware, before any session or
bridge call.

Whether a syntactically valid id is *registered* on a session or a workspace is the session
registry's business; this module only provides the two body shapes those refusals use so
every route words them the same way.

Pure functions, no I/O, no state.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "CLIENT_ID_HEADER",
    "INVALID_CLIENT_ID_BODY",
    "INVALID_CLIENT_ID_CODE",
    "INVALID_CLIENT_ID_MESSAGE",
    "MAX_CLIENT_ID_CHARS",
    "InvalidClientId",
    "InvalidClientIdBody",
    "is_valid_client_id",
    "unknown_session_client_body",
    "unknown_workspace_client_body",
    "validate_client_id",
]

CLIENT_ID_HEADER = "X-Qwen-Client-Id"
MAX_CLIENT_ID_CHARS = 128
INVALID_CLIENT_ID_CODE = "invalid_client_id"
INVALID_CLIENT_ID_MESSAGE = (
    "`X-Qwen-Client-Id` must be a non-empty token of 128 characters or fewer"
)

# ASCII-only character class; ``fullmatch`` so a trailing "\n" cannot slip past ``$``.
_CLIENT_ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}", re.ASCII)


class InvalidClientId(ValueError):
    """The *client* sent a malformed ``X-Qwen-Client-Id`` header (→ 400 invalid_client_id).

    The offending value is kept on ``.value`` for the log line (truncated there by the
    caller); it is never echoed in the syntax-error body.
    """

    def __init__(self, value: str) -> None:
        super().__init__(INVALID_CLIENT_ID_MESSAGE)
        self.value = value


class InvalidClientIdBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``{"error", "code": "invalid_client_id", "sessionId"?, "clientId"?}``."""

    error: str
    code: str = INVALID_CLIENT_ID_CODE
    session_id: str | UnsetType = UNSET
    client_id: str | UnsetType = UNSET

    def encode(self) -> bytes:
        return msgspec.json.encode(self)


INVALID_CLIENT_ID_BODY = InvalidClientIdBody(error=INVALID_CLIENT_ID_MESSAGE)
"""Body of the 400 for a syntactically malformed header."""


def is_valid_client_id(value: str) -> bool:
    """True iff ``value`` is 1–128 characters of ``[A-Za-z0-9._:-]``."""
    return _CLIENT_ID_RE.fullmatch(value) is not None


def validate_client_id(value: str | None) -> str | None:
    """The client id carried by a header value, or ``None`` for anonymous.

    ``None`` (header absent) and ``""`` (header present but empty) are anonymous. Any other
    value must be a valid id, returned unchanged; otherwise :class:`InvalidClientId`.
    Surrounding whitespace is *not* trimmed here: HTTP servers already strip optional
    whitespace around header values, so whatever is left is part of the value.
    """
    if value is None or value == "":
        return None
    if is_valid_client_id(value):
        return value
    raise InvalidClientId(value)


def unknown_session_client_body(session_id: str, client_id: str) -> InvalidClientIdBody:
    """400 body for a valid id that is not registered on the addressed session."""
    return InvalidClientIdBody(
        error=f'Client id "{client_id}" is not registered on session "{session_id}"',
        session_id=session_id,
        client_id=client_id,
    )


def unknown_workspace_client_body(client_id: str) -> InvalidClientIdBody:
    """400 body for a valid id unknown to every live session of the workspace."""
    return InvalidClientIdBody(
        error=f'Client id "{client_id}" is not registered for this workspace',
        client_id=client_id,
    )
