"""Snapshots of what a live agent advertised: providers, context, commands, ACP cells.

Theory of operation
-------------------
Everything here reads state a :class:`~serve.sessions.actor.AgentAdvert` already holds
(``session.setup``: the ``session/new`` result with ``models``/``modes``/
``configOptions``; ``session.conn.info``: the ``initialize`` result with auth methods
and capabilities; ``session.available_commands``: the last ``available_commands_update``)
and shapes it into the seed's bodies. No agent request is made, so these answers are
cheap and never start or wake an agent; with no session the routes answer
``initialized: false`` / ``not_started`` instead of calling in here.

Model ids of the form ``base(authType)`` (qwen-code's spelling) are split into
``baseModelId`` and the ``authType`` they are grouped under; other ids are grouped under
``authType: "default"``. What is read of the session is the :class:`AgentAdvert` port
(the session actor implements it); the agent's own values are checked as they are read.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from serve.status.preflight import PreflightCell

if TYPE_CHECKING:
    from acp.client import AgentConnection

__all__ = [
    "ACP_CELL_KINDS",
    "MAX_COMMANDS",
    "AgentAdvert",
    "acp_cells",
    "context_state",
    "providers_snapshot",
    "supported_commands",
]

#: Most commands relayed by ``GET /session/:id/supported-commands``.
MAX_COMMANDS: Final = 1000
#: Most models reported by ``GET /workspace/providers``.
MAX_MODELS: Final = 1000
ACP_CELL_KINDS: Final = ("auth", "mcp_discovery", "skills", "providers", "tool_registry", "egress")
DEFAULT_AUTH_TYPE: Final = "default"

_MODEL_ID = re.compile(r"^(?P<base>.+)\((?P<auth>[^()]+)\)$")


class AgentAdvert(Protocol):
    """What these snapshots read of a session (live values; no agent request)."""

    @property
    def session_id(self) -> str: ...

    @property
    def current_model(self) -> str | None: ...

    @property
    def current_mode(self) -> str | None: ...

    @property
    def available_commands(self) -> msgspec.Raw | None:
        """The last ``available_commands_update``, undecoded."""
        ...

    @property
    def conn(self) -> AgentConnection | None:
        """The agent connection: its ``initialize`` result and live config options."""
        ...

    def state_snapshot(self) -> dict[str, Any]:
        """``models``, ``modes``, ``configOptions`` and ``_meta`` of the session's setup."""
        ...


def _state(session: AgentAdvert) -> dict[str, Any]:
    return session.state_snapshot()


def _live_options(session: AgentAdvert, state: dict[str, Any]) -> list[object]:
    """The agent's config options: the connection's live list (updated by
    ``config_option_update`` and ``set_config_option`` answers), else the set-up result's."""
    conn = session.conn
    live = conn.config_options(session.session_id) if conn is not None else None
    if live is not None:
        return [msgspec.to_builtins(o) for o in live]
    options = state.get("configOptions")
    return options if isinstance(options, list) else []


def context_state(session: AgentAdvert) -> dict[str, Any]:
    """``state`` of ``GET /session/:id/context``: models, modes, configOptions (current).

    An agent that offers models or modes only as config options (``category: model`` /
    ``mode``; codex-acp, opencode) gets them reported in ACP's ``models``/``modes`` shape
    built from those options, so clients read one shape whatever the agent sent."""
    state = _state(session)
    options = _live_options(session, state)
    models = state.get("models")
    modes = state.get("modes")
    models = dict(models) if isinstance(models, dict) else {}
    modes = dict(modes) if isinstance(modes, dict) else {}
    view = dict(state, configOptions=options)
    if not models:
        listed, current = _advertised_models(view)
        if listed:
            models = {
                "currentModelId": current,
                "availableModels": [{k: v for k, v in m.items() if v is not None} for m in listed],
            }
    if not modes or _has_mode_option(options):
        modes = _option_modes(options) or modes
    current_model = session.current_model
    current_mode = session.current_mode
    if models and isinstance(current_model, str):
        models["currentModelId"] = current_model
    if modes and isinstance(current_mode, str):
        modes["currentModeId"] = current_mode
    return {"models": models, "modes": modes, "configOptions": options}


def _has_mode_option(options: list[object]) -> bool:
    return any(isinstance(o, dict) and o.get("category") == "mode" for o in options)


def _option_modes(options: list[object]) -> dict[str, Any]:
    """ACP's ``modes`` shape from a ``category: mode`` select option (``{}`` when none)."""
    for option in options:
        if not isinstance(option, dict) or option.get("category") != "mode":
            continue
        available = []
        for entry in option.get("options") or ():
            subs = entry.get("options") if isinstance(entry, dict) and "group" in entry else None
            for choice in subs if isinstance(subs, list) else [entry]:
                if isinstance(choice, dict) and isinstance(choice.get("value"), str):
                    mode = {"id": choice["value"], "name": choice.get("name") or choice["value"]}
                    if isinstance(choice.get("description"), str):
                        mode["description"] = choice["description"]
                    available.append(mode)
        current = option.get("currentValue")
        return {
            "currentModeId": current if isinstance(current, str) else None,
            "availableModes": available,
        }
    return {}


def _split_model_id(model_id: str) -> tuple[str, str]:
    match = _MODEL_ID.match(model_id)
    if match is None:
        return model_id, DEFAULT_AUTH_TYPE
    return match.group("base"), match.group("auth")


def _advertised_models(state: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """``(models, currentModelId)`` from ``models`` or else a ``category: model`` option."""
    models = state.get("models")
    if isinstance(models, dict) and isinstance(models.get("availableModels"), list):
        out = [
            {
                "modelId": m["modelId"],
                "name": m.get("name") if isinstance(m.get("name"), str) else m["modelId"],
                "description": m.get("description")
                if isinstance(m.get("description"), str)
                else None,
            }
            for m in models["availableModels"]
            if isinstance(m, dict) and isinstance(m.get("modelId"), str)
        ]
        current = models.get("currentModelId")
        return out, current if isinstance(current, str) else None
    for option in state.get("configOptions") or ():
        if not isinstance(option, dict) or option.get("category") != "model":
            continue
        out = []
        for entry in option.get("options") or ():
            subs = entry.get("options") if isinstance(entry, dict) and "group" in entry else None
            for choice in subs if isinstance(subs, list) else [entry]:
                if isinstance(choice, dict) and isinstance(choice.get("value"), str):
                    name = choice.get("name")
                    description = choice.get("description")
                    out.append(
                        {
                            "modelId": choice["value"],
                            "name": name if isinstance(name, str) else choice["value"],
                            "description": description if isinstance(description, str) else None,
                        }
                    )
        current = option.get("currentValue")
        return out, current if isinstance(current, str) else None
    return [], None


def providers_snapshot(session: AgentAdvert) -> dict[str, Any]:
    """``current`` and ``providers`` of ``GET /workspace/providers`` (models grouped)."""
    models, current = _advertised_models(_state(session))
    models = models[:MAX_MODELS]
    live_current = session.current_model
    if isinstance(live_current, str):
        current = live_current
    groups: dict[str, list[dict[str, Any]]] = {}
    for model in models:
        base, auth = _split_model_id(model["modelId"])
        groups.setdefault(auth, []).append(
            {
                "modelId": model["modelId"],
                "baseModelId": base,
                "name": model["name"],
                "description": model["description"],
                "contextLimit": None,
                "isCurrent": model["modelId"] == current,
                "isRuntime": False,
            }
        )
    current_auth = _split_model_id(current)[1] if current is not None else None
    providers = [
        {
            "kind": "model_provider",
            "status": "ok",
            "authType": auth,
            "current": auth == current_auth,
            "models": entries,
        }
        for auth, entries in groups.items()
    ]
    return {
        "current": {"authType": current_auth, "modelId": current} if current is not None else None,
        "providers": providers,
    }


def supported_commands(session: AgentAdvert) -> list[dict[str, Any]]:
    """The commands of the agent's last ``available_commands_update`` (``[]`` if none)."""
    raw = session.available_commands
    if raw is None:
        return []
    try:
        update = msgspec.json.decode(bytes(raw))
    except (msgspec.DecodeError, TypeError):
        return []
    commands = update.get("availableCommands") if isinstance(update, dict) else None
    out: list[dict[str, Any]] = []
    for command in commands if isinstance(commands, list) else ():
        if not isinstance(command, dict) or not isinstance(command.get("name"), str):
            continue
        description = command.get("description")
        entry: dict[str, Any] = {
            "name": command["name"],
            "description": description if isinstance(description, str) else "",
            "input": command.get("input"),
        }
        if isinstance(command.get("_meta"), dict):
            entry["_meta"] = command["_meta"]
        out.append(entry)
        if len(out) >= MAX_COMMANDS:
            break
    return out


def _not_started(kind: str) -> PreflightCell:
    hint = (
        "egress probing is not implemented by acp-serve"
        if kind == "egress"
        else "spawn a session to populate"
    )
    return PreflightCell(kind, "not_started", "acp", hint=hint)


def acp_cells(session: AgentAdvert | None, skill_count: int | None) -> list[PreflightCell]:
    """The agent-local preflight cells; ``not_started`` placeholders without a session."""
    if session is None:
        return [_not_started(kind) for kind in ACP_CELL_KINDS]
    conn = session.conn
    info = conn.info if conn is not None else None
    methods = [
        m.id for m in (info.auth_methods if info is not None else ()) if isinstance(m.id, str)
    ]
    models, current = _advertised_models(_state(session))
    agent = info.agent_info if info is not None else None
    auth_detail: dict[str, Any] = {"methods": methods}
    if agent is not None:
        auth_detail["agent"] = {"name": agent.name, "version": agent.version}
    providers = (
        PreflightCell(
            "providers", "ok", "acp", detail={"models": len(models), "currentModelId": current}
        )
        if models
        else PreflightCell(
            "providers", "unknown", "acp", hint="the agent advertised no models over ACP"
        )
    )
    skills = (
        PreflightCell("skills", "ok", "acp", detail={"count": skill_count})
        if skill_count is not None
        else PreflightCell("skills", "unknown", "acp")
    )
    return [
        PreflightCell("auth", "ok", "acp", detail=auth_detail),
        PreflightCell(
            "mcp_discovery",
            "unknown",
            "acp",
            hint="the agent discovers MCP servers itself; GET /workspace/mcp lists the "
            "configured ones",
        ),
        skills,
        providers,
        PreflightCell(
            "tool_registry",
            "unknown",
            "acp",
            hint="the agent does not report its tool registry over ACP",
        ),
        _not_started("egress"),
    ]
