"""A session route's ``404 session_not_found`` for a session that is persisted (journaled)
but not loaded says how to restore it: ``POST /session/:id/load``.

After a restart every session is on disk only until it is loaded; a prompt, an event
stream or any other session route then answers the contract's ``404 session_not_found``
(status, code and ``sessionId`` unchanged), and its message names the load route, so a
caller is not left guessing. Only for a caller that may load the session (its journaled
owner and members, as the load route itself decides); anyone else gets the plain 404.
"""

from __future__ import annotations

from typing import Any

from quart import request

from serve.api import SessionService
from serve.http.access import principal
from serve.http.context import daemon

#: The routes that restore a session: their 404 means there is nothing to restore.
_RESTORE_SUFFIXES = ("/load", "/resume")


async def add_load_hint(session_id: str, body: dict[str, Any]) -> None:
    """Add the load route to ``body["error"]`` when ``session_id`` is persisted, not live,
    and the caller may load it."""
    rule = request.url_rule.rule if request.url_rule is not None else ""
    if not session_id or "<" not in rule or rule.rstrip("/").endswith(_RESTORE_SUFFIXES):
        return
    host = daemon()
    service = SessionService(host)
    groups = dict(host.config.access.session_groups)
    if await service.persisted_not_loaded(session_id, principal(), groups):
        body["error"] = (
            f'Session "{session_id}" is persisted but not loaded; restore it with '
            f"POST /session/{session_id}/load"
        )
