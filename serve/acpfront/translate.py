"""Session-log frames → the JSON-RPC messages an ACP client receives.

A session's :class:`~serve.events.EventLog` stores complete SSE frames (``id: N`` /
``event: T`` / ``data: <envelope>``); the front reads them through a subscriber, exactly as
``GET /session/:id/events`` does, and re-encodes each one:

* ``session_update`` → the ``session/update`` notification, its params the event's
  ``{sessionId, update}`` bytes untouched;
* ``permission_request`` → a ``session/request_permission`` request with a string id
  (``perm_<requestId>``) and ``_meta.qwen.requestId`` (or, for the daemon-dialect client
  over WebSocket, which cannot see requests, the ``_qwen/notify permission_request`` event);
* ``elicitation_request`` / ``elicitation_complete`` → ``elicitation/create`` /
  ``elicitation/complete`` for a connection that advertised the mode (:mod:`.elicit`);
* everything else → ``_qwen/notify {kind, data, promptId?, originatorClientId?, _meta}``.

Frames without an id (``replay_complete``, ``state_resync_required``, ``client_evicted``,
``slow_client_warning``) are stream lifecycle: they become id-less notifications.

An event with an id (except a permission request, whose id the front must remember) is not
re-encoded when it is queued: :func:`translate_frame` gives a :class:`Deferred` that holds
the log's own frame (one ``bytes`` object shared by every connection's outbox and the ring)
and builds the message only when a writer takes it. So N connections with a session loaded
hold one copy of its events, not N (a multi-MiB update would otherwise be copied into every
outbox).
"""

from __future__ import annotations

import msgspec

from serve.acpfront import elicit

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


class Deferred:
    """A log frame whose JSON-RPC message is built when a writer takes it (its size, for an
    outbox's byte bound, is the frame's)."""

    __slots__ = ("frame", "requests")

    def __init__(self, frame: bytes, requests: bool) -> None:
        self.frame = frame
        self.requests = requests

    def __len__(self) -> int:
        return len(self.frame)

    def render(self) -> bytes:
        """The message (b"" if the frame cannot be read)."""
        event_id, _type, envelope = frame_parts(self.frame)
        msg = translate(event_id, envelope, requests=self.requests) if envelope else None
        return msg.payload if msg is not None and isinstance(msg.payload, bytes) else b""


class Translated(msgspec.Struct, frozen=True):
    event_id: int | None
    event_type: str
    payload: bytes | Deferred
    #: For a permission request: (JSON-RPC id, session id, mediator request id).
    permission: tuple[str, str, str] | None = None


def frame_parts(frame: bytes) -> tuple[int | None, str, memoryview | None]:
    """One log frame's id, ``event:`` type and envelope JSON (a view of ``frame``, not a
    copy; None when the frame has no ``data:`` line)."""
    event_id: int | None = None
    event_type = ""
    pos = 0
    while True:
        end = frame.find(b"\n", pos)
        if end < 0:
            return event_id, event_type, None
        if frame.startswith(b"data: ", pos):
            stop = len(frame)
            while stop > pos and frame[stop - 1] == 0x0A:
                stop -= 1
            return event_id, event_type, memoryview(frame)[pos + 6 : stop]
        if frame.startswith(b"id: ", pos):
            try:
                event_id = int(frame[pos + 4 : end])
            except ValueError:
                event_id = None
        elif frame.startswith(b"event: ", pos):
            event_type = frame[pos + 7 : end].decode("utf-8", "replace")
        pos = end + 1


def translate_frame(
    frame: bytes, *, requests: bool = True, elicitation: frozenset[str] = frozenset()
) -> Translated | None:
    """One log frame (as a subscriber hands it out) as a JSON-RPC message: deferred (see
    the module docstring) when it has an id and its type is known from its ``event:`` line,
    else translated now. ``elicitation``: the modes the connection's client advertised."""
    event_id, event_type, envelope = frame_parts(frame)
    if envelope is None:
        return None
    if (
        event_id is not None
        and event_type
        and event_type != "permission_request"
        and event_type not in elicit.EVENTS
    ):
        return Translated(event_id, event_type, Deferred(frame, requests))
    return translate(event_id, envelope, requests=requests, elicitation=elicitation)


def translate(
    event_id: int | None,
    envelope: bytes | memoryview,
    *,
    requests: bool = True,
    elicitation: frozenset[str] = frozenset(),
) -> Translated | None:
    """One frame's envelope as a JSON-RPC message (None when it cannot be read)."""
    try:
        env = _envelope.decode(envelope)
    except msgspec.DecodeError:
        return None
    if env.type in elicit.EVENTS and requests and elicitation:
        built = elicit.message(env.type, bytes(env.data), elicitation)
        if built is not None:
            return Translated(event_id, env.type, built[0], built[1])
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


def notify(kind: str, data: object) -> bytes:
    """An id-less ``_qwen/notify`` the front itself emits (eviction, lifecycle)."""
    return _encoder.encode(
        {"jsonrpc": "2.0", "method": "_qwen/notify", "params": {"kind": kind, "data": data}}
    )
