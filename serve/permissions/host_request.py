"""The Host's own permission request: the synthetic tool call and options clients vote on,
and the JSON-RPC error an agent gets for a refused or failed effect (pure).

The :class:`~serve.permissions.effects.EffectGate`'s prompt stage
(:mod:`serve.permissions.prompt_stage`) asks the session's clients through the mediator
when the decision is ``prompt`` and nothing earlier covers it (:func:`ask_clients`:
:func:`host_tool_call` and :func:`host_options`, voted on like any permission request; an
unavailable mediator is a ``cancelled`` answer, never a hang); a refusal is
:data:`EFFECT_DENIED`; a workspace boundary error maps through :func:`fs_error`.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from acp.errors import INTERNAL_ERROR, INVALID_PARAMS, RESOURCE_NOT_FOUND, HandlerError
from actors import ActorError
from serve.permissions.approval import Decision, Effect
from serve.permissions.mediator import OpenPermission, request_decision
from serve.permissions.voting import PermissionOption
from serve.workspaces.files import WorkspaceFsError

if TYPE_CHECKING:
    from serve.permissions.effect_session import EffectSession
    from serve.permissions.mediator import PermissionMediator

log = logging.getLogger(__name__)

Outcome = Literal["allow_once", "allow_always", "rejected", "cancelled"]

#: JSON-RPC error code for an effect the Host refused (policy, a client's reject, cancel).
EFFECT_DENIED: Final = -32003

OPTION_ALLOW_ONCE: Final = "allow_once"
OPTION_ALLOW_ALWAYS: Final = "allow_always"
OPTION_REJECT_ONCE: Final = "reject_once"

#: A write's new text is shown in the permission request up to this many characters.
MAX_PREVIEW_CHARS: Final = 16_384
#: Bound on handing a request to the mediator (its inbox, not the vote).
OPEN_PERMISSION_TIMEOUT_S: Final = 10.0

_encoder = msgspec.json.Encoder()

_KIND_OF = {"fs.read": "read", "fs.write": "edit", "terminal.exec": "execute"}
_VERB_OF = {"fs.read": "Read", "fs.write": "Write", "terminal.exec": "Run"}


def host_tool_call(
    effect: Effect,
    decision: Decision,
    *,
    cwd: str | None = None,
    content: str | None = None,
    tool_call_id: str | None = None,
) -> dict[str, Any]:
    """The ``toolCall`` of a Host permission request describing ``effect``."""
    target = effect.target or ""
    call: dict[str, Any] = {
        "toolCallId": tool_call_id or f"host_{uuid.uuid4().hex}",
        "title": f"{_VERB_OF.get(effect.capability, effect.capability)} {target}".strip(),
        "kind": _KIND_OF.get(effect.capability, "other"),
        "status": "pending",
    }
    if effect.capability == "terminal.exec":
        raw: dict[str, Any] = {"command": target}
        if cwd is not None:
            raw["cwd"] = cwd
        call["rawInput"] = raw
    else:
        call["locations"] = [{"path": target}]
        raw = {"path": target}
        if content is not None:
            raw["bytes"] = len(content.encode("utf-8", "surrogatepass"))
            if len(content) <= MAX_PREVIEW_CHARS:
                call["content"] = [{"type": "diff", "path": target, "newText": content}]
        call["rawInput"] = raw
    call["_meta"] = {
        "qwen.daemon.effect": {
            "source": "host",
            "capability": effect.capability,
            "risk": effect.risk,
            "rule": decision.rule,
            "reason": decision.reason,
            "inWorkspace": effect.in_workspace,
        }
    }
    return call


def host_options(*, offer_always: bool) -> list[dict[str, str]]:
    """The options of a Host permission request (``allow_always`` only when cacheable)."""
    opts = [{"optionId": OPTION_ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"}]
    if offer_always:
        opts.append(
            {"optionId": OPTION_ALLOW_ALWAYS, "name": "Always allow", "kind": "allow_always"}
        )
    opts.append({"optionId": OPTION_REJECT_ONCE, "name": "Reject", "kind": "reject_once"})
    return opts


def fs_error(err: WorkspaceFsError, path: str) -> HandlerError:
    """Map a workspace boundary error to the agent's JSON-RPC error."""
    data: dict[str, Any] = {"path": path, "errorKind": err.kind}
    if err.hint:
        data["hint"] = err.hint
    if err.kind == "path_not_found":
        return HandlerError(RESOURCE_NOT_FOUND, "Resource not found", data)
    if err.kind in ("path_outside_workspace", "symlink_escape", "untrusted_workspace"):
        data["reason"] = err.message
        return HandlerError(EFFECT_DENIED, err.message, data)
    if err.kind in ("parse_error", "binary_file", "file_too_large"):
        return HandlerError(INVALID_PARAMS, err.message, data)
    return HandlerError(INTERNAL_ERROR, err.message, data)


async def ask_clients(
    mediator: PermissionMediator,
    session: EffectSession,
    effect: Effect,
    decision: Decision,
    *,
    offer_always: bool,
    content: str | None,
    cwd: str | None,
) -> Outcome:
    """Ask the session's clients about ``effect`` (a Host permission request, voted on)."""
    tool_call = host_tool_call(effect, decision, cwd=cwd, content=content)
    options = host_options(offer_always=offer_always)
    active = session.active
    msg = OpenPermission(
        session_id=session.session_id,
        session=session,
        tool_call=msgspec.Raw(_encoder.encode(tool_call)),
        options=msgspec.Raw(_encoder.encode(options)),
        option_list=tuple(
            PermissionOption(option_id=o["optionId"], kind=o["kind"], name=o["name"])
            for o in options
        ),
        prompt_id=active.prompt_id if active is not None else None,
        originator=active.client_id if active is not None else None,
        session_clients=session.client_ids,
    )
    try:  # withdrawn (our caller cancelled: the agent withdrew its request) at once
        response = await request_decision(mediator, msg, timeout_s=OPEN_PERMISSION_TIMEOUT_S)
    except ActorError:
        log.warning("permission mediator unavailable: refusing %s", effect.capability)
        return "cancelled"
    outcome = response.get("outcome") or {}
    if outcome.get("outcome") != "selected":
        return "cancelled"
    option = outcome.get("optionId")
    if option == OPTION_ALLOW_ALWAYS:
        return "allow_always"
    if option == OPTION_ALLOW_ONCE:
        return "allow_once"
    return "rejected"
