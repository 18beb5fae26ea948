"""``PUT /session/:id/pending-prompts/:promptId``: edit a queued prompt before it starts.

The rest of the editable queue is in ``routes/sessions.py`` (``GET .../pending-prompts``
lists it, ``DELETE .../pending-prompts/:promptId`` withdraws one); the domain side is
``serve/sessions/queue_edits.py``. Strict: the body is ``{prompt, _meta?}`` validated as a
prompt's, any other key is ``400 invalid_pending_prompt``.
"""

from __future__ import annotations

from typing import Final

from quart import Blueprint, Response

from serve.api import forwarded, prompt_content
from serve.http.access import principal
from serve.http.capabilities import Feature
from serve.http.errors import ApiError, bad_request
from serve.http.routes.sessions import (
    ask,
    find_session,
    header_client_id,
    session_client,
    sessions_api,
)
from serve.http.wire import json_body, json_response
from serve.sessions.messages import PendingReplaced, PromptRunning, ReplacePending, SubmitPrompt

blueprint = Blueprint("pending", __name__)

_ROUTE: Final = "/session/<session_id>/pending-prompts/<prompt_id>"
_KEYS: Final = frozenset({"prompt", "_meta"})

FEATURES: tuple[Feature, ...] = (Feature("session_pending_prompt_edit", (("PUT", _ROUTE),)),)


@blueprint.put(_ROUTE)
async def replace_pending_prompt(session_id: str, prompt_id: str) -> Response:
    body = await json_body(allow_empty=False)
    header_client_id()  # a malformed X-Qwen-Client-Id is refused before anything else
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise bad_request(
            f"unknown field `{unknown[0]}`: a queued prompt takes `prompt` and `_meta`",
            "invalid_pending_prompt",
        )
    content, extra = prompt_content(body.get("prompt")), forwarded(body)
    session = find_session(session_id)
    client_id = await session_client(session)
    # New content for the agent (no new turn: the prompt was charged when queued).
    sessions_api().check_budget(principal())
    request = SubmitPrompt(content.blocks, content.text, client_id, extra or None)
    try:
        replaced = await ask(session, ReplacePending(prompt_id, request), object)
    except PromptRunning:
        raise ApiError(
            409,
            {
                "error": "The prompt is running; steer it or cancel it",
                "code": "prompt_running",
                "sessionId": session_id,
                "promptId": prompt_id,
            },
        ) from None
    if not isinstance(replaced, PendingReplaced):
        raise ApiError(
            404,
            {
                "error": f'No pending prompt "{prompt_id}"',
                "code": "prompt_not_found",
                "sessionId": session_id,
                "promptId": prompt_id,
            },
        )
    return json_response(
        {
            "sessionId": session_id,
            "promptId": replaced.prompt_id,
            "text": replaced.text,
            "queuedAt": replaced.queued_at,
            "state": "queued",
        }
    )
