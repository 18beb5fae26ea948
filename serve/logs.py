"""Logging set-up: text or one JSON object per line on stderr, written off the event loop,
with secrets redacted.

:func:`setup_logging` gives the root logger one :class:`BoundedQueueHandler`: a log call on
the trio thread only formats the message (and a traceback, if any) and puts the record in a
bounded :class:`queue.Queue` (:data:`LOG_QUEUE_RECORDS` records); a writer thread
(``log-writer``) writes it to stderr. A slow or blocked stderr
(a full pipe nobody reads, a stalled log collector) therefore never blocks the loop: the
queue fills, further records are dropped and counted, and once there is room again one
``N log records dropped`` record says how many. :func:`stop_logging` (registered with
``atexit``) writes what is queued, waiting :data:`STOP_WAIT_S` at most (the writer is a
daemon thread: a stderr that never drains cannot hold the exit).

:func:`install_redaction` attaches a :class:`serve.tokens.RedactingFilter` to every
root handler so a bearer token that reaches a log call (as text, an argument or in a
traceback) is written as ``[redacted]``; the security front calls it with the configured
token at start-up. Filters sit on handlers, not loggers, so records propagated from child
loggers (``hypercorn.error``, ``serve.*``) are covered; the filter runs on the caller's
thread, before the record is queued.
"""

from __future__ import annotations

import atexit
import copy
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Iterable

import msgspec

from serve.tokens import RedactingFilter
from serve.tracecontext import TraceFilter

#: Records waiting for the writer thread at most; past it records are dropped and counted.
LOG_QUEUE_RECORDS = 10_000

#: How long :func:`stop_logging` waits for the writer to empty the queue, in seconds.
STOP_WAIT_S = 2.0

_encoder = msgspec.json.Encoder()
_writer: _Writer | None = None


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "session_id", "client_id", "trace_id", "span_id"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted before the record was queued
            entry["exc"] = record.exc_text
        return _encoder.encode(entry).decode()


class TextFormatter(logging.Formatter):
    """The text format, with a ``[trace <id>]`` suffix on records of a traced request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        return f"{text} [trace {trace_id}]" if trace_id else text


class BoundedQueueHandler(logging.handlers.QueueHandler):
    """Queue records for the writer thread; never block, drop (and count) when full."""

    def __init__(self, records: int = LOG_QUEUE_RECORDS) -> None:
        super().__init__(queue.Queue(records))
        self.dropped = 0
        self._lock_dropped = threading.Lock()
        self._exc_formatter = logging.Formatter()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """Resolve what cannot cross threads (args, the traceback); keep the rest for the
        writer's formatter."""
        try:
            message = record.getMessage()
        except Exception:
            message = f"{record.msg} [log arguments dropped: format failed]"
        record = copy.copy(record)
        record.msg = message
        record.message = message
        record.args = None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self._exc_formatter.formatException(record.exc_info)
            record.exc_info = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        q = self.queue
        assert isinstance(q, queue.Queue)
        try:
            if self.dropped:
                with self._lock_dropped:
                    dropped, self.dropped = self.dropped, 0
                if dropped:
                    note = logging.LogRecord(
                        "serve.logs",
                        logging.WARNING,
                        __file__,
                        0,
                        f"{dropped} log records dropped (the log writer could not keep up)",
                        None,
                        None,
                    )
                    try:
                        q.put_nowait(note)
                    except queue.Full:
                        with self._lock_dropped:
                            self.dropped += dropped
            q.put_nowait(record)
        except queue.Full:
            with self._lock_dropped:
                self.dropped += 1


class _Writer(threading.Thread):
    """The thread that takes queued records and hands them to the stderr handler."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None], target: logging.Handler):
        super().__init__(name="log-writer", daemon=True)
        self.records = records
        self.target = target

    def run(self) -> None:
        while True:
            record = self.records.get()
            if record is None:
                return
            try:
                self.target.handle(record)
            except Exception:  # pragma: no cover - Handler.handle reports its own errors
                pass

    def stop(self, wait_s: float) -> None:
        try:
            self.records.put(None, timeout=wait_s)
        except queue.Full:
            return
        self.join(wait_s)


def setup_logging(
    fmt: str = "text", level: int = logging.INFO, *, queue_records: int = LOG_QUEUE_RECORDS
) -> None:
    """Route the root logger through a bounded queue to a stderr writer thread."""
    global _writer
    stop_logging()
    target = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        target.setFormatter(JsonFormatter())
    else:
        target.setFormatter(TextFormatter())
    handler = BoundedQueueHandler(queue_records)
    handler.addFilter(TraceFilter())  # W3C trace context of the request (serve/tracecontext)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    assert isinstance(handler.queue, queue.Queue)
    _writer = _Writer(handler.queue, target)
    _writer.start()


def stop_logging(wait_s: float = STOP_WAIT_S) -> None:
    """Write what is queued and stop the writer thread (idempotent, bounded by ``wait_s``)."""
    global _writer
    writer, _writer = _writer, None
    if writer is not None:
        writer.stop(wait_s)


atexit.register(stop_logging)


def install_redaction(secrets: Iterable[str | None]) -> None:
    """Redact ``secrets`` in everything the root logger's handlers write.

    Idempotent: a previous redacting filter installed here is replaced. ``None`` and empty
    values are ignored; with nothing to hide, no filter is installed.
    """
    # Values shorter than 6 characters are not redacted as substrings (a one-letter token
    # would turn every log line to mush); the settings warn about such weak tokens.
    values = [s for s in secrets if s and len(s) >= 6]
    for handler in logging.getLogger().handlers:
        for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(old)
        if values:
            handler.addFilter(RedactingFilter(values))
