"""The sans-IO prompt queue, without trio: every operation sequence up to a length.

Every operation sequence up to four operations is run (and a fixed sample of longer ones).
The model checked: each admitted prompt gets at most one terminal while it lives and
exactly one once everything is aborted; a re-submitted ``promptId`` is the same job; at most
one job runs, taken in FIFO order; the limit holds; a job past its deadline never starts.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import msgspec
import pytest

from serve.sessions.prompt_queue import (
    Job,
    PromptQueue,
    PromptQueueFull,
    PromptRequest,
    PromptRunning,
    Terminal,
)

RAW = msgspec.Raw(b'[{"type":"text","text":"x"}]')

# Operations: (name, argument). Prompt ids come from a small set so re-submission and
# removal hit existing jobs; None lets the queue mint one.
OPS: list[tuple[str, Any]] = [
    ("admit", None),
    ("admit", "a"),
    ("admit", "b"),
    ("admit_short", None),  # a 1 s deadline
    ("admit_front", "a"),  # ahead of the queue (a steer that became a prompt)
    ("replace", "b"),  # new content, same id and place
    ("take", None),
    ("finish", None),  # the running job completes
    ("release", None),
    ("remove", "a"),
    ("cancel_queued", "b"),
    ("tick", None),  # 2 s pass
    ("abort", None),
]


class Model:
    def __init__(self, limit: int) -> None:
        counter = itertools.count()
        self.q = PromptQueue(limit=limit, deadline_ms=None, new_id=lambda: f"p{next(counter)}")
        self.now = 0.0
        self.limit = limit
        self.admitted: list[Job] = []
        self.terminals: dict[int, list[Terminal]] = {}
        self.taken: list[Job] = []
        self.notified: dict[int, int] = {}
        self.expected: list[Job] = []  # the queue's order: FIFO, front admissions first

    def record(self, terminals: list[Terminal | None]) -> None:
        for t in terminals:
            if t is None:
                continue
            self.terminals.setdefault(id(t.job), []).append(t)
            assert t.job.terminal is t
            assert t.data["promptId"] == t.job.prompt_id

    def apply(self, op: str, arg: Any) -> None:
        q = self.q
        if op in ("admit", "admit_short", "admit_front"):
            before = q.pending_count
            req = PromptRequest(RAW, "x", None, prompt_id=arg, deadline_ms=1000)
            if op != "admit_short":
                req = PromptRequest(RAW, "x", None, prompt_id=arg)
            else:
                q.deadline_ms = 60_000  # the request's 1 s shortens it
            try:
                admitted = q.admit(req, now=self.now, front=op == "admit_front")
            except PromptQueueFull:
                assert self.limit and before >= self.limit
                assert arg is None or all(j.prompt_id != arg for j in self.admitted)
                return
            finally:
                q.deadline_ms = None
            job = admitted.job
            if admitted.fresh:
                assert job not in self.admitted
                assert job.queued == (before > 0)
                self.admitted.append(job)
                if op == "admit_front":
                    self.expected.insert(0, job)
                else:
                    self.expected.append(job)
                key = id(job)
                self.notified[key] = 0

                def bump(key: int = key) -> None:
                    self.notified[key] += 1

                job.notify = bump
            else:
                assert arg is not None and job.prompt_id == arg and job in self.admitted
        elif op == "take":
            running = q.running
            job, expired = q.take(self.now)
            self.record(list(expired))
            if running is not None:
                assert job is None and not expired
                return
            for t in expired:
                assert t.kind == "turn_error" and t.data["code"] == "prompt_deadline_exceeded"
                assert not t.started
            if job is not None:
                assert job.terminal is None and job.state == "running" and job.started
                assert job.deadline is None or self.now < job.deadline
                # the queue's order: every job ahead of it in the queue has ended
                ahead = self.expected[: self.expected.index(job)]
                assert all(j.done for j in ahead)
                self.taken.append(job)
        elif op == "replace":
            running = q.running
            try:
                job = q.replace(arg, PromptRequest(RAW, "y", None))
            except PromptRunning:
                assert running is not None and running.prompt_id == arg
                return
            if job is None:
                assert all(j.prompt_id != arg for j in q.queued)
            else:
                assert job.prompt_id == arg and job.text == "y" and job in q.queued
        elif op == "finish":
            if q.running is not None:
                self.record([q.finish(q.running, "turn_complete", {"stopReason": "end_turn"})])
        elif op == "release":
            if q.running is not None:
                self.record([q.release(q.running)])
        elif op in ("remove", "cancel_queued"):
            running = q.running
            try:
                fn = q.remove if op == "remove" else q.cancel_queued
                terminal = fn(arg, {"stopReason": "cancelled"})
            except PromptRunning:
                assert op == "remove" and running is not None and running.prompt_id == arg
                return
            self.record([terminal])
            if terminal is not None:
                assert terminal.job.prompt_id == arg and not terminal.started
                assert terminal.job not in q.queued
        elif op == "tick":
            self.now += 2.0
        elif op == "abort":
            self.record(list(q.abort_all("turn_error", {"code": "x"})))
            assert all(j.done for j in q.jobs())
        self.check()

    def check(self) -> None:
        q = self.q
        for job in self.admitted:
            got = self.terminals.get(id(job), [])
            assert len(got) <= 1, f"{job} got {len(got)} terminals"
            assert (len(got) == 1) == job.done
            assert self.notified[id(job)] == len(got)
        assert q.pending_count == len(q.jobs())
        assert all(j.state == "queued" and not j.done for j in q.queued)
        self.expected = [j for j in self.expected if j.state == "queued"]
        assert list(q.queued) == self.expected
        if self.limit:
            assert len(q.queued) + (1 if q.running is not None else 0) <= self.limit + 1
        assert len({id(j) for j in self.taken}) == len(self.taken)

    def close(self) -> None:
        """Abort, release: every admitted prompt has exactly one terminal."""
        self.record(list(self.q.abort_all("turn_error", {"code": "daemon_shutdown"})))
        if self.q.running is not None:
            self.record([self.q.release(self.q.running)])
        assert self.q.pending_count == 0
        for job in self.admitted:
            assert len(self.terminals.get(id(job), [])) == 1, job


@pytest.mark.parametrize("limit", [0, 2])
def test_every_sequence_of_operations_keeps_the_invariants(limit: int) -> None:
    """Exhaustive up to four operations (13**4 sequences per limit)."""
    length = 4
    count = 0
    for seq in itertools.product(OPS, repeat=length):
        model = Model(limit)
        for op, arg in seq:
            model.apply(op, arg)
        model.close()
        count += 1
    assert count == len(OPS) ** length


@pytest.mark.parametrize("limit", [0, 2])
def test_longer_random_sequences_keep_the_invariants(limit: int) -> None:
    """Beyond the exhaustive length: a fixed sample of 12-operation sequences."""
    rng = random.Random(1516)
    for _ in range(3000):
        model = Model(limit)
        for op, arg in rng.choices(OPS, k=12):
            model.apply(op, arg)
        model.close()


def test_resubmitted_prompt_id_is_the_same_turn_even_after_it_ended() -> None:
    q = PromptQueue()
    first = q.admit(PromptRequest(RAW, "x", "c", prompt_id="p"), now=0)
    job, _ = q.take(0)
    assert job is first.job
    q.finish(job, "turn_complete", {"stopReason": "end_turn"})
    q.release(job)
    again = q.admit(PromptRequest(RAW, "x", "c", prompt_id="p"), now=1)
    assert not again.fresh and again.job is first.job and q.pending_count == 0


def test_remembered_ids_are_bounded() -> None:
    q = PromptQueue(remember=2)
    for pid in ("a", "b", "c"):
        q.admit(PromptRequest(RAW, "x", None, prompt_id=pid), now=0)
    assert q.admit(PromptRequest(RAW, "x", None, prompt_id="a"), now=0).fresh  # forgotten
    assert not q.admit(PromptRequest(RAW, "x", None, prompt_id="c"), now=0).fresh


def test_a_prompt_remembered_from_the_journal_answers_its_id_and_never_runs() -> None:
    q = PromptQueue(remember=2)
    ended = q.remember_ended(
        "old",
        client_id="c",
        text="t",
        queued=False,
        started=True,
        kind="turn_error",
        data={"code": "owner_lost"},
    )
    assert ended is not None and ended.job.done and ended.data["promptId"] == "old"
    again = q.admit(PromptRequest(RAW, "x", "c", prompt_id="old"), now=0)
    assert not again.fresh and again.job is ended.job
    assert q.pending_count == 0 and q.take(0) == (None, [])  # nothing to run

    def remember(pid: str) -> Terminal | None:
        return q.remember_ended(
            pid, client_id=None, text="", queued=False, started=True, kind="k", data={}
        )

    assert remember("old") is None  # known: kept as it was
    remember("b")
    remember("c")  # past the bound: the oldest is forgotten
    assert q.known("old") is None and q.known("c") is not None


def test_deadline_counts_queueing_time_and_the_shorter_one_wins() -> None:
    q = PromptQueue(deadline_ms=10_000)
    a = q.admit(PromptRequest(RAW, "x", None), now=0).job
    b = q.admit(PromptRequest(RAW, "x", None, deadline_ms=500), now=0).job
    c = q.admit(PromptRequest(RAW, "x", None, deadline_ms=50_000), now=0).job
    assert (a.deadline, b.deadline, c.deadline) == (10.0, 0.5, 10.0)
    assert q.take(0)[0] is a
    q.finish(a, "turn_complete", {"stopReason": "end_turn"})
    q.release(a)
    job, expired = q.take(1.0)  # b waited past its deadline: it ends, c runs
    assert job is c and [t.job for t in expired] == [b]
    assert b.terminal is not None and b.terminal.data["code"] == "prompt_deadline_exceeded"


def test_a_job_that_ended_while_running_blocks_the_next_turn_until_released() -> None:
    q = PromptQueue()
    a = q.admit(PromptRequest(RAW, "x", None), now=0).job
    b = q.admit(PromptRequest(RAW, "x", None), now=0).job
    assert q.take(0)[0] is a
    assert q.finish(a, "turn_error", {"code": "cancel_grace_exceeded"}) is not None
    assert q.take(0) == (None, [])  # the agent's turn has not returned yet
    q.release(a)
    assert q.take(0)[0] is b
