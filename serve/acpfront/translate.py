"""Session-log frames → the JSON-RPC messages an ACP client receives.

A session's :class:`~serve.events.EventLog` stores complete SSE frames (``id: N`` /
``event: T`` / ``data: <envelope>``); the front reads them through a subscriber, exactly as
``GET /session/:id/events`` does, and re-encodes each one:

* ``session_update`` → the ``session/update`` notification, its params the event's
  ``{sessionId, update}`` bytes untouched;
* ``permission_request`` → a ``session/request_permission`` request with a string id
  (``perm_<requestId>``) and ``_meta.qwen.requestId`` (or, for the daemon-dialect client
  over WebSocket, which cannot see requests, the ``_qwen/notify permission_request`` event);
* everything else → ``_qwen/notify {kind, data, promptId?, originatorClientId?, _meta}``.

Frames without an id (``replay_complete``, ``state_resync_required``, ``client_evicted``,
``slow_client_warning``) are stream lifecycle: they become id-less notifications.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()

PERMISSION_ID_PREFIX = "perm_"


class Envelope(msgspec.Struct, frozen=True):
    type: str
    data: msgspec.Raw = msgspec.Raw(b"null")
    promptId: str | None = None
    originatorClientId: str | None = None
    meta: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="_meta")


class PermissionData(msgspec.Struct, frozen=True):
    requestId: str
    sessionId: str
    toolCall: msgspec.Raw
    options: msgspec.Raw


_envelope = msgspec.json.Decoder(Envelope)
_permission = msgspec.json.Decoder(PermissionData)


class Translated(msgspec.Struct, frozen=True):
    event_id: int | None
    event_type: str
    payload: bytes
    #: For a permission request: (JSON-RPC id, session id, mediator request id).
    permission: tuple[str, str, str] | None = None


def split_frames(chunk: bytes) -> list[tuple[int | None, bytes]]:
    """``(event id, envelope JSON)`` of each SSE frame in ``chunk`` (a subscriber's output)."""
    out: list[tuple[int | None, bytes]] = []
    for frame in chunk.split(b"\n\n"):
        if not frame:
            continue
        event_id: int | None = None
        data: bytes | None = None
        for line in frame.split(b"\n"):
            if line.startswith(b"id: "):
                try:
                    event_id = int(line[4:])
                except ValueError:
                    event_id = None
            elif line.startswith(b"data: "):
                data = line[6:]
        if data is not None:
            out.append((event_id, data))
    return out


def translate(event_id: int | None, envelope: bytes, *, requests: bool = True) -> Translated | None:
    """One frame's envelope as a JSON-RPC message (None when it cannot be read)."""
    try:
        env = _envelope.decode(envelope)
    except msgspec.DecodeError:
        return None
    if env.type == "session_update":
        payload = b'{"jsonrpc":"2.0","method":"session/update","params":' + bytes(env.data) + b"}"
        return Translated(event_id, env.type, payload)
    if env.type == "permission_request" and requests:
        try:
            perm = _permission.decode(bytes(env.data))
        except msgspec.DecodeError:
            return None
        rid = PERMISSION_ID_PREFIX + perm.requestId
        params = (
            b'{"sessionId":'
            + _encoder.encode(perm.sessionId)
            + b',"toolCall":'
            + bytes(perm.toolCall)
            + b',"options":'
            + bytes(perm.options)
            + b',"_meta":{"qwen":{"requestId":'
            + _encoder.encode(perm.requestId)
            + b"}}}"
        )
        payload = (
            b'{"jsonrpc":"2.0","id":'
            + _encoder.encode(rid)
            + b',"method":"session/request_permission","params":'
            + params
            + b"}"
        )
        return Translated(event_id, env.type, payload, (rid, perm.sessionId, perm.requestId))
    parts = [b'{"jsonrpc":"2.0","method":"_qwen/notify","params":{"kind":']
    parts.append(_encoder.encode(env.type))
    parts.append(b',"data":')
    parts.append(bytes(env.data))
    if env.promptId is not None:
        parts.append(b',"promptId":' + _encoder.encode(env.promptId))
    if env.originatorClientId is not None:
        parts.append(b',"originatorClientId":' + _encoder.encode(env.originatorClientId))
    if event_id is not None:
        parts.append(b',"eventId":%d' % event_id)
    if env.meta:
        parts.append(b',"_meta":' + bytes(env.meta))
    parts.append(b"}}")
    return Translated(event_id, env.type, b"".join(parts))


def notify(kind: str, data: Any) -> bytes:
    """An id-less ``_qwen/notify`` the front itself emits (eviction, lifecycle)."""
    return _encoder.encode(
        {"jsonrpc": "2.0", "method": "_qwen/notify", "params": {"kind": kind, "data": data}}
    )
