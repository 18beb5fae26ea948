"""What a turn sends and what its terminal events say (pure helpers of the session actor).

The session actor runs a turn as ``session/prompt`` with :func:`prompt_extra` (the caller's
``_meta`` plus ``_meta["qwen.daemon.invocation"]``; :func:`passthrough` is what the fronts take
from a prompt request, an allow-list), echoes the prompt's content blocks
(:func:`text_blocks`) as ``user_message_chunk`` updates, and ends it with one of the
terminal payloads below (``turn_complete`` / ``turn_error`` data, ``promptId`` added by the
prompt queue).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from acp.client import PROMPT_EXTRA_KEYS
from acp.errors import INVALID_PARAMS, RESOURCE_NOT_FOUND, RemoteError
from serve.sessions.errors import MemoryBudgetExceeded
from serve.sessions.prompt_queue import Job


def passthrough(request: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a client's prompt request that go on to the agent's ``session/prompt``:
    only those of :data:`~acp.client.PROMPT_EXTRA_KEYS` (``_meta``, a JSON object). Every other
    field is the daemon's own (``sessionId``, ``prompt``, ``promptId``, ...) or is dropped, so
    no client field reaches the agent unread. ``ValueError`` (the message) for a bad ``_meta``."""
    meta = request.get("_meta")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise ValueError("`_meta` must be a JSON object")
    return {"_meta": meta}


def prompt_extra(job: Job, session_id: str) -> dict[str, Any]:
    extra = {k: v for k, v in (job.extra or {}).items() if k in PROMPT_EXTRA_KEYS}
    meta = dict(extra.pop("_meta", None) or {})
    meta["qwen.daemon.invocation"] = {
        "version": 1,
        "sessionId": session_id,
        "promptId": job.prompt_id,
        **({"originatorClientId": job.client_id} if job.client_id else {}),
    }
    extra["_meta"] = meta
    return extra


def text_blocks(prompt: msgspec.Raw) -> list[bytes]:
    """The raw JSON of each content block (echoed as user_message_chunk updates)."""
    try:
        blocks = msgspec.json.decode(bytes(prompt), type=list[msgspec.Raw])
    except msgspec.DecodeError:
        return []
    return [bytes(b) for b in blocks]


def user_chunk(block: bytes) -> msgspec.Raw:
    return msgspec.Raw(b'{"sessionUpdate":"user_message_chunk","content":' + block + b"}")


def completed(session_id: str, stop_reason: str, meta_raw: msgspec.Raw | None) -> dict[str, Any]:
    data: dict[str, Any] = {"sessionId": session_id, "stopReason": stop_reason}
    if meta_raw:
        try:
            decoded = msgspec.json.decode(bytes(meta_raw))
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, dict) and "qwen.branchPoint" in decoded:
            data["branchPoint"] = decoded["qwen.branchPoint"]
    return data


def remote_error(session_id: str, exc: RemoteError) -> dict[str, Any]:
    data: dict[str, Any] = {"sessionId": session_id, "message": exc.message, "code": exc.code}
    if exc.data is not None:
        data["data"] = exc.data
    return data


def protocol_error(session_id: str, exc: Exception) -> dict[str, Any]:
    return {"sessionId": session_id, "message": str(exc), "code": "protocol_error"}


def channel_closed(session_id: str) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "message": "agent channel exited before the prompt completed",
        "code": "channel_closed",
    }


def agent_restarted(session_id: str) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "message": "the agent exited during the prompt and was restarted",
        "code": "agent_restarted",
        "errorKind": "agent_restarted",
    }


def agent_oom(session_id: str, message: str) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "message": message,
        "code": "agent_oom",
        "errorKind": "agent_oom",
    }


def deadline_exceeded(session_id: str) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "message": "the prompt exceeded its deadline",
        "code": "prompt_deadline_exceeded",
        "errorKind": "prompt_deadline_exceeded",
    }


def budget_exhausted(session_id: str, detail: dict[str, Any]) -> dict[str, Any]:
    """A turn ended (or not started) because the session's budget is spent."""
    return {
        **detail,
        "sessionId": session_id,
        "message": f"the session's {detail.get('dimension', 'token')} budget is exhausted",
        "code": "budget_exhausted",
        "errorKind": "budget_exhausted",
    }


def cancel_timeout(session_id: str, grace_ms: int) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "message": f"the agent did not stop the turn within {grace_ms} ms of the cancel; "
        "it is restarted",
        "code": "cancel_timeout",
        "errorKind": "cancel_timeout",
    }


def session_unknown(exc: BaseException) -> bool:
    """The agent's answer to ``session/resume`` / ``session/load`` says it does not know the
    session (``-32002`` resource not found, or ``-32602`` invalid params)."""
    return isinstance(exc, RemoteError) and exc.code in (RESOURCE_NOT_FOUND, INVALID_PARAMS)


def rebind_failed(session_id: str, exc: BaseException) -> dict[str, Any]:
    """The terminal of the prompts a released session could not bind an agent for (the
    session stays released; retryable): ``memory_budget_exceeded`` or ``agent_unavailable``."""
    code = (
        "memory_budget_exceeded" if isinstance(exc, MemoryBudgetExceeded) else "agent_unavailable"
    )
    message = str(exc) or type(exc).__name__
    if code == "agent_unavailable":
        message = f"no agent could be bound for the session ({type(exc).__name__}: {message})"
    return {"sessionId": session_id, "message": message, "code": code, "errorKind": code}


def aborted(session_id: str, reason: str, *, died: bool) -> tuple[str, dict[str, Any]]:
    """The terminal of every unfinished prompt when the session ends."""
    if died and reason == "channel_closed":
        return "turn_error", channel_closed(session_id)
    if died and reason == "agent_session_not_found":
        return "turn_error", {
            "sessionId": session_id,
            "message": "the agent no longer knows the session",
            "code": reason,
        }
    if died and reason == "agent_oom":
        return "turn_error", agent_oom(
            session_id, "the agent was killed for memory and may not restart again"
        )
    if died:
        return "turn_error", {
            "sessionId": session_id,
            "message": "daemon shutting down",
            "code": reason,
        }
    return "turn_complete", {
        "sessionId": session_id,
        "stopReason": "cancelled",
        "promptCancelled": True,
    }
