"""Votes on the wire: a counted vote's result (``serve.permissions.voting``) as a status and
a JSON body, for a permission request (spec §4.3) and for an elicitation request.

The mediator answers a vote with its domain result (:data:`VoteResult`, or for an
elicitation the refused answer's message); the fronts render it here: REST as the response
(``serve/api/sessions.py``, ``serve/http/routes/elicitation.py``), ``/acp`` as a JSON-RPC
error for anything but 200 (``serve/acpfront/vote_methods.py``, ``elicit.py``).
"""

from __future__ import annotations

from typing import Any

from serve.permissions.voting import (
    META_ERROR,
    OUTCOME_ERROR,
    Forbidden,
    InvalidOption,
    MalformedOutcome,
    NotPending,
    PartialVote,
    Resolved,
    VoteResult,
)

__all__ = ["elicitation_wire", "vote_wire"]


def vote_wire(result: VoteResult, *, legacy: bool = False) -> tuple[int, dict[str, Any]]:
    """Map a vote result to the HTTP status and JSON body of spec §4.3.

    ``legacy``: the ``POST /permission/:requestId`` route (its 404 body has no sessionId).
    """
    match result:
        case Resolved() | PartialVote():
            return 200, {}
        case NotPending(request_id=rid, session_id=sid):
            if legacy or sid is None:
                return 404, {"error": "No pending permission request", "requestId": rid}
            return 404, {
                "error": "No pending permission request for session",
                "sessionId": sid,
                "requestId": rid,
            }
        case MalformedOutcome(field="_meta"):
            return 400, {"error": META_ERROR}
        case MalformedOutcome():
            return 400, {"error": OUTCOME_ERROR}
        case InvalidOption(request_id=rid, option_id=oid):
            return 400, {
                "error": f"Option id {oid!r} is not one of the request's options",
                "code": "invalid_option_id",
                "requestId": rid,
                "optionId": oid,
            }
        case Forbidden(request_id=rid, session_id=sid, reason=reason):
            return 403, {
                "error": f"Permission vote rejected by the mediation policy ({reason})",
                "code": "permission_forbidden",
                "requestId": rid,
                "sessionId": sid,
                "reason": reason,
            }
    raise TypeError(f"not a vote result: {result!r}")  # pragma: no cover


def elicitation_wire(result: VoteResult | str) -> tuple[int, dict[str, Any]]:
    """A vote result (or a refused answer's message) as the HTTP status and body."""
    match result:
        case str():
            return 400, {"error": result, "code": "invalid_elicitation_response"}
        case Resolved() | PartialVote():
            return 200, {}
        case NotPending(request_id=rid, session_id=sid):
            body: dict[str, Any] = {"error": "No pending elicitation request", "requestId": rid}
            if sid is not None:
                body = {
                    "error": "No pending elicitation request for session",
                    "sessionId": sid,
                    "requestId": rid,
                }
            return 404, body
        case Forbidden(request_id=rid, session_id=sid, reason=reason):
            return 403, {
                "error": f"Elicitation answer rejected by the mediation policy ({reason})",
                "code": "elicitation_forbidden",
                "requestId": rid,
                "sessionId": sid,
                "reason": reason,
            }
        case InvalidOption() | MalformedOutcome():  # parse_answer refuses these first
            return 400, {"error": "invalid answer", "code": "invalid_elicitation_response"}
    raise TypeError(f"not a vote result: {result!r}")  # pragma: no cover
