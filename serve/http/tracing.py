"""REST requests in their W3C trace context: the ``traceparent`` header (serve/tracecontext).

A ``before_request`` hook sets the request's trace context (None without a valid header, so
nothing carries over between requests): every log record made while the request is handled
(its access-log line included, with ``--access-log``) carries ``trace_id`` and ``span_id``.
"""

from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from serve import tracecontext


def install(app: QuartTrio) -> None:
    @app.before_request
    async def _trace() -> None:
        tracecontext.current.set(tracecontext.parse(request.headers.get("traceparent")))
