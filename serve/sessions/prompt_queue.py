"""The prompt queue of one session, sans-IO: admission, FIFO, deadlines, terminals.

Theory of operation
-------------------
:class:`PromptQueue` holds the state of a session's prompts and nothing else: no trio, no
agent, no event log. The session actor drives it and publishes what it returns.

* :meth:`~PromptQueue.admit` admits a prompt (``PromptQueueFull`` past the limit) or, for a
  ``promptId`` it remembers (the last :data:`MAX_REMEMBERED_PROMPTS` ids), returns the
  earlier job again: a re-submission is the same turn, not a second one (after a restore
  from the journal, the prompts on record are remembered as ended:
  :meth:`~PromptQueue.remember_ended`). An absolute
  deadline (the daemon's, shortened by the request's) is fixed at admission, so queueing
  time counts.
* :meth:`~PromptQueue.take` hands the worker the next job in FIFO order; jobs whose deadline
  passed while they waited end instead (their terminals are returned). At most one job runs;
  :meth:`~PromptQueue.release` marks the end of its turn.
* :meth:`~PromptQueue.replace` gives a queued prompt new content before it starts (the
  editable queue); ``admit(front=True)`` puts a steer that became a prompt ahead of the queue.
* :meth:`~PromptQueue.finish`, :meth:`~PromptQueue.remove`, :meth:`~PromptQueue.cancel_queued`
  and :meth:`~PromptQueue.abort_all` end jobs. Every operation that ends a job returns its
  :class:`Terminal`, and a job ends once: **every admitted prompt gets exactly one terminal**
  (``tests/unit/test_prompt_queue.py`` checks this over every operation sequence up to a
  length). A job that ended while running stays the running job until released, so a new
  turn never overlaps the agent's last one.

Times are plain floats from the caller's clock (seconds); ids come from ``new_id``.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from acp import telemetry

#: Client-chosen prompt ids remembered for idempotent re-submission (ids).
MAX_REMEMBERED_PROMPTS: Final = 256

JobState = Literal["queued", "running", "done"]


class PromptQueueFull(Exception):
    def __init__(self, limit: int, pending: int) -> None:
        super().__init__(f"prompt queue full ({pending}/{limit})")
        self.limit = limit
        self.pending = pending


class PromptRunning(Exception):
    """The prompt is running; it can be cancelled, not removed from the queue."""


class PromptRequest(msgspec.Struct, frozen=True):
    """What a client submitted (validated by the HTTP layer)."""

    prompt: msgspec.Raw
    text: str
    client_id: str | None
    extra: dict[str, Any] | None = None
    prompt_id: str | None = None
    deadline_ms: int | None = None  # per-request; can only shorten the daemon's
    #: The ``traceparent`` of the span that submitted it (the HTTP request or ``/acp``
    #: message; None with tracing off): its turn's spans join that trace.
    trace: str | None = msgspec.field(default_factory=telemetry.current_traceparent)


class Terminal(msgspec.Struct, frozen=True):
    """The one terminal of a job: ``turn_complete`` or ``turn_error`` with its data.

    ``started`` says whether the job ever ran (a queued job's ``pending_prompt_completed``
    state is ``completed`` or ``removed``)."""

    job: Job
    kind: str
    data: dict[str, Any]
    started: bool


class Job:
    """One admitted prompt."""

    __slots__ = (
        "admitted_ns",
        "agent_trace",
        "client_id",
        "deadline",
        "extra",
        "notify",
        "prompt",
        "prompt_id",
        "queued",
        "queued_at",
        "started",
        "started_at",
        "state",
        "terminal",
        "text",
        "token",
        "trace",
    )

    def __init__(
        self,
        request: PromptRequest,
        prompt_id: str,
        *,
        queued: bool,
        queued_at: str,
        deadline: float | None,
    ) -> None:
        self.prompt_id = prompt_id
        self.prompt = request.prompt
        self.text = request.text
        self.client_id = request.client_id
        self.extra = request.extra
        #: Admitted behind another prompt (it gets ``pending_prompt_*`` events).
        self.queued = queued
        self.queued_at = queued_at
        self.deadline = deadline
        self.state: JobState = "queued"
        self.started = False
        #: When the job began to run (time.monotonic(), s), for the turn's log line.
        self.started_at: float | None = None
        self.terminal: Terminal | None = None
        #: Called once when the job ends (the actor wakes blocking callers with it).
        self.notify: Callable[[], None] | None = None
        #: The owner's handle for this job (the actor keeps its done event here).
        self.token: Any = None
        #: Tracing (acp.telemetry): the submitter's span, when it was admitted
        #: (``time.time_ns()``), and the span of the agent's work on it (the parent of
        #: its permission waits).
        self.trace = request.trace
        self.admitted_ns = time.time_ns() if telemetry.enabled() else 0
        self.agent_trace: str | None = None

    @property
    def done(self) -> bool:
        return self.terminal is not None

    def __repr__(self) -> str:
        return f"Job({self.prompt_id!r}, {self.state})"


class Admitted(msgspec.Struct, frozen=True):
    job: Job
    fresh: bool  # False: an earlier admission of the same promptId


def deadline_error() -> dict[str, Any]:
    return {
        "message": "the prompt exceeded its deadline",
        "code": "prompt_deadline_exceeded",
        "errorKind": "prompt_deadline_exceeded",
    }


def turn_lost_error() -> dict[str, Any]:
    return {"message": "the turn ended without a result", "code": "turn_lost"}


class PromptQueue:
    def __init__(
        self,
        *,
        limit: int = 0,
        deadline_ms: int | None = None,
        remember: int = MAX_REMEMBERED_PROMPTS,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.limit = limit  # 0: unbounded
        self.deadline_ms = deadline_ms
        self.remember = remember
        self._new_id = new_id
        self._queue: deque[Job] = deque()
        self.running: Job | None = None
        self._admitted: OrderedDict[str, Job] = OrderedDict()

    # ---- read models -------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        """Queued prompts plus the running one."""
        return len(self._queue) + (1 if self.running is not None else 0)

    @property
    def queued(self) -> tuple[Job, ...]:
        return tuple(self._queue)

    def known(self, prompt_id: str) -> Job | None:
        """The job admitted with this ``promptId`` (one of the remembered ids), or None."""
        return self._admitted.get(prompt_id)

    def jobs(self) -> list[Job]:
        """The running job first, then the queue in order."""
        return ([self.running] if self.running is not None else []) + list(self._queue)

    # ---- operations --------------------------------------------------------------------

    def admit(
        self, request: PromptRequest, *, now: float, queued_at: str = "", front: bool = False
    ) -> Admitted:
        """``front``: ahead of the other queued prompts (a steer that becomes a prompt)."""
        if request.prompt_id is not None:
            earlier = self._admitted.get(request.prompt_id)
            if earlier is not None:
                return Admitted(earlier, False)
        if self.limit and self.pending_count >= self.limit:
            raise PromptQueueFull(self.limit, self.pending_count)
        prompt_id = request.prompt_id or self._new_id()
        deadline_ms = self.deadline_ms
        if deadline_ms is not None and request.deadline_ms is not None:
            deadline_ms = min(deadline_ms, request.deadline_ms)
        job = Job(
            request,
            prompt_id,
            queued=self.pending_count > 0,
            queued_at=queued_at,
            deadline=None if deadline_ms is None else now + deadline_ms / 1000,
        )
        if front:
            self._queue.appendleft(job)
        else:
            self._queue.append(job)
        self._admitted[prompt_id] = job
        while len(self._admitted) > self.remember:
            self._admitted.popitem(last=False)
        return Admitted(job, True)

    def remember_ended(
        self,
        prompt_id: str,
        *,
        client_id: str | None,
        text: str,
        queued: bool,
        started: bool,
        kind: str,
        data: dict[str, Any],
    ) -> Terminal | None:
        """Remember a prompt admitted before the session was restored from its journal
        (serve/sessions/recovery.py) as ended with ``kind`` / ``data``: a re-submission of
        its id answers it and does not run again. None when the id is known already."""
        if prompt_id in self._admitted:
            return None
        request = PromptRequest(msgspec.Raw(b"[]"), text, client_id, trace=None)
        job = Job(request, prompt_id, queued=queued, queued_at="", deadline=None)
        job.started = started
        data.setdefault("promptId", prompt_id)
        job.terminal = Terminal(job, kind, data, started)
        job.state = "done"
        self._admitted[prompt_id] = job
        while len(self._admitted) > self.remember:
            self._admitted.popitem(last=False)
        return job.terminal

    def take(self, now: float) -> tuple[Job | None, list[Terminal]]:
        """The next job to run (None: nothing queued, or a job still runs), and the
        terminals of queued jobs whose deadline passed."""
        expired: list[Terminal] = []
        if self.running is not None:
            return None, expired
        while self._queue:
            job = self._queue.popleft()
            if job.deadline is not None and now >= job.deadline:
                terminal = self._end(job, "turn_error", deadline_error())
                assert terminal is not None
                expired.append(terminal)
                continue
            job.state = "running"
            job.started = True
            job.started_at = time.monotonic()
            self.running = job
            return job, expired
        return None, expired

    def release(self, job: Job) -> Terminal | None:
        """The worker is done with ``job``'s turn (the agent call returned or failed).

        A job released without a terminal ends here with ``turn_error`` (its turn was torn
        down without a result), so no admitted prompt is left without one."""
        if self.running is job:
            self.running = None
        if job.terminal is None and job.state == "running":
            return self._end(job, "turn_error", turn_lost_error())
        return None

    def finish(self, job: Job, kind: str, data: dict[str, Any]) -> Terminal | None:
        """End ``job`` (None when it already ended)."""
        if job.terminal is not None:
            return None
        if job.state == "queued":
            self._queue.remove(job)
        return self._end(job, kind, data)

    def remove(self, prompt_id: str, data: dict[str, Any]) -> Terminal | None:
        """Remove a queued prompt (its terminal); None when not queued; running: refused."""
        if self.running is not None and self.running.prompt_id == prompt_id:
            raise PromptRunning(prompt_id)
        return self.cancel_queued(prompt_id, data)

    def replace(self, prompt_id: str, request: PromptRequest) -> Job | None:
        """Give a queued prompt new content (its id, place, deadline and client stay);
        None when it is not queued; running: refused (:class:`PromptRunning`)."""
        if self.running is not None and self.running.prompt_id == prompt_id:
            raise PromptRunning(prompt_id)
        for job in self._queue:
            if job.prompt_id == prompt_id:
                job.prompt = request.prompt
                job.text = request.text
                job.extra = request.extra
                return job
        return None

    def cancel_queued(self, prompt_id: str, data: dict[str, Any]) -> Terminal | None:
        for job in self._queue:
            if job.prompt_id == prompt_id:
                return self.finish(job, "turn_complete", data)
        return None

    def abort_all(self, kind: str, data: dict[str, Any]) -> list[Terminal]:
        """End every unfinished job, the running one first."""
        out: list[Terminal] = []
        for job in self.jobs():
            terminal = self.finish(job, kind, dict(data))
            if terminal is not None:
                out.append(terminal)
        return out

    def _end(self, job: Job, kind: str, data: dict[str, Any]) -> Terminal | None:
        if job.terminal is not None:
            return None
        data.setdefault("promptId", job.prompt_id)
        terminal = Terminal(job, kind, data, job.started)
        job.terminal = terminal
        job.state = "done"
        notify, job.notify = job.notify, None
        if notify is not None:
            notify()
        return terminal
