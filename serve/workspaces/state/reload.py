"""``POST /workspace/reload`` state: the last loaded settings, and re-reading grants.

Theory of operation
-------------------
Nothing in the daemon caches the workspace settings file: the MCP pool reads it at every
session start, the memory routes read ``context.fileName`` per request, and agents read
it when they start. What *can* be stale is what the running agents and the daemon last
loaded. :class:`WorkspaceState` (the ``workspace-state`` root-supervised service) keeps,
per configured workspace, the settings document as it was when the daemon started or
last reloaded; a reload re-reads the file and reports the dotted keys that changed since
(:func:`~serve.workspaces.state.settings_edit.changed_keys`), then makes the new document
the baseline. Writes through ``POST /workspace/settings`` do not move the baseline (the
running agents have not loaded them), so a reload reports them too.

Grants and approval policy come from the daemon config file (``--config``):
:func:`plan_config_reload` (pure) compares the current and the re-read
:class:`~serve.config.DaemonConfig`; ``capabilities`` and ``approval`` are applied live by
swapping the daemon's config cell (:class:`~serve.config.ConfigCell`, which the Host's
EffectGate reads on every decision); a changed ``policy`` (mediation strategy, quorum)
needs a restart and is kept as it was (``restartRequired``). A config file that does not
decode is refused as a whole (:class:`~serve.settings.SettingsError`) and nothing changes.

Ownership: the service object is touched only from the trio thread; file reads run in
worker threads. Its run task only loads the baselines and then waits for
:meth:`WorkspaceState.close`;
a restart reloads them.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

from actors import ChildSpec, Restart
from serve.config import DaemonConfig, load_daemon_config
from serve.workspaces.files import WorkspaceFsError
from serve.workspaces.files.set import WorkspaceSet
from serve.workspaces.state.settings_file import SettingsFileError, read_settings

if TYPE_CHECKING:
    from serve.config import ConfigCell
    from serve.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "SERVICE_NAME",
    "ConfigReload",
    "WorkspaceState",
    "apply_config",
    "build",
    "load_settings_doc",
    "plan_config_reload",
    "read_settings_strict",
    "reread_config",
]

SERVICE_NAME: Final = "workspace-state"


def load_settings_doc(workspaces: WorkspaceSet, root: str) -> dict[str, Any]:
    """The settings document of workspace ``root`` (blocking); ``{}`` when unusable."""
    try:
        return read_settings_strict(workspaces, root)
    except (SettingsFileError, WorkspaceFsError) as err:
        log.warning("workspace settings of %s not loaded: %s", root, err)
        return {}


def read_settings_strict(workspaces: WorkspaceSet, root: str) -> dict[str, Any]:
    """The settings document (blocking); raises when the file is unusable."""
    doc, _ = read_settings(workspaces.get(root, trusted=True))
    return doc


class WorkspaceState:
    """The settings each workspace had when last loaded; see the module docstring."""

    def __init__(self, workspaces: Sequence[str], objects: WorkspaceSet) -> None:
        self.workspaces = tuple(workspaces)
        self.objects = objects
        self._loaded: dict[str, dict[str, Any]] = {}
        self.reloads = 0
        self.last_reload_ms: int | None = None
        self._stop = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._stop = trio.Event()
        for root in self.workspaces:
            self._loaded[root] = await trio.to_thread.run_sync(
                load_settings_doc, self.objects, root
            )
        task_status.started()
        await self._stop.wait()

    def close(self) -> None:
        """End :meth:`run` at once (shutdown waits for no grace)."""
        self._stop.set()

    def baseline(self, root: str) -> dict[str, Any]:
        return self._loaded.get(root, {})

    def loaded(self, root: str, doc: dict[str, Any]) -> None:
        """Make ``doc`` the baseline of ``root`` (after a reload)."""
        self._loaded[root] = doc
        self.reloads += 1
        self.last_reload_ms = int(time.time() * 1000)


def build(workspaces: Sequence[str], objects: WorkspaceSet) -> tuple[WorkspaceState, ChildSpec]:
    """The service and the ChildSpec that runs it (the Host builder calls this)."""
    state = WorkspaceState(workspaces, objects)
    spec = ChildSpec(
        SERVICE_NAME, state.run, Restart.PERMANENT, shutdown_grace_s=1.0, stop=state.close
    )
    return state, spec


# ---- grants -------------------------------------------------------------------------------


class ConfigReload(msgspec.Struct, frozen=True):
    """What re-reading the config file changes: the config to install and the report."""

    config: DaemonConfig  # with the running policy kept
    changed: tuple[str, ...]
    restart_required: tuple[str, ...]


def plan_config_reload(old: DaemonConfig, new: DaemonConfig) -> ConfigReload:
    """Which sections changed, which need a restart, and the config to install (pure)."""
    changed = tuple(
        f"config.{section}"
        for section in ("policy", "capabilities", "approval")
        if msgspec.to_builtins(getattr(old, section)) != msgspec.to_builtins(getattr(new, section))
    )
    restart: list[str] = []
    if old.policy.permission_strategy != new.policy.permission_strategy:
        restart.append("config.policy.permissionStrategy")
    if old.policy.consensus_quorum != new.policy.consensus_quorum:
        restart.append("config.policy.consensusQuorum")
    install = msgspec.structs.replace(new, policy=old.policy)
    return ConfigReload(install, changed, tuple(restart))


def apply_config(cell: ConfigCell, config: DaemonConfig) -> bool:
    """Install ``config`` as the daemon's (the effect gate reads the same cell); returns
    whether grants and approvals were reloaded (always, once installed)."""
    cell.swap(config)
    return True


async def reread_config(settings: Settings) -> DaemonConfig:
    """The config file decoded again (worker thread); ``SettingsError`` names a bad key."""
    return await trio.to_thread.run_sync(functools.partial(load_daemon_config, settings))
