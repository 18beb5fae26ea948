"""The scripted agent's ACP 1.21 additions (kept out of :mod:`.agent`, which other features share).

* **Config options** beyond ``model``: a select option ``effort`` (``low|medium|high``) and,
  only for a client that advertised ``clientCapabilities.session.configOptions.boolean`` (as
  the schema asks of agents), a boolean option ``thinking``. ``session/set_config_option``
  sets them (a boolean one must come as ``{type: "boolean", value: <bool>}``); they live in
  the agent process (not the store), per session.
* ``sessionCapabilities.delete``: ``session/delete`` removes the stored session (its file),
  closing it first if it is open here.
* ``agentCapabilities.auth.logout``: ``logout`` answers ``{}`` and counts the calls.
* With ``--auth-methods`` the agent advertises two ``authMethods``: an agent method
  (``scripted-key``, through ``authenticate``) and a terminal one (``scripted-login``,
  ``type: "terminal"``, which a client would run as ``<agent> --login``).
* ``additionalDirectories`` of ``session/new|load|resume`` are remembered per session and
  reported by ``session/list`` (the SessionInfo field); ``[touch PATH]`` creates a file from
  the agent process itself (what its file sandbox allows).
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Any, Final, Protocol

from acp.agents.scripted.store import Store, valid_session_id
from acp.errors import INVALID_PARAMS
from acp.jsonrpc import RequestId

EFFORTS: Final = ("low", "medium", "high")
#: Methods a ``--legacy`` agent does not know.
NOT_LEGACY: Final = frozenset({"session/resume", "session/delete", "logout"})

AUTH_METHODS: Final = (
    {"id": "scripted-key", "name": "API key", "description": "A key the agent keeps"},
    {
        "id": "scripted-login",
        "name": "Log in",
        "description": "Interactive login in a terminal",
        "type": "terminal",
        "args": ["--login"],
    },
)


class Refused(Exception):
    """Answer the current request with this JSON-RPC error (as the agent's RpcFailure)."""

    def __init__(self, code: int, message: str, data: object = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Extras:
    """The per-process state of these additions (one per :class:`ScriptedAgent`)."""

    def __init__(self, *, auth_methods: bool = False) -> None:
        self.auth_methods = auth_methods
        self.boolean_options = False
        self.effort: dict[str, str] = {}
        self.thinking: dict[str, bool] = {}
        self.directories: dict[str, list[str]] = {}
        self.logouts = 0


class ScriptedAgent(Protocol):
    """What these additions use of :class:`~acp.agents.scripted.agent.ScriptedAgent` (a
    Protocol: that module imports this one)."""

    legacy: bool
    extras: Extras
    store: Store

    def forget(self, session_id: str) -> None:
        """Cancel the session's turn (if any) and drop it from the open sessions."""


def on_initialize(agent: ScriptedAgent, params: dict[str, Any], result: dict[str, Any]) -> None:
    """Record the client's boolean-option capability; add 1.21's capabilities to ``result``."""
    extras = agent.extras
    caps = params.get("clientCapabilities")
    session = caps.get("session") if isinstance(caps, dict) else None
    options = session.get("configOptions") if isinstance(session, dict) else None
    extras.boolean_options = isinstance(options, dict) and isinstance(options.get("boolean"), dict)
    if agent.legacy:
        return
    agent_caps = result["agentCapabilities"]
    agent_caps["sessionCapabilities"]["delete"] = {}
    agent_caps["sessionCapabilities"]["additionalDirectories"] = {}
    agent_caps["auth"] = {"logout": {}}
    if extras.auth_methods:
        result["authMethods"] = [dict(m) for m in AUTH_METHODS]


def remember_directories(agent: ScriptedAgent, session_id: str, params: dict[str, Any]) -> None:
    dirs = params.get("additionalDirectories")
    if isinstance(dirs, list):
        agent.extras.directories[session_id] = [d for d in dirs if isinstance(d, str)]


def extra_options(agent: ScriptedAgent, session_id: str) -> list[dict[str, Any]]:
    extras = agent.extras
    out: list[dict[str, Any]] = [
        {
            "id": "effort",
            "name": "Effort",
            "category": "thought_level",
            "type": "select",
            "currentValue": extras.effort.get(session_id, "medium"),
            "options": [{"value": e, "name": e.title()} for e in EFFORTS],
        }
    ]
    if extras.boolean_options:
        out.append(
            {
                "id": "thinking",
                "name": "Show thinking",
                "type": "boolean",
                "currentValue": extras.thinking.get(session_id, False),
            }
        )
    return out


def set_option(agent: ScriptedAgent, session_id: str, params: dict[str, Any]) -> None:
    """Set ``effort`` or ``thinking``; raises :class:`Refused` for anything else."""
    extras = agent.extras
    config_id, value = params.get("configId"), params.get("value")
    if config_id == "effort" and params.get("type") in (None, "value_id"):
        if value not in EFFORTS:
            raise Refused(INVALID_PARAMS, f"unknown effort {value!r}", {"value": value})
        extras.effort[session_id] = str(value)
    elif config_id == "thinking" and extras.boolean_options:
        if params.get("type") != "boolean" or not isinstance(value, bool):
            raise Refused(INVALID_PARAMS, "`thinking` takes {type: boolean, value: <bool>}")
        extras.thinking[session_id] = value
    else:
        raise Refused(INVALID_PARAMS, f"unknown config option {config_id!r}")


def delete_session(agent: ScriptedAgent, rid: RequestId, params: dict[str, Any]) -> object:
    session_id = str(params["sessionId"])
    agent.forget(session_id)
    if valid_session_id(session_id):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(agent.store.dir, session_id + ".json"))
    return {}


def touch(path: str) -> str:
    """``[touch PATH]``: the agent itself (not through ``fs/*``) creates ``PATH``; the text
    it then says (``touched PATH`` or ``touch failed: <errno name>``) shows what its file
    sandbox allows."""
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return f"touch failed: {errno.errorcode.get(exc.errno or 0, str(exc))}"
    return f"touched {path}"


def logout(agent: ScriptedAgent, rid: RequestId, params: dict[str, Any]) -> object:
    agent.extras.logouts += 1
    return {}
