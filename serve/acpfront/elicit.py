"""Elicitation at ``/acp``: the session's ``elicitation_*`` events to and from ACP clients.

* ``elicitation_request`` → an ``elicitation/create`` request (string id
  ``elicit_<requestId>``, ``_meta.qwen.requestId``) with the agent's own fields (``sessionId``,
  ``mode``, ``message``, ``requestedSchema`` or ``url`` + ``elicitationId``, ``toolCallId``),
  sent only to connections whose ``initialize`` advertised that mode in
  ``clientCapabilities.elicitation`` (ACP forbids asking a mode the client lacks); the others
  get the event as ``_qwen/notify`` and may answer over REST
  (``POST /session/:id/elicitation/:requestId``).
* The client's answer is a vote (``CastElicitation``) under the daemon's mediation policy,
  checked like a REST answer; an error reply, or an answer that fails the check, counts as
  ``{action: "cancel"}`` from that client (as an unreadable permission answer counts as
  ``cancelled``): its request id is spent, it cannot answer again.
* ``elicitation_complete`` → the ``elicitation/complete {elicitationId}`` notification, to
  connections that advertised url mode.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from serve.errors.votes import elicitation_wire
from serve.permissions.elicitation import client_modes
from serve.permissions.mediator import CastElicitation, PermissionMediator

log = logging.getLogger(__name__)

ID_PREFIX = "elicit_"
REQUEST = "elicitation_request"
COMPLETE = "elicitation_complete"
EVENTS = (REQUEST, COMPLETE)
_FORWARDED = (
    "sessionId",
    "mode",
    "message",
    "requestedSchema",
    "url",
    "elicitationId",
    "toolCallId",
)
_encoder = msgspec.json.Encoder()

__all__ = ["COMPLETE", "EVENTS", "ID_PREFIX", "REQUEST", "answer", "client_modes", "message"]


def message(
    event_type: str, data: bytes, modes: frozenset[str]
) -> tuple[bytes, tuple[str, str, str] | None] | None:
    """The JSON-RPC message for an elicitation event, and for a request its (JSON-RPC id,
    session id, mediator request id); None: the connection gets the generic notification."""
    try:
        body = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(body, dict):
        return None
    if event_type == COMPLETE:
        eid = body.get("elicitationId")
        if "url" not in modes or not isinstance(eid, str):
            return None
        params = {"elicitationId": eid}
        return (
            _encoder.encode({"jsonrpc": "2.0", "method": "elicitation/complete", "params": params}),
            None,
        )
    request_id, session_id = body.get("requestId"), body.get("sessionId")
    if body.get("mode") not in modes or not isinstance(request_id, str):
        return None
    if not isinstance(session_id, str):
        return None
    fields: dict[str, Any] = {k: body[k] for k in _FORWARDED if body.get(k) is not None}
    fields["_meta"] = {"qwen": {"requestId": request_id}}
    rid = ID_PREFIX + request_id
    payload = _encoder.encode(
        {"jsonrpc": "2.0", "id": rid, "method": "elicitation/create", "params": fields}
    )
    return payload, (rid, session_id, request_id)


async def answer(
    mediator: PermissionMediator,
    session_id: str,
    request_id: str,
    result: object,
    client_id: str | None,
    loopback: bool,
    *,
    timeout_s: float,
) -> int:
    """An ACP client's reply to our ``elicitation/create``: a vote (see the module
    docstring); the status its vote was answered (500: not counted)."""
    body = result if isinstance(result, dict) and "action" in result else {"action": "cancel"}
    try:
        status, out = elicitation_wire(
            await mediator.ask(
                CastElicitation(request_id, session_id, body, client_id, loopback),
                timeout_s=timeout_s,
            )
        )
        if status == 400:
            log.info("ACP elicitation answer refused (%s); counted as cancel", out.get("error"))
            await mediator.ask(
                CastElicitation(request_id, session_id, {"action": "cancel"}, client_id, loopback),
                timeout_s=timeout_s,
            )
    except Exception as exc:
        log.info("ACP elicitation answer not counted: %r", exc)
        return 500
    return status
