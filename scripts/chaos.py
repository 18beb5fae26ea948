#!/usr/bin/env python3
"""Chaos run: realistic clients against a real daemon while a fault injector SIGKILLs agents.

Clients (trio tasks, raw httpx) loop: create or attach a session, stream its events, send
prompts (echo, floods, sleeps, writes that need a permission vote), vote on permission
requests, drop and re-open their SSE stream with ``Last-Event-ID``, close sessions. An
auditor follows every session's stream from id 0 (reconnecting with ``Last-Event-ID``)
so each session's full event history is known. The injector SIGKILLs a random agent
child of the daemon at the configured rate (optionally also MCP servers: none here).

Invariants checked at the end, written to a JSON report and printed:

1. the daemon never died (its process stayed up and ``/health`` answered);
2. every admitted prompt ended with exactly one terminal event (``turn_complete`` or
   ``turn_error``) in its session's history;
3. every SSE client saw a gap-free id sequence, or an explicit ``state_resync_required``
   before a jump;
4. every kill that hit a live session is visible as ``session_restarted`` or
   ``session_died`` in that session's history;
5. no process was left behind: after the daemon's SIGTERM every agent it spawned is gone;
6. the daemon's RSS stayed bounded (max and final reported; bound checked);
7. every session bound to an agent is on a child the agent pool lists (sampled each second).

A session whose auditor's stream broke and which was gone (closed) when the auditor came
back has a cut history: it is counted (``unauditedCount``) and left out of check 2.

The agent pool is configurable: ``--warm-agents``, ``--sessions-per-agent`` (a
kill of a shared child must then be visible in *every* session on it),
``--agent-idle-release-ms`` (idle sessions let their agents go and bind again on their next
prompt), and ``--kill-warm-share`` (the share of kills aimed at warm children, which no
session uses: the pool must replace them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.daemon import spawn_daemon  # noqa: E402

TOKEN = "chaos-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TERMINAL = ("turn_complete", "turn_error")


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Chaos:
    def __init__(self, args: argparse.Namespace, url: str, daemon_pid: int) -> None:
        self.args = args
        self.url = url
        self.daemon_pid = daemon_pid
        self.rng = random.Random(args.seed)
        self.deadline = 0.0
        # session id -> id -> envelope (the auditor's complete history)
        self.history: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        self.admitted: dict[str, set[str]] = defaultdict(set)
        self.sessions: set[str] = set()
        self.stream_checks = {"streams": 0, "gapFree": 0, "resyncExplained": 0, "violations": []}
        self.kills: list[dict[str, Any]] = []
        self.warm_kills = 0
        self.pool_violations: list[dict[str, Any]] = []
        self.pool_samples = 0
        #: Sessions whose auditor lost the tail (reconnected after the session was gone).
        self.unaudited: set[str] = set()
        self.agent_pids: set[int] = set()
        self.rss: list[float] = []
        self.health_failures = 0
        self.counts: dict[str, int] = defaultdict(int)
        self.errors: list[str] = []
        self.audit_client: httpx.AsyncClient | None = None

    # ---- streams -------------------------------------------------------------------------

    async def follow(
        self, client: httpx.AsyncClient, sid: str, *, audit: bool, stop: trio.Event
    ) -> None:
        """Follow a session's stream, reconnecting with Last-Event-ID; check id continuity.

        Clients stop at the deadline; an auditor keeps reconnecting until the session's log
        ends (or the run is over), so the last terminals of a stream that broke near the
        deadline are still collected."""
        last: int | None = 0 if audit else None
        while not stop.is_set() and (audit or trio.current_time() < self.deadline):
            headers = {} if last is None else {"Last-Event-ID": str(last)}
            ended = False
            try:
                # A follower drops its stream after a random while (then resumes with
                # Last-Event-ID); the verdict on a stream is taken however it ends.
                verdict = {"gap_free": True, "resync": False, "opened": False}
                try:
                    with trio.move_on_after(self.rng.uniform(2, 20) if not audit else 3600):
                        async with client.stream(
                            "GET", f"/session/{sid}/events", headers=headers, timeout=None
                        ) as response:
                            if response.status_code == 404:
                                if audit and last:
                                    # The session was gone before the auditor caught up
                                    # (its stream broke near the close): its tail is unknown.
                                    self.unaudited.add(sid)
                                return
                            verdict["opened"] = True
                            self.stream_checks["streams"] += 1
                            expect = None if last is None else last + 1
                            buffer = ""
                            async for text in response.aiter_text():
                                buffer += text
                                while "\n\n" in buffer:
                                    block, buffer = buffer.split("\n\n", 1)
                                    data = [
                                        ln[6:]
                                        for ln in block.split("\n")
                                        if ln.startswith("data: ")
                                    ]
                                    if not data:
                                        continue
                                    event = json.loads("".join(data))
                                    etype = event["type"]
                                    if etype == "state_resync_required":
                                        verdict["resync"] = True
                                    if "id" in event:
                                        eid = event["id"]
                                        if (
                                            expect is not None
                                            and eid != expect
                                            and not verdict["resync"]
                                        ):
                                            verdict["gap_free"] = False
                                            self.stream_checks["violations"].append(
                                                {"session": sid, "expected": expect, "got": eid}
                                            )
                                        expect = eid + 1
                                        last = eid
                                        if audit:
                                            self.history[sid][eid] = event
                                    if etype in ("session_died", "session_closed"):
                                        ended = True
                finally:
                    if verdict["opened"] and verdict["gap_free"]:
                        self.stream_checks["gapFree"] += 1
                        if verdict["resync"]:
                            self.stream_checks["resyncExplained"] += 1
            except (httpx.HTTPError, trio.TooSlowError) as exc:
                self.counts["stream_errors"] += 1
                if not self.daemon_alive():
                    self.errors.append(f"stream failed and daemon is gone: {exc!r}")
                    return
            if ended:
                return
            await trio.sleep(self.rng.uniform(0.05, 0.5))

    def daemon_alive(self) -> bool:
        return alive(self.daemon_pid)

    # ---- clients -------------------------------------------------------------------------

    async def client_loop(self, n: int, nursery: trio.Nursery) -> None:
        async with httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=60) as client:
            while trio.current_time() < self.deadline:
                try:
                    await self.one_session(client, nursery)
                except httpx.HTTPError as exc:
                    self.counts["client_http_errors"] += 1
                    if not self.daemon_alive():
                        self.errors.append(f"client {n}: daemon gone: {exc!r}")
                        return
                    await trio.sleep(0.2)

    async def one_session(self, client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
        scope = "thread" if self.rng.random() < 0.8 else "single"
        r = await client.post("/session", json={"sessionScope": scope})
        if r.status_code != 200:
            self.counts[f"create_{r.status_code}"] += 1
            await trio.sleep(float(r.headers.get("retry-after", "1")))
            return
        created = r.json()
        sid, cid = created["sessionId"], created["clientId"]
        self.counts["sessions_created" if not created["attached"] else "sessions_attached"] += 1
        if sid not in self.sessions:
            self.sessions.add(sid)
            assert self.audit_client is not None
            nursery.start_soon(
                partial(self.follow, self.audit_client, sid, audit=True, stop=trio.Event())
            )
        stop = trio.Event()
        nursery.start_soon(partial(self.follow, client, sid, audit=False, stop=stop))
        nursery.start_soon(self.voter, client, sid, cid, stop)
        try:
            for _ in range(self.rng.randint(2, 8)):
                if trio.current_time() >= self.deadline:
                    break
                text = self.rng.choice(
                    [
                        "hello there",
                        "[flood 300]",
                        "[think pondering] [plan a|b|c] answer",
                        "[sleep 800] slow one",
                        f"[write chaos-{self.rng.randint(0, 50)}.txt data]",
                    ]
                )
                r = await client.post(
                    f"/session/{sid}/prompt",
                    json={"prompt": [{"type": "text", "text": text}]},
                    headers={"Prefer": "respond-async", "X-Qwen-Client-Id": cid},
                )
                if r.status_code == 202:
                    self.admitted[sid].add(r.json()["promptId"])
                    self.counts["prompts_admitted"] += 1
                elif r.status_code == 404:
                    self.counts["prompt_on_dead_session"] += 1
                    return
                else:
                    self.counts[f"prompt_{r.status_code}"] += 1
                await trio.sleep(self.rng.uniform(0.05, 1.0))
                if self.rng.random() < 0.1:
                    await client.post(f"/session/{sid}/cancel", headers={"X-Qwen-Client-Id": cid})
                    self.counts["cancels"] += 1
            await trio.sleep(self.rng.uniform(0.5, 2.0))
            # Clients close when done (the auditor keeps every session subscribed, so a
            # session left behind would never be idle-reaped and the limit would fill).
            await client.delete(f"/session/{sid}", headers={"X-Qwen-Client-Id": cid})
            self.counts["closes"] += 1
        finally:
            stop.set()

    async def voter(self, client: httpx.AsyncClient, sid: str, cid: str, stop: trio.Event) -> None:
        """Answer permission requests of this session (allow mostly, sometimes reject)."""
        seen: set[str] = set()
        while not stop.is_set():
            await trio.sleep(0.2)
            for event in list(self.history.get(sid, {}).values()):
                if event["type"] != "permission_request":
                    continue
                rid = event["data"]["requestId"]
                if rid in seen:
                    continue
                seen.add(rid)
                option = "allow" if self.rng.random() < 0.8 else "reject"
                r = await client.post(
                    f"/session/{sid}/permission/{rid}",
                    json={"outcome": {"outcome": "selected", "optionId": option}},
                    headers={"X-Qwen-Client-Id": cid},
                )
                self.counts[f"vote_{r.status_code}"] += 1

    # ---- faults and probes ---------------------------------------------------------------

    async def injector(self) -> None:
        rate = self.args.kills_per_minute / 60.0
        async with httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=30) as client:
            while trio.current_time() < self.deadline:
                await trio.sleep(self.rng.expovariate(rate))
                try:
                    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
                except (httpx.HTTPError, ValueError):
                    continue
                sessions = status.get("full", {}).get("sessions", [])
                live = [(s["sessionId"], s["agentPid"]) for s in sessions if s.get("agentPid")]
                warm = [
                    c["pid"]
                    for pool in status.get("runtime", {}).get("agents", [])
                    for c in pool["children"]
                    if c["state"] == "warm"
                ]
                if warm and self.rng.random() < self.args.kill_warm_share:
                    try:
                        os.kill(self.rng.choice(warm), signal.SIGKILL)
                        self.warm_kills += 1
                    except ProcessLookupError:
                        pass
                    continue
                if not live:
                    continue
                _, pid = self.rng.choice(live)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                # A shared child: every session on it was hit.
                for other, other_pid in live:
                    if other_pid == pid:
                        self.kills.append({"at": time.time(), "sessionId": other, "pid": pid})

    async def prober(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=10) as client:
            while trio.current_time() < self.deadline:
                self.rss.append(rss_mib(self.daemon_pid))
                self.agent_pids.update(children(self.daemon_pid))
                try:
                    r = await client.get("/health")
                    if r.status_code != 200:
                        self.health_failures += 1
                except httpx.HTTPError:
                    self.health_failures += 1
                try:
                    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
                except (httpx.HTTPError, ValueError):
                    status = {}
                if status:
                    self.pool_samples += 1
                    pids = {
                        c["pid"] for pool in status["runtime"]["agents"] for c in pool["children"]
                    }
                    for s in status["full"]["sessions"]:
                        if s.get("agentPid") and s["agentPid"] not in pids:
                            self.pool_violations.append(
                                {"sessionId": s["sessionId"], "agentPid": s["agentPid"]}
                            )
                await trio.sleep(1.0)

    async def run(self) -> None:
        self.deadline = trio.current_time() + self.args.minutes * 60
        self.audit_client = httpx.AsyncClient(base_url=self.url, headers=AUTH, timeout=60)
        async with self.audit_client, trio.open_nursery() as nursery:
            nursery.start_soon(self.prober)
            nursery.start_soon(self.injector)
            for n in range(self.args.clients):
                nursery.start_soon(self.client_loop, n, nursery)
            await trio.sleep(self.args.minutes * 60 + 5)
            await trio.sleep(10)  # let the auditors collect the last terminals
            nursery.cancel_scope.cancel()

    # ---- verdict -------------------------------------------------------------------------

    def verdict(self, leaked: list[int], exit_code: int | None) -> dict[str, Any]:
        missing: list[dict[str, Any]] = []
        duplicated: list[dict[str, Any]] = []
        for sid, prompt_ids in self.admitted.items():
            if sid in self.unaudited:
                continue  # counted below; not judged on a history known to be cut
            terminals: dict[str, int] = defaultdict(int)
            for event in self.history.get(sid, {}).values():
                if event["type"] in TERMINAL and event.get("promptId"):
                    terminals[event["promptId"]] += 1
            for pid in prompt_ids:
                if terminals[pid] == 0:
                    missing.append({"session": sid, "promptId": pid})
                elif terminals[pid] > 1:
                    duplicated.append({"session": sid, "promptId": pid, "count": terminals[pid]})
        unexplained = []
        racing_close = 0
        for kill in self.kills:
            events = list(self.history.get(kill["sessionId"], {}).values())
            after = [e for e in events if e["_meta"]["serverTimestamp"] / 1000 >= kill["at"] - 1]
            if any(e["type"] in ("session_restarted", "session_died") for e in after):
                continue
            if any(e["type"] == "session_closed" for e in after):
                racing_close += 1  # a client closed the session as the kill landed
                continue
            unexplained.append(kill)
        max_rss = max(self.rss) if self.rss else 0.0
        checks = {
            "daemonNeverDied": not self.errors and self.health_failures == 0 and exit_code == 0,
            "everyPromptOneTerminal": not missing and not duplicated,
            "streamsGapFreeOrResync": not self.stream_checks["violations"],
            "everyCrashVisible": not unexplained,
            "noLeakedProcesses": not leaked,
            "rssBounded": max_rss <= self.args.max_rss_mib,
            "sessionsOnPoolChildren": not self.pool_violations,
        }
        return {
            "ok": all(checks.values()),
            "checks": checks,
            "minutes": self.args.minutes,
            "clients": self.args.clients,
            "killsPerMinuteTarget": self.args.kills_per_minute,
            "kills": len(self.kills),
            "warmKills": self.warm_kills,
            "pool": {
                "warmAgents": self.args.warm_agents,
                "sessionsPerAgent": self.args.sessions_per_agent,
                "agentIdleReleaseMs": self.args.agent_idle_release_ms,
            },
            "poolSamples": self.pool_samples,
            "unauditedSessions": sorted(self.unaudited)[:20],
            "unauditedCount": len(self.unaudited),
            "poolViolations": self.pool_violations[:20],
            "agentReleased": sum(
                1
                for h in self.history.values()
                for e in h.values()
                if e["type"] == "agent_released"
            ),
            "agentRebound": sum(
                1 for h in self.history.values() for e in h.values() if e["type"] == "agent_rebound"
            ),
            "killsRacingAClose": racing_close,
            "sessions": len(self.sessions),
            "promptsAdmitted": sum(len(p) for p in self.admitted.values()),
            "eventsAudited": sum(len(h) for h in self.history.values()),
            "sessionRestarted": sum(
                1
                for h in self.history.values()
                for e in h.values()
                if e["type"] == "session_restarted"
            ),
            "sessionDied": sum(
                1 for h in self.history.values() for e in h.values() if e["type"] == "session_died"
            ),
            "streams": self.stream_checks["streams"],
            "streamsGapFree": self.stream_checks["gapFree"],
            "streamsWithResync": self.stream_checks["resyncExplained"],
            "rssMiB": {"max": round(max_rss, 1), "last": round(self.rss[-1], 1) if self.rss else 0},
            "agentProcessesSeen": len(self.agent_pids),
            "leakedProcesses": leaked,
            "daemonExitCode": exit_code,
            "healthFailures": self.health_failures,
            "counts": dict(self.counts),
            "missingTerminals": missing[:20],
            "duplicateTerminals": duplicated[:20],
            "unexplainedKills": unexplained[:20],
            "streamViolations": self.stream_checks["violations"][:20],
            "errors": self.errors[:20],
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--kills-per-minute", type=float, default=20.0)
    parser.add_argument("--max-rss-mib", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--report", default=None, help="JSON report path (default reports/)")
    parser.add_argument("--warm-agents", type=int, default=1)
    parser.add_argument("--sessions-per-agent", type=int, default=1)
    parser.add_argument("--agent-idle-release-ms", type=int, default=0)
    parser.add_argument("--kill-warm-share", type=float, default=0.0)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="acp-serve-chaos-"))
    daemon = spawn_daemon(
        [
            "--max-sessions",
            "64",
            "--permission-response-timeout-ms",
            "20000",
            "--session-idle-timeout-ms",
            "30000",
            "--session-reap-interval-ms",
            "5000",
            "--warm-agents",
            str(args.warm_agents),
            "--sessions-per-agent",
            str(args.sessions_per_agent),
            "--agent-idle-release-ms",
            str(args.agent_idle_release_ms),
        ],
        workspace=tmp / "ws",
        state_dir=tmp / "state",
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    chaos = Chaos(args, daemon.url, daemon.proc.pid)
    started = time.time()
    try:
        trio.run(chaos.run)
    finally:
        exit_code = daemon.stop(signal.SIGTERM, timeout_s=30)
    time.sleep(1.0)
    leaked = [pid for pid in chaos.agent_pids if alive(pid)]
    report = chaos.verdict(leaked, exit_code)
    report["wallSeconds"] = round(time.time() - started, 1)
    path = Path(args.report) if args.report else ROOT / "reports" / f"chaos-{int(started)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    for key in (
        "ok",
        "checks",
        "kills",
        "warmKills",
        "pool",
        "agentReleased",
        "agentRebound",
        "unauditedCount",
        "sessions",
        "promptsAdmitted",
        "eventsAudited",
        "sessionRestarted",
        "sessionDied",
        "streams",
        "streamsGapFree",
        "rssMiB",
        "leakedProcesses",
        "daemonExitCode",
        "wallSeconds",
    ):
        print(f"{key}: {json.dumps(report[key])}")
    print(f"report: {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
