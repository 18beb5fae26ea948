"""The OpenTelemetry implementation of the tracing facade (:mod:`acp.telemetry`).

Imported only when tracing is on (:func:`serve.telemetry.start`): the SDK's
``TracerProvider`` with the sampler of ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``,
the resource of ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` (service name
``acp-serve`` unless set), and a ``BatchSpanProcessor`` (``OTEL_BSP_*``: its queue of 2048
spans by default is the bound; a full queue drops spans, never blocks) feeding the exporter
``OTEL_TRACES_EXPORTER`` names (a list): ``otlp`` (OTLP/HTTP protobuf to ``--otel-endpoint``, else
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``;
``OTEL_EXPORTER_OTLP_*HEADERS``, ``*TIMEOUT``, ``*COMPRESSION``, ``*CERTIFICATE`` as the SDK
reads them) or ``console``.

Ending a span hands it to the processor's queue (a lock held for an append); the export runs
on the processor's own thread, so nothing here blocks the trio loop. The current span is
this module's context variable (never OpenTelemetry's global context), so a trio task
inherits the span current where it was started.
"""

from __future__ import annotations

import contextvars
import os
import re
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Final

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from acp.telemetry import NOOP_SPAN, Attributes, AttributeValue, Span

_TRACEPARENT: Final = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_KINDS: Final = {
    "internal": SpanKind.INTERNAL,
    "server": SpanKind.SERVER,
    "client": SpanKind.CLIENT,
    "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER,
}
_ROOT: Final = Context()
_current: contextvars.ContextVar[trace_api.Span | None] = contextvars.ContextVar(
    "otel_span", default=None
)


class ConfigError(Exception):
    """The OTEL_* settings name something this daemon cannot export to."""


def parent_context(traceparent: str | None) -> Context | None:
    """The OpenTelemetry context of a valid W3C ``traceparent`` (a remote parent)."""
    if not isinstance(traceparent, str) or len(traceparent) > 128:
        return None
    match = _TRACEPARENT.match(traceparent.strip())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = int(match.group(2), 16), int(match.group(3), 16)
    if not trace_id or not span_id:
        return None
    context = SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(match.group(4), 16) & 1)
    )
    return trace_api.set_span_in_context(trace_api.NonRecordingSpan(context), _ROOT)


def traceparent_of(span: trace_api.Span) -> str | None:
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


class _OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: trace_api.Span) -> None:
        self._span = span

    @property
    def traceparent(self) -> str | None:
        return traceparent_of(self._span)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def set_name(self, name: str) -> None:
        self._span.update_name(name)

    def set_error(self, description: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, description))


def _exporters(endpoint: str | None) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (a comma-separated list; ``otlp`` by
    default and always with ``--otel-endpoint``)."""
    value = os.environ.get("OTEL_TRACES_EXPORTER", "")
    names = {n.strip().lower() for n in value.split(",") if n.strip()} - {"none"} or {"otlp"}
    if endpoint is not None:
        names.add("otlp")
    unknown = sorted(names - {"otlp", "console"})
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={unknown[0]!r} is not supported (otlp, console, none)"
        )
    out: list[SpanExporter] = []
    if "otlp" in names:
        protocol = (
            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        if protocol != "http/protobuf":
            raise ConfigError(
                f"OTLP protocol {protocol!r} is not supported (acp-serve exports http/protobuf)"
            )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        out.append(OTLPSpanExporter(endpoint=endpoint))
    if "console" in names:
        out.append(ConsoleSpanExporter())
    return out


class OtelTracer:
    """The facade's :class:`~acp.telemetry.Tracer` over the OpenTelemetry SDK."""

    def __init__(self, endpoint: str | None) -> None:
        resource = Resource.create(
            {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "acp-serve"}
        )
        # The sampler is OTEL_TRACES_SAMPLER's; no atexit hook (an unbounded wait for a
        # collector that is down): serve.telemetry.stop() flushes, within its bound.
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        for exporter in _exporters(endpoint):
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("acp-serve")

    def _context(self, parent: str | None) -> Context:
        if parent is not None:
            remote = parent_context(parent)
            if remote is not None:
                return remote
        here = _current.get()
        return _ROOT if here is None else trace_api.set_span_in_context(here, _ROOT)

    @contextmanager
    def _block(
        self,
        name: str,
        parent: str | None,
        kind: str,
        attributes: Attributes | None,
        start_ns: int | None,
    ) -> Iterator[Span]:
        span = self._tracer.start_span(
            name,
            context=self._context(parent),
            kind=_KINDS.get(kind, SpanKind.INTERNAL),
            attributes=attributes,
            start_time=start_ns,
        )
        token = _current.set(span)
        try:
            yield _OtelSpan(span)
        except BaseException as exc:
            if isinstance(exc, Exception):
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            else:  # trio.Cancelled, KeyboardInterrupt: the block was cut short
                span.set_attribute("acp_serve.cancelled", True)
            raise
        finally:
            _current.reset(token)
            span.end()

    def span(
        self,
        name: str,
        *,
        parent: str | None,
        kind: str,
        attributes: Attributes | None,
        start_ns: int | None,
    ) -> AbstractContextManager[Span]:
        return self._block(name, parent, kind, attributes, start_ns)

    def record(
        self,
        name: str,
        *,
        start_ns: int,
        end_ns: int,
        parent: str | None,
        attributes: Attributes | None,
    ) -> None:
        span = self._tracer.start_span(
            name, context=self._context(parent), attributes=attributes, start_time=start_ns
        )
        span.end(end_time=max(start_ns, end_ns))

    def current_traceparent(self) -> str | None:
        here = _current.get()
        return None if here is None else traceparent_of(here)

    def current(self) -> Span:
        here = _current.get()
        return NOOP_SPAN if here is None else _OtelSpan(here)

    def shutdown(self, timeout_s: float) -> bool:
        """Export what is queued and stop, within ``timeout_s`` (on a daemon thread: an
        unreachable collector does not hold the exit). True when it finished in time."""
        provider = self.provider

        def stop() -> None:
            provider.force_flush(timeout_millis=int(timeout_s * 1000))
            provider.shutdown()

        thread = threading.Thread(target=stop, name="otel-shutdown", daemon=True)
        thread.start()
        thread.join(timeout_s)
        return not thread.is_alive()
