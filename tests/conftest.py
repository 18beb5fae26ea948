"""Shared fixtures: a real acp-serve daemon per module, async httpx clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.postgres import PostgresServer, running_postgres
from tests.support.postgres import skip_reason as postgres_skip_reason

#: The bearer token of the shared test daemon (strict routes need one configured).
TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def daemon_proc() -> Iterator[DaemonProcess]:
    """One daemon (scripted agent, bearer token ``TOKEN``) shared by a test module."""
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def client(daemon_proc: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30, headers=AUTH) as c:
        yield c


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/support/postgres.py), or a skip."""
    reason = postgres_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_postgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A fresh database on the session's PostgreSQL server."""
    return postgres_server.new_database()


@pytest.fixture(params=["files", "postgresql"])
def journal_args(request: pytest.FixtureRequest) -> list[str]:
    """Daemon flags selecting the journal backend: the files one (none), or PostgreSQL on a
    fresh database of the session's server (``--journal-url``)."""
    if request.param == "files":
        return []
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return ["--journal-url", server.new_database()]
