"""``--approval-mode``: the mode a new session starts in, chosen by whoever starts the daemon
(issue 46). ``qwen --acp`` starts its sessions in "auto" and wrote files unasked; on the
quick-start daemon (no token) a caller cannot change the mode (the approval-mode route and
``approvalMode`` on create are strict: ``401 token_required``), so the operator chooses it
at start, and ``scripts/serve --agent ...`` chooses "default" (ask before writing).

The agent is ``tests/support/flavor_agent.py`` (gemini's modes: default, autoEdit, yolo,
plan; it starts in default), a real child process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import running_daemon

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "tests" / "support" / "flavor_agent.py"
GUARD_S = 30.0


def _mode(http: httpx.Client, sid: str) -> str:
    r = http.get(f"/session/{sid}/context")
    assert r.status_code == 200, r.text
    return str(r.json()["state"]["modes"]["currentModeId"])


def test_a_new_session_starts_in_the_daemons_approval_mode() -> None:
    agent = f"{sys.executable} {AGENT} gemini"
    with running_daemon(["--agent", agent, "--approval-mode", "auto-edit"]) as daemon:
        with httpx.Client(base_url=daemon.url, timeout=GUARD_S) as http:  # no token
            created = http.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200, created.text
            sid = created.json()["sessionId"]
            assert _mode(http, sid) == "autoEdit"  # qwen's auto-edit, the agent's id
            # A caller without a token still cannot change it (strict, as documented).
            refused = http.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"})
            assert refused.status_code == 401
            assert _mode(http, sid) == "autoEdit"
            assert http.delete(f"/session/{sid}").status_code == 204


def test_without_the_flag_a_session_keeps_the_agents_mode() -> None:
    agent = f"{sys.executable} {AGENT} gemini"
    with running_daemon(["--agent", agent]) as daemon:
        with httpx.Client(base_url=daemon.url, timeout=GUARD_S) as http:
            created = http.post("/session", json={"sessionScope": "thread"})
            assert created.status_code == 200, created.text
            assert _mode(http, created.json()["sessionId"]) == "default"


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "acp-serve").exists(), reason="no .venv")
def test_scripts_serve_starts_sessions_of_a_real_agent_in_default(tmp_path: Path) -> None:
    agent = f"{sys.executable} {AGENT} gemini"
    argv = [str(ROOT / "scripts" / "serve"), "--agent", agent, "--port", "0"]
    argv += ["--state-dir", str(tmp_path / "state"), "--workspace", str(tmp_path)]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("acp-serve listening on")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=GUARD_S)
    said = (tmp_path / "stderr").read_text()
    assert "sessions start in approval mode 'default'" in said, said
    assert "--approval-mode default" in said.split("==> starting", 1)[1].splitlines()[0]
