"""REST requests in their W3C trace context: the ``traceparent`` header (serve/tracecontext).

A ``before_request`` hook sets the request's trace context (None without a valid header, so
nothing carries over between requests): every log record made while the request is handled
(its access-log line included, with ``--access-log``) carries ``trace_id`` and ``span_id``.

With OpenTelemetry tracing on (serve/telemetry), :class:`TracedFront`, the outermost ASGI
callable, runs every HTTP request in a ``server`` span whose parent is the
request's ``traceparent`` header (else a new trace); the hook above names it after the
matched route (``POST /session/<session_id>/prompt``). With tracing off it is not installed.
"""

from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from acp import telemetry
from serve import tracecontext
from serve.http.middleware import ASGIApp, Message, Receive, Scope, Send


def install(app: QuartTrio) -> None:
    @app.before_request
    async def _trace() -> None:
        tracecontext.current.set(tracecontext.parse(request.headers.get("traceparent")))
        rule = request.url_rule
        if rule is not None and telemetry.enabled():
            span = telemetry.current()
            span.set_name(f"{request.method} {rule.rule}")
            span.set_attribute("http.route", rule.rule)


class TracedFront:
    """ASGI: one span per HTTP request (installed only with tracing on). A WebSocket gets
    none: it can live for hours, and each of its ``/acp`` messages has its own span."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        parent = None
        for name, value in scope.get("headers") or ():
            if name == b"traceparent":
                parent = value.decode("latin-1")
                break
        method = scope.get("method", "GET")
        attributes = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        with telemetry.span(method, parent=parent, kind="server", attributes=attributes) as span:

            async def traced_send(message: Message) -> None:
                if message.get("type") == "http.response.start":
                    status = int(message.get("status", 0))
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_error(f"HTTP {status}")
                await send(message)

            await self._app(scope, receive, traced_send)
