"""The real acp-serve process: ready line, /health, clean SIGTERM/SIGINT exit."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import ROOT, running_daemon, spawn_daemon


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


def test_busy_port_moves_to_the_next_one(tmp_path: Path) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    busy = blocker.getsockname()[1]
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serve",
                "--port",
                str(busy),
                "--workspace",
                str(tmp_path),
                "--state-dir",
                str(tmp_path / "state"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0
        assert f"port {busy} is in use, trying {busy + 1}" in err
        assert line.startswith("acp-serve listening on http://127.0.0.1:")
        assert int(line.split(":")[2].split(" ")[0]) > busy
    finally:
        blocker.close()


def test_unknown_route_is_a_json_404() -> None:
    with running_daemon() as daemon:
        response = httpx.get(f"{daemon.url}/no/such/route")
        assert response.status_code == 404
        assert response.json() == {"error": "Not found"}
