"""Shared fixtures: a real acp-serve daemon per module, async httpx clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.support.daemon import DaemonProcess, spawn_daemon


@pytest.fixture(scope="module")
def daemon_proc() -> Iterator[DaemonProcess]:
    """One daemon (scripted agent, no token) shared by a test module."""
    d = spawn_daemon()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30) as c:
        yield c
