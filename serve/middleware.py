"""The security front as app middleware (issue 5 fills this in).

Order (the reference's): self-origin strip → Host allowlist → CORS → /health pre-auth on
loopback → bearer → rate limit → body limits → routes (strict gate per route).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart_trio import QuartTrio

if TYPE_CHECKING:
    from serve.daemon import Daemon


def install_middleware(app: QuartTrio, daemon: Daemon) -> None:
    """Install the request checks on ``app``; nothing yet."""
