"""What the effect gate and the permission mediator read of a session: :class:`EffectSession`.

The gate (serve/permissions/effects.py) decides on the session's live state at the moment
it decides (the approval mode a client may have changed meanwhile, the prompt running now),
so this is a Protocol of live values rather than a snapshot; the session actor implements
it. Nothing else of the session is reachable from here: no attribute probing.

* ``session_id``, ``workspace``: who asks and where its boundary is;
* ``current_mode``: the approval mode in force (agent id or qwen name);
* ``agent_name``: the agent's ``agentInfo.name`` (grants by agent), None before initialize;
* ``active``: the running prompt (its id scopes agent approvals; its client is the
  principal of an ``allow_always``), None between turns;
* ``client_ids``: the session's registered clients (who may vote);
* ``publish_event``: hand an event to the session's log writer (the actor's inbox).

And what the gate reads of the daemon config: :class:`ConfigSource` (``serve.config``'s
``ConfigCell``; a reload swaps ``current``) of :class:`PermissionSections`, so this package
never imports ``serve.config`` (which imports it).

A session is hashable and weakly referenceable: the gate keys its per-incarnation token on
the object itself. The mediator's events go to the session's inbox by the ``session``
field of its requests, an opaque value it narrows to an actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from serve.events.messages import PublishEvent
    from serve.permissions.config import ApprovalConfig, CapabilitiesConfig, PolicyConfig


class RunningPrompt(Protocol):
    @property
    def prompt_id(self) -> str: ...

    @property
    def client_id(self) -> str | None: ...


class EffectSession(Protocol):
    """A session, as the effect gate reads it (live values; see the module docstring)."""

    @property
    def session_id(self) -> str: ...

    @property
    def workspace(self) -> str: ...

    @property
    def current_mode(self) -> str | None: ...

    @property
    def agent_name(self) -> str | None: ...

    @property
    def active(self) -> RunningPrompt | None: ...

    @property
    def client_ids(self) -> frozenset[str]: ...

    async def publish_event(self, event: PublishEvent, *, timeout_s: float) -> None: ...


class PermissionSections(Protocol):
    """What the effect gate reads of the daemon config: its three permission sections
    (``serve.config.DaemonConfig`` has them; this package never imports that module)."""

    @property
    def policy(self) -> PolicyConfig: ...

    @property
    def capabilities(self) -> CapabilitiesConfig: ...

    @property
    def approval(self) -> ApprovalConfig: ...


class ConfigSource(Protocol):
    """The config in force (``serve.config.ConfigCell``: a reload swaps ``current``)."""

    @property
    def current(self) -> PermissionSections: ...
