"""ACP schema 1.21 at ``/acp``: what the front adds to the methods of :mod:`.session_methods`.

* **Version**: an ``initialize`` with any ``protocolVersion`` (2 included) is answered with
  version 1, the one the daemon speaks; per ACP's negotiation a client that cannot speak 1
  closes the connection.
* **Auth methods**: ``authMethods`` lists what the workspace's agent advertised (read from a
  live session's ``initialize`` result; none live: an empty list) *minus every method of
  ``type: "terminal"``*: a terminal method asks the client to run the agent's own binary (with
  its ``args``/``env``) in a terminal on the client's machine, which for a remote client of the
  daemon is the wrong machine, the wrong binary and the wrong credentials store.
  ``authenticate {methodId}`` takes only a listed method and is forwarded to the agent of a
  live session of the connection's workspace (the agent's credentials are the daemon's, shared
  by every session of it); ``logout`` likewise, when the agent advertises
  ``agentCapabilities.auth.logout``. Both need a daemon with a token (the transport's gate).
* ``session/set_config_option``: every option the agent advertises (serve/sessions/
  config_options.py), ``select`` values as strings and ``boolean`` ones as
  ``{type: "boolean", value}``; the model and mode options keep their own paths.
* ``session/delete``: the owned session is deleted at its agent (``session/delete``, when the
  agent advertises ``sessionCapabilities.delete``), closed (``client_delete``) and its
  journal deleted (a load is otherwise answered from the journal).
* ``$/cancel_request {requestId}``: cancels the connection's running request with that id,
  which is answered ``-32800`` (a prompt's turn is cancelled, as when its request goes away).
* ``additionalDirectories`` on ``session/new|load|resume``: an entry that is not an absolute
  path of an existing directory, lies in the daemon's state directory or a served workspace,
  or more than :data:`MAX_ADDITIONAL_DIRECTORIES`, is ``invalid_additional_directories``
  (-32602). Valid ones go with the registry's message: the session gets an agent child of its
  own (a warm or packed child's sandbox roots are fixed at spawn) whose Landlock write roots
  include them, and they are sent with its ``session/new|load|resume`` (an agent that does
  not advertise ``sessionCapabilities.additionalDirectories``: ``not_supported_by_agent``).
* ``_meta.traceparent`` of any request: the request runs in that W3C trace context
  (serve/tracecontext.py), and one log line names the method.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

import msgspec
import trio

from acp.schema import InitializeResult
from serve.acpfront.connections import Connection, Connections
from serve.acpfront.jsonrpc import INVALID_PARAMS, SERVER_ERROR, RpcError
from serve.acpfront.links import owned
from serve.journal import JournalError
from serve.sessions.actor import SessionActor
from serve.sessions.messages import (
    AgentCall,
    CloseSession,
    Describe,
    SessionView,
    SetApprovalMode,
    SetConfigOption,
    SetModel,
)
from serve.status.agent import context_state

log = logging.getLogger(__name__)

#: ACP's code for a request the peer cancelled (``$/cancel_request``).
REQUEST_CANCELLED: Final = -32800
#: ``additionalDirectories`` entries one session may name.
MAX_ADDITIONAL_DIRECTORIES: Final = 32
ASK_TIMEOUT_S: Final = 30.0
CANCEL_REQUEST: Final = "$/cancel_request"


def _params_error(message: str, **data: object) -> RpcError:
    return RpcError(INVALID_PARAMS, message, {"httpStatus": 400, **data})


# ---- initialize / auth ----------------------------------------------------------------------


def _agent_init(front: Connections, workspace: str) -> InitializeResult | None:
    """The ``initialize`` result of a live agent of ``workspace`` (read-only), or None."""
    for session in front.host.registry.live(workspace):
        info = getattr(getattr(session, "conn", None), "info", None)
        if isinstance(info, InitializeResult):
            return info
    return None


def auth_methods(front: Connections, workspace: str) -> list[dict[str, Any]]:
    """The agent's auth methods as it sent them, without the terminal ones."""
    info = _agent_init(front, workspace)
    raw = getattr(info, "raw", None)
    if info is None or not raw:
        return []
    try:
        methods = msgspec.json.decode(bytes(raw)).get("authMethods")
    except (msgspec.DecodeError, AttributeError):
        return []
    if not isinstance(methods, list):
        return []
    return [
        m
        for m in methods
        if isinstance(m, dict) and isinstance(m.get("id"), str) and m.get("type") != "terminal"
    ]


def _agent_session(front: Connections, conn: Connection) -> SessionActor:
    owned = [link.session for link in conn.sessions.values() if not link.ended]
    for session in (*owned, *front.host.registry.live(conn.workspace)):
        return session
    raise RpcError(
        SERVER_ERROR,
        "No agent runs for this workspace: create a session first",
        {"httpStatus": 503, "code": "acp_channel_unavailable", "retryable": True},
    )


async def authenticate(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    method_id = params.get("methodId")
    if not isinstance(method_id, str) or not method_id:
        raise _params_error("`methodId` must be a non-empty string")
    listed = [m["id"] for m in auth_methods(front, conn.workspace)]
    if method_id not in listed:
        raise _params_error(
            f"Unknown auth method {method_id!r} (terminal methods are not offered remotely)",
            code="invalid_auth_method",
            allowed=listed,
        )
    session = _agent_session(front, conn)
    await session.call(
        AgentCall("authenticate", {"methodId": method_id}, 60.0), timeout_s=ASK_TIMEOUT_S * 2
    )
    return {}


async def logout(front: Connections, conn: Connection, params: dict[str, Any]) -> dict[str, Any]:
    info = _agent_init(front, conn.workspace)
    auth = getattr(getattr(info, "agent_capabilities", None), "auth", None)
    if not isinstance(auth, dict) or not isinstance(auth.get("logout"), dict):
        raise RpcError(
            -32601,
            "The agent does not support logout",
            {"httpStatus": 501, "code": "not_supported_by_agent"},
        )
    session = _agent_session(front, conn)
    await session.call(AgentCall("logout", {}, ASK_TIMEOUT_S), timeout_s=ASK_TIMEOUT_S)
    return {}


# ---- config options -------------------------------------------------------------------------


async def set_config_option(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    config_id = params.get("configId")
    if not isinstance(config_id, str) or not config_id:
        raise _params_error("`configId` must be a non-empty string")
    value = params.get("value")
    kind = params.get("type")
    if kind == "boolean":
        if not isinstance(value, bool):
            raise _params_error("a boolean config option takes `value: true|false`")
    elif not isinstance(value, str) or not value:
        raise _params_error("`value` must be a non-empty string (or boolean with type boolean)")
    category = _category(link.session, config_id)
    if category == "mode" and config_id != "mode" and front.policy is not None:
        # A mode option under another id changes the approval mode too: the same gate.
        refusal = front.policy(conn, "session/set_mode", params)
        if refusal is not None:
            raise refusal
    if isinstance(value, str) and (config_id == "model" or category == "model"):
        await link.session.call(SetModel(value, link.client_id, timeout_s=60.0), timeout_s=60)
    elif isinstance(value, str) and (config_id == "mode" or category == "mode"):
        await link.session.call(
            SetApprovalMode(value, False, link.client_id), timeout_s=ASK_TIMEOUT_S
        )
    else:
        options = await link.session.call(
            SetConfigOption(config_id, value, link.client_id), timeout_s=ASK_TIMEOUT_S
        )
        return {"configOptions": options}
    view: SessionView = await link.session.call(Describe(), timeout_s=ASK_TIMEOUT_S)
    options = context_state(link.session).get("configOptions")
    return {"configOptions": options or view.state.get("configOptions") or []}


def _category(session: SessionActor, config_id: str) -> str | None:
    for option in context_state(session).get("configOptions") or ():
        if isinstance(option, dict) and option.get("id") == config_id:
            category = option.get("category")
            return category if isinstance(category, str) else None
    return None


# ---- session/delete ---------------------------------------------------------------------------


async def session_delete(
    front: Connections, conn: Connection, params: dict[str, Any]
) -> dict[str, Any]:
    link = owned(conn, params)
    session = link.session
    info = getattr(getattr(session, "conn", None), "info", None)
    caps = getattr(getattr(info, "agent_capabilities", None), "session_capabilities", None)
    if getattr(caps, "delete", None) is not None:
        await session.call(AgentCall("session/delete", {}, ASK_TIMEOUT_S), timeout_s=60)
    await session.call(
        CloseSession(reason="client_delete", closed_by=link.client_id), timeout_s=ASK_TIMEOUT_S
    )
    # Deleted means gone for the daemon too: its journal would otherwise answer a later load.
    journal = front.host.journal
    if journal is not None:
        try:
            await journal.delete(str(params["sessionId"]))
        except JournalError as exc:
            log.warning("session/delete: the journal of %s stays: %s", params["sessionId"], exc)
    return {}


# ---- $/cancel_request -----------------------------------------------------------------------


def cancel_request(conn: Connection, params: dict[str, Any]) -> None:
    """Cancel the connection's running request ``params.requestId`` (unknown ids: ignored)."""
    rid = params.get("requestId")
    if isinstance(rid, bool) or not isinstance(rid, int | str):
        return
    scope = conn.running.get(rid)
    if scope is not None:
        conn.cancelled.add(rid)
        scope.cancel()


def cancelled_error(method: str) -> RpcError:
    return RpcError(REQUEST_CANCELLED, f"Request cancelled: {method}", {"httpStatus": 499})


# ---- additionalDirectories ------------------------------------------------------------------


async def additional_directories(
    front: Connections, params: dict[str, Any], workspace: str
) -> tuple[str, ...]:
    """The validated, resolved ``additionalDirectories`` (empty when absent): absolute paths
    of existing directories, at most :data:`MAX_ADDITIONAL_DIRECTORIES`, none inside the
    daemon's state directory or another served workspace than the session's ``workspace``
    (checked in a worker thread)."""
    settings = front.host.settings
    served = [*settings.workspaces, *settings.untrusted_workspaces]
    return await trio.to_thread.run_sync(
        _additional_directories, params, settings.state_dir, served, workspace
    )


def _additional_directories(
    params: dict[str, Any], state_dir: str, served: list[str], workspace: str
) -> tuple[str, ...]:
    own = os.path.realpath(workspace)
    others = {os.path.realpath(w) for w in served} - {own}
    protected = [os.path.realpath(state_dir), *sorted(others)]
    raw = params.get("additionalDirectories")
    if raw is None or raw == []:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_ADDITIONAL_DIRECTORIES:
        raise _params_error(
            "`additionalDirectories` must be an array of at most "
            f"{MAX_ADDITIONAL_DIRECTORIES} absolute paths",
            code="invalid_additional_directories",
        )
    out: list[str] = []
    for entry in raw:
        if not isinstance(entry, str) or not os.path.isabs(entry) or "\x00" in entry:
            raise _params_error(
                f"additional directory {entry!r} is not an absolute path",
                code="invalid_additional_directories",
            )
        real = os.path.realpath(entry)
        if not os.path.isdir(real):
            raise _params_error(
                f"additional directory {entry!r} is not an existing directory",
                code="invalid_additional_directories",
            )
        state = protected[0]
        if (
            real == state
            or real.startswith(state.rstrip("/") + "/")
            or any(real == w or real.startswith(w.rstrip("/") + "/") for w in protected[1:])
        ):
            raise _params_error(
                f"additional directory {entry!r} is the daemon's state directory or "
                "another served workspace (or inside one)",
                code="invalid_additional_directories",
            )
        if real not in out:
            out.append(real)
    return tuple(out)
