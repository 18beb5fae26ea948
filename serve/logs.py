"""Logging set-up: text or one JSON object per line on stderr, with secrets redacted.

:func:`setup_logging` installs one stderr handler on the root logger. :func:`install_redaction`
attaches a :class:`serve.http.security.bearer.RedactingFilter` to every root handler so a bearer
token that reaches a log call (as text, an argument or in a traceback) is written as
``[redacted]``; the security front calls it with the configured token at start-up. Filters
sit on handlers, not loggers, so records propagated from child loggers (``hypercorn.error``,
``serve.*``) are covered.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

import msgspec

from serve.http.security.bearer import RedactingFilter

_encoder = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("request_id", "session_id", "client_id"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _encoder.encode(entry).decode()


def setup_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)


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
