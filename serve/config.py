"""The daemon config file (``--config FILE``): YAML decoded once into typed Structs.

Theory of operation
-------------------
``load_daemon_config(settings)`` reads ``settings.config_file`` (no file: every section at
its default) and decodes it with :func:`serve.permissions.config.decode_yaml` into the
frozen :class:`DaemonConfig`. Every Struct in the tree forbids unknown fields and every
enumerated value is a ``Literal``, so a misspelt key or a bad value stops start-up with a
:class:`serve.settings.SettingsError` whose message names the file and the key path, e.g.
``config /etc/acp.yaml at policy.permissionStrategy: Expected `str` matching one of …``
or ``config … at policy: Object contains unknown field `permisionStrategy```.

Sections (more are added here as features need them, e.g. restart policies):

``policy``        multi-client permission mediation (``permissionStrategy``,
                  ``consensusQuorum``);
``capabilities``  Host capability grants (``defaults``, ``agents``, ``sessions``);
``approval``      approval policy (``default``, ``tools``, ``capabilities``, ``risks``);
``sandbox``       the agents' file sandbox: ``allowWrite`` (directories every agent may
                  write, as ``--agent-allow-write``; merged into the settings by
                  :func:`with_config_grants`, validated the same way);
``deviceFlow``    device-flow providers (``providers.NAME``: ``deviceAuthorizationEndpoint``,
                  ``tokenEndpoint``, ``clientId``, ``scope``, ``pkce``), see
                  :mod:`serve.deviceflow.providers`;
``access``        multi-user access (``adminGroups``, ``sessionGroups``, ``workspaces``),
                  see :mod:`serve.access.config`;
``webhooks``      webhook bounds, the receiver allow-list and the operator's subscriptions,
                  see :mod:`serve.webhooks.model` and ``docs/webhooks.md``.

Who calls it: ``serve/__main__.py`` calls :func:`load_daemon_config` before anything starts
(so a bad file is a clean exit 1 with the message on stderr), and ``Daemon.__init__``
calls it again to get the same value (the file is small and read synchronously, before the
event loop runs). Non-fatal oddities come back from :func:`config_warnings` for one log
line each. Nothing here holds state.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from serve.access.config import AccessConfig
from serve.deviceflow.providers import DeviceFlowSection
from serve.permissions.config import (
    ApprovalConfig,
    CapabilitiesConfig,
    ConfigError,
    PermissionsConfig,
    PolicyConfig,
    decode_yaml,
)
from serve.permissions.config import config_warnings as _permission_warnings
from serve.settings import Settings, SettingsError
from serve.settings.values import parse_allow_write
from serve.webhooks.model import WebhooksConfig

__all__ = [
    "MAX_CONFIG_BYTES",
    "ConfigCell",
    "DaemonConfig",
    "config_warnings",
    "load_config_text",
    "load_daemon_config",
    "with_config_grants",
]

#: A config file larger than this is refused (it is a few hundred bytes in practice).
MAX_CONFIG_BYTES = 1024 * 1024


class RestartIntensity(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """At most ``intensity`` restarts within ``period_s`` seconds."""

    intensity: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    period_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 60.0
    backoff_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 100


class RestartConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``restart:``: supervision per actor kind.

    ``session``: a session's agent child is restarted in place (when the agent can load or
    resume the session) at most ``intensity`` times in ``periodS``; past that the session
    dies (``session_died``); ``intensity: 0`` disables restarts. ``root``: the daemon's
    permanent actors (mediator, session registries, MCP pool, device-flow poller, HTTP
    front) are restarted on a crash; more than ``intensity`` restarts in ``periodS`` stop
    the daemon (exit non-zero) so the orchestrator restarts it.
    """

    session: RestartIntensity = RestartIntensity()
    root: RestartIntensity = RestartIntensity(intensity=5, period_s=30.0, backoff_ms=0)


class SandboxConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """``sandbox:``: ``allowWrite``, directories every agent child may write (each as one
    ``--agent-allow-write``)."""

    allow_write: Annotated[tuple[str, ...], msgspec.Meta(max_length=256)] = ()


class DaemonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole config file. Absent sections take their defaults."""

    policy: PolicyConfig = PolicyConfig()
    capabilities: CapabilitiesConfig = CapabilitiesConfig()
    approval: ApprovalConfig = ApprovalConfig()
    restart: RestartConfig = RestartConfig()
    sandbox: SandboxConfig = SandboxConfig()
    device_flow: DeviceFlowSection = msgspec.field(default=DeviceFlowSection(), name="deviceFlow")
    access: AccessConfig = AccessConfig()
    webhooks: WebhooksConfig = WebhooksConfig()

    def permissions(self) -> PermissionsConfig:
        """The permission sections as the ``serve.permissions`` package's own Struct."""
        return PermissionsConfig(
            policy=self.policy, capabilities=self.capabilities, approval=self.approval
        )


class ConfigCell:
    """The daemon config in force, in one place: ``POST /workspace/reload`` swaps it as a
    whole (:meth:`swap`) and every reader (the effect gate, status) sees the new one."""

    def __init__(self, config: DaemonConfig) -> None:
        self.current = config

    def swap(self, config: DaemonConfig) -> None:
        self.current = config


def load_config_text(text: str | bytes, *, source: str = "<config>") -> DaemonConfig:
    """Decode a config document; ``ConfigError`` names the bad key or value."""
    return decode_yaml(text, DaemonConfig, source=source)


def load_daemon_config(settings: Settings) -> DaemonConfig:
    """The daemon's config: ``settings.config_file`` decoded, or the defaults without one.

    Raises :class:`SettingsError` (the operator's file is at fault) when the file cannot be
    read, is too large, is not YAML, or holds an unknown key or a bad value; the message
    names the file and the key path.
    """
    path = settings.config_file
    if path is None:
        return DaemonConfig()
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise SettingsError(
            f"cannot read config file {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise SettingsError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return load_config_text(data, source=path)
    except ConfigError as exc:
        raise SettingsError(str(exc)) from None


def with_config_grants(settings: Settings, config: DaemonConfig) -> Settings:
    """``settings`` with the config file's ``sandbox.allowWrite`` added to the agents' write
    grants (after ``--agent-allow-write``'s), validated like the flag: a bad entry is a
    :class:`SettingsError` naming the file and the key."""
    raws = config.sandbox.allow_write
    if not raws:
        return settings
    grants = parse_allow_write(
        f"config {settings.config_file} at sandbox.allowWrite",
        raws,
        state_dir=settings.state_dir,
        workspaces=(*settings.workspaces, *settings.untrusted_workspaces),
        config_file=settings.config_file,
        shared_dir=settings.shared_dir,
    )
    merged = tuple(dict.fromkeys((*settings.agent_allow_write, *grants)))
    return msgspec.structs.replace(settings, agent_allow_write=merged)


def config_warnings(config: DaemonConfig) -> list[str]:
    """Non-fatal oddities worth one start-up log line each."""
    return _permission_warnings(config.permissions())
