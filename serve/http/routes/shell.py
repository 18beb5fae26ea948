"""``POST /session/<id>/shell``: a user's shell command in the session's workspace.

Contract (spec §4.8, qwen serve 0.24.4): body ``{command: string}``; strict route (the
security middleware refuses it on a daemon without a bearer token); needs
``--enable-session-shell`` (else ``403 session_shell_disabled``) and an
``X-Qwen-Client-Id`` registered on the session (absent: ``403 client_id_required``;
unknown: ``400 invalid_client_id``). With multi-user auth, a ``user``'s command that names
a file or folder steering agents (``QWEN.md``, ``.qwen/`` ..., serve/access/steering_files.py)
is refused ``403 forbidden need: admin`` (``reason: "steering_file"``): a tripwire, not a
boundary (docs/multi-user.md says what the shell can and cannot be stopped from doing).
Tag ``session_shell_command``, advertised only when the flag is on *and* a token is
configured: the strict gate has no trusted-loopback
exception here, so without a token the route could never run and the tag would lie.

Order of work:

1. **Admission** through the Host's EffectGate (``host.effects``), exactly as
   an agent's ``terminal/create`` of ``/bin/sh -c COMMAND`` in the workspace: grants,
   hardline commands (``rm -rf /``...), the session's approval mode, and a
   ``permission_request`` voted by the session's clients when the policy says "prompt".
   A refusal is ``403 {code:"effect_denied", reason, capability, rule}`` (the gate has
   already published ``effect_denied``). No gate installed: the command runs directly.
2. ``user_shell_command {sessionId, command, cwd}`` on the session log.
3. The command runs (:func:`serve.workspaces.state.shell_run.run_shell`): own process
   group, 120 s timeout, group SIGKILLed on timeout, when the shell exits (leftover
   background jobs) and when the HTTP client goes away (handler cancelled). Output is
   streamed as ``session_update {sessionId, update:{sessionUpdate:"shell_output", output,
   _meta:{source:"user-shell"}}}`` (first 256 KiB) and returned (last 256 KiB).
4. ``user_shell_result {sessionId, exitCode, signal, aborted, error?}``; events carry the
   caller as originator.
5. For an agent that answers ``qwen/control/session/shell_history`` (qwen-code), the
   command and its output (first 10 000 characters) are handed to the agent so its next
   turn knows about them (best effort, bounded).

Events reach the session's log through its inbox (:class:`PublishEvent`, in order; the
session is its log's only writer); the history hand-off is an ``AgentCall``.

Response ``200 {sessionId, command, cwd, exitCode, signal, aborted, timedOut, output,
truncated, durationMs}``. At most :data:`MAX_SHELLS_PER_SESSION` commands run at once per
session (``429 shell_limit_exceeded``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Final

import trio
from quart import Blueprint, Response

from acp.errors import METHOD_NOT_FOUND, AcpError, HandlerError, RemoteError
from acp.process import scrub_env
from acp.schema import CreateTerminalParams
from actors import ActorStopped, InboxFull
from serve.api import steering
from serve.http.access import principal
from serve.http.capabilities import Feature
from serve.http.context import daemon
from serve.http.errors import ApiError, bad_request
from serve.http.routes.sessions import (
    ask,
    find_session,
    header_client_id,
    publish,
    require_registered,
)
from serve.http.wire import json_body, json_response
from serve.isolation import identity, sandbox
from serve.permissions.host_request import EFFECT_DENIED
from serve.sessions.messages import AgentCall, PublishEvent
from serve.workspaces.state import agent_ext
from serve.workspaces.state.shell_run import DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT_S, run_shell

if TYPE_CHECKING:
    from serve.host import Host
    from serve.sessions.actor import SessionActor

log = logging.getLogger(__name__)

blueprint = Blueprint("session_shell", __name__)

RULE: Final = "/session/<session_id>/shell"
#: Longest command accepted (characters).
MAX_COMMAND_CHARS: Final = 64 * 1024
#: Concurrent shell commands per session.
MAX_SHELLS_PER_SESSION: Final = 4
#: Output handed to the agent's shell history (characters), as qwen serve does.
MAX_HISTORY_CHARS: Final = 10_000
HISTORY_TIMEOUT_S: Final = 10.0


def shell_enabled(d: Host) -> bool:
    """The flag is on and a bearer token is configured (see the module docstring)."""
    settings = d.settings
    return bool(settings.enable_session_shell) and bool(settings.token)


FEATURES: tuple[Feature, ...] = (
    Feature("session_shell_command", (("POST", RULE),), when=shell_enabled),
)


def _denied(err: HandlerError) -> ApiError:
    data = err.data if isinstance(err.data, dict) else {}
    if err.code == EFFECT_DENIED:
        return ApiError(
            403,
            {
                "error": err.message,
                "code": "effect_denied",
                **{k: data[k] for k in ("reason", "capability", "rule", "target") if k in data},
            },
        )
    return bad_request(err.message, "invalid_command")


async def _admit(d: Host, session: SessionActor, command: str) -> None:
    gate = d.effects
    params = CreateTerminalParams(
        session_id=session.session_id,
        command="/bin/sh",
        args=["-c", command],
        cwd=session.workspace,
    )
    try:
        await gate.check_terminal(session, params)
    except HandlerError as err:
        raise _denied(err) from None


async def _share_history(
    session: SessionActor, command: str, output: str, exit_code: int | None
) -> None:
    """Hand the command to an agent that keeps a shell history (best effort)."""
    d = daemon()
    support = agent_ext.support_for(d)
    kind = agent_ext.agent_kind(session)
    if support.verdict(kind, agent_ext.SHELL_HISTORY) is not True:
        return
    if len(output) > MAX_HISTORY_CHARS:
        output = output[:MAX_HISTORY_CHARS] + "\n... (truncated)"
    params = {"command": command, "output": output, "exitCode": exit_code}
    try:
        await ask(session, AgentCall(agent_ext.SHELL_HISTORY, params, HISTORY_TIMEOUT_S), object)
    except RemoteError as err:
        if err.code == METHOD_NOT_FOUND:
            support.observe(kind, agent_ext.SHELL_HISTORY, False)
        log.info("shell history not taken by %s: %s", kind, err)
    except (AcpError, ApiError) as err:
        log.info("shell history not handed to %s: %s", kind, err)


@blueprint.post(RULE)
async def session_shell(session_id: str) -> Response:
    d = daemon()
    session = find_session(session_id)
    if not d.settings.enable_session_shell:
        raise ApiError(
            403,
            {
                "error": "The session shell is disabled; start the daemon with "
                "--enable-session-shell",
                "code": "session_shell_disabled",
                "errorKind": "session_shell_disabled",
            },
        )
    client_id = header_client_id()
    if client_id is None:
        raise ApiError(
            403,
            {
                "error": "The session shell needs an X-Qwen-Client-Id registered on the session",
                "code": "client_id_required",
                "errorKind": "client_id_required",
            },
        )
    await require_registered(session, client_id)
    body = await json_body()
    command = body.get("command")
    if not isinstance(command, str) or not command.strip():
        raise bad_request("`command` is required and must be a non-empty string")
    command = command.strip()
    if len(command) > MAX_COMMAND_CHARS or "\x00" in command:
        raise bad_request(
            f"`command` must be at most {MAX_COMMAND_CHARS} characters without NUL",
            "invalid_command",
        )
    # A user's command that names a file steering agents (QWEN.md, .qwen/ ...) is refused
    # as the files routes refuse it; a tripwire only (serve/api/steering.py).
    untrusted = d.settings.untrusted_workspaces
    await steering.check_command(
        d.workspaces.get(session.workspace, trusted=session.workspace not in untrusted),
        command,
        principal(),
        multi_user=d.multi_user,
        memory_flag=d.settings.memory_file_name,
    )
    running = d.front.shells  # the Host's table, not a module global
    if running.get(session_id, 0) >= MAX_SHELLS_PER_SESSION:
        raise ApiError(
            429,
            {
                "error": f"At most {MAX_SHELLS_PER_SESSION} shell commands run at once per session",
                "code": "shell_limit_exceeded",
                "limit": MAX_SHELLS_PER_SESSION,
            },
            {"Retry-After": "1"},
        )
    running[session_id] = running.get(session_id, 0) + 1
    try:
        return await _run(session, command, client_id)
    finally:
        left = running.get(session_id, 1) - 1
        if left <= 0:
            running.pop(session_id, None)
        else:
            running[session_id] = left


async def _run(session: SessionActor, command: str, client_id: str) -> Response:
    d = daemon()
    sid = session.session_id
    cwd = session.workspace
    await _admit(d, session, command)
    # Events go to the session's inbox in order. A full inbox spills into ``spill``
    # (bounded: the streamed output is at most DEFAULT_OUTPUT_LIMIT bytes) until flushed.
    spill: list[tuple[str, dict[str, Any]]] = []

    def emit(event_type: str, data: dict[str, Any]) -> None:
        if not spill:
            try:
                session.tell_nowait(PublishEvent(event_type, data, originator=client_id))
                return
            except ActorStopped:
                return
            except InboxFull:
                pass
        spill.append((event_type, data))

    async def flush() -> None:
        while spill:
            event_type, data = spill.pop(0)
            await publish(session, event_type, data, client_id)

    emit("user_shell_command", {"sessionId": sid, "command": command, "cwd": cwd})

    def stream(text: str) -> None:
        emit(
            "session_update",
            {
                "sessionId": sid,
                "update": {
                    "sessionUpdate": "shell_output",
                    "output": text,
                    "_meta": {"source": "user-shell"},
                },
            },
        )

    def result(data: dict[str, Any]) -> None:
        emit("user_shell_result", {"sessionId": sid, **data})

    try:
        # The session agent's sandbox, with a private TMPDIR of its own, a pid namespace of
        # its own, its owner's places (their HOME) in multi-user mode and the owner's uid
        # under --agent-uid-range (serve/isolation).
        env, places = await sandbox.tenant_setup(
            d.settings, session.access.owner, scrub_env(os.environ)
        )
        run_as = identity.run_as_for(d.settings, session.access.owner)
        box = await sandbox.prepare(d.settings, cwd, env, places=places, run_as=run_as)
        try:
            outcome = await run_shell(
                command,
                cwd=cwd,
                env=env,
                timeout_s=DEFAULT_TIMEOUT_S,
                output_limit=DEFAULT_OUTPUT_LIMIT,
                on_output=stream,
                confine=box.confinement(),
            )
        finally:
            await box.aclose()
    except OSError as err:  # /bin/sh could not be started
        result({"exitCode": None, "signal": None, "aborted": False, "error": str(err)})
        await flush()
        raise ApiError(
            500, {"error": f"cannot start the shell: {err}", "code": "shell_spawn_failed"}
        ) from None
    except BaseException:  # cancelled (the client went away; may arrive as a group)
        result({"exitCode": None, "signal": "SIGKILL", "aborted": True})
        with trio.CancelScope(shield=True), trio.move_on_after(HISTORY_TIMEOUT_S):
            await flush()
        raise
    data: dict[str, Any] = {
        "exitCode": outcome.exit_code,
        "signal": outcome.signal,
        "aborted": outcome.aborted,
    }
    if outcome.timed_out:
        data["error"] = f"command timed out after {DEFAULT_TIMEOUT_S:g} s"
    result(data)
    await flush()
    await _share_history(session, command, outcome.output, outcome.exit_code)
    return json_response(
        {
            "sessionId": sid,
            "command": command,
            "cwd": cwd,
            "exitCode": outcome.exit_code,
            "signal": outcome.signal,
            "aborted": outcome.aborted,
            "timedOut": outcome.timed_out,
            "output": outcome.output,
            "truncated": outcome.truncated,
            "durationMs": outcome.duration_ms,
        }
    )
