"""The blocking facade: :class:`SyncAcpServeClient` runs the async client on a private loop.

Theory of operation
-------------------
The facade owns an anyio blocking portal: one background thread running a trio event
loop, started in ``__init__`` and stopped by :meth:`close` (or ``with``). Every method
submits the same-named coroutine of an :class:`~serve.client.AcpServeClient` living on
that loop and waits for its answer, so both faces share one implementation, one
connection pool and the same errors (raised in the calling thread). Methods are safe to
call from several threads at once; they run concurrently on the loop.

:class:`SyncEventStream` is the blocking iterator over an
:class:`~serve.client._events.EventStream`; close it (``with`` or :meth:`close`) when
leaving early. An exception interrupting the caller (``KeyboardInterrupt``) while a call
waits leaves that call running on the loop until it ends or :meth:`close` cancels it.
Constructing the facade inside a running event loop raises ``RuntimeError`` (it would
block that loop): use the async client there.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Literal, Self

import sniffio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from serve.client._async import DEFAULT_URL, AcpServeClient, ApprovalMode, PromptInput
from serve.client._cursor import Backoff
from serve.client._events import EventStream, EventStreamStats
from serve.client.types import (
    ApprovalModeResult,
    Capabilities,
    DaemonStatus,
    DirListing,
    Event,
    FileContent,
    FileEditResult,
    FileStat,
    FileWriteResult,
    GlobResult,
    Health,
    HeartbeatResult,
    ModelResult,
    PromptAccepted,
    PromptResult,
    RestoredSession,
    Session,
    SessionList,
)

__all__ = ["SyncAcpServeClient", "SyncEventStream"]


class SyncEventStream:
    """Blocking iterator over one session's events (see :class:`EventStream`)."""

    def __init__(self, portal: BlockingPortal, stream: EventStream) -> None:
        self._portal = portal
        self._stream = stream

    @property
    def last_event_id(self) -> int | None:
        return self._stream.last_event_id

    @property
    def epoch(self) -> str | None:
        return self._stream.epoch

    def stats(self) -> EventStreamStats:
        return self._stream.stats()

    def open(self) -> Self:
        self._portal.call(self._stream.open)
        return self

    def close(self) -> None:
        self._portal.call(self._stream.aclose)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        found, event = self._portal.call(self._next)
        if not found:
            raise StopIteration
        assert event is not None
        return event

    async def _next(self) -> tuple[bool, Event | None]:
        try:
            return True, await self._stream.__anext__()
        except StopAsyncIteration:
            return False, None


class SyncAcpServeClient:
    """Blocking client with the same methods as :class:`~serve.client.AcpServeClient`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        token: str | None = None,
        client_id: str | None = None,
        *,
        timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        read_timeout_s: float = 45.0,
        token_header: str | None = None,
    ) -> None:
        try:
            running = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            running = None
        if running is not None:
            raise RuntimeError(
                f"SyncAcpServeClient blocks; inside a running {running} loop use AcpServeClient"
            )
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("trio")
        self._portal = self._portal_cm.__enter__()
        self._closed = False

        def build() -> AcpServeClient:
            return AcpServeClient(
                base_url,
                token,
                client_id,
                timeout_s=timeout_s,
                backoff=backoff,
                read_timeout_s=read_timeout_s,
                token_header=token_header,
            )

        try:
            self._client = self._portal.call(self._construct, build)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    @staticmethod
    async def _construct(build: Callable[[], AcpServeClient]) -> AcpServeClient:
        return build()  # httpx's pool is created on the loop that will use it

    @property
    def async_client(self) -> AcpServeClient:
        """The async client the facade drives (for ``client_id_for`` and friends)."""
        return self._client

    @property
    def base_url(self) -> str:
        return self._client.base_url

    @property
    def client_id(self) -> str | None:
        return self._client.client_id

    def client_id_for(self, session_id: str) -> str | None:
        return self._client.client_id_for(session_id)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._client.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run[**P, T](self, fn: Callable[P, Awaitable[T]], *args: P.args, **kw: P.kwargs) -> T:
        result: T = self._portal.call(functools.partial(fn, *args, **kw))
        return result

    # ---- the routes (same signatures as the async client) -----------------------------

    def health(self, *, deep: bool = False) -> Health:
        return self._run(self._client.health, deep=deep)

    def capabilities(self, *, refresh: bool = True) -> Capabilities:
        return self._run(self._client.capabilities, refresh=refresh)

    def daemon_status(self, detail: Literal["summary", "full"] = "summary") -> DaemonStatus:
        return self._run(self._client.daemon_status, detail)

    def create_session(
        self,
        cwd: str | None = None,
        scope: Literal["single", "thread"] = "single",
        *,
        approval_mode: ApprovalMode | None = None,
        model: str | None = None,
    ) -> Session:
        return self._run(
            self._client.create_session, cwd, scope, approval_mode=approval_mode, model=model
        )

    def load_session(self, session_id: str, *, cwd: str | None = None) -> RestoredSession:
        return self._run(self._client.load_session, session_id, cwd=cwd)

    def resume_session(self, session_id: str, *, cwd: str | None = None) -> RestoredSession:
        return self._run(self._client.resume_session, session_id, cwd=cwd)

    def list_sessions(
        self, workspace: str | None = None, *, persisted: bool = False
    ) -> SessionList:
        return self._run(
            functools.partial(self._client.list_sessions, persisted=persisted), workspace
        )

    def prompt(
        self,
        session_id: str,
        prompt: PromptInput,
        *,
        deadline_ms: int | None = None,
        prompt_id: str | None = None,
    ) -> PromptResult:
        return self._run(
            self._client.prompt, session_id, prompt, deadline_ms=deadline_ms, prompt_id=prompt_id
        )

    def prompt_async(
        self,
        session_id: str,
        prompt: PromptInput,
        *,
        deadline_ms: int | None = None,
        prompt_id: str | None = None,
    ) -> PromptAccepted:
        return self._run(
            self._client.prompt_async,
            session_id,
            prompt,
            deadline_ms=deadline_ms,
            prompt_id=prompt_id,
        )

    def cancel(self, session_id: str) -> None:
        self._run(self._client.cancel, session_id)

    def close_session(self, session_id: str) -> None:
        self._run(self._client.close_session, session_id)

    def detach(self, session_id: str) -> None:
        self._run(self._client.detach, session_id)

    def heartbeat(self, session_id: str) -> HeartbeatResult:
        return self._run(self._client.heartbeat, session_id)

    def set_model(self, session_id: str, model_id: str) -> ModelResult:
        return self._run(self._client.set_model, session_id, model_id)

    def set_approval_mode(
        self, session_id: str, mode: ApprovalMode, *, persist: bool = False
    ) -> ApprovalModeResult:
        return self._run(self._client.set_approval_mode, session_id, mode, persist=persist)

    def vote(
        self,
        session_id: str,
        request_id: str,
        option_id: str | None = None,
        *,
        cancel: bool = False,
    ) -> None:
        self._run(self._client.vote, session_id, request_id, option_id, cancel=cancel)

    def events(
        self,
        session_id: str,
        last_event_id: int | None = None,
        *,
        epoch: str | None = None,
        max_queued: int | None = None,
        snapshot: bool = False,
    ) -> SyncEventStream:
        stream = self._client.events(
            session_id, last_event_id, epoch=epoch, max_queued=max_queued, snapshot=snapshot
        )
        return SyncEventStream(self._portal, stream)

    def read_file(
        self,
        path: str,
        *,
        line: int | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> FileContent:
        return self._run(self._client.read_file, path, line=line, limit=limit, max_bytes=max_bytes)

    def write_file(
        self,
        path: str,
        content: str,
        expected_hash: str | None = None,
        mode: Literal["create", "replace"] | None = None,
    ) -> FileWriteResult:
        return self._run(self._client.write_file, path, content, expected_hash, mode)

    def edit_file(
        self, path: str, old_text: str, new_text: str, expected_hash: str
    ) -> FileEditResult:
        return self._run(self._client.edit_file, path, old_text, new_text, expected_hash)

    def stat(self, path: str) -> FileStat:
        return self._run(self._client.stat, path)

    def list_dir(self, path: str = ".", *, include_ignored: bool = False) -> DirListing:
        return self._run(self._client.list_dir, path, include_ignored=include_ignored)

    def glob(self, pattern: str, *, cwd: str | None = None) -> GlobResult:
        return self._run(self._client.glob, pattern, cwd=cwd)
