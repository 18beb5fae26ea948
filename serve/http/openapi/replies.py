"""The answers a route gives beyond its own: the security front's and the error tables'.

Why: a route's catalog entry (:mod:`serve.http.openapi.catalog`) lists what its handler
answers on purpose, but every request also passes the security front
(:mod:`serve.http.middleware`) and every domain exception goes through the one error
table (:mod:`serve.errors`). Listing those statuses by hand per route drifts the day a
route or a table row is added; here they are *derived*:

* :func:`front_replies`: what the front can answer on any route, in its order: 403 (Host
  allowlist, CORS, ``daemon_not_bound``), 401 (bearer; ``token_required`` on strict
  routes), 429 (the rate-limit tier of :func:`serve.ratelimit.classify`, with
  ``Retry-After`` and ``X-RateLimit-*``), 413 and 408 (the body limit and read timeout),
  400 (malformed URL encoding), 404 (a path parameter the rule's converter refuses),
  with the front's own body Structs;
* :func:`family_replies`: the error families a rule belongs to, each rendered from its
  table: ``session`` (:data:`serve.errors.SESSION_ERRORS` plus the ACP client's
  failures), ``files`` (:data:`serve.errors.FS_STATUS` with the file envelope),
  ``workspace`` (the same kinds in the daemon envelope, and the settings file's 409),
  ``plural`` (an unknown workspace), ``client`` (a malformed or unregistered
  ``X-Qwen-Client-Id``) and ``acp`` (the JSON-RPC error reply of the ``/acp`` routes).
  Which families a rule is in follows from its shape (:func:`families_of`), so a new
  ``/session/<session_id>/...`` route is documented with the session table's statuses
  without an entry here.

The document merges these with the catalog's replies status by status (bodies become
``anyOf``, a header is required only if every merged reply sends it). Pure data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from serve.acpfront.jsonrpc import ErrorReply
from serve.errors import FS_STATUS, SESSION_ERRORS, SETTINGS_FILE_STATUS
from serve.http.middleware import PUBLIC_PAGES
from serve.http.openapi.types import ErrorEnvelope, FileErrorBody
from serve.http.security._wire import ErrorBody
from serve.http.security.clientid import InvalidClientIdBody
from serve.http.security.strict import is_strict
from serve.ratelimit import RateLimitBody, classify

__all__ = [
    "HEADERS",
    "JSON",
    "Reply",
    "families_of",
    "family_replies",
    "front_replies",
]

JSON: Final = "application/json"


class Reply(msgspec.Struct, frozen=True):
    """One documented response: status, description, body type (``None``: no body; a tuple
    of types: any one of them), media type, and the headers it always sends."""

    status: int
    description: str
    body: object = None  # a type expression
    media: str = JSON
    headers: tuple[str, ...] = ()


RETRY_AFTER: Final = "Retry-After"
_INT_HEADER: Final[dict[str, Any]] = {"type": "string", "pattern": "^[0-9]+$"}
#: Response headers the document describes, by name: (schema, description).
HEADERS: Final[dict[str, tuple[dict[str, Any], str]]] = {
    RETRY_AFTER: (_INT_HEADER, "Seconds to wait before retrying."),
    "X-RateLimit-Limit": (_INT_HEADER, "The tier's budget per window."),
    "X-RateLimit-Remaining": (_INT_HEADER, "Requests left in the window (0 on a 429)."),
    "X-RateLimit-Reset": (_INT_HEADER, "When the budget refills (Unix seconds)."),
    "Acp-Connection-Id": ({"type": "string"}, "The ACP connection id (send it back)."),
}
_RATE_HEADERS: Final = (
    RETRY_AFTER,
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
)


# ---- the security front -------------------------------------------------------------------


def front_replies(method: str, rule: str, *, has_params: bool) -> list[Reply]:
    """What :class:`serve.http.middleware.SecurityFront` (and the app's routing) can answer
    on ``(method, rule)`` before its handler runs."""
    out = [
        Reply(
            403,
            "Refused by the front: `Invalid Host header`, `Request denied by CORS policy`, "
            "or `daemon_not_bound` (a late-bound daemon before its bind).",
            ErrorBody,
        ),
        Reply(400, "Malformed URL encoding (`invalid_request`).", ErrorBody),
        Reply(413, "Request body too large (`--max-body-bytes`).", ErrorBody),
        Reply(408, "The request body did not arrive in time.", ErrorBody),
    ]
    if rule not in PUBLIC_PAGES:  # /health and /readyz too: --require-auth, ?deep=1
        out.append(
            Reply(401, 'Missing or wrong bearer token (`{"error":"Unauthorized"}`).', ErrorBody)
        )
    if is_strict(method, rule):
        out.append(
            Reply(401, "`token_required`: the daemon has no token (strict route).", ErrorBody)
        )
    if classify(method, _sample_path(rule)) is not None:
        out.append(
            Reply(
                429,
                "`rate_limit_exceeded` (`--rate-limit`; `tier`, `retryAfterMs`).",
                RateLimitBody,
                headers=_RATE_HEADERS,
            )
        )
    if has_params:
        out.append(
            Reply(404, "A path parameter this route does not take (`Not found`).", ErrorBody)
        )
    return out


_PARAM: Final = re.compile(r"<[^>]+>")


def _sample_path(rule: str) -> str:
    """A concrete path of ``rule`` for :func:`classify` (which looks at path shapes only)."""
    return _PARAM.sub("x", rule)


# ---- the error families -------------------------------------------------------------------


def _status_headers(rows: Iterable[tuple[int, dict[str, str]]]) -> dict[int, tuple[str, ...]]:
    """Per status, the headers every row of that status sends."""
    common: dict[int, set[str]] = {}
    for status, headers in rows:
        names = set(headers)
        common[status] = common[status] & names if status in common else names
    return {status: tuple(sorted(names)) for status, names in common.items()}


def _session_family() -> tuple[Reply, ...]:
    rows = [(status, headers) for _, status, headers in SESSION_ERRORS]
    # The ACP client's failures (serve/errors/table.py): the agent's own JSON-RPC error
    # (500, numeric `code`), a closed channel (503 + Retry-After), no answer in time (504
    # + Retry-After).
    rows += [(500, {}), (503, {RETRY_AFTER: "5"}), (504, {RETRY_AFTER: "5"})]
    headers = _status_headers(rows)
    descriptions = {
        400: "A request the session or its agent refused (`code`).",
        402: "`budget_exhausted`: raise the budget (PATCH /session/{id}/budget).",
        404: "`session_not_found`, or the agent lost the session.",
        409: "`session_busy` or a conflicting request.",
        500: "The agent failed the call (its JSON-RPC `code`, `data`).",
        501: "`not_supported_by_agent`: the agent lacks this method.",
        503: "Draining, a limit reached, or the agent unavailable (`code`).",
        504: "The agent did not answer in time (`init_timeout`, `agent_timeout`, ...).",
    }
    return tuple(
        Reply(
            status,
            descriptions.get(status, "A session error (`code`)."),
            ErrorEnvelope,
            headers=headers[status],
        )
        for status in sorted(headers)
    )


def _fs_kinds() -> dict[int, list[str]]:
    """The file-system error kinds of :data:`serve.errors.FS_STATUS` by status."""
    kinds: dict[int, list[str]] = {}
    for kind, status in FS_STATUS.items():
        kinds.setdefault(status, []).append(f"`{kind}`")
    return kinds


def _files_family() -> tuple[Reply, ...]:
    return tuple(
        Reply(status, ", ".join(names) + ".", (FileErrorBody, ErrorEnvelope))
        for status, names in sorted(_fs_kinds().items())
    )


def _workspace_family() -> tuple[Reply, ...]:
    kinds = _fs_kinds()
    kinds.setdefault(SETTINGS_FILE_STATUS, []).append("the settings file could not be used")
    return tuple(
        Reply(status, ", ".join(names) + ".", ErrorEnvelope)
        for status, names in sorted(kinds.items())
    )


_ACP_FAMILY: Final = (
    Reply(400, "Not a JSON-RPC message, no `Acp-Connection-Id`, or bad params.", ErrorReply),
    Reply(401, "`token_required` (a strict method on a daemon without a token).", ErrorReply),
    Reply(403, "`session_not_owned`: the session is not this connection's.", ErrorReply),
    Reply(
        404,
        'Unknown connection or workspace (JSON-RPC error); `{"error":"Not found"}` when '
        "`/acp` is off (`QWEN_SERVE_ACP_HTTP=0`).",
        (ErrorReply, ErrorEnvelope),
    ),
    Reply(429, "`rate_limit_exceeded` or `too_many_inflight`.", ErrorReply),
    Reply(503, "The ACP front is not running, draining, or a connection limit.", ErrorReply),
)

_FAMILIES: Final[dict[str, tuple[Reply, ...]]] = {
    "session": _session_family(),
    "files": _files_family(),
    "workspace": _workspace_family(),
    "plural": (Reply(404, "`workspace_not_found`: no such served workspace.", ErrorEnvelope),),
    "client": (
        Reply(400, "`invalid_client_id`: malformed, or not registered here.", InvalidClientIdBody),
    ),
    "acp": _ACP_FAMILY,
}

_FILE_RULES: Final = re.compile(r"^(/workspaces//?<path:workspace>)?/(file|stat|list|glob)(/|$)")
_PLURAL_RULES: Final = re.compile(r"^/workspaces//?<path:workspace>/")
_ACP_RULES: Final = re.compile(r"^(/workspaces//?<path:workspace>)?/acp$")


def families_of(method: str, rule: str) -> tuple[str, ...]:
    """The error families of ``(method, rule)``, from its shape."""
    del method  # every method of a rule shares its families
    if _ACP_RULES.match(rule):
        return ("acp",)
    out: list[str] = []
    if _PLURAL_RULES.match(rule):
        out.append("plural")
    if rule == "/session" or rule.startswith(("/session/", "/permission/")):
        out += ["session", "client"]
    elif _FILE_RULES.match(rule):
        out += ["files", "client"]
    elif rule.startswith(("/workspace/", "/workspaces/")):
        out += ["workspace", "client"]
    return tuple(out)


def family_replies(families: Iterable[str]) -> list[Reply]:
    """The replies of the named families, in order."""
    return [reply for name in families for reply in _FAMILIES[name]]
