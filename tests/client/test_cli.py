"""The ``acp-serve-client`` CLI against the real daemon: interactive runs in a pty (pexpect),
``--json`` runs as plain subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pexpect
import pytest

from serve.client.cli import main
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import ROOT, DaemonProcess

TIMEOUT_S = 30


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    out.update(QWEN_SERVER_TOKEN=TOKEN, COLUMNS="110", LINES="40", TERM="xterm-256color")
    return out


def spawn(daemon: DaemonProcess, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "serve.client.cli", "--url", daemon.url, *args],
        cwd=str(ROOT),
        env=env(),
        encoding="utf-8",
        timeout=TIMEOUT_S,
        dimensions=(40, 110),
    )
    return child


def until_running(daemon: DaemonProcess, sid: str) -> None:
    """Until the daemon runs a prompt of ``sid`` (bounded)."""
    deadline = time.monotonic() + TIMEOUT_S
    url = f"{daemon.url}/session/{sid}/pending-prompts"
    while [p["state"] for p in httpx.get(url, headers=AUTH).json()["pending"]] != ["running"]:
        assert time.monotonic() < deadline, f"no prompt of {sid} runs"
        time.sleep(0.02)


def finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, f"killed by signal {child.signalstatus}"
    return int(child.exitstatus)


def run(daemon: DaemonProcess | None, *args: str, stdin: str = "") -> tuple[int, str, str]:
    url = ["--url", daemon.url] if daemon is not None else []
    done = subprocess.run(
        [sys.executable, "-m", "serve.client.cli", *url, *args],
        cwd=ROOT,
        env=env(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return done.returncode, done.stdout, done.stderr


def lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


class Rest:
    """Set-up calls as another client, on plain sync httpx: no threads in this process, so
    forking the pty child stays safe (the sync SDK facade would run a loop thread)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, headers=AUTH, timeout=TIMEOUT_S)

    def create(self) -> str:
        response = self.http.post("/session", json={"sessionScope": "thread"})
        assert response.status_code == 200, response.text
        return str(response.json()["sessionId"])

    def prompt(self, sid: str, text: str, *, wait: bool = True) -> dict[str, Any]:
        headers = {} if wait else {"Prefer": "respond-async"}
        body = {"prompt": [{"type": "text", "text": text}]}
        response = self.http.post(f"/session/{sid}/prompt", json=body, headers=headers)
        assert response.status_code in (200, 202), response.text
        return response.json()  # type: ignore[no-any-return]

    def close(self, sid: str) -> None:
        assert self.http.delete(f"/session/{sid}").status_code == 204


@pytest.fixture
def rest(daemon_proc: DaemonProcess) -> Iterator[Rest]:
    client = Rest(daemon_proc.url)
    try:
        yield client
    finally:
        client.http.close()


def test_chat_streams_answers_permissions_cancels_and_exits_on_eof(
    daemon_proc: DaemonProcess,
) -> None:
    child = spawn(daemon_proc, "chat", "--new")
    child.expect(r"session (sess_\w+) \(new\)")
    sid = child.match.group(1)
    child.expect("you> ")
    child.sendline("hello there [think pondering] [plan one|two]")
    child.expect("echo: hello there")
    child.expect("pondering")
    child.expect(r"\[ \] one")
    child.expect(r"turn complete \(end_turn\)")
    child.expect("you> ")

    child.sendline("[write chat.txt from chat]")
    child.expect("permission requested")
    child.expect(r"\[1\] Allow")
    child.expect(r"choice \[1-3/c\]> ")
    child.sendline("9")  # not an option: asked again
    child.expect("answer with a listed number")
    child.expect(r"choice \[1-3/c\]> ")
    child.sendline("1")
    child.expect("permission allow by client_")
    child.expect("write_1 completed")
    child.expect(r"turn complete \(end_turn\)")
    child.expect("you> ")

    child.sendline("[write refused.txt nope]")
    child.expect(r"choice \[1-3/c\]> ")
    child.sendline("n")
    child.expect("write_1 failed")
    child.expect("you> ")

    child.sendline("/session")
    child.expect(f"session {sid}, client client_")
    child.expect("you> ")

    child.sendline("[sleep 20000]")
    child.expect("thinking")
    until_running(daemon_proc, sid)  # before, the cancel would find no turn to end
    child.sendintr()
    child.expect("cancelling the running prompt")
    child.expect(r"turn complete \(cancelled\)")
    child.expect("you> ")
    child.sendeof()
    assert finish(child) == 0
    assert (daemon_proc.workspace / "chat.txt").read_text() == "from chat"
    assert not (daemon_proc.workspace / "refused.txt").exists()


def test_chat_attaches_and_answers_another_clients_permission(
    daemon_proc: DaemonProcess, rest: Rest
) -> None:
    sid = rest.create()
    child = spawn(daemon_proc, "chat", "--session", sid)
    child.expect(f"session {sid} \\(attached\\)")
    child.expect("you> ")
    rest.prompt(sid, "from elsewhere [write shared.txt both]", wait=False)
    child.expect("› from elsewhere")  # another client's prompt is shown as such
    child.expect("echo: from elsewhere")
    child.expect(r"choice \[1-3/c\]> ")
    child.sendline("allow")
    child.expect("permission allow")
    child.expect("write_1 completed")
    child.expect(r"turn complete \(end_turn\)")
    assert (daemon_proc.workspace / "shared.txt").read_text() == "both"
    child.sendline("/quit")
    assert finish(child) == 0
    rest.close(sid)


def test_chat_ends_when_the_session_is_closed_and_ctrl_c_twice_quits(
    daemon_proc: DaemonProcess, rest: Rest
) -> None:
    sid = rest.create()
    child = spawn(daemon_proc, "chat", "--session", sid)
    child.expect("you> ")
    rest.close(sid)
    child.expect(r"session closed \(client_close\)")
    assert finish(child) == 0

    child = spawn(daemon_proc, "chat", "--new")
    child.expect("you> ")
    child.sendintr()
    child.expect("Ctrl-C again to quit")
    child.sendintr()
    assert finish(child) == 130


def test_piped_chat_waits_for_its_turns_and_cancels_what_nobody_can_answer(
    daemon_proc: DaemonProcess,
) -> None:
    code, out, _ = run(daemon_proc, "chat", "--new", stdin="piped hello\n[write piped.txt x]\n")
    assert code == 0
    assert "echo: piped hello" in out
    assert "permission cancelled" in out and "connecting" not in out
    assert not (daemon_proc.workspace / "piped.txt").exists()


def test_one_shot_prompt_asks_for_permission_in_the_terminal(
    daemon_proc: DaemonProcess, rest: Rest
) -> None:
    sid = rest.create()
    child = spawn(daemon_proc, "prompt", sid, "go [write asked.txt yes] [plan x|y]")
    child.expect("echo: go")
    child.expect("permission requested")
    child.expect(r"choice \[1-3/c\]> ")
    child.sendline("3")
    child.expect("permission reject")
    child.expect(r"turn complete \(end_turn\)")
    assert finish(child) == 0
    assert not (daemon_proc.workspace / "asked.txt").exists()
    rest.close(sid)


def test_json_commands_for_scripts(daemon_proc: DaemonProcess, rest: Rest) -> None:
    code, out, _ = run(daemon_proc, "--json", "status")
    assert code == 0
    [status] = lines(out)
    assert status["v"] == 1 and status["security"]["tokenConfigured"] is True

    code, out, _ = run(daemon_proc, "--json", "caps")
    assert code == 0 and "session_events" in lines(out)[0]["features"]

    sid = rest.create()
    code, out, _ = run(daemon_proc, "--json", "sessions")
    assert code == 0 and sid in {s["sessionId"] for s in lines(out)}

    code, out, _ = run(
        daemon_proc, "--json", "prompt", sid, "[write cli.txt v1]", "--answer", "allow"
    )
    assert code == 0
    records = lines(out)
    assert records[-1]["stopReason"] == "end_turn"
    types = [r.get("type") for r in records[:-1]]
    assert "permission_request" in types and "permission_resolved" in types
    assert all(r["v"] == 1 for r in records[:-1])
    assert (daemon_proc.workspace / "cli.txt").read_text() == "v1"

    code, out, _ = run(daemon_proc, "--json", "read", "cli.txt")
    assert code == 0
    [read] = lines(out)
    assert read["content"] == "v1" and read["hash"].startswith("sha256:")

    stale = "sha256:" + "0" * 64
    code, out, err = run(
        daemon_proc,
        "--json",
        "write",
        "cli.txt",
        "--text",
        "x",
        "--replace",
        "--expected-hash",
        stale,
    )
    assert code == 1 and out == ""
    assert json.loads(err) | {"error": ""} == {"error": "", "status": 409, "code": "hash_mismatch"}
    assert (daemon_proc.workspace / "cli.txt").read_text() == "v1"

    code, out, _ = run(
        daemon_proc,
        "--json",
        "write",
        "cli.txt",
        "--stdin",
        "--replace",
        "--expected-hash",
        read["hash"],
        stdin="v2\n",
    )
    assert code == 0 and lines(out)[0]["mode"] == "replace"
    assert (daemon_proc.workspace / "cli.txt").read_text() == "v2\n"
    code, out, _ = run(daemon_proc, "--json", "write", "new.txt", "--text", "fresh")
    assert code == 0 and lines(out)[0]["created"] is True

    code, out, err = run(daemon_proc, "read", "cli.txt")  # human form: raw content on stdout
    assert code == 0 and out == "v2\n" and "sha256:" in err

    code, out, _ = run(daemon_proc, "--json", "close", sid)
    assert code == 0 and lines(out) == [{"sessionId": sid, "closed": True}]


def test_tail_follows_until_the_session_closes(daemon_proc: DaemonProcess, rest: Rest) -> None:
    sid = rest.create()
    rest.prompt(sid, "before the tail")
    tail = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serve.client.cli",
            "--url",
            daemon_proc.url,
            "--json",
            "tail",
            sid,
            "--from",
            "0",
        ],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stdout is not None
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] != "replay_complete":
            seen.append(json.loads(tail.stdout.readline()))
        rest.prompt(sid, "during the tail")
        rest.close(sid)
        remaining = [json.loads(line) for line in tail.stdout]
        assert tail.wait(TIMEOUT_S) == 0
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    events = seen + remaining
    assert events[-1]["type"] == "session_closed"
    ids = [e["id"] for e in events if "id" in e]
    assert ids == list(range(1, len(ids) + 1))
    texts = [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    assert texts == ["echo: before the tail", "echo: during the tail"]


def test_exit_codes(daemon_proc: DaemonProcess) -> None:
    code, _, err = run(daemon_proc, "--token", "wrong", "status")
    assert code == 1 and "401" in err
    code, _, err = run(None, "--url", "http://127.0.0.1:9", "--json", "status")
    assert code == 3 and "error" in json.loads(err)
    code, _, err = run(daemon_proc, "--json", "tail", "sess_nope")
    assert code == 1 and json.loads(err)["code"] == "session_not_found"
    code, _, _ = run(daemon_proc)  # no command
    assert code == 2
    assert main(["--help"]) == 0
    assert main(["write", "x"]) == 2  # --stdin or --text is required
