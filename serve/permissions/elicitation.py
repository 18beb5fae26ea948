"""ACP elicitation (``elicitation/create``, schema 1.21 stable), brokered like a permission.

Theory of operation
-------------------
An agent child asks its client for structured input with ``elicitation/create`` in one of
two modes: ``form`` (a flat object schema of string, number, integer, boolean and
multi-select fields) or ``url`` (the user is sent to a URL out of band; ``elicitationId``
names it). The daemon is that client for every session, so it brokers the question to the
session's clients exactly like a ``session/request_permission``: the PermissionMediator
holds it as a pending request of the same pure voting machine
(:mod:`serve.permissions.voting`), under the same policy (first-responder, designated,
consensus, local-only), the same ``--permission-response-timeout-ms``, and the same ends
(turn cancelled or over, session closed, daemon shutdown, the agent's ``$/cancel_request``).

The three ACP answers map onto votes: ``decline`` is the option ``decline``; ``accept`` is
the option ``accept:<digest of the content>`` (so under ``consensus`` only voters who
submitted the *same* content count together, and the content that reached quorum is the one
the agent gets); ``cancel`` is the voting machine's ``cancelled``, honoured from any voter
under every policy. Every way a request ends without an answer (timeout, turn cancelled or
ended, session closed, shutdown) reaches the agent as ``{action: "cancel"}`` with the reason
in ``_meta["qwen.daemon.elicitationCancelReason"]``.

Everything here is pure: parsing the agent's request (:func:`parse_request`), validating a
client's answer against it (:func:`parse_answer`: strict; a form answer's fields must be
known, of the declared JSON type, within the enum; a url answer carries no content), the
events (``elicitation_request``, ``elicitation_resolved``, ``elicitation_partial_vote``,
``elicitation_forbidden``, ``elicitation_already_resolved``) and the HTTP mapping.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Literal

import msgspec

from serve.permissions.voting import (
    Cancelled,
    Outcome,
    PermissionEvent,
    PermissionOption,
    Resolved,
    Selected,
    VoteResult,
)

Mode = Literal["form", "url"]
MODES: tuple[Mode, ...] = ("form", "url")
ACCEPT_PREFIX = "accept:"
DECLINE = "decline"
OPTIONS = (PermissionOption(DECLINE, "reject_once", "Decline"),)
CANCEL_META_KEY = "qwen.daemon.elicitationCancelReason"
#: Bounds of what an agent may ask (a form's fields; a message or URL's characters).
MAX_FIELDS = 64
MAX_TEXT_CHARS = 65_536
PROPERTY_TYPES = ("string", "number", "integer", "boolean", "array")
ANSWER_KEYS = frozenset({"action", "content", "_meta"})

#: The ``clientCapabilities.elicitation`` the daemon advertises to its agent children.
CLIENT_CAPABILITY: dict[str, Any] = {"form": {}, "url": {}}


class RequestError(ValueError):
    """The agent's ``elicitation/create`` is malformed (JSON-RPC ``-32602``)."""


class Spec(msgspec.Struct, frozen=True):
    """A validated ``elicitation/create``: what the clients are shown, what answers fit."""

    mode: Mode
    message: str
    session_id: str | None
    tool_call_id: str | None = None
    schema: dict[str, Any] | None = None  # form: the requestedSchema, as the agent sent it
    url: str | None = None
    elicitation_id: str | None = None

    def event_data(self, request_id: str) -> dict[str, Any]:
        """``elicitation_request``'s data."""
        data: dict[str, Any] = {
            "requestId": request_id,
            "sessionId": self.session_id,
            "mode": self.mode,
            "message": self.message,
        }
        if self.tool_call_id is not None:
            data["toolCallId"] = self.tool_call_id
        if self.mode == "form":
            data["requestedSchema"] = self.schema
        else:
            data["url"] = self.url
            data["elicitationId"] = self.elicitation_id
        return data


def client_modes(capabilities: object) -> frozenset[str]:
    """The modes a ``clientCapabilities`` object advertises (``elicitation.form`` /
    ``.url`` present and not null; anything else advertises nothing)."""
    if not isinstance(capabilities, dict):
        return frozenset()
    elicitation = capabilities.get("elicitation")
    if not isinstance(elicitation, dict):
        return frozenset()
    return frozenset(m for m in MODES if isinstance(elicitation.get(m), dict))


def _text(params: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise RequestError(f"`{key}` must be a non-empty string")
    if len(value) > MAX_TEXT_CHARS:
        raise RequestError(f"`{key}` is longer than {MAX_TEXT_CHARS} characters")
    return value


def _check_property(name: str, prop: object) -> None:
    if not isinstance(prop, dict):
        raise RequestError(f"requestedSchema.properties.{name} must be an object")
    kind = prop.get("type")
    if kind not in PROPERTY_TYPES:
        raise RequestError(
            f"requestedSchema.properties.{name}.type must be one of " + ", ".join(PROPERTY_TYPES)
        )
    choices = _choices(prop)
    if choices is not None and not all(isinstance(c, str) for c in choices):
        raise RequestError(f"requestedSchema.properties.{name}: enum values must be strings")


def parse_request(params: object) -> Spec:
    """Validate an agent's ``elicitation/create`` params (raises :class:`RequestError`)."""
    if not isinstance(params, dict):
        raise RequestError("params must be an object")
    mode = params.get("mode")
    if mode not in MODES:
        raise RequestError(f"unsupported elicitation mode {mode!r} (the client offers form, url)")
    message = _text(params, "message")
    assert message is not None
    session_id = params.get("sessionId")
    if session_id is not None and not isinstance(session_id, str):
        raise RequestError("`sessionId` must be a string")
    tool_call_id = params.get("toolCallId")
    if tool_call_id is not None and not isinstance(tool_call_id, str):
        raise RequestError("`toolCallId` must be a string")
    if mode == "url":
        url = _text(params, "url")
        assert url is not None
        if not url.startswith(("https://", "http://")):
            raise RequestError("`url` must be an http(s) URL")
        return Spec(
            "url",
            message,
            session_id,
            tool_call_id,
            url=url,
            elicitation_id=_text(params, "elicitationId"),
        )
    schema = params.get("requestedSchema")
    if not isinstance(schema, dict):
        raise RequestError("`requestedSchema` must be an object")
    if schema.get("type", "object") != "object":
        raise RequestError('requestedSchema.type must be "object"')
    props = schema.get("properties", {})
    if props is None:
        props = {}
    if not isinstance(props, dict):
        raise RequestError("requestedSchema.properties must be an object")
    if len(props) > MAX_FIELDS:
        raise RequestError(f"requestedSchema has more than {MAX_FIELDS} properties")
    for name, prop in props.items():
        _check_property(name, prop)
    required = schema.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise RequestError("requestedSchema.required must be an array of strings")
    unknown = [r for r in required or () if r not in props]
    if unknown:
        raise RequestError(f"requestedSchema.required names no property: {unknown[0]!r}")
    return Spec("form", message, session_id, tool_call_id, schema=schema)


# -- answers -------------------------------------------------------------------------------


class Answer(msgspec.Struct, frozen=True):
    action: Literal["accept", "decline", "cancel"]
    content: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None


def _choices(prop: dict[str, Any]) -> list[object] | None:
    """A field's allowed values (``enum``, ``oneOf[].const``; arrays: of their items)."""
    source = prop.get("items") if prop.get("type") == "array" else prop
    if not isinstance(source, dict):
        return None
    if isinstance(source.get("enum"), list):
        return list(source["enum"])
    for key in ("oneOf", "anyOf"):
        options = source.get(key)
        if isinstance(options, list):
            return [o.get("const") for o in options if isinstance(o, dict)]
    return None


def _field_error(name: str, prop: dict[str, Any], value: object) -> str | None:
    kind = prop.get("type")
    match kind:
        case "string":
            if not isinstance(value, str):
                return f"`content.{name}` must be a string"
            lo, hi = prop.get("minLength"), prop.get("maxLength")
            if isinstance(lo, int) and len(value) < lo:
                return f"`content.{name}` must be at least {lo} characters"
            if isinstance(hi, int) and len(value) > hi:
                return f"`content.{name}` must be at most {hi} characters"
        case "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"`content.{name}` must be an integer"
        case "number":
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"`content.{name}` must be a number"
            if isinstance(value, float) and not math.isfinite(value):
                return f"`content.{name}` must be a finite number"
        case "boolean":
            if not isinstance(value, bool):
                return f"`content.{name}` must be a boolean"
        case "array":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return f"`content.{name}` must be an array of strings"
            lo, hi = prop.get("minItems"), prop.get("maxItems")
            if isinstance(lo, int) and len(value) < lo:
                return f"`content.{name}` must have at least {lo} items"
            if isinstance(hi, int) and len(value) > hi:
                return f"`content.{name}` must have at most {hi} items"
    if kind in ("integer", "number") and isinstance(value, int | float):  # checked above
        lo, hi = prop.get("minimum"), prop.get("maximum")
        if isinstance(lo, int | float) and value < lo:
            return f"`content.{name}` must be >= {lo}"
        if isinstance(hi, int | float) and value > hi:
            return f"`content.{name}` must be <= {hi}"
    choices = _choices(prop)
    if choices is not None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v not in choices:
                return f"`content.{name}` value {v!r} is not one of {choices!r}"
    return None


def parse_answer(spec: Spec, body: object) -> Answer | str:
    """A client's answer ``{action, content?, _meta?}`` checked against ``spec`` (strict:
    unknown keys, a form field that is unknown, missing, or of the wrong type, a url answer
    with content: each is refused with a message naming it)."""
    if not isinstance(body, dict):
        return "body must be an object with an `action` member"
    extra = sorted(set(body) - ANSWER_KEYS)
    if extra:
        return f"unknown member `{extra[0]}` (allowed: action, content, _meta)"
    action = body.get("action")
    if action not in ("accept", "decline", "cancel"):
        return '`action` must be "accept", "decline" or "cancel"'
    meta = body.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return "`_meta` must be an object"
    meta = dict(meta) if meta else None
    if action != "accept":  # content is meaningless here (ACP: receivers ignore it)
        return Answer(action, None, meta)
    content = body.get("content")
    if content is not None and not isinstance(content, dict):
        return "`content` must be an object"
    if spec.mode == "url":
        if content:
            return "a url-mode elicitation is answered without `content`"
        return Answer("accept", None, meta)
    schema = spec.schema or {}
    props: dict[str, Any] = schema.get("properties") or {}
    given = content
    content = content or {}
    for name, value in content.items():
        prop = props.get(name)
        if prop is None:
            return f"`content.{name}` is not a field of the requested schema"
        error = _field_error(name, prop, value)
        if error is not None:
            return error
    for name in schema.get("required") or ():
        if name not in content:
            return f"`content.{name}` is required"
    return Answer("accept", given, meta)  # absent stays absent


def digest(content: dict[str, Any] | None) -> str:
    """The option id an accepted ``content`` votes for (equal contents, equal ids)."""
    canonical = msgspec.json.encode(content or {}, order="sorted")
    return ACCEPT_PREFIX + hashlib.sha256(canonical).hexdigest()[:32]


def outcome_of(answer: Answer) -> Outcome:
    if answer.action == "cancel":
        return Cancelled()
    if answer.action == "decline":
        return Selected(DECLINE)
    return Selected(digest(answer.content))


# -- results -------------------------------------------------------------------------------


class Pending:
    """The mediator's record of one open elicitation: its spec and the contents voted."""

    __slots__ = ("contents", "spec")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.contents: dict[str, dict[str, Any] | None] = {}  # accept option -> content


def _action(outcome: Outcome) -> str:
    if isinstance(outcome, Cancelled):
        return "cancel"
    return "decline" if outcome.option_id == DECLINE else "accept"


def agent_response(resolved: Resolved, pending: Pending) -> dict[str, Any]:
    """The ``elicitation/create`` result for the agent."""
    action = _action(resolved.outcome)
    out: dict[str, Any] = {"action": action}
    if action == "accept" and isinstance(resolved.outcome, Selected):
        content = pending.contents.get(resolved.outcome.option_id)
        if content is not None:
            out["content"] = content
    meta = dict(resolved.meta or {})
    if isinstance(resolved.outcome, Cancelled) and resolved.reason not in (None, "voter"):
        meta[CANCEL_META_KEY] = resolved.reason
    if meta:
        out["_meta"] = meta
    return out


def resolved_events(resolved: Resolved, pending: Pending) -> tuple[PermissionEvent, ...]:
    """``permission_resolved`` of an elicitation, as ``elicitation_resolved``."""
    action = _action(resolved.outcome)
    data: dict[str, Any] = {
        "requestId": resolved.request.request_id,
        "sessionId": resolved.request.session_id,
        "action": action,
    }
    if action == "accept" and isinstance(resolved.outcome, Selected):
        content = pending.contents.get(resolved.outcome.option_id)
        if content is not None:
            data["content"] = content
    if resolved.voter_client_id is not None:
        data["voterClientId"] = resolved.voter_client_id
    if isinstance(resolved.outcome, Cancelled) and resolved.reason not in (None, "voter"):
        data["reason"] = resolved.reason
    return (PermissionEvent("elicitation_resolved", data, resolved.voter_client_id),)


_RENAMED = {
    "permission_partial_vote": "elicitation_partial_vote",
    "permission_forbidden": "elicitation_forbidden",
    "permission_already_resolved": "elicitation_already_resolved",
}


def vote_events(result: VoteResult) -> VoteResult:
    """A non-final vote result's events under their elicitation names (the already-resolved
    event reports the ``action``, never a content digest)."""
    events = getattr(result, "events", ())
    if not events or isinstance(result, Resolved):
        return result
    renamed = []
    for event in events:
        data = dict(event.data)
        if event.type == "permission_already_resolved":
            outcome = data.pop("outcome", {})
            data["action"] = (
                "cancel"
                if outcome.get("outcome") == "cancelled"
                else "decline"
                if outcome.get("optionId") == DECLINE
                else "accept"
            )
        renamed.append(
            PermissionEvent(_RENAMED.get(event.type, event.type), data, event.originator_client_id)
        )
    return msgspec.structs.replace(result, events=tuple(renamed))
