"""The ``webhooks`` service: taps the session event logs, owns the subscriptions and the
outbox, and delivers each subscription's messages in order, one at a time.

Theory of operation
-------------------
* **Tap** (:meth:`WebhookService.tap`, installed as every session log's ``tap``): runs on
  the trio thread inside ``EventLog.publish``; for the few log types that are webhook
  events (:data:`~serve.webhooks.model.FROM_LOG`) it reads the session's owner and usage
  (``facts``, a dict lookup) and ``send_nowait``s the frame to the inbox (bounded,
  :data:`INBOX_EVENTS` events). A full inbox drops the event and counts it
  (``dropped.inboxFull``): a session never waits for a receiver.
* **Accept** (the run loop): decodes the frame, builds the Standard Webhooks payload
  ``{type, timestamp, data}`` once, and for each subscription that wants it writes a
  :class:`~serve.webhooks.outbox.Message` to the outbox on disk (fsynced, in a worker
  thread) and appends it to that subscription's queue. Past ``outboxMaxEntries`` messages
  or ``outboxMaxBytes`` bytes owed (all subscriptions) a new message is dropped and counted
  (``dropped.outboxFull``): a receiver that is down costs at most those bounds, on disk and
  in memory.
* **Deliver** (one task per subscription with messages owed): the oldest message first,
  attempts until a 2xx; between attempts it waits ``initialBackoffMs`` doubled each time up
  to ``maxBackoffMs`` (with up to 20 % jitter); a message that failed ``maxAttempts`` times
  or is older than ``maxAgeS`` is dropped (``dropped.expired``). Each attempt checks the
  receiver's addresses against the allow-list again (:mod:`.targets`) and is bounded by
  ``timeoutS`` (connect, send, response head; the body is not read).
* **Restart**: :meth:`run` reloads the API subscriptions and the outbox before it reports
  ready; messages of a subscription that no longer exists are removed (``dropped.orphaned``).

The subscription table is changed only on the trio thread by :meth:`subscribe` /
:meth:`unsubscribe` (synchronous checks, then one awaited save, serialized by a lock).
"""

from __future__ import annotations

import collections
import datetime
import logging
import os
import random
import secrets
import time
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import httpx
import msgspec
import trio

from serve.threads import run_sync, webhooks_limiter
from serve.webhooks import disk as outbox
from serve.webhooks.model import (
    FROM_LOG,
    Subscription,
    WebhookError,
    WebhooksConfig,
)
from serve.webhooks.signing import key_of, new_secret, sign
from serve.webhooks.targets import AllowList, target_of

__all__ = ["INBOX_EVENTS", "SessionFacts", "WebhookService"]

log = logging.getLogger(__name__)

#: Events waiting for the service (events); past it the tap drops and counts.
INBOX_EVENTS: Final = 1024
#: One message's body at most (bytes); a larger one is dropped and counted.
MAX_MESSAGE_BYTES: Final = 1024 * 1024
#: API subscriptions per principal, and in all (subscriptions).
MAX_PER_PRINCIPAL: Final = 32
MAX_SUBSCRIPTIONS: Final = 1024
#: Turn start times kept for ``durationMs`` (sessions).
MAX_TURN_STARTS: Final = 10_000
USER_AGENT: Final = "acp-serve-webhooks/1"


class SessionFacts(NamedTuple):
    """What the tap reads of a live session: its owner and its usage so far."""

    owner: str | None
    usage: dict[str, Any] | None


class _Event(NamedTuple):
    session_id: str
    kind: str
    #: A log event's SSE frame, or the data itself (``quota.exceeded``).
    frame: bytes | dict[str, Any]
    facts: SessionFacts
    duration_ms: int | None


class _Queue:
    def __init__(self) -> None:
        self.messages: collections.deque[outbox.Message] = collections.deque()
        self.wake = trio.Event()
        self.scope: trio.CancelScope | None = None


def _iso(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).isoformat(timespec="milliseconds")


def _envelope(frame: bytes) -> dict[str, Any]:
    start = frame.index(b"\ndata: ") + 7
    decoded = msgspec.json.decode(frame[start:].rstrip(b"\n"))
    return decoded if isinstance(decoded, dict) else {}


class WebhookService:
    """See the module docstring. ``facts(session_id)``: the live session's owner and
    usage (None when unknown)."""

    def __init__(
        self,
        config: WebhooksConfig,
        *,
        state_dir: str,
        allow: AllowList,
        facts: Callable[[str], SessionFacts | None],
    ) -> None:
        self.config = config
        self.root = os.path.join(state_dir, "webhooks")
        self.allow = allow
        self.facts = facts
        self.subs: dict[str, Subscription] = {}
        self._queues: dict[str, _Queue] = {}
        self._send, self._recv = trio.open_memory_channel[_Event](INBOX_EVENTS)
        self._turn_start: dict[str, float] = {}
        self._seq = 0
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self.owed_bytes = 0
        self.delivered = 0
        self.retried = 0
        self.failed_attempts = 0
        self.dropped: dict[str, int] = {
            "inboxFull": 0,
            "outboxFull": 0,
            "tooLarge": 0,
            "expired": 0,
            "orphaned": 0,
        }
        for index, item in enumerate(config.subscriptions):
            key_of(item.secret)  # validated by the config loader; fails loudly here too
            sub_id = f"whcfg_{index}"
            self.subs[sub_id] = Subscription(
                sub_id,
                item.url,
                item.secret,
                tuple(item.events),
                item.session_id,
                None,
                True,
                "config",
                _iso(time.time()),
            )

    # ---- the tap (trio thread, inside EventLog.publish) --------------------------------

    def tap(self, session_id: str, event_id: int, event_type: str, frame: bytes) -> None:
        """An event was published in ``session_id``'s log. O(1); never blocks or raises."""
        if not self.subs:
            return
        kind = FROM_LOG.get(event_type)
        now = time.monotonic()
        if kind is None:
            if event_type == "session_update" and len(self._turn_start) < MAX_TURN_STARTS:
                self._turn_start.setdefault(session_id, now)
            return
        duration: int | None = None
        if kind in ("turn.completed", "turn.failed"):
            started = self._turn_start.pop(session_id, None)
            duration = round((now - started) * 1000) if started is not None else None
        elif kind in ("session.closed", "session.failed"):
            self._turn_start.pop(session_id, None)
        facts = self.facts(session_id) or SessionFacts(None, None)
        try:
            self._send.send_nowait(_Event(session_id, kind, frame, facts, duration))
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.dropped["inboxFull"] += 1

    def quota(self, principal_id: str, refusal: dict[str, Any]) -> None:
        """``principal_id`` hit a quota or its budget (the refusal's body): a
        ``quota.exceeded`` for its principal-wide subscriptions and the admins'."""
        if not self.subs:
            return
        data = {k: v for k, v in refusal.items() if k != "error"}
        data["principal"] = principal_id
        data["message"] = refusal.get("error")
        event = _Event("", "quota.exceeded", data, SessionFacts(principal_id, None), None)
        try:
            self._send.send_nowait(event)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.dropped["inboxFull"] += 1

    # ---- the run loop ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the API subscriptions and the outbox, start the deliveries, then accept
        events until cancelled. Owns one ``httpx.AsyncClient`` and every delivery task."""
        limiter = webhooks_limiter()
        # A restart starts from the disk, the truth: every message accepted is there.
        self._queues.clear()
        self.owed_bytes = 0
        stored = await run_sync(limiter, outbox.load_subscriptions, self.root)
        for sub in stored:
            self.subs.setdefault(sub.id, sub)
        loaded = await run_sync(limiter, outbox.load, self.root, self.config.outbox_max_entries)
        if loaded.bad:
            log.warning("webhooks: %d unreadable outbox entries removed", loaded.bad)
        self._seq = max(self._seq, loaded.last_seq)
        timeout = httpx.Timeout(self.config.timeout_s)
        async with (
            httpx.AsyncClient(
                timeout=timeout,
                follow_redirects=False,
                trust_env=False,
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            ) as client,
            trio.open_nursery() as nursery,
        ):
            self._client = client
            self._nursery = nursery
            for message in loaded.messages:
                if message.sub_id not in self.subs:
                    self.dropped["orphaned"] += 1
                    await run_sync(limiter, outbox.remove, self.root, message.seq)
                    continue
                self._queue(message)
            task_status.started()
            async for event in self._recv:
                await self._accept(event)
            # close(): the events still in the inbox are in the outbox now; what is owed
            # is delivered after the next start.
            nursery.cancel_scope.cancel()

    def close(self) -> None:
        """Stop: accept what the inbox holds (bounded by the stop grace), then end."""
        self._send.close()

    async def _accept(self, event: _Event) -> None:
        wanted = [
            s
            for s in self.subs.values()
            if s.wants(event.kind, event.session_id, event.facts.owner)
        ]
        if not wanted:
            return
        if isinstance(event.frame, dict):
            data = event.frame
        else:
            try:
                envelope = _envelope(event.frame)
            except (ValueError, msgspec.DecodeError):
                return
            raw = envelope.get("data")
            data = dict(raw) if isinstance(raw, dict) else {}
            data["sessionId"] = event.session_id
            data["eventId"] = envelope.get("id")
            if envelope.get("promptId") is not None:
                data["promptId"] = envelope["promptId"]
        if event.kind in ("turn.completed", "turn.failed"):
            data["durationMs"] = event.duration_ms
            data["usage"] = event.facts.usage
        if event.kind == "permission.requested" and "requestId" in data:
            data["answer"] = {
                "method": "POST",
                "path": f"/session/{event.session_id}/permission/{data['requestId']}",
            }
        now = time.time()
        body = msgspec.json.encode({"type": event.kind, "timestamp": _iso(now), "data": data})
        for sub in wanted:
            await self._owe(sub, event.kind, body, now)

    async def _owe(self, sub: Subscription, kind: str, body: bytes, now: float) -> None:
        if len(body) > MAX_MESSAGE_BYTES:
            self.dropped["tooLarge"] += 1
            return
        if (
            self.depth >= self.config.outbox_max_entries
            or self.owed_bytes + len(body) > self.config.outbox_max_bytes
        ):
            self.dropped["outboxFull"] += 1
            log.warning("webhooks: outbox full, a %s for %s dropped", kind, sub.id)
            return
        self._seq += 1
        message = outbox.Message(self._seq, sub.id, f"msg_{secrets.token_hex(12)}", kind, body, now)
        await run_sync(webhooks_limiter(), outbox.write, self.root, message)
        if sub.id in self.subs:
            self._queue(message)
        else:  # unsubscribed while it was written
            await run_sync(webhooks_limiter(), outbox.remove, self.root, message.seq)

    def _queue(self, message: outbox.Message) -> None:
        queue = self._queues.get(message.sub_id)
        if queue is None:
            queue = self._queues[message.sub_id] = _Queue()
            assert self._nursery is not None
            self._nursery.start_soon(self._deliver_loop, message.sub_id, queue)
        queue.messages.append(message)
        self.owed_bytes += len(message.body)
        queue.wake.set()

    # ---- deliveries --------------------------------------------------------------------

    async def _deliver_loop(self, sub_id: str, queue: _Queue) -> None:
        with trio.CancelScope() as scope:
            queue.scope = scope
            while True:
                while not queue.messages:
                    queue.wake = trio.Event()
                    await queue.wake.wait()
                message = queue.messages[0]
                await self._deliver(message)
                queue.messages.popleft()
                self.owed_bytes -= len(message.body)
                await run_sync(webhooks_limiter(), outbox.remove, self.root, message.seq)

    async def _deliver(self, message: outbox.Message) -> None:
        cfg = self.config
        attempt = 0
        while True:
            sub = self.subs.get(message.sub_id)
            if sub is None:
                return
            attempt += 1
            why = await self._attempt(sub, message)
            if why is None:
                self.delivered += 1
                return
            self.failed_attempts += 1
            if attempt >= cfg.max_attempts or time.time() - message.created >= cfg.max_age_s:
                self.dropped["expired"] += 1
                log.warning(
                    "webhooks: %s %s to %s given up after %d attempts: %s",
                    message.type,
                    message.msg_id,
                    sub.id,
                    attempt,
                    why,
                )
                return
            self.retried += 1
            delay_ms = min(cfg.initial_backoff_ms * 2 ** min(attempt - 1, 30), cfg.max_backoff_ms)
            await trio.sleep(delay_ms / 1000 * random.uniform(0.8, 1.0))

    async def _attempt(self, sub: Subscription, message: outbox.Message) -> str | None:
        """One POST; None when the receiver answered 2xx, else why not."""
        try:
            target = target_of(sub.url)
            await self.allow.check(target)
        except (ValueError, PermissionError) as exc:
            return str(exc)
        stamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": message.msg_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign(sub.secret, message.msg_id, stamp, message.body),
        }
        with trio.move_on_after(self.config.timeout_s):
            try:
                async with self._client.stream(
                    "POST", sub.url, content=message.body, headers=headers
                ) as response:
                    if 200 <= response.status_code < 300:
                        return None
                    return f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"
        return f"no answer within {self.config.timeout_s} s"

    # ---- subscriptions (trio thread, from the fronts) ----------------------------------

    def visible(self, owner: str, admin: bool) -> list[Subscription]:
        return [s for s in self.subs.values() if admin or s.owner == owner]

    async def subscribe(
        self,
        *,
        owner: str,
        admin: bool,
        url: str,
        events: tuple[str, ...],
        session_id: str | None,
        secret: str | None,
    ) -> Subscription:
        """Add an API subscription (the caller checked ``session_id``'s ownership);
        :class:`WebhookError` says why not."""
        try:
            target = target_of(url)
        except ValueError as exc:
            raise WebhookError("invalid_webhook", str(exc), "url") from None
        if secret is not None:
            try:
                key_of(secret)
            except ValueError as exc:
                raise WebhookError("invalid_webhook", f"`secret`: {exc}", "secret") from None
        try:
            await self.allow.check(target)
        except PermissionError as exc:
            raise WebhookError("webhook_target_forbidden", str(exc), "url") from None
        api = [s for s in self.subs.values() if s.source == "api"]
        if len(api) >= MAX_SUBSCRIPTIONS or (
            sum(1 for s in api if s.owner == owner) >= MAX_PER_PRINCIPAL
        ):
            raise WebhookError("webhook_limit", "too many webhook subscriptions")
        sub = Subscription(
            f"wh_{secrets.token_hex(12)}",
            url,
            secret or new_secret(),
            events,
            session_id,
            owner,
            admin,
            "api",
            _iso(time.time()),
        )
        async with self._lock:
            self.subs[sub.id] = sub
            await self._save()
        return sub

    async def unsubscribe(self, sub_id: str, owner: str, admin: bool) -> None:
        sub = self.subs.get(sub_id)
        if sub is None or not (admin or sub.owner == owner):
            raise WebhookError("webhook_not_found", f'No webhook with id "{sub_id}"', "id")
        if sub.source == "config":
            raise WebhookError(
                "webhook_from_config", "a webhook of the config file is removed there", "id"
            )
        async with self._lock:
            del self.subs[sub_id]
            await self._save()
        queue = self._queues.pop(sub_id, None)
        if queue is not None:
            if queue.scope is not None:
                queue.scope.cancel()
            for message in queue.messages:
                self.owed_bytes -= len(message.body)
                await run_sync(webhooks_limiter(), outbox.remove, self.root, message.seq)

    async def _save(self) -> None:
        api = [s for s in self.subs.values() if s.source == "api"]
        await run_sync(webhooks_limiter(), outbox.save_subscriptions, self.root, api)

    # ---- read models -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return sum(len(q.messages) for q in self._queues.values())

    def statistics(self) -> dict[str, Any]:
        """The ``webhooks`` section of ``/daemon/status``."""
        return {
            "subscriptions": len(self.subs),
            "fromConfig": sum(1 for s in self.subs.values() if s.source == "config"),
            "outbox": {
                "entries": self.depth,
                "bytes": self.owed_bytes,
                "maxEntries": self.config.outbox_max_entries,
                "maxBytes": self.config.outbox_max_bytes,
            },
            "inbox": {"queued": self._recv.statistics().current_buffer_used, "max": INBOX_EVENTS},
            "delivered": self.delivered,
            "retried": self.retried,
            "failedAttempts": self.failed_attempts,
            "dropped": dict(self.dropped),
        }
