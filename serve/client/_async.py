"""The async client: one method per daemon route, typed answers, typed errors.

Theory of operation
-------------------
:class:`AcpServeClient` wraps one ``httpx.AsyncClient`` (anyio underneath, so it runs
under trio or asyncio). Each method builds one request, sends it with the bearer token
and the caller's client id, and decodes a ``2xx`` body into the frozen Struct of
:mod:`serve.client.types`; any other status becomes the matching
:class:`~serve.client.errors.DaemonHttpError` subclass (mapped in ``errors.py`` only), a
connection failure :class:`~serve.client.errors.DaemonUnreachableError`, a body of the
wrong shape :class:`~serve.client.errors.ProtocolError`.

Client identity: the daemon mints a client id per session on create/load (the
``X-Qwen-Client-Id`` header is honoured only when already registered on that session).
The client remembers the id of every session it created or attached (at most
:data:`MAX_REMEMBERED_SESSIONS`, oldest forgotten first) and sends it on that session's
routes, so votes, cancels and closes are attributed to it; workspace routes (file writes)
carry the most recent one. ``client_id=`` given to the constructor is the id to ask for
(a client resuming its identity) and the header for sessions it has not attached.

Timeouts: ``timeout_s`` per ordinary request; a blocking :meth:`prompt` has no read
timeout (a turn takes as long as it takes; cancel the call and the daemon cancels the
turn, because the HTTP request goes away); event streams use ``read_timeout_s`` (three
missed heartbeats) and reconnect (see :mod:`serve.client._events`).

Ownership: the client owns its ``httpx.AsyncClient`` unless one was passed in; close it
with ``aclose()`` or ``async with``. Open :class:`EventStream`\\ s must be closed by their
user (``async with client.events(sid) as stream``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

import httpx
import msgspec

from serve.client._cursor import Backoff
from serve.client._events import EventStream
from serve.client.errors import DaemonUnreachableError, ProtocolError, error_for_status
from serve.client.types import (
    ApprovalModeResult,
    Capabilities,
    DaemonStatus,
    DirListing,
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

__all__ = ["DEFAULT_URL", "MAX_REMEMBERED_SESSIONS", "AcpServeClient", "PromptInput"]

DEFAULT_URL = "http://127.0.0.1:4170"
MAX_REMEMBERED_SESSIONS = 1024
_MAX_ERROR_BODY = 64 * 1024

#: A prompt: plain text, or ACP content blocks (``{"type": "text", "text": ...}`` ...).
PromptInput = str | Sequence[Mapping[str, Any]]
ApprovalMode = Literal["plan", "default", "auto-edit", "auto", "yolo"]


def _blocks(prompt: PromptInput) -> list[Mapping[str, Any]]:
    if isinstance(prompt, str):
        return [{"type": "text", "text": prompt}]
    return list(prompt)


class AcpServeClient:
    """Async client of one acp-serve / ``qwen serve`` v1 daemon.

    ::

        async with AcpServeClient("http://127.0.0.1:4170", token="...") as client:
            caps = await client.capabilities()
            caps.require("session_create", "session_events")
            session = await client.create_session()
            async with client.events(session.session_id) as events:
                accepted = await client.prompt_async(session.session_id, "hello")
                async for event in events:
                    ...
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        token: str | None = None,
        client_id: str | None = None,
        *,
        timeout_s: float = 30.0,
        http: httpx.AsyncClient | None = None,
        backoff: Backoff | None = None,
        read_timeout_s: float = 45.0,
        token_header: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token or None
        #: Send the token in this header instead of ``Authorization: Bearer`` (a daemon
        #: started with ``--token-header``, behind a proxy that strips ``Authorization``).
        self._token_header = token_header or None
        self._requested_client_id = client_id
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s)
        )
        self._backoff = backoff or Backoff()
        self._read_timeout_s = read_timeout_s
        self._session_clients: dict[str, str] = {}
        self._last_client_id: str | None = None
        self._capabilities: Capabilities | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- identity ------------------------------------------------------------------------

    def client_id_for(self, session_id: str) -> str | None:
        """The client id this client uses on ``session_id`` (None when unknown)."""
        return self._session_clients.get(session_id, self._requested_client_id)

    @property
    def client_id(self) -> str | None:
        """The most recently assigned client id (or the requested one)."""
        return self._last_client_id or self._requested_client_id

    def _remember(self, session_id: str, client_id: str) -> None:
        self._session_clients.pop(session_id, None)
        self._session_clients[session_id] = client_id
        while len(self._session_clients) > MAX_REMEMBERED_SESSIONS:
            del self._session_clients[next(iter(self._session_clients))]
        self._last_client_id = client_id

    def _headers(self, session_id: str | None = None, *, workspace: bool = False) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self._token:
            if self._token_header:
                headers[self._token_header] = self._token
            else:
                headers["Authorization"] = f"Bearer {self._token}"
        if session_id is not None:
            client_id = self.client_id_for(session_id)
        elif workspace:
            client_id = self.client_id
        else:
            client_id = None
        if client_id:
            headers["X-Qwen-Client-Id"] = client_id
        return headers

    # ---- transport -----------------------------------------------------------------------

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        content = None if json is None else msgspec.json.encode(json)
        all_headers = dict(headers or {})
        if content is not None:
            all_headers["Content-Type"] = "application/json"
        request = self._http.build_request(
            method,
            path,
            content=content,
            params=params,
            headers=all_headers,
            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise DaemonUnreachableError(f"{method} {request.url}: {exc!r}") from exc
        try:
            if response.is_success:
                await response.aread()
                return response
            raw = b""
            async for chunk in response.aiter_bytes():
                raw += chunk
                if len(raw) > _MAX_ERROR_BODY:
                    break
        except httpx.TransportError as exc:
            raise DaemonUnreachableError(f"{method} {request.url}: {exc!r}") from exc
        finally:
            await response.aclose()
        try:
            body = msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError:
            body = {"error": raw[:500].decode("utf-8", "replace")}
        raise error_for_status(
            response.status_code,
            body if isinstance(body, dict) else {},
            method=method,
            url=str(request.url),
            retry_after=response.headers.get("retry-after"),
        )

    async def _call[T](
        self,
        typ: type[T],
        method: str,
        path: str,
        *,
        json: object = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> T:
        response = await self._send(
            method, path, json=json, params=params, headers=headers, timeout=timeout
        )
        try:
            return msgspec.json.decode(response.content, type=typ)
        except msgspec.DecodeError as exc:
            raise ProtocolError(
                f"{method} {path} answered {response.status_code} with an unexpected body: {exc}"
            ) from None

    @staticmethod
    def _sid(segment: str) -> str:
        """One URL path segment (ids are opaque to the client)."""
        return urllib.parse.quote(segment, safe="")

    # ---- health, capabilities, status ----------------------------------------------------

    async def health(self, *, deep: bool = False) -> Health:
        """``GET /health`` (``deep`` adds session/permission/client counters)."""
        params = {"deep": "1"} if deep else None
        return await self._call(Health, "GET", "/health", params=params, headers=self._headers())

    async def capabilities(self, *, refresh: bool = True) -> Capabilities:
        """``GET /capabilities``; ``refresh=False`` reuses the last answer when there is one."""
        if refresh or self._capabilities is None:
            self._capabilities = await self._call(
                Capabilities, "GET", "/capabilities", headers=self._headers()
            )
        return self._capabilities

    async def daemon_status(self, detail: Literal["summary", "full"] = "summary") -> DaemonStatus:
        """``GET /daemon/status``."""
        return await self._call(
            DaemonStatus,
            "GET",
            "/daemon/status",
            params={"detail": detail},
            headers=self._headers(),
        )

    # ---- sessions ------------------------------------------------------------------------

    async def create_session(
        self,
        cwd: str | None = None,
        scope: Literal["single", "thread"] = "single",
        *,
        approval_mode: ApprovalMode | None = None,
        model: str | None = None,
    ) -> Session:
        """``POST /session``: create, or attach to the workspace's ``single`` session."""
        body: dict[str, Any] = {"sessionScope": scope}
        if cwd is not None:
            body["cwd"] = cwd
        if approval_mode is not None:
            body["approvalMode"] = approval_mode
        if model is not None:
            body["modelServiceId"] = model
        headers = self._headers()
        if self._requested_client_id:
            headers["X-Qwen-Client-Id"] = self._requested_client_id
        session = await self._call(Session, "POST", "/session", json=body, headers=headers)
        self._remember(session.session_id, session.client_id)
        return session

    async def _restore(self, session_id: str, action: str, cwd: str | None) -> RestoredSession:
        body: dict[str, Any] = {} if cwd is None else {"cwd": cwd}
        restored = await self._call(
            RestoredSession,
            "POST",
            f"/session/{self._sid(session_id)}/{action}",
            json=body,
            headers=self._headers(session_id),
            timeout=httpx.Timeout(None, connect=10.0),
        )
        self._remember(restored.session_id, restored.client_id)
        return restored

    async def load_session(self, session_id: str, *, cwd: str | None = None) -> RestoredSession:
        """``POST /session/:id/load``: attach if live, else restore through the agent."""
        return await self._restore(session_id, "load", cwd)

    async def resume_session(self, session_id: str, *, cwd: str | None = None) -> RestoredSession:
        """``POST /session/:id/resume``."""
        return await self._restore(session_id, "resume", cwd)

    async def list_sessions(
        self, workspace: str | None = None, *, persisted: bool = False
    ) -> SessionList:
        """``GET /workspace/:id/sessions`` (default: the daemon's primary workspace);
        ``persisted``: also the journaled sessions not loaded (``active_work_state``
        ``"persisted"``; :meth:`load_session` restores one)."""
        if workspace is None:
            workspace = (await self.capabilities(refresh=False)).workspace_cwd
        ref = urllib.parse.quote(workspace, safe="")
        return await self._call(
            SessionList,
            "GET",
            f"/workspace/{ref}/sessions",
            params={"include": "persisted"} if persisted else None,
            headers=self._headers(),
        )

    async def prompt(
        self,
        session_id: str,
        prompt: PromptInput,
        *,
        deadline_ms: int | None = None,
        prompt_id: str | None = None,
    ) -> PromptResult:
        """``POST /session/:id/prompt``, blocking until the turn ends.

        An agent error raises :class:`~serve.client.errors.ServerError` with the agent's
        JSON-RPC ``code``; a crashed agent :class:`~serve.client.errors.ServiceUnavailableError`.
        """
        return await self._call(
            PromptResult,
            "POST",
            f"/session/{self._sid(session_id)}/prompt",
            json=self._prompt_body(prompt, deadline_ms, prompt_id),
            headers=self._headers(session_id),
            timeout=httpx.Timeout(None, connect=10.0),
        )

    async def prompt_async(
        self,
        session_id: str,
        prompt: PromptInput,
        *,
        deadline_ms: int | None = None,
        prompt_id: str | None = None,
    ) -> PromptAccepted:
        """``POST /session/:id/prompt`` with ``Prefer: respond-async``: ``202`` on admission.

        Subscribe with ``events(sid, last_event_id=accepted.last_event_id)`` to see the
        whole turn, or keep a stream opened before the call.
        """
        headers = self._headers(session_id)
        headers["Prefer"] = "respond-async"
        return await self._call(
            PromptAccepted,
            "POST",
            f"/session/{self._sid(session_id)}/prompt",
            json=self._prompt_body(prompt, deadline_ms, prompt_id),
            headers=headers,
        )

    @staticmethod
    def _prompt_body(
        prompt: PromptInput, deadline_ms: int | None, prompt_id: str | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": _blocks(prompt)}
        if deadline_ms is not None:
            body["deadlineMs"] = deadline_ms
        if prompt_id is not None:
            body["promptId"] = prompt_id
        return body

    async def cancel(self, session_id: str) -> None:
        """``POST /session/:id/cancel``: end the running turn (``stopReason: cancelled``)."""
        await self._send(
            "POST", f"/session/{self._sid(session_id)}/cancel", headers=self._headers(session_id)
        )

    async def close_session(self, session_id: str) -> None:
        """``DELETE /session/:id``: subscribers see ``session_closed``."""
        await self._send(
            "DELETE", f"/session/{self._sid(session_id)}", headers=self._headers(session_id)
        )
        self._session_clients.pop(session_id, None)

    async def detach(self, session_id: str) -> None:
        """``POST /session/:id/detach``: release this client's attachment."""
        await self._send(
            "POST", f"/session/{self._sid(session_id)}/detach", headers=self._headers(session_id)
        )
        self._session_clients.pop(session_id, None)

    async def heartbeat(self, session_id: str) -> HeartbeatResult:
        """``POST /session/:id/heartbeat``: keep the session from the idle reaper."""
        return await self._call(
            HeartbeatResult,
            "POST",
            f"/session/{self._sid(session_id)}/heartbeat",
            headers=self._headers(session_id),
        )

    async def set_model(self, session_id: str, model_id: str) -> ModelResult:
        """``POST /session/:id/model``."""
        return await self._call(
            ModelResult,
            "POST",
            f"/session/{self._sid(session_id)}/model",
            json={"modelId": model_id},
            headers=self._headers(session_id),
            timeout=httpx.Timeout(90.0),
        )

    async def set_approval_mode(
        self, session_id: str, mode: ApprovalMode, *, persist: bool = False
    ) -> ApprovalModeResult:
        """``POST /session/:id/approval-mode`` (a strict route: needs a daemon token)."""
        return await self._call(
            ApprovalModeResult,
            "POST",
            f"/session/{self._sid(session_id)}/approval-mode",
            json={"mode": mode, "persist": persist},
            headers=self._headers(session_id),
        )

    async def vote(
        self,
        session_id: str,
        request_id: str,
        option_id: str | None = None,
        *,
        cancel: bool = False,
    ) -> None:
        """``POST /session/:id/permission/:requestId``: select ``option_id`` or cancel.

        Raises :class:`~serve.client.errors.NotFoundError` when the request is unknown or
        already resolved, :class:`~serve.client.errors.BadRequestError` (code
        ``invalid_option_id``) for an option the request does not offer.
        """
        if cancel == (option_id is not None):
            raise ValueError("vote needs exactly one of option_id or cancel=True")
        outcome: dict[str, str] = (
            {"outcome": "cancelled"}
            if cancel
            else {"outcome": "selected", "optionId": option_id or ""}
        )
        await self._send(
            "POST",
            f"/session/{self._sid(session_id)}/permission/{self._sid(request_id)}",
            json={"outcome": outcome},
            headers=self._headers(session_id),
        )

    def events(
        self,
        session_id: str,
        last_event_id: int | None = None,
        *,
        epoch: str | None = None,
        max_queued: int | None = None,
        snapshot: bool = False,
    ) -> EventStream:
        """The session's events as a resumable async iterator (see :class:`EventStream`).

        ``last_event_id=None`` starts live; ``0`` replays the daemon's whole ring; an id
        from ``prompt_async``/``load_session`` replays what followed it.
        """
        return EventStream(
            self._http,
            session_id,
            headers=lambda: self._headers(session_id),
            last_event_id=last_event_id,
            epoch=epoch,
            max_queued=max_queued,
            snapshot=snapshot,
            backoff=self._backoff,
            read_timeout_s=self._read_timeout_s,
        )

    # ---- files ---------------------------------------------------------------------------

    async def read_file(
        self,
        path: str,
        *,
        line: int | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> FileContent:
        """``GET /file``: text content plus the whole file's ``sha256:<hex>`` hash."""
        params = {"path": path}
        for name, value in (("line", line), ("limit", limit), ("maxBytes", max_bytes)):
            if value is not None:
                params[name] = str(value)
        return await self._call(FileContent, "GET", "/file", params=params, headers=self._headers())

    async def write_file(
        self,
        path: str,
        content: str,
        expected_hash: str | None = None,
        mode: Literal["create", "replace"] | None = None,
    ) -> FileWriteResult:
        """``POST /file/write`` (strict route).

        ``mode`` defaults to ``replace`` when ``expected_hash`` is given, else ``create``.
        ``create`` on an existing file and ``replace`` with a stale hash raise
        :class:`~serve.client.errors.ConflictError` (``file_already_exists`` /
        ``hash_mismatch``).
        """
        effective = mode or ("replace" if expected_hash is not None else "create")
        body: dict[str, Any] = {"path": path, "content": content, "mode": effective}
        if expected_hash is not None:
            body["expectedHash"] = expected_hash
        return await self._call(
            FileWriteResult,
            "POST",
            "/file/write",
            json=body,
            headers=self._headers(workspace=True),
        )

    async def edit_file(
        self, path: str, old_text: str, new_text: str, expected_hash: str
    ) -> FileEditResult:
        """``POST /file/edit``: replace the single occurrence of ``old_text`` (strict route)."""
        return await self._call(
            FileEditResult,
            "POST",
            "/file/edit",
            json={
                "path": path,
                "oldText": old_text,
                "newText": new_text,
                "expectedHash": expected_hash,
            },
            headers=self._headers(workspace=True),
        )

    async def stat(self, path: str) -> FileStat:
        """``GET /stat``."""
        return await self._call(
            FileStat, "GET", "/stat", params={"path": path}, headers=self._headers()
        )

    async def list_dir(self, path: str = ".", *, include_ignored: bool = False) -> DirListing:
        """``GET /list``."""
        params = {"path": path}
        if include_ignored:
            params["includeIgnored"] = "1"
        return await self._call(DirListing, "GET", "/list", params=params, headers=self._headers())

    async def glob(self, pattern: str, *, cwd: str | None = None) -> GlobResult:
        """``GET /glob``."""
        params = {"pattern": pattern}
        if cwd is not None:
            params["cwd"] = cwd
        return await self._call(GlobResult, "GET", "/glob", params=params, headers=self._headers())
