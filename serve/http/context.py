"""Access to the running daemon from request handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import current_app

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon


def daemon() -> Daemon:
    return current_app.extensions["acp_serve"]  # type: ignore[no-any-return]
