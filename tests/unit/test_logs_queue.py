"""The bounded log queue: a full queue drops (and counts) instead of blocking the caller."""

from __future__ import annotations

import logging
import queue

from serve.logs import BoundedQueueHandler, JsonFormatter


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("t", logging.WARNING, __file__, 1, msg, args, None)


def test_full_queue_drops_and_then_reports_the_count() -> None:
    handler = BoundedQueueHandler(records=3)
    for i in range(10):
        handler.handle(_record("line %d", i))  # never blocks
    q = handler.queue
    assert isinstance(q, queue.Queue)
    assert [q.get_nowait().getMessage() for _ in range(3)] == ["line 0", "line 1", "line 2"]
    assert handler.dropped == 7
    handler.handle(_record("after"))
    got = [q.get_nowait().getMessage() for _ in range(2)]
    assert got == ["7 log records dropped (the log writer could not keep up)", "after"]
    assert handler.dropped == 0


def test_queued_record_keeps_its_traceback_as_text() -> None:
    handler = BoundedQueueHandler(records=4)
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "t", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info()
        )
    handler.handle(record)
    q = handler.queue
    assert isinstance(q, queue.Queue)
    queued = q.get_nowait()
    assert queued.exc_info is None and queued.args is None
    assert queued.getMessage() == "failed x" and "ValueError: boom" in (queued.exc_text or "")
    assert "ValueError: boom" in JsonFormatter().format(queued)
    assert "ValueError: boom" in logging.Formatter().format(queued)
