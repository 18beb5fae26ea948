"""Setting any of the agent's session config options (ACP ``session/set_config_option``).

Theory of operation
-------------------
An agent advertises ``configOptions`` in its session set-up (and updates them with
``config_option_update``, or in a ``set_config_option`` answer; the connection keeps the live
list). Since schema 1.21 an option is a ``select`` (``currentValue``: one of its
``options``' values, possibly grouped) or a ``boolean`` (``currentValue: true|false``; set with
``{type: "boolean", value: <bool>}``; an agent offers them only to a client that advertised
``clientCapabilities.session.configOptions.boolean``, which the daemon does).

:class:`~serve.sessions.messages.SetConfigOption` is checked against the live list in the
session's inbox (:func:`check`: an unknown id, a value of the wrong kind, a select value not
offered are :class:`~serve.sessions.errors.SessionRequestError` ``invalid_config_option``,
400, and nothing is sent), then runs as a *switch* (one at a time with model and mode
switches, within its caller's bound; a released agent is bound again first). The agent's
answer is the complete new list: it is published as the ACP ``config_option_update`` session
update (a ``session_update`` event), so every client of the session, REST and ``/acp``, sees
the change, and returned. An agent's refusal is ``config_option_failed`` (400).

The ``model`` and ``mode`` options (``category`` ``model`` / ``mode``) keep their own paths
(``SetModel``, ``SetApprovalMode``: ``model_switched``, ``approval_mode_changed``); the
callers route them there.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import msgspec

from acp.errors import RemoteError, RequestTimeout
from actors import Reply
from serve.sessions.errors import AgentRefusedError, SessionRequestError
from serve.sessions.messages import SetConfigOption

if TYPE_CHECKING:
    from acp.schema import SessionConfigOption
    from serve.sessions.core import SessionCore


def _options(session: SessionCore) -> list[SessionConfigOption]:
    conn = session.link.conn
    live = conn.config_options(session.session_id) if conn is not None else None
    if live is not None:
        return list(live)
    setup = session.setup
    return list(setup.config_options or ()) if setup is not None else []


def check(session: SessionCore, msg: SetConfigOption) -> None:
    """Refuse (before anything is sent) what the agent's advertised options cannot take."""
    options = _options(session)
    option = next((o for o in options if o.id == msg.config_id), None)
    if option is None:
        raise SessionRequestError(
            f"The agent offers no config option {msg.config_id!r}",
            "invalid_config_option",
            configId=msg.config_id,
            available=[o.id for o in options],
        )
    if option.type == "boolean":
        if not isinstance(msg.value, bool):
            raise SessionRequestError(
                f"Config option {msg.config_id!r} is a boolean: send "
                '{"type": "boolean", "value": true|false}',
                "invalid_config_option",
                configId=msg.config_id,
            )
        return
    if isinstance(msg.value, bool):
        raise SessionRequestError(
            f"Config option {msg.config_id!r} is a {option.type}, not a boolean",
            "invalid_config_option",
            configId=msg.config_id,
        )
    allowed = option.select_values() if option.type == "select" else []
    if option.type == "select" and msg.value not in allowed:
        raise SessionRequestError(
            f"{msg.value!r} is not a value of config option {msg.config_id!r}",
            "invalid_config_option",
            configId=msg.config_id,
            allowed=allowed,
        )


def start(session: SessionCore, msg: SetConfigOption) -> Reply[list[object]]:
    """The inbox's part: check, then run the switch (see the module docstring)."""
    check(session, msg)
    return session.calls.start_switch(
        "config option change",
        msg.timeout_s,
        functools.partial(
            session.binding.bound_then, "config", functools.partial(_apply, session), msg
        ),
        connected=lambda: session.link.connected or session.binding.released,
    )


async def _apply(session: SessionCore, msg: SetConfigOption, timeout_s: float) -> list[object]:
    conn = session.link.conn
    assert conn is not None
    try:
        options = await conn.set_config_option(
            session.session_id, msg.config_id, msg.value, timeout_s=timeout_s
        )
    except (RemoteError, RequestTimeout) as exc:
        error = exc.message if isinstance(exc, RemoteError) else str(exc)
        raise AgentRefusedError(
            f"The agent refused the config option: {error}",
            "config_option_failed",
            configId=msg.config_id,
        ) from None
    listed: list[object] = [msgspec.to_builtins(o) for o in options or _options(session)]
    session.log.publish(
        "session_update",
        {
            "sessionId": session.session_id,
            "update": {"sessionUpdate": "config_option_update", "configOptions": listed},
        },
        originator=msg.client_id,
    )
    return listed
