"""W3C trace context (``traceparent``) carried into the daemon's logs.

ACP reserves the root ``_meta`` keys ``traceparent``, ``tracestate`` and ``baggage`` for W3C
trace context (the extensibility page of the protocol). A request that carries a valid
``traceparent`` (``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``, neither id all
zeros) runs with it in :data:`current` (a context variable: trio tasks started meanwhile
inherit it); :class:`TraceFilter`, on the root log handler, stamps every record logged in
that context with ``trace_id`` and ``span_id`` (the parent id), which the JSON log format
writes as fields and the text format as a ``[trace <trace_id>]`` suffix. An invalid value is
ignored (never an error: tracing must not break a request). Nothing here does I/O.
"""

from __future__ import annotations

import contextvars
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

_TRACEPARENT: Final = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

#: (trace id, parent span id) of the request being handled, if it carried one.
current: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "traceparent", default=None
)


def parse(value: object) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of a valid ``traceparent``, else None."""
    if not isinstance(value, str) or len(value) > 128:
        return None
    match = _TRACEPARENT.match(value.strip())  # lowercase hex only, as W3C requires
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = match.group(2), match.group(3)
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


def from_meta(params: object) -> tuple[str, str] | None:
    """The trace context of a JSON-RPC request's ``params._meta.traceparent``."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    return parse(meta.get("traceparent")) if isinstance(meta, dict) else None


@contextmanager
def traced(trace: tuple[str, str] | None) -> Iterator[None]:
    """Run the block with ``trace`` as the current trace context (no-op for None)."""
    if trace is None:
        yield
        return
    token = current.set(trace)
    try:
        yield
    finally:
        current.reset(token)


class TraceFilter(logging.Filter):
    """Stamps records with the current ``trace_id``/``span_id`` (runs on the caller's
    thread, before a record is queued for the writer)."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace = current.get()
        if trace is not None and getattr(record, "trace_id", None) is None:
            record.trace_id, record.span_id = trace
        return True
