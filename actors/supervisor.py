"""An OTP-style supervisor on a trio nursery.

Theory of operation
-------------------
A :class:`Supervisor` owns one nursery. Each child is described by a :class:`ChildSpec`
(name, an async ``target(task_status=...)``, restart type, shutdown grace, backoff) and
runs inside a *runner* task of that nursery. The runner owns a per-child nursery, starts
the target with ``nursery.start`` (so readiness is the target's ``task_status.started``
value) and, when the target ends, classifies the exit:

===========  =====================  =====================
restart      normal return          exception (a crash)
===========  =====================  =====================
permanent    restarted              restarted
transient    not restarted          restarted
temporary    not restarted          not restarted
===========  =====================  =====================

Strategy is ``one_for_one``: a crash is caught in its runner, so it never cancels a
sibling. That includes a child that fails *while being cancelled* (its cleanup raises while
another of its tasks ends ``Cancelled``): the runner splits the resulting mixed exception
group, records the failure as a crash ("... (while stopping)") and lets the ``Cancelled``
part go on to the scope that asked for it, so the child simply stops.

Every restart is counted in a window shared by the supervisor (intensity ``N``
restarts within ``period_s`` seconds); one more than that makes the supervisor give up:
it records ``give_up``, awaits its ``on_give_up`` hook (bounded by ``give_up_grace_s``;
the daemon uses it to end every SSE stream with a terminal event while the HTTP front is
still up), stops every child in order and raises
:class:`~actors.errors.SupervisorGaveUp` out of :meth:`Supervisor.run`, so *its* parent
decides (a parent supervisor treats it as that child's crash).

A first start that fails before readiness is not a crash to restart: the error goes to
whoever asked for the start (:meth:`Supervisor.start_child` or :meth:`Supervisor.run`).
A restart that fails before readiness counts as a crash.

Shutdown is ordered and bounded: children stop in reverse start order; each first gets
its spec's ``stop`` hook (a polite request), then ``shutdown_grace_s`` to finish, then its
scope is cancelled. ``Cancelled`` is never swallowed: cancelling the supervisor's own
scope tears the tree down as trio intends.

Every start, crash, restart, give-up and stop is appended to a bounded history of
:class:`SupervisorEvent` (and passed to an optional listener), which the daemon exposes
in ``/daemon/status``.
"""

from __future__ import annotations

import enum
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
import trio

from actors.errors import ActorError, SupervisorGaveUp

log = logging.getLogger(__name__)


class Restart(enum.StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class EventKind(enum.StrEnum):
    START = "start"
    CRASH = "crash"
    EXIT = "exit"
    RESTART = "restart"
    GIVE_UP = "give_up"
    STOP = "stop"


class SupervisorEvent(msgspec.Struct, frozen=True):
    """One observable supervision fact (wall-clock ``at`` in Unix seconds)."""

    supervisor: str
    child: str
    kind: EventKind
    reason: str
    at: float
    attempt: int = 0


class Target(Protocol):
    """A child's body: ``await target(task_status=...)``, reporting readiness once with
    ``task_status.started(value)`` (any ``TaskStatus[T]`` accepts the supervisor's)."""

    def __call__(self, *, task_status: trio.TaskStatus[object]) -> Awaitable[object]: ...


#: Asks a running child to finish: sync, or returning an awaitable the supervisor awaits.
StopHook = Callable[[], object]


class RestartWindow:
    """Restart intensity: at most ``intensity`` restarts within ``period_s`` seconds.

    Pure bookkeeping on the trio clock; shared by :class:`Supervisor` and by actors that
    restart a resource of their own (a session restarting its agent child).
    """

    __slots__ = ("_times", "intensity", "period_s")

    def __init__(self, intensity: int, period_s: float) -> None:
        self.intensity = intensity
        self.period_s = period_s
        self._times: deque[float] = deque()

    def _trim(self, now: float) -> None:
        while self._times and now - self._times[0] > self.period_s:
            self._times.popleft()

    def allows(self, now: float | None = None) -> bool:
        """Would one more restart now stay within the intensity?"""
        now = trio.current_time() if now is None else now
        self._trim(now)
        return len(self._times) < self.intensity

    def count(self, now: float | None = None) -> bool:
        """Record one restart; False when it exceeds the intensity."""
        now = trio.current_time() if now is None else now
        self._times.append(now)
        self._trim(now)
        return len(self._times) <= self.intensity

    def __len__(self) -> int:
        return len(self._times)


class ChildSpec(msgspec.Struct, frozen=True):
    """How to run, restart and stop one child.

    ``target`` is called as ``await target(task_status=...)`` and must call
    ``task_status.started(value)`` once it is ready. ``stop`` (optional, sync or async)
    politely asks a running child to finish; after ``shutdown_grace_s`` seconds it is
    cancelled. Restarts wait ``backoff_s * 2**(n-1)`` (capped at ``max_backoff_s``, with
    ±20 % jitter) where ``n`` counts restarts since the child last ran ``stable_after_s``
    seconds without crashing.
    """

    name: str
    target: Target
    restart: Restart = Restart.PERMANENT
    shutdown_grace_s: float = 5.0
    stop: StopHook | None = None
    backoff_s: float = 0.0
    max_backoff_s: float = 5.0
    stable_after_s: float = 30.0


class _Child:
    __slots__ = (
        "done",
        "incarnation_scope",
        "ready_value",
        "restarts",
        "spec",
        "started_at",
        "state",
        "stopping",
    )

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.done = trio.Event()
        self.incarnation_scope: trio.CancelScope | None = None
        self.stopping = False
        self.restarts = 0
        self.started_at = 0.0
        self.state = "starting"
        self.ready_value: object = None


class Supervisor:
    """Owns a nursery of children; see the module docstring for the semantics.

    ``intensity``/``period_s``: more than ``intensity`` restarts within ``period_s``
    seconds (trio clock) make the supervisor give up. ``history`` bounds the event log.
    """

    def __init__(
        self,
        name: str,
        *,
        intensity: int = 3,
        period_s: float = 5.0,
        history: int = 256,
        listener: Callable[[SupervisorEvent], None] | None = None,
        on_give_up: Callable[[SupervisorGaveUp], Awaitable[None]] | None = None,
        give_up_grace_s: float = 5.0,
    ) -> None:
        self.name = name
        #: Awaited once when the supervisor gives up, before any child is stopped.
        self.on_give_up = on_give_up
        self.give_up_grace_s = give_up_grace_s
        self.intensity = intensity
        self.period_s = period_s
        self.events: deque[SupervisorEvent] = deque(maxlen=history)
        self._listener = listener
        self._restarts = RestartWindow(intensity, period_s)
        self._children: dict[str, _Child] = {}
        self._order: list[str] = []
        self._nursery: trio.Nursery | None = None
        self._shutdown = trio.Event()
        self._gave_up: SupervisorGaveUp | None = None
        self.running = False
        #: Set when :meth:`run` has returned (or raised) and every child is gone.
        self.finished = trio.Event()

    # ---- observation -------------------------------------------------------------------

    def record(self, child: str, kind: EventKind, reason: str, attempt: int = 0) -> None:
        """Append an event for a child that manages its own restarts (e.g. a session
        restarting its agent process), so every restart is visible in one history."""
        self._record(child, kind, reason, attempt)

    def _record(self, child: str, kind: EventKind, reason: str, attempt: int = 0) -> None:
        event = SupervisorEvent(self.name, child, kind, reason, time.time(), attempt)
        self.events.append(event)
        # Routine starts and stops are for debugging; restarts and failures are news.
        routine = kind in (EventKind.START, EventKind.STOP) or (
            kind == EventKind.EXIT and reason == "normal"
        )
        level = logging.DEBUG if routine else logging.INFO
        log.log(level, "supervisor %s: %s %s (%s)", self.name, child, kind, reason)
        if self._listener is not None:
            try:
                self._listener(event)
            except Exception:
                log.exception("supervisor listener failed")

    def children(self) -> list[dict[str, Any]]:
        """A snapshot of the children for status pages."""
        return [
            {
                "name": c.spec.name,
                "restart": str(c.spec.restart),
                "state": c.state,
                "restarts": c.restarts,
            }
            for c in (self._children[n] for n in self._order)
        ]

    def has_child(self, name: str) -> bool:
        return name in self._children

    # ---- lifecycle ---------------------------------------------------------------------

    async def run(
        self,
        specs: list[ChildSpec] | tuple[ChildSpec, ...] = (),
        *,
        task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start ``specs`` in order, report readiness, supervise until :meth:`shutdown`.

        A supervisor whose previous run ended (e.g. it gave up and its parent restarts it)
        starts afresh: new restart window, no give-up; its history is kept."""
        if self.finished.is_set():
            self.finished = trio.Event()
            self._shutdown = trio.Event()
            self._gave_up = None
            self._restarts = RestartWindow(self.intensity, self.period_s)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.running = True
                for spec in specs:
                    await self.start_child(spec)
                task_status.started(self)
                await self._shutdown.wait()
                if self._gave_up is not None and self.on_give_up is not None:
                    with trio.move_on_after(self.give_up_grace_s):
                        try:
                            await self.on_give_up(self._gave_up)
                        except Exception:
                            log.exception("on_give_up hook of supervisor %s failed", self.name)
                await self._stop_all()
                nursery.cancel_scope.cancel()
        finally:
            self.running = False
            self._nursery = None
            self.finished.set()
        if self._gave_up is not None:
            raise self._gave_up

    def shutdown(self) -> None:
        """Ask :meth:`run` to stop every child in reverse order and return."""
        self._shutdown.set()

    async def start_child(self, spec: ChildSpec) -> object:
        """Start a (possibly dynamic) child; returns its readiness value.

        Raises whatever the target raised before it was ready; the child is then not
        registered and not restarted.
        """
        if self._nursery is None:
            raise ActorError(f"supervisor {self.name!r} is not running")
        if spec.name in self._children:
            raise ActorError(f"supervisor {self.name!r} already has a child {spec.name!r}")
        child = _Child(spec)
        self._children[spec.name] = child
        self._order.append(spec.name)
        try:
            return await self._nursery.start(self._runner, child)
        except BaseException:
            self._forget(child)
            raise

    async def stop_child(self, name: str, *, grace_s: float | None = None) -> None:
        """Stop one child politely, then by cancellation after its grace period."""
        child = self._children.get(name)
        if child is None:
            return
        await self._stop(child, grace_s)

    def _forget(self, child: _Child) -> None:
        if self._children.get(child.spec.name) is child:
            del self._children[child.spec.name]
            self._order.remove(child.spec.name)

    async def _stop_all(self) -> None:
        for name in reversed(list(self._order)):
            child = self._children.get(name)
            if child is not None:
                await self._stop(child, None)

    async def _stop(self, child: _Child, grace_s: float | None) -> None:
        child.stopping = True
        grace = child.spec.shutdown_grace_s if grace_s is None else grace_s
        if child.spec.stop is not None and not child.done.is_set():
            try:
                result = child.spec.stop()
                if isinstance(result, Awaitable):
                    with trio.move_on_after(grace):
                        await result
            except Exception:
                log.exception("stop hook of %s failed", child.spec.name)
        with trio.move_on_after(grace):
            await child.done.wait()
        if not child.done.is_set():
            if child.incarnation_scope is not None:
                child.incarnation_scope.cancel()
            await child.done.wait()

    # ---- the runner --------------------------------------------------------------------

    async def _runner(self, child: _Child, *, task_status: trio.TaskStatus[object]) -> None:
        spec = child.spec
        ready_reported = False
        attempt = 0
        try:
            while True:
                crash: BaseException | None = None
                scope = trio.CancelScope()
                child.incarnation_scope = scope
                began = trio.current_time()
                with scope:
                    try:
                        async with trio.open_nursery() as inner:
                            value = await inner.start(_call_target, spec.target)
                            child.ready_value = value
                            child.state = "running"
                            child.started_at = time.time()
                            self._record(spec.name, EventKind.START, "ready", attempt)
                            if not ready_reported:
                                ready_reported = True
                                task_status.started(value)
                    except Exception as exc:
                        if not ready_reported:
                            child.state = "failed"
                            raise unwrap_group(exc) from None
                        crash = unwrap_group(exc)
                    except BaseExceptionGroup as group:
                        # Failed while being cancelled: Cancelled + errors. Keep the errors
                        # here (a crash of this child only) and re-raise the Cancelled part
                        # for the scope that cancelled (ours: the child stops).
                        cancelled, rest = group.split(trio.Cancelled)
                        errors, others = rest.split(Exception) if rest else (None, None)
                        if errors is None or others is not None:
                            raise
                        if not ready_reported:
                            child.state = "failed"
                            raise
                        crash = unwrap_group(errors)
                        self._crashed_while_stopping(spec.name, crash, attempt)
                        crash = None
                        if cancelled is not None:
                            raise cancelled from None
                if scope.cancelled_caught or child.stopping:
                    if crash is not None:
                        self._crashed_while_stopping(spec.name, crash, attempt)
                    child.state = "stopped"
                    self._record(spec.name, EventKind.STOP, "shutdown", attempt)
                    return
                if crash is None:
                    self._record(spec.name, EventKind.EXIT, "normal", attempt)
                    if spec.restart is not Restart.PERMANENT:
                        child.state = "exited"
                        return
                else:
                    log.warning(
                        "child %s of %s crashed: %r", spec.name, self.name, crash, exc_info=crash
                    )
                    self._record(spec.name, EventKind.CRASH, _describe(crash), attempt)
                    if spec.restart is Restart.TEMPORARY:
                        child.state = "crashed"
                        return
                # A restart: count it against the intensity, back off, go again.
                if trio.current_time() - began >= spec.stable_after_s:
                    attempt = 0
                attempt += 1
                child.restarts += 1
                if self._count_restart(spec.name):
                    child.state = "gave_up"
                    return
                child.state = "restarting"
                delay = _backoff(spec, attempt)
                self._record(spec.name, EventKind.RESTART, f"attempt {attempt}", attempt)
                if delay > 0:
                    await trio.sleep(delay)
                if child.stopping:
                    child.state = "stopped"
                    self._record(spec.name, EventKind.STOP, "shutdown", attempt)
                    return
        finally:
            child.done.set()
            if child.state in ("stopped", "exited", "crashed", "gave_up"):
                self._forget(child)

    def _crashed_while_stopping(self, name: str, crash: BaseException, attempt: int) -> None:
        log.warning("child %s of %s failed while stopping: %r", name, self.name, crash)
        self._record(name, EventKind.CRASH, f"{_describe(crash)} (while stopping)", attempt)

    def _count_restart(self, name: str) -> bool:
        """Count one restart; True when the intensity is exceeded (we give up)."""
        if self._restarts.count():
            return False
        self._record(
            name, EventKind.GIVE_UP, f"more than {self.intensity} restarts in {self.period_s:g} s"
        )
        if self._gave_up is None:
            self._gave_up = SupervisorGaveUp(self.name, name, self.intensity, self.period_s)
        # run() stops the other children in order, then raises the give-up to our parent.
        self._shutdown.set()
        return True


async def _call_target(target: Target, *, task_status: trio.TaskStatus[object]) -> None:
    await target(task_status=task_status)


def unwrap_group(exc: BaseException) -> BaseException:
    """Peel single-exception groups (what a nursery adds around one child's error)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _backoff(spec: ChildSpec, attempt: int) -> float:
    if spec.backoff_s <= 0:
        return 0.0
    base = min(spec.max_backoff_s, spec.backoff_s * 2 ** (attempt - 1))
    return float(base * random.uniform(0.8, 1.2))
