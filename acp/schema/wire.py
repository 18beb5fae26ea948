"""The base of every ACP wire type and the lenient decoding of what an agent sends.

:class:`Wire` fixes the encoding (camelCase keys, defaults omitted, keyword-only fields);
:func:`lenient` / :func:`lenient_list` decode an optional part of an agent's answer so that a
malformed part becomes ``None`` (or is skipped) instead of failing the call, as the schema's
``x-deserialize-default-on-error`` annotations ask. Nothing here does I/O.
"""

from __future__ import annotations

import logging
from typing import Final

import msgspec
from msgspec import Raw

log = logging.getLogger(__name__)

PROTOCOL_VERSION: Final = 1
EMPTY_RAW: Final = Raw(b"")


class Wire(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True, kw_only=True):
    """Base of every ACP wire type: camelCase keys, defaults omitted, keyword-only."""


def lenient[T](raw: Raw | bytes, typ: type[T], *, what: str = "") -> T | None:
    """Decode ``raw`` as ``typ``; absent/``null``/malformed gives ``None`` (logged at debug)."""
    if not raw or bytes(raw) == b"null":
        return None
    try:
        return msgspec.json.decode(raw, type=typ)
    except msgspec.DecodeError as exc:
        log.debug("ignoring malformed %s from agent: %s", what or typ.__name__, exc)
        return None


def lenient_list[T](raw: Raw | bytes, typ: type[T], *, what: str = "") -> list[T] | None:
    """Decode a JSON array item by item, skipping invalid items; ``None`` if not an array."""
    items = lenient(raw, list[Raw], what=what)
    if items is None:
        return None
    out: list[T] = []
    for item in items:
        value = lenient(item, typ, what=what)
        if value is not None:
            out.append(value)
    return out
