"""The /acp file methods run under the file routes' thread budget (issue 22, item 20).

They ran on trio's shared default limiter (40 threads), so a burst of slow file calls over
/acp could take every thread the rest of the daemon draws on, past the file routes' 8.
"""

from __future__ import annotations

import trio
import trio.testing

from serve.acpfront import file_methods as _Files
from serve.threads import FILE_ROUTE_THREADS, file_routes_limiter


async def test_acp_file_calls_wait_for_the_file_route_limiter() -> None:
    limiter = file_routes_limiter()
    holders = [object() for _ in range(FILE_ROUTE_THREADS)]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    results: list[int] = []

    async def call() -> None:
        results.append(await _Files.run(lambda: 7))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        assert limiter.statistics().tasks_waiting == 1  # queued behind the 8 file threads
        assert results == []
        limiter.release_on_behalf_of(holders.pop())
    assert results == [7]
    for holder in holders:
        limiter.release_on_behalf_of(holder)
