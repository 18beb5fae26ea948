"""Which vendor extension methods an agent answers (qwen-code's ``qwen/status/...``, ...).

Theory of operation
-------------------
ACP lets an agent answer methods outside the spec; qwen-code answers ``qwen/status/
session/<x>`` and ``qwen/control/session/<x>`` (spec §7.8). Nothing in ``initialize``
lists them, so support is decided per *agent kind* (``agentInfo.name@version`` of the
session's agent) from two sources, observations winning:

1. :data:`KNOWN_AGENT_METHODS`: what an agent name is known to implement (qwen-code
   0.24.4 answered every method here over ACP when probed);
2. what calls showed: a call answered ``-32601`` (method not found) marks the method
   unsupported for that kind, any other answer (a result, or an error about the params)
   marks it supported.

:meth:`ExtSupport.verdict` is ``True`` (known or seen to work), ``False`` (seen
``-32601``) or ``None`` (unknown: the route forwards once and learns). Capability tags
are advertised only on ``True`` for some live session (:func:`any_live_supports`), so an
agent nobody has heard of never gets the tags, and its routes answer ``501
not_supported_by_agent`` after the first probe without a round trip.

Ownership: one :class:`ExtSupport` per daemon (:func:`support_for`, kept in a weak map so
a test's discarded daemon takes its table with it), touched only from the trio thread.
Bounded: at most :data:`MAX_AGENT_KINDS` kinds (least recently observed dropped first),
each with at most one verdict per method name of at most :data:`MAX_METHOD_CHARS`.
Pure: no I/O.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = [
    "BRANCH",
    "BTW",
    "CONTEXT_USAGE",
    "HOOKS",
    "KNOWN_AGENT_METHODS",
    "LANGUAGE",
    "LSP",
    "MAX_AGENT_KINDS",
    "RECAP",
    "REWIND",
    "REWIND_SNAPSHOTS",
    "SHELL_HISTORY",
    "STATS",
    "TASKS",
    "ExtSupport",
    "agent_kind",
    "agent_name",
    "any_live_supports",
    "live_supported",
    "support_for",
]

RECAP: Final = "qwen/control/session/recap"
BTW: Final = "qwen/control/session/btw"
REWIND: Final = "qwen/control/session/rewind"
REWIND_SNAPSHOTS: Final = "qwen/status/session/rewind_snapshots"
BRANCH: Final = "qwen/control/session/branch"
CONTEXT_USAGE: Final = "qwen/status/session/context_usage"
STATS: Final = "qwen/status/session/stats"
TASKS: Final = "qwen/status/session/tasks"
LSP: Final = "qwen/status/session/lsp"
HOOKS: Final = "qwen/status/session/hooks"
LANGUAGE: Final = "qwen/control/session/language"
SHELL_HISTORY: Final = "qwen/control/session/shell_history"

#: Methods an agent (by ``agentInfo.name``) is known to answer.
KNOWN_AGENT_METHODS: Final[Mapping[str, frozenset[str]]] = {
    "qwen-code": frozenset(
        {
            RECAP,
            BTW,
            REWIND,
            REWIND_SNAPSHOTS,
            BRANCH,
            CONTEXT_USAGE,
            STATS,
            TASKS,
            LSP,
            HOOKS,
            LANGUAGE,
            SHELL_HISTORY,
        }
    ),
}

#: Agent kinds remembered (least recently observed dropped first).
MAX_AGENT_KINDS: Final = 64
#: Longest method name remembered (longer ones are never cached).
MAX_METHOD_CHARS: Final = 256


def _implementation(session: object) -> object:
    """``agentInfo`` of the session's agent (``None`` before the handshake)."""
    conn = getattr(session, "conn", None)
    info = getattr(conn, "info", None)
    return getattr(info, "agent_info", None)


def agent_name(session: object) -> str | None:
    """``agentInfo.name`` of the session's agent, once its handshake is done."""
    name = getattr(_implementation(session), "name", None)
    return name if isinstance(name, str) and name else None


def agent_kind(session: object) -> str | None:
    """``name@version`` of the session's agent (``None`` before the handshake)."""
    name = agent_name(session)
    if name is None:
        return None
    implementation = _implementation(session)
    version = getattr(implementation, "version", None)
    return f"{name}@{version}" if isinstance(version, str) and version else name


class ExtSupport:
    """Verdicts per (agent kind, method); see the module docstring."""

    def __init__(
        self,
        known: Mapping[str, frozenset[str]] = KNOWN_AGENT_METHODS,
        *,
        max_kinds: int = MAX_AGENT_KINDS,
    ) -> None:
        self._known = known
        self._max_kinds = max_kinds
        self._seen: OrderedDict[str, dict[str, bool]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(v) for v in self._seen.values())

    @staticmethod
    def _name_of(kind: str) -> str:
        return kind.split("@", 1)[0]

    def verdict(self, kind: str | None, method: str) -> bool | None:
        """True: supported; False: the agent said ``-32601``; None: unknown."""
        if kind is None:
            return None
        seen = self._seen.get(kind)
        if seen is not None and method in seen:
            return seen[method]
        if method in self._known.get(self._name_of(kind), frozenset()):
            return True
        return None

    def observe(self, kind: str | None, method: str, supported: bool) -> None:
        """Record what a call to ``method`` showed for agent ``kind``."""
        if kind is None or len(method) > MAX_METHOD_CHARS:
            return
        seen = self._seen.get(kind)
        if seen is None:
            seen = self._seen[kind] = {}
            while len(self._seen) > self._max_kinds:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(kind)
        seen[method] = supported

    def snapshot(self) -> dict[str, dict[str, bool]]:
        """Observed verdicts (for diagnostics)."""
        return {kind: dict(methods) for kind, methods in self._seen.items()}


_by_daemon: weakref.WeakKeyDictionary[object, ExtSupport] = weakref.WeakKeyDictionary()


def support_for(daemon: object) -> ExtSupport:
    """The daemon's :class:`ExtSupport` (created on first use)."""
    found = _by_daemon.get(daemon)
    if found is None:
        found = _by_daemon[daemon] = ExtSupport()
    return found


def _live(daemon: object) -> Iterable[object]:
    registry = getattr(daemon, "registry", None)
    if registry is None:
        return ()
    try:
        return list(registry.live())
    except Exception:  # a registry that is not running yet has nothing live
        return ()


def live_supported(daemon: object, live: Iterable[object], methods: Iterable[str]) -> set[str]:
    """Which of ``methods`` some session of ``live`` has an agent known (or seen) to answer."""
    support = support_for(daemon)
    kinds = {agent_kind(s) for s in live}
    return {m for m in methods if any(support.verdict(k, m) is True for k in kinds)}


def any_live_supports(daemon: object, method: str) -> bool:
    """Whether some live session's agent is known (or was seen) to answer ``method``."""
    support = support_for(daemon)
    return any(support.verdict(agent_kind(s), method) is True for s in _live(daemon))
