"""The Host: built once by build_host, its parts wired by constructor, its children ordered."""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec

from actors import ChildSpec
from serve.acpfront import AcpFront
from serve.config import load_config_text
from serve.runtime.build import build_host
from serve.settings import Settings, parse_settings


def _settings(tmp_path: Path, *args: str) -> Settings:
    return parse_settings(
        ["--workspace", str(tmp_path), "--state-dir", str(tmp_path / "state"), *args],
        {"HOME": str(tmp_path)},
    )


def _optional(services: ChildSpec) -> list[str]:
    """The names of the children the ``services`` supervisor is started with."""
    assert services.name == "services" and isinstance(services.target, functools.partial)
    assert services.target.func == services.stop.__self__.run  # type: ignore[union-attr]
    return [spec.name for spec in services.target.args[0]]


def test_children_in_start_order(tmp_path: Path) -> None:
    host, children = build_host(_settings(tmp_path))
    names = [c.name for c in children]
    ws = next(iter(host.registry)).id
    # The workspace hub is a core child (routes await it); the optional services run under
    # their own supervisor, a child of the root with its own restart budget.
    # The agents' limits (serve/isolation) start before the pools and stop after them; the
    # webhooks service before the registries, so it takes their sessions' last events.
    assert names == [
        "permission-mediator",
        "isolation",
        "webhooks",
        f"agents:{ws}",
        f"sessions:{ws}",
        "workspace-hub",
        "services",
        "acp-front",  # the /acp front, beside http (which the Daemon adds last)
    ]
    assert isinstance(host.acp_front, AcpFront) and children[-1].target == host.acp_front.run
    services = children[-2]
    assert services.stop == host.lifecycle.services.shutdown
    assert _optional(services) == [
        "journal-janitor",
        "device-flow-poller",
        "mcp-pool",
        "workspace-state",
    ]
    with_extras, children = build_host(
        _settings(tmp_path, "--chaos-kill-rate", "1", "--no-journal"), reaper=True
    )
    names = [c.name for c in children]
    optional = _optional(children[-2])
    assert names[0] == "reaper" and optional[0] == "chaos" and with_extras.chaos is not None
    assert "journal-janitor" not in optional


def test_parts_share_one_set_of_collaborators(tmp_path: Path) -> None:
    host, _ = build_host(_settings(tmp_path))
    for runtime in host.registry:
        registry = runtime.registry
        assert registry.effects is host.effects
        assert registry.journal is host.journal
        assert registry.mcp_pool is host.mcp_pool
        assert registry.mediator is host.mediator
        assert host.webhooks is not None and registry.event_tap == host.webhooks.tap
    assert host.front.rate_limiter is not None


def test_a_reload_swaps_the_one_config_cell_the_effect_gate_reads(tmp_path: Path) -> None:
    host, _ = build_host(_settings(tmp_path))
    assert host.effects.config is host.config
    new = load_config_text(b"approval:\n  default: deny\n")
    host.config_cell.swap(new)
    assert host.config is new and host.effects.config is new
    assert msgspec.to_builtins(host.effects.describe()["approval"])["default"] == "deny"


def test_the_host_owns_one_workspace_object_per_root(tmp_path: Path) -> None:
    """The effect gate, the workspace-state service and the fronts share the Host's
    WorkspaceSet (one per-path writer lock table per workspace), and two Hosts in one
    process share nothing (it was a module global of serve/status/shared.py)."""
    host, _ = build_host(_settings(tmp_path))
    root = host.settings.primary_workspace
    ws = host.workspaces.get(root)
    session = type("S", (), {"workspace": root})()
    assert host.effects._workspace(session) is ws
    assert host.workspace_state.objects is host.workspaces
    assert host.workspaces.get(str(tmp_path) + "/.") is ws  # any spelling, one object
    other, _ = build_host(_settings(tmp_path))
    assert other.workspaces.get(root) is not ws
    assert host.front.shells is not other.front.shells


def test_each_workspace_pool_and_registry_are_wired_by_constructor(tmp_path: Path) -> None:
    """The registry's agent source is its workspace's pool, and the pool's memory-budget
    release reaches that workspace's sessions, without a setter after construction."""
    other = tmp_path / "other"
    other.mkdir()
    host, _ = build_host(_settings(tmp_path, "--workspace", str(other)))
    runtimes = list(host.registry)
    assert len(runtimes) == 2
    for rt in runtimes:
        assert rt.registry.agent_source is rt.agents
        assert rt.registry.isolation is host.isolation and rt.agents.isolation is host.isolation
        assert rt.agents.releaser == rt.release_lru_idle
        assert rt.agents.has_releasable is not None and rt.agents.has_releasable() is False
