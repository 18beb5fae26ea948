"""The session's half of an agent's ``elicitation/create``: validate, then ask the clients.

Called from :class:`~serve.sessions.agent_side.AgentSide` (the connection's request task,
never the actor's inbox). The request is checked (:func:`serve.permissions.elicitation.
parse_request`: a malformed one, or a mode other than ``form``/``url``, is answered JSON-RPC
``-32602`` as ACP asks), then brokered through the PermissionMediator like a permission
request (``elicitation_request`` in the log, answers from the session's clients as votes,
``elicitation_resolved``); the agent gets ``{action, content?}``. A request the session
cannot broker (another session's, a request-scoped one with no session, a closing session,
the mediator unavailable) is answered ``{action: "cancel"}``: nobody can be asked.

A url-mode request's ``elicitationId`` is remembered (the last :data:`MAX_URL_IDS`), so the
agent's later ``elicitation/complete`` for it is published as ``elicitation_complete
{sessionId, elicitationId}`` (the /acp front forwards it as ``elicitation/complete``); an
unknown id is dropped, as ACP asks of clients.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from acp.errors import INVALID_PARAMS, HandlerError
from actors import ActorError
from serve.permissions import elicitation
from serve.permissions.mediator import OpenElicitation, request_decision

if TYPE_CHECKING:
    from serve.events import EventLog
    from serve.permissions.mediator import PermissionMediator
    from serve.sessions.clients import ClientTable
    from serve.sessions.prompt_queue import PromptQueue

METHOD = "elicitation/create"
COMPLETE = "elicitation/complete"
CANCEL: dict[str, Any] = {"action": "cancel"}
#: url-mode elicitation ids remembered per session, for elicitation/complete (entries).
MAX_URL_IDS = 256


class Side(Protocol):
    """What of the session's AgentSide this uses (serve/sessions/agent_side.py)."""

    session_id: str
    closing: bool
    prompts: PromptQueue
    mediator: PermissionMediator
    clients: ClientTable
    log: EventLog


async def broker(
    side: Side, url_ids: OrderedDict[str, None], params: msgspec.Raw
) -> dict[str, Any]:
    """Answer one ``elicitation/create`` of the agent (see the module docstring)."""
    try:
        decoded = msgspec.json.decode(bytes(params)) if params else None
        spec = elicitation.parse_request(decoded)
    except msgspec.DecodeError:
        raise HandlerError(INVALID_PARAMS, "Invalid params: not JSON") from None
    except elicitation.RequestError as exc:
        raise HandlerError(INVALID_PARAMS, f"Invalid params: {exc}") from None
    if spec.session_id is None or spec.session_id != side.session_id or side.closing:
        return dict(CANCEL)
    if spec.mode == "url" and spec.elicitation_id is not None:
        ids = url_ids
        ids[spec.elicitation_id] = None
        while len(ids) > MAX_URL_IDS:
            ids.popitem(last=False)
    active = side.prompts.running
    try:
        return await request_decision(
            side.mediator,
            OpenElicitation(
                session_id=side.session_id,
                session=side,
                spec=spec,
                prompt_id=active.prompt_id if active else None,
                originator=active.client_id if active else None,
                session_clients=side.clients.voters(),
            ),
            timeout_s=10,
        )
    except ActorError:
        return dict(CANCEL)


def on_complete(side: Side, url_ids: OrderedDict[str, None], params: msgspec.Raw) -> None:
    """The agent's ``elicitation/complete``: published when it names one of ours."""
    try:
        decoded = msgspec.json.decode(bytes(params)) if params else None
    except msgspec.DecodeError:
        return
    eid = decoded.get("elicitationId") if isinstance(decoded, dict) else None
    if not isinstance(eid, str) or eid not in url_ids:
        return
    del url_ids[eid]
    active = side.prompts.running
    side.log.publish(
        "elicitation_complete",
        {"sessionId": side.session_id, "elicitationId": eid},
        prompt_id=active.prompt_id if active else None,
        originator=active.client_id if active else None,
    )
