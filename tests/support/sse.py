"""A small SSE reader for tests (parses frames the way the SDK does: JSON of data: lines)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx


async def iter_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Yield envelopes from an open streaming response; ``{"comment": ...}`` for comments."""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            data_lines = []
            for line in block.split("\n"):
                if line.startswith("data:"):
                    data_lines.append(line[5:].removeprefix(" "))
                elif line.startswith(":"):
                    yield {"comment": line[1:].strip()}
            if data_lines:
                yield json.loads("\n".join(data_lines))


async def collect_until(
    response: httpx.Response, stop: Any, limit: int = 100_000
) -> list[dict[str, Any]]:
    """Collect envelopes until ``stop(envelope)`` is true (included) or the stream ends."""
    out: list[dict[str, Any]] = []
    async for event in iter_events(response):
        if "comment" in event:
            continue
        out.append(event)
        if stop(event) or len(out) >= limit:
            break
    return out
