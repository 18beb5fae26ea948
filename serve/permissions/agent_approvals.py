"""Agent approvals: an allowed agent permission request covers the Host effects it announced.

Pure and bounded: :class:`AgentApprovals` (allowed requests per session incarnation),
:class:`ToolCallLog` (what an agent's ``tool_call`` notifications named, by id) and
:func:`agent_approval_from` (the approval an answered request grants). The gate's prompt
stage (:class:`~serve.permissions.prompt_stage.PromptStage`) owns one of each and consults
them before it asks clients.

Not asking twice (agent approvals)
----------------------------------
Agents such as qwen-code ask their own ``session/request_permission`` before an edit and
then call ``fs/write_text_file``. When a client *allowed* such a request (an option of
kind ``allow_once``/``allow_always``), the session actor calls
:meth:`~serve.permissions.effects.EffectGate.note_agent_permission`. The rule: for
:data:`AGENT_APPROVAL_WINDOW_MS` (60 s) and at most :data:`AGENT_APPROVAL_USES` (8)
effects, within the same session incarnation and the same running prompt, a ``prompt``
verdict is satisfied without asking again when the effect matches the approved tool call:

* its capability is one the tool call's ``kind`` implies (``read`` → ``fs.read``;
  ``edit``/``delete``/``move`` → ``fs.write`` and ``fs.read``; ``execute`` →
  ``terminal.exec``; any other kind → all three), and
* for file effects, its path (as the agent spelled it, normalised, or canonical) is one of
  the tool call's ``locations[].path``, ``diff`` content blocks' ``path`` (kimi names a
  write's target only there) or ``rawInput`` paths (``path``, ``file_path``,
  ``filePath``, ``absolute_path``, ``absolutePath``, ``paths``); for terminals, the
  command text (``command``, ``command args…``, or the script of ``sh -c SCRIPT``)
  equals ``rawInput.command``. The tool call counts as what the permission request
  carries *plus* what the agent's earlier ``tool_call`` / ``tool_call_update``
  notifications with the same ``toolCallId`` named (kind, locations, diffs, rawInput;
  the session actor hands each to
  :meth:`~serve.permissions.effects.EffectGate.note_tool_call`, kept in a bounded
  :class:`ToolCallLog`), so a request that names only the id is linked too.

It never overrides ``deny`` (grants, hardline commands, ``plan`` mode are checked first).
An agent-level ``allow_always`` additionally seeds the Host cache with the decisions of the
tool call's own file targets / command (same binding rules as above), so an agent that
stops asking after "always allow" is not prompted by the Host either.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from acp.schema import RequestPermissionParams, ToolCallFields
from serve import threads
from serve.permissions.approval import Effect, classify_read, classify_write
from serve.permissions.terminal_guard import classify_terminal

#: How long an allowed agent permission request covers the matching Host effects.
AGENT_APPROVAL_WINDOW_MS: Final = 60_000
#: How many Host effects one allowed agent permission request covers at most.
AGENT_APPROVAL_USES: Final = 8
#: Allowed agent permission requests remembered per session (oldest dropped first).
MAX_AGENT_APPROVALS_PER_SESSION: Final = 64
#: Sessions with remembered agent approvals (oldest dropped first).
MAX_AGENT_APPROVAL_SESSIONS: Final = 4096
#: Agent tool calls whose targets are remembered per session (oldest dropped first).
MAX_TOOL_CALLS_PER_SESSION: Final = 256
#: Paths or commands remembered per agent tool call.
MAX_TARGETS_PER_TOOL_CALL: Final = 16

RAW_INPUT_PATH_KEYS = ("path", "file_path", "filePath", "absolute_path", "absolutePath")
_KIND_CAPABILITIES: Mapping[str, frozenset[str]] = {
    "read": frozenset({"fs.read"}),
    "edit": frozenset({"fs.write", "fs.read"}),
    "delete": frozenset({"fs.write", "fs.read"}),
    "move": frozenset({"fs.write", "fs.read"}),
    "execute": frozenset({"terminal.exec"}),
}
_ALL_CAPABILITIES = frozenset({"fs.read", "fs.write", "terminal.exec"})
_ALLOW_KINDS = frozenset({"allow_once", "allow_always"})


class AgentApproval(msgspec.Struct, frozen=True):
    """One allowed agent permission request, as the Host effects it may cover."""

    tool_call_id: str
    prompt_id: str | None
    capabilities: frozenset[str]
    paths: frozenset[str]  # normalised absolute paths
    commands: frozenset[str]  # command texts
    always: bool  # the client chose an allow_always option


def norm_path(path: str, cwd: str) -> str:
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(cwd, path))


def diff_paths(content: object) -> list[str]:
    """The ``path`` of each ``diff`` content block (kimi names a write's target only there)."""
    out: list[str] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "diff":
            p = block.get("path")
            if isinstance(p, str) and p:
                out.append(p)
    return out


def agent_approval_from(
    params: RequestPermissionParams,
    option_id: str,
    *,
    cwd: str,
    prompt_id: str | None,
    earlier: ToolCallTargets | None = None,
) -> AgentApproval | None:
    """The approval an answered agent request grants, or None when it was not an allow.

    ``earlier``: what the agent's own ``tool_call``/``tool_call_update`` notifications with
    the same ``toolCallId`` named (kind, paths, commands), merged in."""
    option = next((o for o in params.options if o.option_id == option_id), None)
    if option is None or option.kind not in _ALLOW_KINDS:
        return None
    call = params.tool_call
    kind = call.kind or (earlier.kind if earlier is not None else None)
    caps = _KIND_CAPABILITIES.get(kind or "", _ALL_CAPABILITIES)
    paths: set[str] = set()
    for loc in call.locations or ():
        p = loc.get("path") if isinstance(loc, dict) else None
        if isinstance(p, str) and p:
            paths.add(norm_path(p, cwd))
    paths.update(norm_path(p, cwd) for p in diff_paths(call.content))
    commands: set[str] = set()
    if earlier is not None:
        paths.update(norm_path(p, cwd) for p in earlier.paths)
        commands.update(earlier.commands)
    raw = call.raw_input
    if isinstance(raw, dict):
        for key in RAW_INPUT_PATH_KEYS:
            p = raw.get(key)
            if isinstance(p, str) and p:
                paths.add(norm_path(p, cwd))
        many = raw.get("paths")
        if isinstance(many, list):
            paths.update(norm_path(p, cwd) for p in many if isinstance(p, str) and p)
        for key in ("command", "cmd"):
            c = raw.get(key)
            if isinstance(c, str) and c.strip():
                commands.add(c.strip())
    return AgentApproval(
        tool_call_id=call.tool_call_id,
        prompt_id=prompt_id,
        capabilities=caps,
        paths=frozenset(paths),
        commands=frozenset(commands),
        always=option.kind == "allow_always",
    )


class ToolCallTargets(msgspec.Struct, frozen=True):
    """What an agent's ``tool_call``/``tool_call_update`` notifications named for one id."""

    kind: str | None = None
    paths: tuple[str, ...] = ()  # as the agent spelled them
    commands: tuple[str, ...] = ()


class _ToolCallHead(msgspec.Struct, rename="camel"):
    tool_call_id: str
    kind: str | None = None
    content: object = None
    locations: object = None
    raw_input: object = None


_tool_call_head = msgspec.json.Decoder(_ToolCallHead)


class ToolCallLog:
    """The targets of recent agent tool calls, per session incarnation (pure, bounded).

    A permission request may name only the ``toolCallId`` of a tool call the agent announced
    earlier with its locations or diff; :meth:`note` keeps, per id, the kind, the paths
    (``locations``, ``diff`` blocks, ``rawInput`` path keys) and commands it named, so the
    approval covers them (see "Not asking twice"). At most :data:`MAX_TOOL_CALLS_PER_SESSION`
    ids per session (oldest dropped first), :data:`MAX_TARGETS_PER_TOOL_CALL` paths or commands
    per id, and :data:`MAX_AGENT_APPROVAL_SESSIONS` sessions.
    """

    def __init__(
        self,
        *,
        max_per_session: int = 0,
        max_sessions: int = MAX_AGENT_APPROVAL_SESSIONS,
    ) -> None:
        self._max_per_session = max_per_session or MAX_TOOL_CALLS_PER_SESSION
        self._max_sessions = max_sessions
        self._by_session: OrderedDict[str, OrderedDict[str, ToolCallTargets]] = OrderedDict()

    def note(self, session_key: str, update: bytes) -> None:
        try:
            head = _tool_call_head.decode(update)
        except msgspec.DecodeError:
            return
        paths = diff_paths(head.content)
        for loc in head.locations if isinstance(head.locations, list) else ():
            p = loc.get("path") if isinstance(loc, dict) else None
            if isinstance(p, str) and p:
                paths.append(p)
        commands: list[str] = []
        raw = head.raw_input
        if isinstance(raw, dict):
            paths.extend(p for k in RAW_INPUT_PATH_KEYS if isinstance(p := raw.get(k), str) and p)
            for key in ("command", "cmd"):
                c = raw.get(key)
                if isinstance(c, str) and c.strip():
                    commands.append(c.strip())
        calls = self._by_session.pop(session_key, None) or OrderedDict()
        self._by_session[session_key] = calls
        while len(self._by_session) > self._max_sessions:
            self._by_session.popitem(last=False)
        known = calls.pop(head.tool_call_id, None) or ToolCallTargets()
        if not paths and not commands and head.kind is None and known == ToolCallTargets():
            return
        cap = MAX_TARGETS_PER_TOOL_CALL
        calls[head.tool_call_id] = ToolCallTargets(
            kind=head.kind or known.kind,
            paths=tuple(dict.fromkeys([*known.paths, *paths]))[:cap],
            commands=tuple(dict.fromkeys([*known.commands, *commands]))[:cap],
        )
        while len(calls) > self._max_per_session:
            calls.popitem(last=False)

    def get(self, session_key: str, tool_call_id: str) -> ToolCallTargets | None:
        calls = self._by_session.get(session_key)
        return calls.get(tool_call_id) if calls else None

    def forget(self, session_key: str) -> None:
        self._by_session.pop(session_key, None)

    def sessions(self) -> list[str]:
        return list(self._by_session)


def terminal_texts(command: str, args: Sequence[str]) -> frozenset[str]:
    """The spellings of a ``terminal/create`` an agent's ``rawInput.command`` may use."""
    out = {command.strip(), shlex.join([command, *args]).strip()}
    if args:
        out.add(" ".join([command, *args]).strip())
    if posixpath.basename(command) in ("sh", "bash", "zsh", "dash") and "-c" in args:
        k = list(args).index("-c")
        if k + 1 < len(args):
            out.add(args[k + 1].strip())
    return frozenset(t for t in out if t)


class _Entry:
    __slots__ = ("approval", "expires_at_ms", "uses_left")

    def __init__(self, approval: AgentApproval, expires_at_ms: int, uses: int) -> None:
        self.approval = approval
        self.expires_at_ms = expires_at_ms
        self.uses_left = uses


class AgentApprovals:
    """Recently allowed agent permission requests per session incarnation (pure, bounded).

    ``match`` consumes one use of the first live entry that covers the effect and returns
    its tool call id (see the module docstring for the rule).
    """

    def __init__(
        self,
        *,
        window_ms: int = AGENT_APPROVAL_WINDOW_MS,
        uses: int = AGENT_APPROVAL_USES,
        max_per_session: int = MAX_AGENT_APPROVALS_PER_SESSION,
        max_sessions: int = MAX_AGENT_APPROVAL_SESSIONS,
    ) -> None:
        if window_ms <= 0 or uses <= 0 or max_per_session <= 0 or max_sessions <= 0:
            raise ValueError("AgentApprovals bounds must be positive")
        self._window_ms = window_ms
        self._uses = uses
        self._max_per_session = max_per_session
        self._max_sessions = max_sessions
        self._by_session: OrderedDict[str, list[_Entry]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_session.values())

    def count_of(self, session_ids: set[str]) -> int:
        """The entries of ``session_ids`` (keys are ``<session id>#<incarnation>``)."""
        return sum(len(v) for k, v in self._by_session.items() if k.split("#", 1)[0] in session_ids)

    def note(self, session_key: str, approval: AgentApproval, *, now_ms: int) -> None:
        entries = self._by_session.pop(session_key, [])
        entries = [e for e in entries if e.expires_at_ms > now_ms]
        entries.append(_Entry(approval, now_ms + self._window_ms, self._uses))
        del entries[: max(0, len(entries) - self._max_per_session)]
        self._by_session[session_key] = entries
        while len(self._by_session) > self._max_sessions:
            self._by_session.popitem(last=False)

    def match(
        self,
        session_key: str,
        prompt_id: str | None,
        capability: str,
        *,
        paths: Iterable[str] = (),
        commands: Iterable[str] = (),
        now_ms: int,
    ) -> str | None:
        entries = self._by_session.get(session_key)
        if not entries:
            return None
        wanted_paths = set(paths)
        wanted_commands = set(commands)
        for entry in entries:
            a = entry.approval
            if entry.expires_at_ms <= now_ms or entry.uses_left <= 0:
                continue
            if a.prompt_id != prompt_id or capability not in a.capabilities:
                continue
            if capability == "terminal.exec":
                hit = bool(wanted_commands & a.commands)
            else:
                hit = bool(wanted_paths & a.paths)
            if hit:
                entry.uses_left -= 1
                return a.tool_call_id
        return None

    def forget(self, session_key: str) -> None:
        self._by_session.pop(session_key, None)

    def sessions(self) -> list[str]:
        return list(self._by_session)


# ---- the agent's own permission request, as the Host effect it announces ------------------

#: The capability a tool call's ``kind`` names (the effect its permission request announces).
AGENT_KIND_CAPABILITY: Mapping[str, str] = {
    "read": "fs.read",
    "edit": "fs.write",
    "delete": "fs.write",
    "move": "fs.write",
    "execute": "terminal.exec",
}


async def agent_effect(
    call: ToolCallFields, earlier: ToolCallTargets | None, *, root: str, cwd: str
) -> Effect | None:
    """The Host effect an agent's permission request announces (its first target, filled in
    from its earlier ``tool_call``), classified like the effect itself; None when unmapped."""
    kind = call.kind or (earlier.kind if earlier is not None else None)
    capability = AGENT_KIND_CAPABILITY.get(kind or "")
    if capability is None:
        return None
    raw = call.raw_input if isinstance(call.raw_input, dict) else {}
    if capability == "terminal.exec":
        command = raw.get("command")
        if not isinstance(command, str) and earlier is not None and earlier.commands:
            command = earlier.commands[0]
        if not isinstance(command, str) or not command.strip():
            return None
        run_in = raw.get("cwd")
        return classify_terminal(
            command,
            cwd=run_in if isinstance(run_in, str) and run_in.startswith("/") else None,
            workspace_roots=[root],
        )
    path = _tool_call_path(call, raw)
    if not path and earlier is not None and earlier.paths:
        path = earlier.paths[0]
    if not path:
        return None  # no path to classify: the clients are asked (not a write to "")
    absolute = norm_path(path, cwd)
    real = await threads.run_sync(threads.agent_fs_limiter(), os.path.realpath, absolute)
    if capability == "fs.read":
        return classify_read(real, [root])
    return classify_write(real, [root])


def _tool_call_path(call: ToolCallFields, raw: Mapping[str, Any]) -> str | None:
    for loc in call.locations or ():
        p = loc.get("path") if isinstance(loc, dict) else getattr(loc, "path", None)
        if isinstance(p, str) and p:
            return p
    diffs = diff_paths(call.content)  # kimi names a write's target only in its diff
    if diffs:
        return diffs[0]
    for key in RAW_INPUT_PATH_KEYS:
        p = raw.get(key)
        if isinstance(p, str) and p:
            return p
    return None


def option_of(params: RequestPermissionParams, kinds: Sequence[str]) -> str | None:
    """The first offered option of the first of ``kinds`` that is offered."""
    for kind in kinds:
        for option in params.options:
            if option.kind == kind:
                return option.option_id
    return None
