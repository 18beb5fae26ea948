"""Error mapping, capability helpers, typed payloads, and the pinned public surface."""

from __future__ import annotations

import msgspec
import pytest

import serve.client
from serve.client import errors as e
from serve.client.types import Capabilities, Event, PermissionRequest, SessionUpdate


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, e.BadRequestError),
        (401, e.UnauthorizedError),
        (403, e.ForbiddenError),
        (404, e.NotFoundError),
        (409, e.ConflictError),
        (413, e.PayloadTooLargeError),
        (429, e.RateLimitedError),
        (500, e.ServerError),
        (503, e.ServiceUnavailableError),
        (504, e.ServerError),
        (418, e.DaemonHttpError),
    ],
)
def test_status_maps_to_exception_type(status: int, cls: type[e.DaemonHttpError]) -> None:
    err = e.error_for_status(status, {"error": "boom"}, method="GET", url="/x")
    assert type(err) is cls
    assert isinstance(err, e.DaemonHttpError) and isinstance(err, e.AcpServeClientError)
    assert err.status == status and err.message == "boom"


def test_code_retry_after_and_message() -> None:
    err = e.error_for_status(
        503, {"error": "full", "code": "prompt_queue_full", "limit": 5}, retry_after="5"
    )
    assert err.code == "prompt_queue_full" and err.retry_after_s == 5.0
    assert err.body["limit"] == 5
    assert "prompt_queue_full" in str(err)
    # file routes carry errorKind instead of code
    file_err = e.error_for_status(
        409, {"errorKind": "hash_mismatch", "error": "stale", "status": 409}
    )
    assert file_err.code == "hash_mismatch"
    # agent JSON-RPC errors keep their integer code
    assert e.error_for_status(500, {"error": "x", "code": -32603}).code == -32603
    assert e.error_for_status(400, {}).code is None
    assert e.error_for_status(429, {}, retry_after="soon").retry_after_s is None


def test_capability_helpers() -> None:
    caps = msgspec.json.decode(
        b'{"v":1,"features":["session_create","permission_mediation"],'
        b'"featureDetails":{"permission_mediation":{"since":"v1","modes":["first-responder"]}},'
        b'"protocolVersions":{"current":"v1"},"policy":{"permission":"first-responder"},'
        b'"somethingNew":{"a":1}}',
        type=Capabilities,
    )
    assert caps.supports("session_create") and not caps.supports("session_create", "nope")
    assert caps.missing("nope", "session_create", "other") == ("nope", "other")
    caps.require("session_create")
    with pytest.raises(e.MissingCapabilityError) as info:
        caps.require("session_create", "nope", "other")
    assert info.value.missing == ("nope", "other")
    assert caps.modes("permission_mediation") == ("first-responder",)
    assert caps.modes("session_create") == () and caps.modes("absent") == ()
    assert caps.permission_policy == "first-responder" and caps.protocol_version == "v1"


def test_typed_payloads_and_fallbacks() -> None:
    update = Event(
        v=1,
        type="session_update",
        data={
            "sessionId": "s",
            "update": {
                "sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": "hm"},
            },
        },
    ).payload
    assert isinstance(update, SessionUpdate) and (update.kind, update.text) == (
        "agent_thought_chunk",
        "hm",
    )
    request = Event(
        v=1,
        type="permission_request",
        data={
            "requestId": "r",
            "sessionId": "s",
            "toolCall": {},
            "options": [{"optionId": "allow"}],
        },
    ).payload
    assert isinstance(request, PermissionRequest) and request.options[0].option_id == "allow"
    unknown = Event(v=1, type="mcp_server_added", data={"name": "x"})
    assert unknown.payload == {"name": "x"}
    with pytest.raises(e.ProtocolError):
        _ = Event(v=1, type="turn_complete", data={"sessionId": "s"}).payload  # no stopReason


def test_event_encodes_back_to_the_wire_envelope() -> None:
    event = Event(id=3, v=1, type="x", data={"a": 1}, prompt_id="p", meta={"serverTimestamp": 1})
    assert msgspec.json.decode(msgspec.json.encode(event)) == {
        "id": 3,
        "v": 1,
        "type": "x",
        "data": {"a": 1},
        "promptId": "p",
        "_meta": {"serverTimestamp": 1},
    }
    synthetic = Event(v=1, type="replay_complete", data={})
    assert "id" not in msgspec.json.decode(msgspec.json.encode(synthetic))


def test_public_surface_is_pinned() -> None:
    exported = {name for name in dir(serve.client) if not name.startswith("_")}
    exported -= {"annotations", "errors", "types", "cli"}  # submodules and __future__
    assert exported == set(serve.client.__all__)
    assert {
        "AcpServeClient",
        "SyncAcpServeClient",
        "EventStream",
        "DaemonHttpError",
        "Capabilities",
        "Event",
    } <= exported
