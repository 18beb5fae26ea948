"""Answering an agent's elicitation (ACP ``elicitation/create``; logic in
serve/permissions/elicitation.py), the REST twin of the permission vote.

=====================================================  ===================================
route                                                  answer
=====================================================  ===================================
``POST /session/<id>/elicitation/<requestId>``         a vote; ``200 {}`` when counted
=====================================================  ===================================

The request reached the session's clients as the event ``elicitation_request {requestId,
sessionId, mode, message, requestedSchema | url + elicitationId, toolCallId?}``. The body is
ACP's ``CreateElicitationResponse``: ``{action: "accept", content?}``, ``{action: "decline"}``
or ``{action: "cancel"}``, plus an optional ``_meta`` object passed to the agent; any other
key, a form ``content`` field that the schema does not have, is missing while required, has
another JSON type or is outside its ``enum``, or content on a url-mode answer is ``400
{code: "invalid_elicitation_response"}``. The daemon's mediation policy decides as for a
permission (``403 elicitation_forbidden``; ``consensus`` counts equal contents together);
``404`` for an unknown or already resolved request, or one of another session. The outcome
is published as ``elicitation_resolved {requestId, sessionId, action, content?,
voterClientId?, reason?}``.
"""

from __future__ import annotations

from quart import Blueprint, Response

from actors import ActorStopped
from serve.errors.votes import elicitation_wire
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import service_unavailable
from serve.http.routes.sessions import find_session, from_loopback, session_client
from serve.http.wire import json_body, json_response
from serve.permissions.mediator import CastElicitation

blueprint = Blueprint("session_elicitation", __name__)

_P = "/session/<session_id>/elicitation/<request_id>"
_ASK_TIMEOUT_S = 30.0

FEATURES: tuple[Feature, ...] = (Feature("session_elicitation", (("POST", _P),)),)


@blueprint.post(_P)
async def answer_elicitation(session_id: str, request_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    client_id = await session_client(session)
    try:
        result = await daemon().mediator.ask(
            CastElicitation(request_id, session_id, body, client_id, from_loopback()),
            timeout_s=_ASK_TIMEOUT_S,
        )
    except ActorStopped:
        raise service_unavailable(
            "Permission mediator unavailable", "mediator_unavailable"
        ) from None
    status, out = elicitation_wire(result)
    return json_response(out, status)
