"""Issue 47's chaos test: 3 daemons on one PostgreSQL journal, one workspace and one
``--shared-dir``; 30 sessions; clients on random daemons (tests/cluster/harness.py).

Three faults, one after another, each hitting an owner mid-turn (every session it owns is
in a slow turn whose first step has run):

1. SIGKILL of d0's whole process tree; d0 is restarted on its state directory afterwards.
2. SIGKILL of d1 (which by then also owns some of d0's sessions); restarted afterwards.
3. SIGSTOP of d2 (daemon and agents) past its lease (``LEASE_MS``), then SIGCONT; a
   client that had not noticed sent a prompt to d2 first (it waits in d2's socket).

After each fault every session answers a new prompt on a serving daemon (the killed
prompt, retried with its ``promptId``, gets a definitive answer first); the time from the
fault to that answer is the failover time (p50/p95 printed, recorded in
docs/performance.md). At the end:

* every session's stream, read over SSE across the failovers with ``Last-Event-ID`` and
  ``X-Qwen-Event-Epoch``, had consecutive ids; the only exception is a takeover's
  ``state_resync_required`` (new epoch) whose replay replaces the tail the dead owner had
  sent but not journaled (docs/postgres-journal.md: a crash loses at most the batches not
  yet committed), bounded here;
* in the database the epochs of a session's rows never go down along its ids, and no row
  of the frozen owner's epoch was written after it resumed (its writes are refused: its log
  says ``lease lost``, ``runtime.journal.fencedSessions`` counts them);
* every prompt wrote one marker line when it ran (``[shell echo ID >> ran.log]`` in the
  shared workspace): no ``promptId`` ran twice.
"""

from __future__ import annotations

import collections
import json
import os
import time
import uuid
from pathlib import Path

import httpx
import pytest
import trio

from tests.cluster.harness import (
    Answer,
    Cluster,
    Member,
    Prompter,
    Seen,
    Watcher,
    client,
    percentile,
)

SESSIONS = 30
#: The sessions' lease (``--journal-lease-ms``): shorter than the default 20 s so the
#: freeze costs CI seconds, not half a minute; ``ACP_CHAOS_LEASE_MS=20000`` measures the
#: defaults (docs/performance.md has both).
LEASE_MS = int(os.environ.get("ACP_CHAOS_LEASE_MS", "6000"))
#: Failover bounds asserted (seconds, from the fault to the session's first answered
#: prompt): the issue's promise with the defaults (10 s after a SIGKILL, 30 s after a
#: freeze), plus slack for a loaded 2-core CI. A freeze costs the lease or the forwarder's
#: 10 s wait for the frozen owner's answer, whichever is longer, then a retry.
KILL_BOUND_S = 15.0
FREEZE_BOUND_S = max(LEASE_MS / 1000, 10.0) * 1.25 + 10
#: Ids a client may have seen from a dead owner that were never journaled (per resync):
#: what one flush window (50 ms) of a turn publishes, with a wide margin.
MAX_LOST_TAIL = 200
MARKER = "ran.log"
#: A slow turn: events every 50 ms for about 10 s, so a fault lands while the owner is
#: publishing (and flushing) them.
SLOW = " ".join(f"[think tick {i}] [sleep 50]" for i in range(200)) + " slow done"

pytestmark = pytest.mark.timeout(240)


def ask(prompt_id: str, rest: str) -> str:
    """A prompt whose first step appends its id to the shared marker file."""
    return f"[shell echo {prompt_id} >> {MARKER}] {rest}"


def markers(cluster: Cluster) -> collections.Counter[str]:
    path = cluster.workspace / MARKER
    lines = path.read_text().split() if path.exists() else []
    return collections.Counter(lines)


def stale_rows(cluster: Cluster, sid: str, epoch: int) -> tuple[int, int]:
    """(count, max id) of the session's rows written with ``epoch``."""
    row = cluster.sql(
        "SELECT count(*), coalesce(max(event_id), 0) FROM journal_events"
        " WHERE session_id = %s AND lease_epoch = %s",
        sid,
        epoch,
    )[0]
    return int(row[0]), int(row[1])


def journal_view(cluster: Cluster, sid: str) -> dict[int, Seen]:
    """The session's journaled events as a client reads them (type and data, by id)."""
    out: dict[int, Seen] = {}
    for eid, frame in cluster.sql(
        "SELECT event_id, frame FROM journal_events WHERE session_id = %s", sid
    ):
        data = [
            line[5:].removeprefix(" ")
            for line in bytes(frame).decode().split("\n")
            if line.startswith("data:")
        ]
        env = json.loads("\n".join(data))
        out[int(eid)] = Seen(int(eid), env["type"], json.dumps(env.get("data"), sort_keys=True))
    return out


async def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    with trio.move_on_after(timeout_s) as scope:
        # Files and rows written by other processes: nothing to wait on but polling.
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110
            await trio.sleep(0.05)
    if scope.cancelled_caught:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Chaos:
    def __init__(self, cluster: Cluster, http: httpx.AsyncClient) -> None:
        self.cluster = cluster
        self.http = http
        self.prompter = Prompter(cluster, http)
        self.sessions: list[str] = []
        self.watchers: dict[str, Watcher] = {}
        self.answers: dict[str, Answer] = {}  # promptId -> its definitive answer
        self.failover: dict[str, list[float]] = {"kill": [], "freeze": []}
        self.killed_turns: dict[str, Answer] = {}
        #: The victim's lease epoch of each of its sessions, when the fault hit.
        self.epochs: dict[str, int] = {}

    async def create(self, n: int) -> None:
        async def one() -> None:
            m = self.cluster.pick()
            r = await self.http.post(
                f"{m.url}/session", json={"sessionScope": "thread"}, timeout=60
            )
            assert r.status_code == 200, r.text
            self.sessions.append(r.json()["sessionId"])

        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)

    async def answer(
        self, sid: str, text: str, deadline_s: float, first: Member | None = None
    ) -> Answer:
        pid = "p-" + uuid.uuid4().hex[:12]
        got = await self.prompter.prompt(
            sid, ask(pid, text), pid, deadline_s=deadline_s, first=first
        )
        self.answers[pid] = got
        assert got.status == 200, (sid, got)
        return got

    async def every_session_answers(self, deadline_s: float) -> dict[str, float]:
        done: dict[str, float] = {}

        async def one(sid: str) -> None:
            done[sid] = (await self.answer(sid, "ok", deadline_s)).answered_at

        async with trio.open_nursery() as nursery:
            for sid in self.sessions:
                nursery.start_soon(one, sid)
        return done

    async def fault(self, victim: Member, kind: str, bound_s: float) -> list[str]:
        """Start a slow turn in every session ``victim`` owns, wait until each turn's marker
        is written (mid-turn), apply the fault, then every session answers; returns the
        victim's sessions."""
        owned = self.cluster.owned_by(victim)
        leases = self.cluster.leases()
        self.epochs.update({sid: leases[sid][1] for sid in owned})
        assert owned, f"{victim.name} owns no session"
        slow: dict[str, str] = {}
        for sid in owned:
            pid = "slow-" + uuid.uuid4().hex[:12]
            slow[sid] = pid
            started = await self.prompter.prompt(
                sid, ask(pid, SLOW), pid, deadline_s=20, respond_async=True
            )
            assert started.status == 202, (sid, started)
        await wait_for(
            lambda: all(markers(self.cluster)[p] for p in slow.values()),
            20,
            f"the slow turns on {victim.name} to start",
        )
        t0 = time.monotonic()
        if kind == "kill":
            await trio.to_thread.run_sync(self.cluster.kill, victim)
        else:
            self.cluster.freeze(victim)
            for sid, w in self.watchers.items():  # streams from or through it hang
                if w.member is victim or sid in slow:
                    w.reconnect()

        async def recover(sid: str) -> None:
            pid = slow[sid]
            # The killed turn, retried with its promptId: a definitive answer, never a rerun.
            self.killed_turns[pid] = await self.prompter.prompt(
                sid, ask(pid, SLOW), pid, deadline_s=bound_s + 30
            )
            got = await self.answer(sid, "after", bound_s + 30)
            self.failover[kind].append(got.answered_at - t0)

        async with trio.open_nursery() as nursery:
            for sid in owned:
                nursery.start_soon(recover, sid)
                if kind == "freeze":
                    # A client that has not noticed the freeze tries the frozen daemon
                    # first: its request waits in that daemon's socket until it resumes,
                    # long after the client gave up and the prompt ran elsewhere.
                    nursery.start_soon(self.answer, sid, "unaware", bound_s + 30, victim)
            others = [s for s in self.sessions if s not in slow]
            for sid in others:
                nursery.start_soon(self.answer, sid, "bystander", bound_s)
        return owned


async def test_three_daemons_survive_kills_and_a_freeze(tmp_path: Path, pg_url: str) -> None:
    cluster = Cluster(pg_url, tmp_path, lease_ms=LEASE_MS)
    d0, d1, d2 = cluster.members
    began = time.monotonic()
    phases: list[str] = []

    def phase(name: str) -> None:
        phases.append(f"{name} at {time.monotonic() - began:.1f} s")

    try:
        cluster.start_all()
        async with client() as http, trio.open_nursery() as watchers:
            chaos = Chaos(cluster, http)
            await chaos.create(SESSIONS)
            for sid in chaos.sessions:
                chaos.watchers[sid] = w = Watcher(sid)
                watchers.start_soon(w.run, cluster, http)
            await chaos.every_session_answers(60)
            phase("30 sessions answered")

            # 1. SIGKILL d0 mid-turn; restart it on its state directory.
            await chaos.fault(d0, "kill", KILL_BOUND_S)
            await trio.to_thread.run_sync(cluster.start, d0)
            phase("d0 killed, recovered, restarted")
            # 2. SIGKILL d1 mid-turn (it owns some of d0's sessions by now); restart it.
            await chaos.fault(d1, "kill", KILL_BOUND_S)
            await trio.to_thread.run_sync(cluster.start, d1)
            phase("d1 killed, recovered, restarted")
            # 3. Freeze d2 mid-turn past its lease; its sessions answer on d0/d1.
            frozen = await chaos.fault(d2, "freeze", FREEZE_BOUND_S)
            frozen_epochs = {
                sid: epoch
                for sid, (owner, epoch, _) in cluster.leases().items()
                if sid in frozen and owner == d2.owner_id
            }
            assert not frozen_epochs, "d2 still holds its sessions' leases after they answered"
            # The rows each frozen session holds from d2's epoch, before d2 resumes.
            d2_rows = {sid: stale_rows(cluster, sid, chaos.epochs[sid]) for sid in frozen}
            phase("d2 frozen, recovered")
            cluster.thaw(d2)
            # d2 resumes: its frozen turns go on and their events try to reach the
            # journal; the renewer finds its leases taken. The database refuses it.
            await wait_for(lambda: "lease lost" in d2.log(), 30, "d2 to log 'lease lost'")
            status = (await http.get(f"{d2.url}/daemon/status", timeout=30)).json()
            journal = status["runtime"]["journal"]
            assert journal["fencedSessions"] and journal["leasesLost"] >= 1, journal
            for w in chaos.watchers.values():  # streams through any daemon, d2 included
                w.reconnect()

            # After the thaw every session still answers, on any daemon (d2 included).
            await chaos.every_session_answers(60)
            last_ids = {
                sid: int(n)
                for sid, n in cluster.sql(
                    "SELECT session_id, max(event_id) FROM journal_events GROUP BY session_id"
                )
            }

            def behind() -> dict[str, tuple[int | None, int, list[str]]]:
                return {
                    sid: (w.last, last_ids.get(sid, 0), w.connections[-4:])
                    for sid, w in chaos.watchers.items()
                    if (w.last or 0) < last_ids.get(sid, 0)
                }

            with trio.move_on_after(15):  # asserted below, after the markers
                while behind():  # noqa: ASYNC110 (events arriving over sockets)
                    await trio.sleep(0.05)
            lagging = behind()
            phase("d2 resumed, fenced; every session answered again")
            watchers.cancel_scope.cancel()
    finally:
        cluster.stop_all()
        for m in cluster.members:  # kept with the test's tmp_path, for a failure's story
            (tmp_path / f"{m.name}.log").write_text(m.log())

    print("phases:", "; ".join(phases))
    # Every property is checked and every failure named (a chaos run is costly to repeat).
    problems: list[str] = []

    # ---- no prompt ran twice -------------------------------------------------------------
    ran = markers(cluster)
    twice = {p: n for p, n in ran.items() if n > 1}
    if twice:
        problems.append(f"{len(twice)} prompts ran more than once: {twice}")
    problems += [f"answered prompt {p} ran {ran[p]} times" for p in chaos.answers if ran[p] != 1]
    journal_text = b"".join(
        bytes(f)
        for (f,) in cluster.sql(
            "SELECT frame FROM journal_events WHERE event_type = 'turn_complete'"
        )
    )
    problems += [  # an answered turn is in the journal (not a fenced owner's copy's)
        f"answered prompt {p} has no turn_complete in the journal"
        for p in chaos.answers
        if f'"{p}"'.encode() not in journal_text
    ]
    killed = collections.Counter(
        f"{a.status} {a.body.get('code', '')}".strip() for a in chaos.killed_turns.values()
    )
    print("the killed turns retried with their promptId answered:", dict(killed))

    # ---- failover times ------------------------------------------------------------------
    for kind, bound in (("kill", KILL_BOUND_S), ("freeze", FREEZE_BOUND_S)):
        times = chaos.failover[kind]
        print(
            f"failover after {kind} (lease {LEASE_MS} ms): n={len(times)}"
            f" p50={percentile(times, 0.5):.2f} s p95={percentile(times, 0.95):.2f} s"
            f" max={max(times):.2f} s"
        )
        if max(times) > bound:
            problems.append(f"failover after {kind} over {bound} s: {sorted(times)}")

    # ---- event ids per session -----------------------------------------------------------
    if lagging:
        problems.append(f"streams that never reached their journal's last event: {lagging}")
    for sid, w in chaos.watchers.items():
        if w.violations:
            problems.append(f"{sid}: ids out of order {w.violations} via {w.connections}")
        if any(n > MAX_LOST_TAIL for n in w.lost):
            problems.append(f"{sid}: a lost tail over {MAX_LOST_TAIL} ids: {w.lost}")
        ids = sorted(w.received)
        if ids != list(range(ids[0], ids[-1] + 1)):
            problems.append(f"{sid}: the client's view has holes")
        # What the client ended with is what the journal holds: same ids, same events.
        journaled = journal_view(cluster, sid)
        differ = [eid for eid in ids if journaled.get(eid) != w.received[eid]]
        if differ:
            problems.append(f"{sid}: events the journal does not hold as seen: {differ[:10]}")
    print(
        "resyncs:",
        sum(len(w.resyncs) for w in chaos.watchers.values()),
        "lost tails:",
        [n for w in chaos.watchers.values() for n in w.lost],
    )

    # ---- fencing in the database ---------------------------------------------------------
    for sid in chaos.sessions:
        epochs = [
            int(e)
            for (e,) in cluster.sql(
                "SELECT lease_epoch FROM journal_events WHERE session_id = %s ORDER BY event_id",
                sid,
            )
        ]
        if epochs != sorted(epochs):
            problems.append(f"{sid}: an older epoch wrote after a newer one")
    for sid, before in d2_rows.items():  # d2 wrote nothing after it resumed
        if stale_rows(cluster, sid, chaos.epochs[sid]) != before:
            problems.append(f"{sid}: the frozen owner wrote after it resumed")
    assert not problems, "\n".join(problems)
