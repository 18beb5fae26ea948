"""The vocabulary of the operation catalog: what one documented operation is.

:class:`Operation` (a summary, the request body type, query and header parameters, the
replies its handler gives on purpose) and :class:`Param`, the small constructors the
catalog is written with (``ok``, ``err``, ``file_err``, ``q``, ``h``), and the parameters
and replies many operations share (the client id header, ``session_not_found``, the 503s).
:mod:`serve.http.openapi.catalog` is the table written in it; this module knows no route.

Pure data; no I/O.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from serve.http.openapi import types as t
from serve.http.openapi.replies import RETRY_AFTER, Reply

SSE: Final = "text/event-stream"
HTML: Final = "text/html"
TEXT: Final = "text/plain"


class Param(msgspec.Struct, frozen=True):
    """A query or header parameter; ``schema`` is a JSON Schema object."""

    name: str
    location: Literal["query", "header"]
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


class Operation(msgspec.Struct, frozen=True):
    """One documented route. ``public``: no bearer needed on loopback binds (``/health``)."""

    summary: str
    replies: tuple[Reply, ...]
    body: object = None  # a type expression
    body_required: bool = False
    params: tuple[Param, ...] = ()
    description: str = ""
    public: bool = False
    #: The error families (:mod:`serve.http.openapi.replies`) beside ``replies``;
    #: ``None``: those of the rule's shape (:func:`~serve.http.openapi.replies.families_of`).
    families: tuple[str, ...] | None = None


# ---- building blocks ---------------------------------------------------------------------------

OPEN_OBJECT: Final = dict[str, Any]


def ok(body: object, description: str = "OK", status: int = 200) -> Reply:
    return Reply(status, description, body)


def err(status: int, description: str) -> Reply:
    return Reply(status, description, t.ErrorEnvelope)


def file_err(status: int, description: str) -> Reply:
    """A file-route error: the file envelope, or the daemon-wide one (malformed JSON or URL
    encoding, an unregistered client id, the security front's refusals)."""
    return Reply(status, description, (t.FileErrorBody, t.ErrorEnvelope))


def q(name: str, schema: dict[str, Any], description: str = "", required: bool = False) -> Param:
    return Param(name, "query", schema, description, required)


def h(name: str, schema: dict[str, Any], description: str = "") -> Param:
    return Param(name, "header", schema, description)


STRING: Final[dict[str, Any]] = {"type": "string"}
FLAG: Final[dict[str, Any]] = {"type": "string", "enum": ["", "1", "true", "0", "false"]}
CLIENT_ID = h(
    "X-Qwen-Client-Id",
    {"type": "string", "pattern": "^[A-Za-z0-9._:-]{0,128}$"},
    "The daemon-issued client id (from POST /session); must be registered on the session "
    "(session routes) or on a live session of the workspace (workspace routes). Empty: "
    "anonymous, as if absent.",
)
ACP_CONNECTION = h("Acp-Connection-Id", STRING, "The connection id `initialize` answered.")
ACP_SESSION = h("Acp-Session-Id", STRING, "A session of this connection.")
NO_SESSION = err(404, "No such session (`session_not_found`).")
BAD_REQUEST = err(400, "Invalid input (`code` names the field or rule).")
BAD_JSON = err(400, "Malformed JSON, or a field of the wrong type.")
UNAVAILABLE = Reply(
    503,
    "Draining or a limit reached (`code`; `Retry-After`).",
    t.ErrorEnvelope,
    headers=(RETRY_AFTER,),
)
#: A create or restore whose agent could not start (``Retry-After`` only when retryable).
AGENT_START = Reply(
    503,
    "Draining, a limit reached, or the agent did not start: `acp_channel_unavailable` "
    "(retryable, `Retry-After`; `retryable: false` with `consecutiveFailures` and no "
    "`Retry-After` once the same command failed to start by exiting 3 times in a row, "
    "the pool `failing`), or `agent_sandbox_denied` (`retryable: false`, no "
    "`Retry-After`: the file sandbox refused the agent `path`; `grantFlag` is the "
    "`--agent-allow-write DIR` that allows it, null for a protected place).",
    t.ErrorEnvelope,
)
