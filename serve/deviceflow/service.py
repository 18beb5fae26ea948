"""Builds the DeviceFlowPoller and the ChildSpec that runs it under the root supervisor.

Providers come from :func:`serve.deviceflow.providers.load_providers` (built-in
``qwen-oauth``, ``ACP_SERVE_DEVICE_FLOW_PROVIDERS``, the config file's
``deviceFlow.providers`` when that section exists, and ``settings.device_flow_providers``).
A malformed entry is logged and the daemon runs with the built-in provider only.
Credentials go to ``<state-dir>/credentials/``; events go to every live session's log through
the :class:`~serve.workspaces.hub.WorkspaceHub` (a ``Broadcast`` message; the poller never
waits: when the hub's inbox is full or the hub is down the event is dropped with a log line).
The Host builder (:mod:`serve.runtime.build`) calls :func:`build`; routes reach the running
poller as ``host.device_flow``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from actors import ActorError, ChildSpec, Restart
from serve.deviceflow.poller import DeviceFlowPoller
from serve.deviceflow.providers import (
    QWEN_OAUTH,
    DeviceFlowSection,
    ProviderConfigError,
    load_providers,
)
from serve.workspaces.hub import Broadcast, WorkspaceHub

if TYPE_CHECKING:
    from serve.settings import Settings

log = logging.getLogger(__name__)

SERVICE_NAME = "device-flow-poller"


class DeviceFlowConfig(Protocol):
    """What the service reads of the daemon config (``serve.config.DaemonConfig`` has it;
    this package never imports that module): the ``deviceFlow:`` section."""

    @property
    def device_flow(self) -> DeviceFlowSection: ...


def build(
    settings: Settings, config: DeviceFlowConfig, hub: WorkspaceHub
) -> tuple[DeviceFlowPoller, ChildSpec]:
    try:
        providers = load_providers(settings, config_providers=config.device_flow.providers)
    except ProviderConfigError as exc:
        log.error("device-flow providers ignored: %s", exc)
        providers = {QWEN_OAUTH.id: QWEN_OAUTH}

    def fanout(event_type: str, data: dict[str, Any]) -> None:
        try:
            hub.tell_nowait(Broadcast(None, event_type, data))
        except ActorError as exc:
            log.warning("device-flow event %s not published: %r", event_type, exc)

    poller = DeviceFlowPoller(providers=providers, state_dir=settings.state_dir, fanout=fanout)
    spec = ChildSpec(
        SERVICE_NAME, poller.run, Restart.PERMANENT, shutdown_grace_s=5.0, stop=poller.close
    )
    return poller, spec
