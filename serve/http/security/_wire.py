"""Wire shapes shared by the security front's error responses.

Every refusal the front door produces is a small JSON object with an ``error`` string and,
for most of them, a machine-readable ``code``. They are frozen msgspec Structs so the
middleware encodes them with ``msgspec.json.encode(body)`` and the field order on the wire
is the declaration order. Fields left ``UNSET`` are omitted, which is how the uniform
``401 {"error":"Unauthorized"}`` carries no ``code``.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["ErrorBody"]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """``{"error": <message>, "code"?: <code>}``."""

    error: str
    code: str | UnsetType = UNSET

    def encode(self) -> bytes:
        """The JSON bytes of this body."""
        return msgspec.json.encode(self)
