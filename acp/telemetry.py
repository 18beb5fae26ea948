"""The tracing facade: what the daemon's code calls to make a span, a no-op until a tracer
is installed.

Theory of operation
-------------------
Every traced place calls :func:`span` (a context manager) or :func:`record` (a span whose
times are known after the fact, e.g. a queue wait). With no tracer installed (tracing off,
the default) :func:`span` returns one shared, stateless no-op context manager and
:func:`record` returns at once: no OpenTelemetry module is imported and a traced place costs
a global lookup and a call. ``serve.telemetry`` installs the OpenTelemetry implementation
(:func:`install`) when the daemon starts with tracing on; ``acp`` knows only this module, so
the agent RPC layer (:mod:`acp.rpc`) traces without importing ``serve``.

Parents: a span's parent is the ``traceparent`` given (a W3C ``traceparent`` string: what a
caller sent in an HTTP header or ACP ``_meta``, or what a span of another task handed over,
e.g. a prompt admitted by an HTTP request and run by the session's turn task), else the
span current in this task (:func:`current_traceparent`; trio tasks inherit it from the task
that started them), else none (a new trace).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Final, Protocol

type AttributeValue = str | bool | int | float
type Attributes = Mapping[str, AttributeValue]


class Span(Protocol):
    """The span a :func:`span` block runs in."""

    @property
    def traceparent(self) -> str | None:
        """Its W3C ``traceparent`` (what a child in another task or process names as its
        parent); None for the no-op span."""
        ...

    def set_attribute(self, key: str, value: AttributeValue) -> None: ...

    def set_name(self, name: str) -> None: ...

    def set_error(self, description: str) -> None:
        """Mark the span failed (status ERROR) without an exception."""
        ...


class Tracer(Protocol):
    """What :mod:`serve.telemetry` installs (the OpenTelemetry SDK behind it)."""

    def span(
        self,
        name: str,
        *,
        parent: str | None,
        kind: str,
        attributes: Attributes | None,
        start_ns: int | None,
    ) -> AbstractContextManager[Span]: ...

    def record(
        self,
        name: str,
        *,
        start_ns: int,
        end_ns: int,
        parent: str | None,
        attributes: Attributes | None,
    ) -> None: ...

    def current_traceparent(self) -> str | None: ...

    def current(self) -> Span: ...


class _NoopSpan:
    __slots__ = ()

    @property
    def traceparent(self) -> str | None:
        return None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass

    def set_name(self, name: str) -> None:
        pass

    def set_error(self, description: str) -> None:
        pass


class _NoopBlock:
    """A reusable, stateless ``with`` block yielding the no-op span."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return NOOP_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


NOOP_SPAN: Final[Span] = _NoopSpan()
_NOOP_BLOCK: Final = _NoopBlock()
_tracer: Tracer | None = None


def install(tracer: Tracer | None) -> None:
    """Make ``tracer`` the one every :func:`span` uses (None: back to the no-op)."""
    global _tracer
    _tracer = tracer


def enabled() -> bool:
    return _tracer is not None


def span(
    name: str,
    *,
    parent: str | None = None,
    kind: str = "internal",
    attributes: Attributes | None = None,
    start_ns: int | None = None,
) -> AbstractContextManager[Span]:
    """A block traced as one span (see the module docstring for its parent). ``kind`` is
    ``internal``, ``server`` or ``client``; ``start_ns`` back-dates its start
    (``time.time_ns()``). An exception leaving the block marks it failed."""
    tracer = _tracer
    if tracer is None:
        return _NOOP_BLOCK
    return tracer.span(name, parent=parent, kind=kind, attributes=attributes, start_ns=start_ns)


def record(
    name: str,
    *,
    start_ns: int,
    end_ns: int,
    parent: str | None = None,
    attributes: Attributes | None = None,
) -> None:
    """A finished span with known times (``time.time_ns()``), e.g. a wait measured after
    the fact."""
    tracer = _tracer
    if tracer is not None:
        tracer.record(name, start_ns=start_ns, end_ns=end_ns, parent=parent, attributes=attributes)


def current_traceparent() -> str | None:
    """The ``traceparent`` of the span current in this task (None: none, or tracing off)."""
    tracer = _tracer
    return None if tracer is None else tracer.current_traceparent()


def current() -> Span:
    """The span current in this task (the no-op span when none, or tracing off)."""
    tracer = _tracer
    return NOOP_SPAN if tracer is None else tracer.current()


def with_traceparent(params: dict[str, object], traceparent: str) -> dict[str, object]:
    """A copy of JSON-RPC ``params`` whose ``_meta.traceparent`` is ``traceparent`` (the
    rest of ``_meta`` kept): how the agent joins the daemon's trace."""
    meta = params.get("_meta")
    new_meta = dict(meta) if isinstance(meta, dict) else {}
    new_meta["traceparent"] = traceparent
    return {**params, "_meta": new_meta}
