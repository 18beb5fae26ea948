#!/usr/bin/env python3
"""Four hardening figures against a checkout: requests abandoned turns leave pending,
anonymous clients that never heartbeat, a bad ``deviceFlow.providers`` config at start, and
a ``deny`` policy applied to the agent's own write request.

    .venv/bin/python scripts/probe_hardening.py [--root CHECKOUT]

``--root`` (default: this checkout) is the tree whose ``python -m serve`` is started, so
the same probe measures main (before) and a branch (after). Every daemon binds 127.0.0.1,
gets a temporary workspace and state directory and is stopped by pid. Prints one line per
figure. The fake agent is this checkout's ``tests/support/permission_agent.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parents[1]
AGENT = shlex.join([sys.executable, str(HERE / "tests" / "support" / "permission_agent.py")])
TOKEN = "probe-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Daemon:
    def __init__(self, root: Path, args: list[str], config: str | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="acp-probe-"))
        self.workspace = self.tmp / "ws"
        self.workspace.mkdir()
        argv = [sys.executable, "-m", "serve", "--port", "0", "--workspace", str(self.workspace)]
        argv += ["--state-dir", str(self.tmp / "state"), *args]
        if config is not None:
            (self.tmp / "c.yaml").write_text(config)
            argv += ["--config", str(self.tmp / "c.yaml")]
        env = {**os.environ, "QWEN_SERVER_TOKEN": TOKEN, "PYTHONPATH": str(root)}
        self.err = open(self.tmp / "stderr.log", "w")
        self.proc = subprocess.Popen(
            argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=self.err, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.started = bool(line)
        self.url = ""
        match = re.match(r"^acp-serve listening on (https?://\S+) ", line)
        self.started = match is not None
        self.url = match.group(1) if match else ""

    def stderr(self) -> str:
        self.err.flush()
        return (self.tmp / "stderr.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def events_of_turn(
    c: httpx.Client, sid: str, cid: str, text: str, vote_for: str | None, limit_s: float = 60
) -> list[dict[str, Any]]:
    r = c.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={"Prefer": "respond-async", "X-Qwen-Client-Id": cid},
    )
    r.raise_for_status()
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    with c.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": str(r.json()["lastEventId"])}
    ) as stream:
        data: list[str] = []
        for line in stream.iter_lines():
            if time.monotonic() > deadline:
                out.append({"type": "probe_gave_up"})
                break
            if line.startswith("data:"):
                data.append(line[5:].strip())
                continue
            if line or not data:
                continue
            event = json.loads("".join(data))
            data = []
            out.append(event)
            if event.get("type") == "permission_request" and vote_for is not None:
                loc = (event["data"]["toolCall"].get("locations") or [{}])[0].get("path", "")
                if loc.endswith(vote_for):
                    opts = event["data"]["options"]
                    allow = next(o["optionId"] for o in opts if o["kind"].startswith("allow"))
                    c.post(
                        f"/session/{sid}/permission/{event['data']['requestId']}",
                        json={"outcome": {"outcome": "selected", "optionId": allow}},
                        headers={"X-Qwen-Client-Id": cid},
                    )
            if event.get("type") in ("turn_complete", "turn_error"):
                break
    return out


def said(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e.get("type") == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]


def pending(c: httpx.Client) -> int:
    body = c.get("/daemon/status", params={"detail": "full"}).json()
    return int(body["runtime"]["permissions"]["pending"])


def probe_withdrawn(root: Path) -> None:
    d = Daemon(root, ["--agent", AGENT, "--permission-response-timeout-ms", "0"])
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=120) as c:
            s = c.post("/session", json={"sessionScope": "thread"}).json()
            ev = events_of_turn(
                c, s["sessionId"], s["clientId"], "withdraw 200 5 ask edit real.txt", "real.txt"
            )
            announced = sum(1 for e in ev if e.get("type") == "permission_request")
            print(
                f"16.2  200 withdrawn then a real request: announced={announced} "
                f"real request answered {said(ev)} ; pending after the turn={pending(c)}"
            )
            for _ in range(3):
                events_of_turn(c, s["sessionId"], s["clientId"], "leave 20 100", None)
            print(f"16.2  3 turns abandoning 20 requests each: pending after={pending(c)}")
    finally:
        d.stop()


def probe_clients(root: Path) -> None:
    flag_files = [*(root / "serve").glob("settings.py"), *(root / "serve").glob("settings/*.py")]
    has_flag = any("client-idle-timeout" in p.read_text() for p in flag_files)
    args = ["--client-idle-timeout-ms", "1000"] if has_flag else []
    d = Daemon(root, args)
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=60) as c:
            sid = c.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            for _ in range(300):
                c.post(f"/session/{sid}/load", json={})
            time.sleep(2.0)

            def count() -> int:
                body = c.get("/daemon/status", params={"detail": "full"}).json()
                return next(
                    s["clientCount"] for s in body["full"]["sessions"] if s["sessionId"] == sid
                )

            print(
                f"16.11 301 attaches (300 anonymous, none heartbeats), 2 s later "
                f"{'(idle 1000 ms)' if has_flag else '(no expiry setting)'}: clientCount={count()}"
            )
    finally:
        d.stop()


def probe_config(root: Path) -> None:
    config = (
        "deviceFlow:\n  providers:\n    corp:\n"
        "      deviceAuthorizationEndpoint: https://idp.example/device/code\n"
        "      tokenEndpoint: https://idp.example/token\n      clientId: abc\n"
    )
    d = Daemon(root, [], config=config)
    try:
        if not d.started:
            d.proc.wait(20)
            err = d.stderr().strip().splitlines()
            print(f"16.14 deviceFlow.providers config: exit {d.proc.returncode}: {err[-1][:160]}")
            return
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=30) as c:
            r = c.get("/workspace/auth/status")
            print(
                "16.14 deviceFlow.providers config: started; auth status",
                r.status_code,
                r.text[:160],
            )
    finally:
        d.stop()


def probe_policy(root: Path) -> None:
    d = Daemon(root, [], config="approval:\n  capabilities: {fs.write: deny}\n")
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=60) as c:
            s = c.post("/session", json={"sessionScope": "thread"}).json()
            ev = events_of_turn(
                c, s["sessionId"], s["clientId"], "[write w.txt x]", None, limit_s=15
            )
            kinds = [e.get("type") for e in ev]
            print(
                f"16.15 fs.write: deny and the agent's own write request: "
                f"permission_request shown to clients={kinds.count('permission_request')} "
                f"effect_denied={kinds.count('effect_denied')} "
                f"turn ended={'turn_complete' in kinds or 'turn_error' in kinds}"
            )
    finally:
        d.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=HERE)
    ap.add_argument("--only", default="withdrawn,clients,config,policy")
    ns = ap.parse_args()
    probes = {
        "withdrawn": probe_withdrawn,
        "clients": probe_clients,
        "config": probe_config,
        "policy": probe_policy,
    }
    for name in ns.only.split(","):
        probes[name](ns.root.resolve())


if __name__ == "__main__":
    main()
