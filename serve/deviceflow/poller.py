"""The DeviceFlowPoller actor: RFC 8628 flows, their polling timers, credential storage.

Theory of operation
-------------------
All flow state lives in one :class:`~serve.deviceflow.machine.FlowTable` (pure, tested
with a fake clock) owned by this actor; secrets (device codes, PKCE verifiers) live next
to it, wrapped in :class:`~serve.deviceflow.idp.Secret`, and are dropped as soon as a flow
ends. I/O runs in tasks of the actor's nursery and reports back through the inbox:

* ``POST`` → :class:`StartFlow`: attach to the provider's live flow, or create one and
  run the device authorization request (bounded by :data:`START_TIMEOUT_S`). The caller
  gets a :class:`Ticket` that resolves when the IdP answered (attachers of a flow that is
  still starting wait on the same answer); an IdP failure is :class:`UpstreamError`.
* A timer task sleeps until ``FlowTable.next_deadline_ms()`` (re-armed after every
  message) and sends :class:`_Tick`: expiries and evictions are applied, due flows get one
  token request each (bounded by :data:`POLL_TIMEOUT_S`), answered by :class:`_Polled`.
* A grant is written by :func:`~serve.deviceflow.store.save_credentials` in a worker
  thread (bounded by :data:`PERSIST_TIMEOUT_S`), answered by :class:`_Persisted`
  (``authorized`` or ``persist_failed``).

Events are published through ``fanout(type, data)`` (every live session's log: they are
workspace-wide) and never carry user codes, URIs or tokens. Views for HTTP are read
directly (one trio thread). If the actor crashes its flows are lost (they are in memory
only); the supervisor restarts it empty and clients start a new flow.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

from actors import Actor, Reply
from actors.actor import Request

if TYPE_CHECKING:
    import httpx
from serve.deviceflow.idp import (
    DeviceCode,
    IdpError,
    Pkce,
    Secret,
    new_pkce,
    poll_token,
    request_device_code,
)
from serve.deviceflow.machine import (
    Attach,
    Create,
    Event,
    FlowStatus,
    FlowTable,
    PollFailed,
    PollOutcome,
    TooMany,
)
from serve.deviceflow.providers import ProviderConfig
from serve.deviceflow.store import PersistError, save_credentials

log = logging.getLogger(__name__)

START_TIMEOUT_S: Final = 30.0
POLL_TIMEOUT_S: Final = 30.0
PERSIST_TIMEOUT_S: Final = 30.0


def wall_ms() -> int:
    return int(time.time() * 1000)


# ---- errors (mapped to the wire by serve.http.routes.auth) -------------------------------------


class UnsupportedProvider(Exception):
    def __init__(self, provider_id: str, supported: list[str]) -> None:
        super().__init__(f'Unsupported device-flow provider "{provider_id}"')
        self.provider_id = provider_id
        self.supported = supported


class TooManyFlows(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"Too many active device flows (limit {limit}); cancel one first")
        self.limit = limit


class UpstreamError(Exception):
    """The IdP did not start the flow."""


class FlowNotFound(Exception):
    def __init__(self, flow_id: str) -> None:
        super().__init__(f'No device flow with id "{flow_id}"')
        self.flow_id = flow_id


class Ticket(Reply[tuple[str, bool]]):
    """Resolves to ``(flow_id, attached)`` once the flow's start is settled."""

    __slots__ = ()


# ---- messages -----------------------------------------------------------------------------


class StartFlow(msgspec.Struct, Request[Ticket], frozen=True):
    provider_id: str
    client_id: str | None


class CancelFlow(msgspec.Struct, frozen=True):
    flow_id: str


class _Started(msgspec.Struct, frozen=True):
    flow_id: str
    code: DeviceCode | None
    pkce: Pkce | None
    error: str | None = None


class _Polled(msgspec.Struct, frozen=True):
    flow_id: str
    outcome: PollOutcome
    tokens: Secret[dict[str, Any]] | None = None  # on a grant


class _Persisted(msgspec.Struct, frozen=True):
    flow_id: str
    ok: bool
    hint: str | None = None


class _Tick(msgspec.Struct, frozen=True):
    pass


PollerMsg = StartFlow | CancelFlow | _Started | _Polled | _Persisted | _Tick


class _Secrets(msgspec.Struct, frozen=True):
    device_code: Secret[str]
    pkce: Pkce | None


class DeviceFlowPoller(Actor[PollerMsg]):
    """See the module docstring. ``fanout(type, data)`` publishes a workspace-wide event."""

    def __init__(
        self,
        *,
        providers: dict[str, ProviderConfig],
        state_dir: str,
        fanout: Callable[[str, dict[str, Any]], None],
        clock: Callable[[], int] = wall_ms,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__("device-flow-poller", inbox_size=256)
        self.providers = dict(providers)
        self.state_dir = state_dir
        self._fanout = fanout
        self._clock = clock
        self._given_http = http
        self._http: httpx.AsyncClient | None = http
        self.table = FlowTable()
        self._secrets: dict[str, _Secrets] = {}
        self._waiters: dict[str, list[tuple[Ticket, bool]]] = {}
        self._nursery: trio.Nursery | None = None
        self._rearm = trio.Event()

    @property
    def supported(self) -> list[str]:
        return list(self.providers)

    # ---- lifecycle -----------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Actor[PollerMsg]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # The HTTP client is created on the first flow: importing httpx (and reading the
        # proxy environment) costs start-up time and memory most daemons never need.
        self._http = self._given_http
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._timer)
                await super().run(task_status=task_status)
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            if self._given_http is None and self._http is not None:
                with trio.CancelScope(shield=True):
                    await self._http.aclose()
                self._http = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(POLL_TIMEOUT_S), follow_redirects=False, trust_env=True
            )
        return self._http

    async def on_start(self) -> None:
        self.table = FlowTable()
        self._secrets.clear()
        self._waiters.clear()

    async def on_stop(self) -> None:
        for waiters in self._waiters.values():
            for ticket, _ in waiters:
                ticket.fail(UpstreamError("the device-flow poller stopped"))
        self._waiters.clear()

    async def _timer(self) -> None:
        while True:
            rearm = self._rearm
            deadline = self.table.next_deadline_ms()
            if deadline is None:
                await rearm.wait()
            else:
                with trio.move_on_after(max(0.0, (deadline - self._clock()) / 1000)):
                    await rearm.wait()
                if not rearm.is_set():
                    await self.tell(_Tick())
            if rearm.is_set():
                self._rearm = trio.Event()

    # ---- the public surface --------------------------------------------------------------

    async def start_flow(self, provider_id: str, client_id: str | None) -> tuple[str, bool]:
        """Start or attach; ``(flow_id, attached)``. Raises :class:`UnsupportedProvider`,
        :class:`TooManyFlows`, :class:`UpstreamError` or :class:`actors.ActorError`."""
        ticket: Ticket = await self.ask(StartFlow(provider_id, client_id), timeout_s=10.0)
        with trio.move_on_after(START_TIMEOUT_S + 5) as scope:
            return await ticket.wait()
        assert scope.cancelled_caught
        raise UpstreamError(f"the IdP did not answer within {START_TIMEOUT_S:g} s")

    def view(
        self, flow_id: str, client_id: str | None, *, attached: bool | None = None
    ) -> dict[str, Any]:
        try:
            return self.table.view(flow_id, client_id, attached=attached)
        except KeyError:
            raise FlowNotFound(flow_id) from None

    async def cancel_flow(self, flow_id: str) -> None:
        """Cancel a live flow (event), accept a terminal one silently; :class:`FlowNotFound`."""
        found = await self.ask(CancelFlow(flow_id), timeout_s=10.0)
        if not found:
            raise FlowNotFound(flow_id)

    def pending_flows(self) -> list[dict[str, Any]]:
        return self.table.pending_summary()

    # ---- handling ------------------------------------------------------------------------

    async def handle(self, msg: PollerMsg) -> Ticket | bool | None:
        try:
            return self._handle(msg)
        finally:
            self._rearm.set()

    def _handle(self, msg: PollerMsg) -> Ticket | bool | None:
        now = self._clock()
        match msg:
            case StartFlow(provider_id=provider_id, client_id=client_id):
                return self._start(provider_id, client_id, now)
            case CancelFlow(flow_id=flow_id):
                found, events = self.table.cancel(flow_id, now)
                self._emit(events)
                self._forget_if_ended(flow_id)
                return found
            case _Started():
                self._on_started(msg, now)
            case _Tick():
                self._emit(self.table.expire(now))
                for flow_id in list(self._secrets):
                    self._forget_if_ended(flow_id)
                for flow in self.table.due(now):
                    secrets = self._secrets.get(flow.flow_id)
                    provider = self.providers.get(flow.provider_id)
                    if secrets is None or provider is None:
                        continue
                    self._spawn(self._poll_task, flow.flow_id, provider, secrets)
            case _Polled(flow_id=flow_id, outcome=outcome, tokens=tokens):
                events, persist = self.table.poll_result(flow_id, outcome, now)
                self._emit(events)
                if persist is not None and tokens is not None:
                    self._spawn(self._persist_task, flow_id, persist.provider_id, tokens)
                self._forget_if_ended(flow_id)
            case _Persisted(flow_id=flow_id, ok=ok, hint=hint):
                self._emit(self.table.persisted(flow_id, now, ok=ok, hint=hint))
                self._forget_if_ended(flow_id)
        return None

    def _start(self, provider_id: str, client_id: str | None, now: int) -> Ticket:
        provider = self.providers.get(provider_id)
        if provider is None:
            raise UnsupportedProvider(provider_id, self.supported)
        ticket = Ticket()
        begun = self.table.begin(provider_id, client_id, now, str(uuid.uuid4()))
        match begun:
            case TooMany(limit=limit):
                raise TooManyFlows(limit)
            case Attach(flow_id=flow_id):
                if flow_id in self._waiters:
                    self._waiters[flow_id].append((ticket, True))
                else:
                    ticket.set((flow_id, True))
            case Create(flow_id=flow_id):
                self._waiters[flow_id] = [(ticket, False)]
                self._spawn(self._start_task, flow_id, provider)
        return ticket

    def _on_started(self, msg: _Started, now: int) -> None:
        waiters = self._waiters.pop(msg.flow_id, [])
        if msg.code is None:
            self.table.start_failed(msg.flow_id)
            error = UpstreamError(msg.error or "the IdP did not start the flow")
            for ticket, _ in waiters:
                ticket.fail(error)
            return
        flow = self.table.get(msg.flow_id)
        if flow is not None and flow.status is FlowStatus.STARTING:
            self._secrets[msg.flow_id] = _Secrets(msg.code.device_code, msg.pkce)
        self._emit(self.table.started(msg.flow_id, msg.code.public, now))
        for ticket, attached in waiters:
            ticket.set((msg.flow_id, attached))

    def _forget_if_ended(self, flow_id: str) -> None:
        flow = self.table.get(flow_id)
        if flow is None or not flow.live:
            self._secrets.pop(flow_id, None)

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            try:
                self._fanout(event.type, event.data)
            except Exception:
                log.exception("publishing %s failed", event.type)

    def _spawn[*Ts](self, fn: Callable[[*Ts], Awaitable[object]], *args: *Ts) -> None:
        nursery = self._nursery
        assert nursery is not None
        nursery.start_soon(fn, *args)

    # ---- I/O tasks -----------------------------------------------------------------------

    async def _start_task(self, flow_id: str, provider: ProviderConfig) -> None:
        pkce = new_pkce() if provider.pkce else None
        client = self._client()
        result = _Started(flow_id, None, None, f"the IdP did not answer in {START_TIMEOUT_S:g} s")
        with trio.move_on_after(START_TIMEOUT_S):
            try:
                code = await request_device_code(client, provider, pkce)
                result = _Started(flow_id, code, pkce)
            except IdpError as exc:
                result = _Started(flow_id, None, None, str(exc))
        await self.tell(result)

    async def _poll_task(self, flow_id: str, provider: ProviderConfig, secrets: _Secrets) -> None:
        client = self._client()
        outcome: PollOutcome = PollFailed(f"no token answer within {POLL_TIMEOUT_S:g} s")
        tokens: dict[str, Any] | None = None
        with trio.move_on_after(POLL_TIMEOUT_S):
            outcome, tokens = await poll_token(client, provider, secrets.device_code, secrets.pkce)
        await self.tell(_Polled(flow_id, outcome, Secret(tokens) if tokens is not None else None))

    async def _persist_task(
        self, flow_id: str, provider_id: str, tokens: Secret[dict[str, Any]]
    ) -> None:
        message = _Persisted(
            flow_id, False, f"could not store credentials in {PERSIST_TIMEOUT_S:g} s"
        )
        with trio.move_on_after(PERSIST_TIMEOUT_S):
            try:
                await trio.to_thread.run_sync(
                    save_credentials,
                    self.state_dir,
                    provider_id,
                    tokens.reveal(),
                    self._clock(),
                    abandon_on_cancel=True,
                )
                message = _Persisted(flow_id, True)
            except PersistError as exc:
                log.warning("device flow %s: %s (%s)", flow_id, exc, exc.path)
                message = _Persisted(flow_id, False, str(exc))
        await self.tell(message)
