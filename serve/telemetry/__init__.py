"""OpenTelemetry traces of the daemon: whether they are on, and their start and stop.

The spans themselves are made through the facade :mod:`acp.telemetry` (a no-op until
:func:`start` installs a tracer), so a daemon with tracing off imports nothing of
OpenTelemetry (``runtime.tracing.sdkLoaded`` in ``/daemon/status`` shows it) and a traced
place costs one global lookup. docs/tracing.md lists the spans and the settings.

Tracing is on when ``--otel-endpoint URL`` is given, or when the environment asks for it as
the OpenTelemetry SDK defines it: ``OTEL_TRACES_EXPORTER`` set to ``otlp`` or ``console``, or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` set; it is off with
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` (the flag still turns it on).
Agent children inherit the daemon's environment, ``OTEL_*`` included: an agent that traces
exports to the same collector, and joins the prompt's trace through ``_meta.traceparent``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from acp import telemetry

if TYPE_CHECKING:
    from serve.telemetry.otel import OtelTracer

log = logging.getLogger(__name__)

#: How long the exit waits for the last spans to be exported (an unreachable collector).
SHUTDOWN_FLUSH_S: Final = 5.0

_active: OtelTracer | None = None
_endpoint: str | None = None


class TracingConfigError(Exception):
    """Tracing was asked for with settings this daemon cannot honour."""


def wanted(endpoint: str | None, env: Mapping[str, str] = os.environ) -> bool:
    """Whether tracing is on (see the module docstring)."""
    if endpoint:
        return True
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def start(endpoint: str | None) -> bool:
    """Turn tracing on when :func:`wanted` (imports the SDK); True when on.
    :class:`TracingConfigError` for an exporter or protocol it cannot use."""
    global _active, _endpoint
    if not wanted(endpoint):
        return False
    # lazy: the OpenTelemetry SDK is loaded only with tracing on
    from serve.telemetry.otel import ConfigError, OtelTracer

    try:
        tracer = OtelTracer(endpoint or None)
    except ConfigError as exc:
        raise TracingConfigError(str(exc)) from exc
    _active, _endpoint = tracer, endpoint
    telemetry.install(tracer)
    shown = _shown(endpoint) if endpoint else "from OTEL_*"
    log.info("OpenTelemetry tracing on (exporter endpoint: %s)", shown)
    return True


def stop(timeout_s: float = SHUTDOWN_FLUSH_S) -> None:
    """Export the spans still queued, within ``timeout_s``, and turn tracing off. Called
    after the trio loop has ended (it blocks its thread up to ``timeout_s``)."""
    global _active
    tracer, _active = _active, None
    telemetry.install(None)
    if tracer is not None and not tracer.shutdown(timeout_s):
        log.warning("tracing: the last spans were not exported within %.1f s", timeout_s)


def status() -> dict[str, Any]:
    """``runtime.tracing`` of ``/daemon/status``."""
    return {
        "enabled": _active is not None,
        "sdkLoaded": "opentelemetry" in sys.modules,
        **({"endpoint": _shown(_endpoint)} if _endpoint else {}),
    }


def _shown(url: str) -> str:
    """``url`` without a ``user:password@`` part (status pages are read by many)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"
