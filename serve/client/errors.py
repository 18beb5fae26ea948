"""The client's exception tree, and the one place HTTP answers become exceptions.

Who failed is the type::

    AcpServeClientError                 base of everything this package raises
    ├── DaemonUnreachableError          the network: connect/read failed (cause chained)
    ├── ProtocolError                   the daemon: a body or SSE frame not in the v1 shape
    ├── MissingCapabilityError          the daemon build: a required feature tag is absent
    ├── EventStreamLostError            the network, persistently: reconnects exhausted
    └── DaemonHttpError(status, body)   the daemon answered with an error status
        ├── BadRequestError             400 (the request was wrong)
        ├── UnauthorizedError           401 (missing or wrong bearer token; strict-route
        │                                    ``token_required`` included)
        ├── ForbiddenError              403
        ├── NotFoundError               404 (unknown session, resolved permission, missing file)
        ├── ConflictError               409 (stale ``expectedHash``, file exists, restore race)
        ├── PayloadTooLargeError        413
        ├── RateLimitedError            429 (rate limit, SSE subscriber limit)
        ├── ServerError                 5xx other than 503 (agent errors keep their code)
        └── ServiceUnavailableError     503 (queue full, session limit, draining, agent gone)

``DaemonHttpError.code`` is the body's ``code`` (a string for daemon errors, an int for
JSON-RPC errors relayed from the agent) or, on the file routes, the body's ``errorKind``;
``retry_after_s`` is the ``Retry-After`` header when the daemon sent one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "AcpServeClientError",
    "BadRequestError",
    "ConflictError",
    "DaemonHttpError",
    "DaemonUnreachableError",
    "EventStreamLostError",
    "ForbiddenError",
    "MissingCapabilityError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProtocolError",
    "RateLimitedError",
    "ServerError",
    "ServiceUnavailableError",
    "UnauthorizedError",
    "error_for_status",
]


class AcpServeClientError(Exception):
    """Base of every exception raised by :mod:`serve.client`."""


class DaemonUnreachableError(AcpServeClientError):
    """The daemon could not be reached or the connection broke (``__cause__`` has why)."""


class ProtocolError(AcpServeClientError):
    """The daemon answered something that is not the v1 wire shape."""


class EventStreamLostError(AcpServeClientError):
    """An event stream could not be re-established within its reconnect budget."""

    def __init__(self, session_id: str, attempts: int, last_event_id: int | None) -> None:
        super().__init__(
            f"event stream of session {session_id} lost after {attempts} reconnect attempts"
            f" (last event id {last_event_id})"
        )
        self.session_id = session_id
        self.attempts = attempts
        self.last_event_id = last_event_id


class MissingCapabilityError(AcpServeClientError):
    """The daemon does not advertise a feature tag the caller requires."""

    def __init__(self, missing: Iterable[str]) -> None:
        self.missing = tuple(missing)
        super().__init__("daemon does not support: " + ", ".join(self.missing))


class DaemonHttpError(AcpServeClientError):
    """The daemon answered ``status`` with the JSON ``body`` (``{}`` when not JSON)."""

    def __init__(
        self,
        status: int,
        body: Mapping[str, Any],
        *,
        method: str = "",
        url: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        self.status = status
        self.body: Mapping[str, Any] = body
        self.method = method
        self.url = url
        self.retry_after_s = retry_after_s
        message = body.get("error")
        text = message if isinstance(message, str) else f"HTTP {status}"
        where = f" ({method} {url})" if method else ""
        code = self.code
        super().__init__(f"{status} {text}" + (f" [{code}]" if code is not None else "") + where)

    @property
    def code(self) -> str | int | None:
        """The body's ``code`` (or ``errorKind`` on the file routes), if any."""
        code = self.body.get("code")
        if isinstance(code, (str, int)) and not isinstance(code, bool):
            return code
        kind = self.body.get("errorKind")
        return kind if isinstance(kind, str) else None

    @property
    def message(self) -> str:
        message = self.body.get("error")
        return message if isinstance(message, str) else f"HTTP {self.status}"


class BadRequestError(DaemonHttpError):
    """400: the request was malformed or named something invalid."""


class UnauthorizedError(DaemonHttpError):
    """401: the bearer token is missing or wrong, or the route needs a configured token."""


class ForbiddenError(DaemonHttpError):
    """403: the daemon refused the caller (policy, untrusted workspace)."""


class NotFoundError(DaemonHttpError):
    """404: no such session, permission request or file."""


class ConflictError(DaemonHttpError):
    """409: the state changed under the caller (``hash_mismatch``, ``file_already_exists``)."""


class PayloadTooLargeError(DaemonHttpError):
    """413: a body or file over the daemon's limit."""


class RateLimitedError(DaemonHttpError):
    """429: slow down (see ``retry_after_s``)."""


class ServerError(DaemonHttpError):
    """5xx: the daemon or its agent failed (agent JSON-RPC errors keep their int code)."""


class ServiceUnavailableError(ServerError):
    """503: temporarily unavailable (queue full, limits, draining, agent channel closed)."""


_BY_STATUS: dict[int, type[DaemonHttpError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_for_status(
    status: int,
    body: Mapping[str, Any],
    *,
    method: str = "",
    url: str = "",
    retry_after: str | None = None,
) -> DaemonHttpError:
    """The exception for an error answer; the mapping lives here and nowhere else."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else DaemonHttpError
    return cls(status, body, method=method, url=url, retry_after_s=_retry_after(retry_after))
