"""W3C traceparent parsing and the log filter (pure logic)."""

from __future__ import annotations

import logging

from serve import tracecontext
from serve.logs import JsonFormatter, TextFormatter

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def test_valid_traceparent_gives_trace_and_parent_ids() -> None:
    assert tracecontext.parse(f"00-{TRACE}-{SPAN}-01") == (TRACE, SPAN)
    assert tracecontext.from_meta({"_meta": {"traceparent": f"00-{TRACE}-{SPAN}-00"}}) == (
        TRACE,
        SPAN,
    )


def test_invalid_traceparents_are_ignored() -> None:
    for bad in (
        None,
        42,
        "",
        f"ff-{TRACE}-{SPAN}-01",  # version ff is forbidden
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE.upper()}-{SPAN}-01",  # uppercase hex
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}",
        "x" * 500,
    ):
        assert tracecontext.parse(bad) is None, bad
    assert tracecontext.from_meta({"_meta": "nope"}) is None
    assert tracecontext.from_meta(None) is None


def test_records_logged_in_a_traced_block_carry_the_trace() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with tracecontext.traced((TRACE, SPAN)):
        tracecontext.TraceFilter().filter(record)
    outside = logging.LogRecord("x", logging.INFO, __file__, 1, "later", None, None)
    tracecontext.TraceFilter().filter(outside)
    assert TextFormatter().format(record).endswith(f"hello [trace {TRACE}]")
    assert f'"trace_id":"{TRACE}"' in JsonFormatter().format(record)
    assert f'"span_id":"{SPAN}"' in JsonFormatter().format(record)
    assert "trace" not in TextFormatter().format(outside)
