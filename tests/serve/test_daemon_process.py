"""The real acp-serve process: ready line, /health, clean SIGTERM/SIGINT exit."""

from __future__ import annotations

import signal
import socket
import time

import httpx
import pytest

from serve.runtime.daemon import bind_listener
from tests.support.daemon import running_daemon, spawn_daemon


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_starts_on_port_zero_answers_health_and_exits_cleanly(sig: int) -> None:
    daemon = spawn_daemon()
    try:
        assert daemon.url.startswith("http://127.0.0.1:") and daemon.port != 0
        response = httpx.get(f"{daemon.url}/health")
        assert response.status_code == 200
        assert response.json() == {"status": "ok"}
        started = time.monotonic()
        assert daemon.stop(sig) == 0
        assert time.monotonic() - started < 5.0
        # Exactly one line on stdout.
        assert daemon.proc.stdout is not None
        assert daemon.proc.stdout.read() == ""
    finally:
        daemon.stop()


def test_a_busy_default_port_moves_to_the_next_one(capfd: pytest.CaptureFixture[str]) -> None:
    """Without ``--port`` (the default 4170) a busy port moves on; a port given with the
    flag is refused instead (tests/serve/test_startup_refusals.py)."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    busy = blocker.getsockname()[1]
    try:
        fd, port = bind_listener("127.0.0.1", busy, move_on=True)
        socket.socket(fileno=fd).close()
        assert port > busy
        assert f"port {busy} is in use, trying {busy + 1}" in capfd.readouterr().err
        with pytest.raises(OSError):
            bind_listener("127.0.0.1", busy, move_on=False)
    finally:
        blocker.close()


def test_unknown_route_is_a_json_404() -> None:
    with running_daemon() as daemon:
        response = httpx.get(f"{daemon.url}/no/such/route")
        assert response.status_code == 404
        assert response.json() == {"error": "Not found"}
