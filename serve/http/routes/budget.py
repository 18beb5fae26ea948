"""A session's token and cost budget over HTTP (the logic is in serve/sessions/budget.py).

===========================================  =========================
route                                        answer
===========================================  =========================
``GET   /session/<id>/budget``               the usage and limits (``Cache-Control: no-store``)
``PATCH /session/<id>/budget`` (strict)      new limits; the same shape
===========================================  =========================

The body of ``PATCH`` is an object with any of ``maxTokens`` (integer in [1, 2**53] or
``null``: no limit), ``maxCost`` (number in (0, 1e12] or ``null``) and ``currency`` (ISO 4217,
three letters); absent keys keep their value, any other key is ``400 invalid_budget``. The
answer (and ``GET``) is ``{sessionId, unbudgeted, usage: {totalTokens, inputTokens,
outputTokens, turnsReported, inTurnEstimate, contextUsed, contextSize, cost}, budget:
{maxTokens, maxCost, currency}, exhausted, warnAt}``; the session publishes
``budget_updated`` with it. An exhausted session answers ``POST /prompt`` with ``402
{code: "budget_exhausted"}`` until a ``PATCH`` raises the limit above what was spent.
"""

from __future__ import annotations

import math
from typing import Any, Final

from quart import Blueprint, Response

from serve.http.capabilities import Feature
from serve.http.errors import bad_request
from serve.http.routes.sessions import ask, find_session, session_client
from serve.http.wire import json_body, json_response
from serve.sessions.budget import MAX_COST_LIMIT, MAX_TOKEN_LIMIT
from serve.sessions.messages import SetBudget

blueprint = Blueprint("session_budget", __name__)

_P = "/session/<session_id>/budget"
_KEYS: Final = frozenset({"maxTokens", "maxCost", "currency"})

FEATURES: tuple[Feature, ...] = (Feature("session_budget", (("GET", _P), ("PATCH", _P))),)


def _invalid(message: str, field: str) -> Exception:
    return bad_request(message, "invalid_budget", field=field)


@blueprint.get(_P)
async def read_budget(session_id: str) -> Response:
    session = find_session(session_id)
    await session_client(session)
    out: dict[str, Any] = {"sessionId": session.session_id, **session.budget.snapshot()}
    return json_response(out, headers={"Cache-Control": "no-store"})


@blueprint.patch(_P)
async def patch_budget(session_id: str) -> Response:
    body = await json_body(allow_empty=False)
    session = find_session(session_id)
    unknown = sorted(set(body) - _KEYS)
    if unknown:
        raise _invalid(
            f"unknown field `{unknown[0]}` (allowed: {', '.join(sorted(_KEYS))})", unknown[0]
        )
    limits = session.budget.limits
    max_tokens, max_cost, currency = limits.max_tokens, limits.max_cost, limits.currency
    if "maxTokens" in body:
        max_tokens = body["maxTokens"]
        if max_tokens is not None and (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, int)
            or not 1 <= max_tokens <= MAX_TOKEN_LIMIT
        ):
            raise _invalid("`maxTokens` must be an integer in [1, 2**53] or null", "maxTokens")
    if "maxCost" in body:
        max_cost = body["maxCost"]
        if max_cost is not None and (
            isinstance(max_cost, bool)
            or not isinstance(max_cost, int | float)
            or not math.isfinite(max_cost)
            or not 0 < max_cost <= MAX_COST_LIMIT
        ):
            raise _invalid("`maxCost` must be a number in (0, 1e12] or null", "maxCost")
        max_cost = float(max_cost) if max_cost is not None else None
    if "currency" in body:
        currency = body["currency"]
        if not (
            isinstance(currency, str)
            and len(currency) == 3
            and currency.isascii()
            and currency.isalpha()
        ):
            raise _invalid("`currency` must be an ISO 4217 code such as USD", "currency")
        currency = currency.upper()
    client_id = await session_client(session)
    snapshot = await ask(session, SetBudget(max_tokens, max_cost, currency, client_id), dict)
    return json_response(snapshot)
