"""``GET /daemon/status`` and the per-session status routes ``/context``, ``/supported-commands``.

* ``GET /daemon/status?detail=summary|full`` (default summary; anything else is
  ``400 invalid_detail``): :func:`serve.http.daemon_status.daemon_status`, in-memory
  only; a failure while building it is ``500 daemon_status_failed`` (logged).
* ``GET /session/<id>/context``: ``{v, sessionId, workspaceCwd, state: {models, modes,
  configOptions}, agent: {agentInfo, fork: {supported, via}}}`` from the agent's set-up
  result, with the current model/mode, and what the agent is and whether it can fork.
* ``GET /session/<id>/supported-commands``: ``{v, sessionId, availableCommands,
  availableSkills}``: the agent's last ``available_commands_update`` and the names of the
  project skills.

Session routes answer the common session errors (404 ``session_not_found``, 400
``invalid_client_id`` for an id not registered on the session). No agent request is made.
"""

from __future__ import annotations

import logging

import trio
from quart import Blueprint, Response, request

from serve.http.addressing import primary_workspace
from serve.http.capabilities import Feature
from serve.http.context import daemon, features
from serve.http.daemon_status import DETAILS, daemon_status
from serve.http.errors import ApiError, bad_request
from serve.http.forks import session_agent
from serve.http.routes.sessions import find_session, session_client
from serve.http.wire import json_response
from serve.status.agent import context_state, supported_commands
from serve.status.skills import project_skills
from serve.workspaces.files import WorkspaceFsError

log = logging.getLogger(__name__)

blueprint = Blueprint("status", __name__)

NO_STORE = {"Cache-Control": "no-store"}

FEATURES: tuple[Feature, ...] = (
    Feature("daemon_status", (("GET", "/daemon/status"),)),
    Feature("session_context", (("GET", "/session/<session_id>/context"),)),
    Feature("session_supported_commands", (("GET", "/session/<session_id>/supported-commands"),)),
)


@blueprint.get("/daemon/status")
async def get_daemon_status() -> Response:
    detail = request.args.get("detail", "summary")
    if detail not in DETAILS:
        raise bad_request("detail must be one of: summary, full", "invalid_detail")
    tokens_file = daemon().tokens_file
    if tokens_file is not None:
        await tokens_file.refresh()  # its state as of now (at most once a second)
    try:
        body = daemon_status(daemon(), "full" if detail == "full" else "summary", features())
    except Exception:
        log.exception("building /daemon/status failed")
        raise ApiError(
            500, {"error": "Failed to build the daemon status", "code": "daemon_status_failed"}
        ) from None
    return json_response(body, headers=NO_STORE)


@blueprint.get("/session/<session_id>/context")
async def get_session_context(session_id: str) -> Response:
    session = find_session(session_id)
    await session_client(session)
    body = {
        "v": 1,
        "sessionId": session.session_id,
        "workspaceCwd": session.workspace,
        "state": context_state(session),
        "agent": session_agent(daemon(), session),  # its agentInfo and fork {supported, via}
    }
    return json_response(body, headers=NO_STORE)


@blueprint.get("/session/<session_id>/supported-commands")
async def get_supported_commands(session_id: str) -> Response:
    session = find_session(session_id)
    await session_client(session)
    skills: list[str] = []
    if session.workspace == daemon().settings.primary_workspace:
        try:
            cells = await trio.to_thread.run_sync(project_skills, primary_workspace(daemon()))
            skills = [c["name"] for c in cells if c.get("status") == "ok"]
        except WorkspaceFsError:
            skills = []
    body = {
        "v": 1,
        "sessionId": session.session_id,
        "availableCommands": supported_commands(session),
        "availableSkills": skills,
    }
    return json_response(body, headers=NO_STORE)
