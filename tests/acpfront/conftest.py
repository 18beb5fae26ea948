"""Fixtures shared by the /acp wire tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from tests.acpfront.helpers import AcpHttp


@pytest.fixture
async def acp(client: httpx.AsyncClient) -> AsyncIterator[AcpHttp]:
    """A raw ACP-over-HTTP connection to the test's daemon, deleted when the test ends."""
    async with trio.open_nursery() as nursery:
        conn = AcpHttp(client, nursery)
        yield conn
        if conn.connection_id:
            await client.delete("/acp", headers=conn.headers())
        nursery.cancel_scope.cancel()
