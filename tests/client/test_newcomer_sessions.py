"""Sessions as a newcomer meets them (issue 46): after a restart a journaled session is on
disk but not loaded, and a prompt to it says how to load it; the client lists it and says
it "restored" it; a chat attached to a session waiting for a permission shows the request
and lets the user answer it (it used to show nothing, and closing stdin cancelled it)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import httpx
import pexpect

from tests.client.test_cli import TIMEOUT_S, Rest, finish, run, spawn
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, running_daemon


def _wait_for_permission_request(url: str, sid: str) -> None:
    """Read the session's events until it asks for a permission (bounded)."""
    with httpx.Client(base_url=url, headers=AUTH, timeout=TIMEOUT_S) as http:
        with http.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("event:") and "permission_request" in line:
                    return
    raise AssertionError("the stream ended without a permission request")


def _summary(url: str, workspace: Path, sid: str) -> dict[str, object]:
    ref = urllib.parse.quote(str(workspace), safe="")
    response = httpx.get(f"{url}/workspace/{ref}/sessions", headers=AUTH, timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    found = [s for s in response.json()["sessions"] if s["sessionId"] == sid]
    assert len(found) == 1, response.text
    return found[0]  # type: ignore[no-any-return]


def test_a_persisted_session_after_a_restart_is_named_listed_and_restored(
    tmp_path: Path,
) -> None:
    workspace, state = tmp_path / "ws", tmp_path / "state"
    kwargs: dict[str, object] = {
        "workspace": workspace,
        "state_dir": state,
        "env": {"QWEN_SERVER_TOKEN": TOKEN},
    }
    with running_daemon(**kwargs) as first:
        rest = Rest(first.url)
        sid = rest.create()
        assert rest.prompt(sid, "before the restart")["stopReason"] == "end_turn"
        rest.http.close()

    with running_daemon(**kwargs) as second:
        with httpx.Client(base_url=second.url, headers=AUTH, timeout=TIMEOUT_S) as http:
            body = {"prompt": [{"type": "text", "text": "after"}]}
            response = http.post(f"/session/{sid}/prompt", json=body)
            assert response.status_code == 404, response.text  # the contract's answer ...
            error = response.json()
            assert error["code"] == "session_not_found" and error["sessionId"] == sid
            assert f"POST /session/{sid}/load" in error["error"]  # ... says how to load it
            # A session nobody persisted keeps the plain answer.
            unknown = http.post("/session/sess_nobody/prompt", json=body).json()
            assert "load" not in unknown["error"]

        code, out, err = run(second, "sessions")
        assert code == 0, err
        assert sid in out and "persisted" in out, out
        code, out, err = run(second, "--json", "sessions")
        assert code == 0, err
        listed = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert [s["activeWorkState"] for s in listed if s["sessionId"] == sid] == ["persisted"], out

        code, out, err = run(second, "chat", "--session", sid)
        assert code == 0, err
        assert f"session {sid} (restored)" in out, out
        assert "(new)" not in out


def test_chat_attached_to_a_waiting_permission_shows_it_and_answers_it(
    daemon_proc: DaemonProcess,
) -> None:
    rest = Rest(daemon_proc.url)
    try:
        sid = rest.create()
        rest.prompt(sid, "[write waiting.txt answered]", wait=False)
        _wait_for_permission_request(daemon_proc.url, sid)

        # A piped chat that ends at once leaves another client's request alone.
        code, _, err = run(daemon_proc, "chat", "--session", sid)
        assert code == 0, err
        assert _summary(daemon_proc.url, daemon_proc.workspace, sid)["isWaitingForPermission"]

        child: pexpect.spawn = spawn(daemon_proc, "chat", "--session", sid)
        child.expect(f"session {sid} \\(attached\\)")
        child.expect("a permission is waiting")
        child.expect(r"\[1\] Allow")
        child.expect(r"choice \[1-3/c\]> ")
        child.sendline("1")
        child.expect("write_1 completed")
        child.expect(r"turn complete \(end_turn\)")
        child.sendeof()
        assert finish(child) == 0
        assert (daemon_proc.workspace / "waiting.txt").read_text() == "answered"
        rest.close(sid)
    finally:
        rest.http.close()
