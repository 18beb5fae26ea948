"""Registers the DeviceFlowPoller as a root-supervised service (imported by the auth routes).

Providers come from :func:`serve.deviceflow.providers.load_providers` (built-in
``qwen-oauth``, ``ACP_SERVE_DEVICE_FLOW_PROVIDERS``, ``daemon.config.device_flow.providers``
and ``settings.device_flow_providers`` when those exist). A malformed entry is logged and
the daemon runs with the built-in provider only. Credentials go to
``<state-dir>/credentials/``; events go to every live session's log through the
:class:`~serve.workspace.hub.WorkspaceHub` (a ``Broadcast`` message; the poller never waits:
when the hub's inbox is full or the hub is down the event is dropped with a log line).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from actors import ActorError, ChildSpec, Restart
from serve.deviceflow.poller import DeviceFlowPoller
from serve.deviceflow.providers import QWEN_OAUTH, ProviderConfigError, load_providers
from serve.runtime.services import ServiceSpec, register_service
from serve.status.shared import hub_of
from serve.workspace.hub import Broadcast

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon

log = logging.getLogger(__name__)

SERVICE_NAME = "device-flow-poller"


def build(daemon: Daemon) -> tuple[DeviceFlowPoller, ChildSpec]:
    section = getattr(getattr(daemon, "config", None), "device_flow", None)
    try:
        providers = load_providers(
            daemon.settings, config_providers=getattr(section, "providers", None)
        )
    except ProviderConfigError as exc:
        log.error("device-flow providers ignored: %s", exc)
        providers = {QWEN_OAUTH.id: QWEN_OAUTH}

    def fanout(event_type: str, data: dict[str, Any]) -> None:
        hub = hub_of(daemon)
        if hub is None:
            return
        try:
            hub.tell_nowait(Broadcast(None, event_type, data))
        except ActorError as exc:
            log.warning("device-flow event %s not published: %r", event_type, exc)

    poller = DeviceFlowPoller(
        providers=providers, state_dir=daemon.settings.state_dir, fanout=fanout
    )
    spec = ChildSpec(
        SERVICE_NAME, poller.run, Restart.PERMANENT, shutdown_grace_s=5.0, stop=poller.close
    )
    return poller, spec


def poller_of(daemon: Daemon) -> DeviceFlowPoller | None:
    poller = daemon.services.get(SERVICE_NAME)
    return poller if isinstance(poller, DeviceFlowPoller) else None


register_service(ServiceSpec(SERVICE_NAME, build))
