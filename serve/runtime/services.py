"""Pluggable daemon services: actors that live under the root supervisor.

A feature module (the MCP pool, the device-flow poller, ...) registers a
:class:`ServiceSpec` at import time; route modules import their feature module, and the
daemon imports every route module before it builds the supervisor tree, so each service
is started (in registration order, after the mediator and the session registry, before
the HTTP front) and stopped in reverse order. The running object is available to routes
as ``daemon().services[name]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from actors import ChildSpec

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon


class ServiceSpec(msgspec.Struct, frozen=True):
    """``build(daemon)`` returns the service object and the ChildSpec that runs it.

    ``optional`` services run under the daemon's ``services`` supervisor, with their own
    restart budget; a core one (``optional=False``) is a direct child of the root."""

    name: str
    build: Callable[[Daemon], tuple[Any, ChildSpec]]
    optional: bool = True


SERVICES: list[ServiceSpec] = []


def register_service(spec: ServiceSpec) -> None:
    if any(s.name == spec.name for s in SERVICES):
        raise ValueError(f"duplicate service {spec.name!r}")
    SERVICES.append(spec)
