"""The start-up log tells a caller without a token what it may do (issue 46).

On a loopback daemon without a token the log used to say "local callers ... have full API
access", while ``POST /session/:id/approval-mode`` (a strict route, seed semantics) answered
``401 token_required``. The log now names the routes that need a token, and says how
callers are authenticated.
"""

from __future__ import annotations

import time

import httpx

from tests.support.daemon import DaemonProcess, running_daemon

GUARD_S = 20.0


def _log_line(daemon: DaemonProcess, needle: str) -> str:
    """The daemon's first stderr line holding ``needle`` (waits for it, bounded)."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        for line in daemon.stderr().splitlines():
            if needle in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} in the log:\n{daemon.stderr()}")


def test_the_no_token_log_names_what_needs_a_token() -> None:
    with running_daemon() as daemon:
        warning = _log_line(daemon, "no bearer token")
        assert "full API access" not in warning
        with httpx.Client(base_url=daemon.url, timeout=GUARD_S) as http:
            created = http.post("/session", json={})
            assert created.status_code == 200, created.text
            sid = created.json()["sessionId"]
            refused = http.post(f"/session/{sid}/approval-mode", json={"mode": "auto-edit"})
            assert refused.status_code == 401
            assert refused.json()["code"] == "token_required"
            # What the log promises: the refused route is named there, with the way out.
            assert "session approval mode" in warning and "token_required" in warning
            assert "--token" in warning
            assert http.delete(f"/session/{sid}").status_code == 204
        assert "auth: none" in _log_line(daemon, "auth:")


def test_the_log_says_how_callers_are_authenticated() -> None:
    with running_daemon(env={"QWEN_SERVER_TOKEN": "a-token-of-sixteen-chars"}) as daemon:
        line = _log_line(daemon, "auth:")
        assert "operator bearer token" in line
        assert "a-token-of-sixteen-chars" not in daemon.stderr()
