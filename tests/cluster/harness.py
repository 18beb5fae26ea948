"""A cluster of real daemons for the chaos test: N ``acp-serve`` processes on one PostgreSQL
journal (``--journal-url``), one workspace and one ``--shared-dir``, each with its own
``--state-dir``, port and ``--advertise-url``; and the faults a pod meets: SIGKILL of the
whole process tree (a pod that dies), SIGSTOP/SIGCONT of it (a pod frozen or partitioned
away past its lease), restart on the same state directory (same owner id, same address).

Also the clients' side: :class:`Prompter` (a prompt with a client-chosen ``promptId`` sent
to random serving daemons, retried with the same id on transport errors, 5xx and 404 until
it is answered, bounded) and :class:`Watcher` (one session's SSE stream read across
daemons with ``Last-Event-ID`` / ``X-Qwen-Event-Epoch``, checking ids as it goes).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from ``/proc/*/task/*/children``), parents first."""
    out: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class Member:
    """One daemon of the cluster (alive, frozen or dead)."""

    name: str
    port: int
    state_dir: Path
    proc: DaemonProcess | None = None
    frozen: bool = False
    owner_id: str = ""
    lives: int = 0
    #: The stderr of every earlier life (a restart starts a new log file).
    old_logs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    @property
    def serving(self) -> bool:
        return self.alive and not self.frozen

    def log(self) -> str:
        now = self.proc.stderr() if self.proc is not None else ""
        return "".join(self.old_logs) + now


class Cluster:
    def __init__(self, pg_url: str, root: Path, size: int = 3, lease_ms: int = 20_000) -> None:
        self.pg_url = pg_url
        self.lease_ms = lease_ms
        self.workspace = root / "ws"
        self.shared = root / "shared"
        self.workspace.mkdir(parents=True)
        self.shared.mkdir(parents=True)
        self.members = [Member(f"d{i}", free_port(), root / f"state-{i}") for i in range(size)]

    def args(self, m: Member) -> list[str]:
        return [
            *("--journal-url", self.pg_url, "--shared-dir", str(self.shared)),
            *("--port", str(m.port), "--advertise-url", m.url),
            *("--journal-lease-ms", str(self.lease_ms), "--approval-mode", "yolo"),
        ]

    def start(self, m: Member) -> None:
        assert not m.alive
        if m.proc is not None:
            m.old_logs.append(m.proc.stderr())
        m.proc = spawn_daemon(
            self.args(m),
            workspace=self.workspace,
            state_dir=m.state_dir,
            env={"QWEN_SERVER_TOKEN": TOKEN},
            ready_timeout_s=60,
        )
        m.frozen = False
        m.lives += 1
        id_file = m.state_dir / "daemon-id"  # written as the journal opens, maybe after
        deadline = time.monotonic() + 30
        while not id_file.exists() or not id_file.read_text().strip():
            assert time.monotonic() < deadline, f"{m.name} wrote no {id_file}"
            time.sleep(0.05)
        m.owner_id = id_file.read_text().strip()

    def start_all(self) -> None:
        for m in self.members:
            self.start(m)

    def kill(self, m: Member) -> None:
        """SIGKILL the daemon and every process under it (a pod that dies), and reap it."""
        assert m.proc is not None
        pid = m.proc.proc.pid
        tree = descendants(pid)
        os.kill(pid, signal.SIGKILL)
        _signal_all(tree, signal.SIGKILL)
        _signal_all(descendants(pid), signal.SIGKILL)  # any forked meanwhile
        m.proc.proc.wait(10)
        m.frozen = False

    def freeze(self, m: Member) -> None:
        """SIGSTOP the daemon, then its tree (nothing of the pod runs)."""
        assert m.proc is not None
        pid = m.proc.proc.pid
        os.kill(pid, signal.SIGSTOP)
        _signal_all(descendants(pid), signal.SIGSTOP)
        m.frozen = True

    def thaw(self, m: Member) -> None:
        assert m.proc is not None
        pid = m.proc.proc.pid
        _signal_all(descendants(pid), signal.SIGCONT)
        os.kill(pid, signal.SIGCONT)
        m.frozen = False

    def stop_all(self) -> None:
        for m in self.members:
            if m.proc is None:
                continue
            if m.frozen:
                self.thaw(m)
            if m.alive:
                m.proc.stop(timeout_s=15)

    def serving(self) -> list[Member]:
        return [m for m in self.members if m.serving]

    def pick(self) -> Member:
        live = self.serving()
        assert live, "no daemon serving"
        return random.choice(live)

    def by_owner_id(self, owner_id: str) -> Member | None:
        return next((m for m in self.members if m.owner_id == owner_id), None)

    # ---- the database ------------------------------------------------------------------

    def sql(self, query: str, *args: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            cur = conn.execute(query.encode(), args or None)
            return cur.fetchall() if cur.description else []

    def leases(self) -> dict[str, tuple[str, int, bool]]:
        """session -> (owner id, epoch, live)."""
        rows = self.sql(
            "SELECT session_id, owner_id, epoch, expires_at > now() FROM session_leases"
        )
        return {r[0]: (r[1], int(r[2]), bool(r[3])) for r in rows}

    def owned_by(self, m: Member) -> list[str]:
        return [s for s, (owner, _, live) in self.leases().items() if owner == m.owner_id and live]


# ---- clients -------------------------------------------------------------------------------


def _json(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {"text": r.text[:200]}
    return body if isinstance(body, dict) else {"body": body}


#: Answers after which the same promptId is sent again (to another random daemon), unless
#: the body is the prompt's own terminal (it names the promptId).
RETRY_STATUSES = frozenset({404, 409, 429, 500, 502, 503, 504})


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    attempts: int
    #: (daemon, status or exception name) of every attempt that was retried.
    retried: list[tuple[str, str]]
    answered_at: float
    first_failure_at: float | None


class Prompter:
    """Sends prompts to random serving daemons of ``cluster``."""

    def __init__(self, cluster: Cluster, client: httpx.AsyncClient) -> None:
        self.cluster = cluster
        self.client = client

    async def prompt(
        self,
        sid: str,
        text: str,
        prompt_id: str,
        *,
        deadline_s: float,
        request_timeout_s: float = 15.0,
        respond_async: bool = False,
        first: Member | None = None,
        first_timeout_s: float = 2.0,
    ) -> Answer:
        """Send until a definitive answer (2xx, or a status not in RETRY_STATUSES), at most
        ``deadline_s``; every retry carries the same ``promptId``. ``first``: the daemon
        of the first attempt (with ``first_timeout_s``), e.g. a frozen one a client has not
        noticed yet: its request waits in that daemon's socket."""
        body = {"prompt": [{"type": "text", "text": text}], "promptId": prompt_id}
        headers = {"Prefer": "respond-async"} if respond_async else {}
        retried: list[tuple[str, str]] = []
        first_failure: float | None = None
        with trio.move_on_after(deadline_s):
            while True:
                m, timeout = (first, first_timeout_s) if first else (self.cluster.pick(), None)
                first = None
                try:
                    r = await self.client.post(
                        f"{m.url}/session/{sid}/prompt",
                        json=body,
                        headers=headers,
                        timeout=timeout or request_timeout_s,
                    )
                except httpx.TransportError as exc:
                    outcome = type(exc).__name__
                else:
                    got = _json(r)
                    if r.status_code not in RETRY_STATUSES or got.get("promptId") == prompt_id:
                        # A status a retry cannot change, or this prompt's own terminal (an
                        # ended turn: a retry with its promptId gets the same answer again).
                        return Answer(
                            r.status_code,
                            got,
                            len(retried) + 1,
                            retried,
                            time.monotonic(),
                            first_failure,
                        )
                    outcome = f"{r.status_code} {got.get('code', '')}".strip()
                    retry_after = r.headers.get("Retry-After", "")
                first_failure = first_failure or time.monotonic()
                retried.append((m.name, outcome))
                pause = 0.2
                if outcome[:1].isdigit() and retry_after.isdigit():
                    pause = min(1.0, float(retry_after))
                await trio.sleep(pause)  # a client's back-off between retries
        raise AssertionError(
            f"session {sid}: prompt {prompt_id} not answered in {deadline_s} s;"
            f" {len(retried)} attempts, the last: {retried[-8:]}"
        )


@dataclass
class Seen:
    id: int
    type: str
    data: str  # the envelope's data, as JSON


@dataclass
class Watcher:
    """One session's event stream as a client sees it across daemons and failovers.

    ``received`` is the client's view, by id. Every frame's id must be the one after the
    previous frame's; the one exception is a ``state_resync_required`` with reason
    ``epoch_reset`` (the session was restored with a new epoch, by a takeover or a
    restart): the replay that follows starts over, and the frames with ids the client had
    already seen must be the same events, up to the first one that differs: from there on
    the client had seen the dead owner's tail that never reached the journal, which the
    new owner's events replace (``lost``: how many ids, per resync)."""

    sid: str
    received: dict[int, Seen] = field(default_factory=dict)
    last: int | None = None
    epoch: str | None = None
    violations: list[str] = field(default_factory=list)
    resyncs: list[dict[str, Any]] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    connections: list[str] = field(default_factory=list)
    member: Member | None = None
    scope: trio.CancelScope | None = None
    #: The id of the last frame taken on the current timeline (None: a replay starts over).
    pos: int | None = None
    #: After an epoch reset: the last id seen before it, until the new timeline passes it.
    reset_at: int | None = None
    diverged: bool = False

    def reconnect(self) -> None:
        """Drop the current connection (its daemon was frozen); the loop opens another."""
        if self.scope is not None:
            self.scope.cancel()

    def _frame(self, env: dict[str, Any]) -> None:
        etype = env.get("type", "")
        if etype == "state_resync_required":
            data = env.get("data") or {}
            self.resyncs.append({"at": self.last, **data})
            if data.get("reason") != "epoch_reset":
                self.violations.append(f"resync {data} after {self.last}")
            self.pos, self.reset_at, self.diverged = None, self.last, False
            return
        if "id" not in env:
            return
        eid = int(env["id"])
        seen = Seen(eid, etype, json.dumps(env.get("data"), sort_keys=True))
        if self.pos is not None and eid != self.pos + 1:
            self.violations.append(f"{self.pos} -> {eid} ({etype})")
        self.pos = eid
        if self.reset_at is not None and eid <= self.reset_at:
            old = self.received.get(eid)
            if old is not None and old != seen and not self.diverged:
                self.diverged = True
                self.lost.append(self.reset_at - eid + 1)
                for gone in range(eid, self.reset_at + 1):
                    self.received.pop(gone, None)
        elif eid in self.received and self.received[eid] != seen:
            self.violations.append(f"id {eid} seen twice with different events")
        if self.reset_at is not None and eid >= self.reset_at:
            self.reset_at = None
        self.received[eid] = seen
        self.last = eid if self.diverged or self.last is None else max(self.last, eid)

    async def run(self, cluster: Cluster, client: httpx.AsyncClient) -> None:
        """Read the stream forever (until cancelled), reconnecting to random serving daemons."""
        while True:
            m = cluster.pick()
            headers = {"Last-Event-ID": str(self.last if self.last is not None else 0)}
            if self.epoch:
                headers["X-Qwen-Event-Epoch"] = self.epoch
            with trio.CancelScope() as scope:
                self.member, self.scope = m, scope
                try:
                    async with client.stream(
                        "GET",
                        f"{m.url}/session/{self.sid}/events",
                        headers=headers,
                        timeout=httpx.Timeout(10.0, read=30.0),
                    ) as stream:
                        self.connections.append(f"{m.name}:{stream.status_code}")
                        if stream.status_code != 200:
                            await stream.aread()
                        else:
                            epoch = stream.headers.get("x-qwen-event-epoch")
                            if epoch:
                                self.epoch = epoch
                            await self._read(stream)
                except (httpx.TransportError, httpx.StreamError):
                    self.connections.append(f"{m.name}:dropped")
            self.member, self.scope = None, None
            await trio.sleep(0.2)  # a client's back-off before reconnecting

    async def _read(self, stream: httpx.Response) -> None:
        buffer = ""
        async for text in stream.aiter_text():
            buffer += text
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                data = [
                    ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")
                ]
                if data:
                    self._frame(json.loads("\n".join(data)))


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        headers=AUTH, limits=httpx.Limits(max_connections=200, max_keepalive_connections=50)
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]
