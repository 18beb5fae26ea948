"""What a request handler reaches: the Host it serves and the app's feature list."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import current_app

if TYPE_CHECKING:
    from serve.host import Host
    from serve.http.capabilities import Feature

HOST_KEY = "acp_serve"
FEATURES_KEY = "acp_serve.features"


def daemon() -> Host:
    """The Host of the daemon this request reached."""
    return current_app.extensions[HOST_KEY]  # type: ignore[no-any-return]  # quart: dict[str, Any]


def features() -> tuple[Feature, ...]:
    """Every feature the app serves (advertised or not), in ``/capabilities`` order."""
    return current_app.extensions[FEATURES_KEY]  # type: ignore[no-any-return]  # as above
