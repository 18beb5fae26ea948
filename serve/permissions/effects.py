"""The EffectGate: every effect an agent asks of the Host passes grants and approvals first.

Theory of operation
-------------------
The Host builds one gate. A :class:`~serve.sessions.actor.SessionActor` (the ACP client
handler) hands each agent → client effect request to the gate installed in
``session.effects``: ``fs/read_text_file`` (:meth:`EffectGate.read_text_file`),
``fs/write_text_file`` (:meth:`EffectGate.write_text_file`) and ``terminal/create``
(:meth:`EffectGate.check_terminal`, which only admits; the session then runs it). Each
request goes through the same pipeline:

1. **Classify** (:mod:`serve.permissions.approval`): the path is made absolute-canonical
   first (``realpath`` in a worker thread: a symlink inside the workspace that points out
   is classified as outside), then mapped to a capability (``fs.read``, ``fs.write``,
   ``terminal.exec``) with a risk and a guard floor (sensitive files, outside targets,
   commands that run workspace code or pass an environment: at least ``prompt``;
   hardline commands: ``deny``). A relative path or a malformed request is the agent's
   fault: JSON-RPC ``-32602``.
2. **Decide**: grants are resolved per session (``capabilities.defaults`` <
   ``agents[<agentInfo.name>]`` < ``sessions[<session id>]``) and ``approval.decide``
   combines them with the ``approval:`` config and the session's approval mode
   (``session.current_mode``, set by ``POST /session/:id/approval-mode``; unknown → the
   ``default`` mode) monotonically: ``auto < prompt < deny``.
3. **deny** → the agent gets JSON-RPC error :data:`EFFECT_DENIED` (``-32003``, ``data``:
   ``{reason, capability, rule, target}``) and the session log gets ``effect_denied
   {sessionId, capability, target, rule, reason, risk}`` (a ``PublishEvent`` the session
   actor writes; the gate waits for it, bounded, before refusing). No client is asked,
   nothing touches the disk. The agent's *own* ``session/request_permission`` passes the
   same decision first (:meth:`EffectGate.screen_agent_permission`): deny → its reject
   option and ``effect_denied``, auto → its allow option, prompt → clients are asked.
4. **prompt** → in order, the first that applies:

   a. *already approved by the agent's own question* (see below): run;
   b. a live ``always_allow_for_session`` entry (:class:`~serve.permissions.cache.
      ApprovalCache`) for (session incarnation, principal, policy fingerprint, rule): run;
   c. otherwise a permission request through the PermissionMediator: ``OpenPermission``
      with a synthetic tool call (``toolCallId: "host_…"``, kind ``read``/``edit``/
      ``execute``, the path or command, ``_meta["qwen.daemon.effect"]`` with capability,
      risk, rule and reason) and options ``allow_once``, ``allow_always`` (only when the
      answer may be cached) and ``reject_once``. The request is published as the usual
      ``permission_request`` event and voted on under the daemon's mediation policy.
      ``allow_*`` runs it (``allow_always`` is cached); ``reject_once`` and ``cancelled``
      (timeout, session cancel/close, mediator crash) refuse it like a deny
      (``effect_denied`` with rule ``permission:rejected`` / ``permission:cancelled``).
      Concurrent identical requests (same session, principal, policy and effect) share
      one request (:class:`~serve.permissions.cache.InflightTable`); if the leader is
      cancelled (the agent withdrew its request) the next waiter asks again.
5. **auto** (or approved) → run. Targets inside the workspace go through the shared
   :mod:`serve.workspaces.files` boundary (the same
   :class:`~serve.workspaces.files.Workspace` as the HTTP file routes, so writes serialise
   with clients' writes and a symlink swapped in after the check fails with
   ``symlink_escape``); targets outside the workspace, which only an ``any``-scoped grant
   allows, use plain file I/O in a worker thread.

The principal
-------------
A cached ``allow_always`` is bound to the *prompt originator's* client id (the
``X-Qwen-Client-Id`` that submitted the running prompt): only later effects of prompts by
the same client in the same session incarnation reuse it. An anonymous prompt has no
principal and is never cached (its requests do not offer ``allow_always``). The session
part of the key is a per-actor token, so a session replaced under the same id (load after
close) never inherits entries; entries of sessions that are no longer live are dropped on
the next gate call. ``secret.bind`` decisions are never cached (``approval.decide`` marks
them non-cacheable, and ``ApprovalCache`` refuses them). Entries expire after 8 hours.

Not asking twice: an allowed agent ``session/request_permission`` covers the matching Host
effects of its prompt (:mod:`serve.permissions.agent_approvals`). The request clients vote
on, and the agent's error codes: :mod:`serve.permissions.host_request`.

Ownership and errors: all state (cache, in-flight table, agent approvals, counters) is
touched only from the trio thread and never across an ``await``, so the handler tasks of
every session can share one gate. Blocking work (``realpath``, file I/O) runs in worker
threads. If the mediator is unavailable the request resolves ``cancelled`` (refused), never
hanging the agent. The session is read through :class:`~serve.permissions.context.EffectSession`.
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

import msgspec
import trio

from acp.errors import INVALID_PARAMS, HandlerError
from acp.handler import read_text as plain_read_text
from acp.handler import write_text as plain_write_text
from acp.schema import (
    CancelledPermissionOutcome,
    CreateTerminalParams,
    PermissionOutcome,
    ReadTextFileParams,
    RequestPermissionParams,
    SelectedPermissionOutcome,
    WriteTextFileParams,
)
from serve import threads
from serve.events.messages import PublishEvent
from serve.permissions.agent_approvals import (
    AGENT_APPROVAL_USES,
    AGENT_APPROVAL_WINDOW_MS,
    AGENT_KIND_CAPABILITY,
    AgentApproval,
    AgentApprovals,
    ToolCallLog,
    agent_approval_from,
    agent_effect,
    option_of,
    terminal_texts,
)
from serve.permissions.approval import (
    Decision,
    Effect,
    classify_read,
    classify_write,
    decide,
    describe_policy,
    effect_fingerprint,
    policy_fingerprint,
)
from serve.permissions.cache import (
    ALWAYS_ALLOW_TTL_MS,
    ApprovalCache,
    CacheKey,
    DecisionKey,
    Existing,
    Full,
    InflightTable,
    Leader,
    cache_key,
)
from serve.permissions.config import APPROVAL_MODES, VERDICTS, ApprovalMode
from serve.permissions.context import ConfigSource, EffectSession, PermissionSections
from serve.permissions.grants import EffectiveGrants, resolve_grants
from serve.permissions.host_request import EFFECT_DENIED, Outcome, ask_clients, fs_error
from serve.permissions.modes import qwen_equivalent
from serve.permissions.terminal_guard import classify_acp_request, classify_terminal
from serve.threads import agent_fs_limiter
from serve.workspaces.files import Workspace, WorkspaceFsError, overwrite_text
from serve.workspaces.files import read_text as ws_read_text
from serve.workspaces.files.set import WorkspaceSet

if TYPE_CHECKING:
    from serve.permissions.mediator import PermissionMediator
    from serve.settings import Settings

log = logging.getLogger(__name__)

__all__ = ["EffectGate"]

#: Bound on handing an event to the session actor (its inbox; the event is kept queued).
PUBLISH_TIMEOUT_S: Final = 5.0
_encoder = msgspec.json.Encoder()


def _wall_ms() -> int:
    return int(time.time() * 1000)


# -- the gate -------------------------------------------------------------------------------


class _Shared:
    """The in-flight decision the leader makes for every identical request."""

    __slots__ = ("done", "outcome")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.outcome: Outcome | None = None  # None: the leader gave up, ask again


class EffectGate:
    """Grants + approval policy + the workspace boundary for agent effects (see module doc).

    ``config`` is the daemon's config cell (a reload swaps it; every decision reads the
    current one); ``live_sessions`` lists the live sessions; ``clock_ms`` (wall
    milliseconds) is replaceable for tests.
    """

    def __init__(
        self,
        config: ConfigSource,
        *,
        settings: Settings,
        mediator: PermissionMediator,
        live_sessions: Callable[[], Sequence[EffectSession]] = tuple,
        clock_ms: Callable[[], int] = _wall_ms,
        agent_approvals: AgentApprovals | None = None,
        cache: ApprovalCache | None = None,
        workspaces: WorkspaceSet | None = None,
    ) -> None:
        self._config = config
        #: The Host's workspace objects (their per-path writer locks are the file routes').
        self._workspaces = workspaces or WorkspaceSet()
        self._settings = settings
        self._mediator = mediator
        self._live = live_sessions
        self._clock = clock_ms
        self.cache = cache or ApprovalCache()
        self.agent_approvals = agent_approvals or AgentApprovals()
        self.tool_calls = ToolCallLog()
        self._inflight: InflightTable[DecisionKey, _Shared] = InflightTable()
        self._tokens: weakref.WeakKeyDictionary[EffectSession, str] = weakref.WeakKeyDictionary()
        self._cached_sessions: set[str] = set()
        self.counters: dict[str, int] = {
            "auto": 0,
            "prompted": 0,
            "denied": 0,
            "allowedByCache": 0,
            "allowedByAgentApproval": 0,
            "rejected": 0,
            "cancelled": 0,
        }

    # ---- per-session policy ------------------------------------------------------------

    def session_key(self, session: EffectSession) -> str:
        """The session incarnation's token (a session replaced under its id gets a new one)."""
        key = self._tokens.get(session)
        if key is None:
            key = f"{session.session_id}#{uuid.uuid4().hex[:12]}"
            self._tokens[session] = key
        return key

    @staticmethod
    def agent_name(session: EffectSession) -> str | None:
        return session.agent_name

    @staticmethod
    def approval_mode(session: EffectSession) -> ApprovalMode:
        mode = qwen_equivalent(session.current_mode)  # acceptEdits → auto-edit
        return mode if mode in APPROVAL_MODES else "default"

    def grants_for(self, session: EffectSession) -> EffectiveGrants:
        return resolve_grants(
            self.config.capabilities,
            agent=self.agent_name(session),
            session_id=session.session_id or None,
        )

    def _workspace_trusted(self, root: str) -> bool:
        return root not in self._settings.untrusted_workspaces

    def _workspace(self, session: EffectSession) -> Workspace:
        try:
            return self._workspaces.get(
                session.workspace, trusted=self._workspace_trusted(session.workspace)
            )
        except WorkspaceFsError as err:
            raise fs_error(err, session.workspace) from None

    # ---- the ClientHandler entry points ------------------------------------------------

    async def read_text_file(self, session: EffectSession, params: ReadTextFileParams) -> str:
        path = _absolute(params.path)
        real = await threads.run_sync(agent_fs_limiter(), os.path.realpath, path)
        ws = self._workspace(session)
        effect = classify_read(real, [ws.root])
        await self._admit(session, effect, paths=(posixpath.normpath(path), real))
        if effect.in_workspace:
            try:
                result = await threads.run_sync(
                    agent_fs_limiter(),
                    functools.partial(
                        ws_read_text, ws, real, line=params.line, limit=params.limit, agent=True
                    ),
                )
            except WorkspaceFsError as err:
                raise fs_error(err, path) from None
            return result.content
        return await threads.run_sync(
            agent_fs_limiter(), plain_read_text, real, params.line, params.limit
        )

    async def write_text_file(self, session: EffectSession, params: WriteTextFileParams) -> None:
        path = _absolute(params.path)
        real = await threads.run_sync(agent_fs_limiter(), os.path.realpath, path)
        ws = self._workspace(session)
        effect = classify_write(real, [ws.root])
        await self._admit(
            session, effect, paths=(posixpath.normpath(path), real), content=params.content
        )
        if effect.in_workspace:
            try:
                await threads.run_sync(
                    agent_fs_limiter(), functools.partial(overwrite_text, ws, real, params.content)
                )
            except WorkspaceFsError as err:
                raise fs_error(err, path) from None
            return
        await threads.run_sync(agent_fs_limiter(), plain_write_text, real, params.content)

    async def check_terminal(self, session: EffectSession, params: CreateTerminalParams) -> None:
        """Admit a ``terminal/create`` (raises :class:`HandlerError` to refuse)."""
        ws = self._workspace(session)
        cwd = params.cwd
        if cwd is not None:
            cwd = await threads.run_sync(
                agent_fs_limiter(), os.path.realpath, _absolute(cwd, field="cwd")
            )
        request = {
            "command": params.command,
            "args": list(params.args),
            "env": [{"name": e.name} for e in params.env],
            "cwd": cwd,
        }
        try:
            effect = classify_acp_request("terminal/create", request, [ws.root])
        except ValueError as exc:
            raise HandlerError(INVALID_PARAMS, str(exc)) from None
        await self._admit(
            session,
            effect,
            commands=terminal_texts(params.command, params.args),
            cwd=cwd or session.workspace,
        )

    # ---- agent approvals (the session actor's hook) ------------------------------------

    def note_tool_call(self, session: EffectSession, update: bytes | msgspec.Raw) -> None:
        """The agent announced or updated a tool call: remember what it targets by id."""
        self.tool_calls.note(self.session_key(session), bytes(update))

    def note_agent_permission(
        self, session: EffectSession, params: RequestPermissionParams, outcome: PermissionOutcome
    ) -> None:
        """A client answered the agent's own permission request; remember an allow."""
        if not isinstance(outcome, SelectedPermissionOutcome):
            return
        active = session.active
        prompt_id = active.prompt_id if active is not None else None
        skey = self.session_key(session)
        try:
            approval = agent_approval_from(
                params,
                outcome.option_id,
                cwd=session.workspace,
                prompt_id=prompt_id,
                earlier=self.tool_calls.get(skey, params.tool_call.tool_call_id),
            )
        except (AttributeError, TypeError):  # a tool call shape we cannot route on
            return
        if approval is None:
            return
        now = self._clock()
        self.agent_approvals.note(skey, approval, now_ms=now)
        if approval.always:
            self._seed_cache_from_agent(session, skey, approval, now)

    def _seed_cache_from_agent(
        self, session: EffectSession, skey: str, approval: AgentApproval, now: int
    ) -> None:
        principal = _originator(session)
        if principal is None:
            return
        grants = self.grants_for(session)
        mode = self.approval_mode(session)
        approval_cfg = self.config.approval
        fingerprint = policy_fingerprint(grants, approval_cfg, mode)
        roots = [session.workspace]
        effects: list[Effect] = []
        for path in approval.paths:
            if "fs.write" in approval.capabilities:
                effects.append(classify_write(path, roots))
            if "fs.read" in approval.capabilities:
                effects.append(classify_read(path, roots))
        if "terminal.exec" in approval.capabilities:
            for command in approval.commands:
                effects.append(
                    classify_terminal(command, cwd=session.workspace, workspace_roots=roots)
                )
        for effect in effects:
            decision = decide(effect, grants, approval_cfg, mode)
            if decision.verdict != "prompt":
                continue
            if self.cache.remember(cache_key(skey, principal, fingerprint, decision), now_ms=now):
                self._cached_sessions.add(skey)

    # ---- the pipeline ------------------------------------------------------------------

    async def _admit(
        self,
        session: EffectSession,
        effect: Effect,
        *,
        paths: Iterable[str] = (),
        commands: Iterable[str] = (),
        content: str | None = None,
        cwd: str | None = None,
    ) -> None:
        """Return when ``effect`` may run; raise :class:`HandlerError` when refused."""
        grants = self.grants_for(session)
        mode = self.approval_mode(session)
        approval_cfg = self.config.approval
        decision = decide(effect, grants, approval_cfg, mode)
        if decision.verdict == "deny":
            self.counters["denied"] += 1
            await self._refuse(session, effect, decision.rule, decision.reason)
        if decision.verdict == "auto":
            self.counters["auto"] += 1
            return
        now = self._clock()
        self._sweep(now)
        skey = self.session_key(session)
        active = session.active
        prompt_id = active.prompt_id if active is not None else None
        if (
            self.agent_approvals.match(
                skey,
                prompt_id,
                effect.capability,
                paths=paths,
                commands=commands,
                now_ms=now,
            )
            is not None
        ):
            self.counters["allowedByAgentApproval"] += 1
            return
        principal = _originator(session)
        fingerprint = policy_fingerprint(grants, approval_cfg, mode)
        key = cache_key(skey, principal, fingerprint, decision)
        if self.cache.allowed(key, now_ms=now):
            self.counters["allowedByCache"] += 1
            return
        outcome = await self._shared_decision(
            session,
            DecisionKey(skey, principal, fingerprint, effect_fingerprint(effect)),
            effect,
            decision,
            key,
            content=content,
            cwd=cwd,
        )
        if outcome in ("allow_once", "allow_always"):
            return
        self.counters[outcome] += 1
        rule = f"permission:{outcome}"
        why = (
            "a client rejected the request"
            if outcome == "rejected"
            else "the permission request was cancelled"
        )
        await self._refuse(session, effect, rule, why)

    async def _shared_decision(
        self,
        session: EffectSession,
        dkey: DecisionKey,
        effect: Effect,
        decision: Decision,
        key: CacheKey | None,
        *,
        content: str | None,
        cwd: str | None,
    ) -> Outcome:
        while True:
            mine = _Shared()
            joined = self._inflight.lookup_or_join(dkey, mine)
            if isinstance(joined, Full):
                return "cancelled"
            if isinstance(joined, Existing):
                leader = self._inflight.leader_of(dkey)
                try:
                    if leader is None:  # pragma: no cover - a joined key always has a leader
                        continue
                    await leader.done.wait()
                finally:
                    self._inflight.leave(dkey, mine)
                if leader.outcome is not None:
                    return leader.outcome
                continue  # the leader gave up: ask again
            assert isinstance(joined, Leader)
            try:
                mine.outcome = await self._ask_clients(
                    session, effect, decision, key, content=content, cwd=cwd
                )
                return mine.outcome
            finally:
                self._inflight.finish(dkey)
                mine.done.set()

    async def _ask_clients(
        self,
        session: EffectSession,
        effect: Effect,
        decision: Decision,
        key: CacheKey | None,
        *,
        content: str | None,
        cwd: str | None,
    ) -> Outcome:
        self.counters["prompted"] += 1
        outcome = await ask_clients(
            self._mediator,
            session,
            effect,
            decision,
            offer_always=key is not None,
            content=content,
            cwd=cwd,
        )
        if outcome == "allow_always":
            if self.cache.remember(key, now_ms=self._clock()) and key is not None:
                self._cached_sessions.add(key.session_id)
        return outcome

    async def _refuse(
        self, session: EffectSession, effect: Effect, rule: str, reason: str
    ) -> NoReturn:
        target = effect.target or ""
        await self._announce_denied(session, effect, rule, reason)
        raise HandlerError(
            EFFECT_DENIED,
            f"{effect.capability} refused by the Host: {reason}",
            {"reason": reason, "capability": effect.capability, "rule": rule, "target": target},
        )

    async def _announce_denied(
        self, session: EffectSession, effect: Effect, rule: str, reason: str
    ) -> None:
        """``effect_denied`` on the session's log, written by the session actor: we run in
        its agent-request task, so we wait (bounded) until it is in the log and the agent's
        next updates come after it."""
        active = session.active
        event = PublishEvent(
            "effect_denied",
            {
                "sessionId": session.session_id,
                "capability": effect.capability,
                "target": effect.target or "",
                "rule": rule,
                "reason": reason,
                "risk": effect.risk,
            },
            prompt_id=active.prompt_id if active is not None else None,
            originator=active.client_id if active is not None else None,
        )
        try:
            await session.publish_event(event, timeout_s=PUBLISH_TIMEOUT_S)
        except Exception as exc:  # gone, closing or wedged: the agent is refused anyway
            log.warning("effect_denied not published on session %s: %r", session.session_id, exc)

    # ---- the agent's own permission requests (approval policy first) -------------------

    async def screen_agent_permission(
        self, session: EffectSession, params: RequestPermissionParams
    ) -> PermissionOutcome | None:
        """Apply the approval policy to the agent's own ``session/request_permission``
        before anyone is asked.

        The tool call's ``kind`` names the capability (``read`` → ``fs.read``;
        ``edit``/``delete``/``move`` → ``fs.write``; ``execute`` → ``terminal.exec``), its
        first location, ``diff`` block or ``rawInput`` path (or ``rawInput.command``) the
        target; what the request lacks comes from the agent's earlier ``tool_call`` with the
        same id (:class:`ToolCallLog`); it is
        classified and decided exactly like the Host effect it announces. ``deny``: the
        agent gets its reject option (``reject_once``, else ``reject_always``; none:
        cancelled) and the log gets ``effect_denied``; no client sees the request.
        ``auto``: the agent gets its allow option (``allow_once`` preferred). ``prompt``,
        or a tool call we cannot map: None, the clients are asked as before.
        """
        effect = await self._agent_effect(session, params)
        if effect is None:
            return None
        decision = decide(
            effect, self.grants_for(session), self.config.approval, self.approval_mode(session)
        )
        if decision.verdict == "deny":
            self.counters["denied"] += 1
            await self._announce_denied(session, effect, decision.rule, decision.reason)
            option = option_of(params, ("reject_once", "reject_always"))
            if option is None:
                return CancelledPermissionOutcome()
            return SelectedPermissionOutcome(option_id=option)
        if decision.verdict == "auto":
            option = option_of(params, ("allow_once", "allow_always"))
            if option is None:
                return None
            self.counters["auto"] += 1
            selected = SelectedPermissionOutcome(option_id=option)
            self.note_agent_permission(session, params, selected)
            return selected
        return None

    async def _agent_effect(
        self, session: EffectSession, params: RequestPermissionParams
    ) -> Effect | None:
        call = params.tool_call
        # What the agent's earlier tool_call with this id named fills in the request's gaps.
        earlier = self.tool_calls.get(self.session_key(session), call.tool_call_id)
        kind = call.kind or (earlier.kind if earlier is not None else None)
        if AGENT_KIND_CAPABILITY.get(kind or "") is None:
            return None
        try:
            root = self._workspace(session).root
        except HandlerError:
            return None
        return await agent_effect(call, earlier, root=root, cwd=session.workspace)

    def _sweep(self, now: int) -> None:
        """Drop cache entries and agent approvals of sessions that are no longer live."""
        self.cache.expire(now)
        live = {self._tokens[s] for s in self._live_sessions() if s in self._tokens}
        for skey in [k for k in self._cached_sessions if k not in live]:
            self.cache.invalidate_session(skey)
            self._cached_sessions.discard(skey)
        for skey in self.agent_approvals.sessions():
            if skey not in live:
                self.agent_approvals.forget(skey)
        for skey in self.tool_calls.sessions():
            if skey not in live:
                self.tool_calls.forget(skey)

    def _live_sessions(self) -> list[EffectSession]:
        return list(self._live())

    @property
    def config(self) -> PermissionSections:
        """The config in force (the cell's current value)."""
        return self._config.current

    # ---- read models -------------------------------------------------------------------

    def describe(self, workspace: str | None = None) -> dict[str, Any]:
        """``GET /workspace/permissions``: effective grants and approval policy, no secrets."""
        self._sweep(self._clock())
        caps = self.config.capabilities
        settings = self._settings
        sessions = []
        for session in self._live_sessions():
            if workspace is not None and session.workspace != workspace:
                continue
            mode = self.approval_mode(session)
            sessions.append(
                {
                    "sessionId": session.session_id,
                    "agent": self.agent_name(session),
                    **describe_policy(self.grants_for(session), self.config.approval, mode),
                }
            )
        return {
            "v": 1,
            "workspaceCwd": workspace or settings.primary_workspace,
            "policy": {
                "permissionStrategy": self.config.policy.permission_strategy,
                "consensusQuorum": self.config.policy.consensus_quorum,
                "permissionResponseTimeoutMs": settings.permission_response_timeout_ms or None,
            },
            "grants": {
                "defaults": resolve_grants(caps).to_public(),
                "agents": {n: resolve_grants(caps, agent=n).to_public() for n in caps.agents},
                "sessions": {
                    s: resolve_grants(caps, session_id=s).to_public() for s in caps.sessions
                },
            },
            "approval": msgspec.to_builtins(self.config.approval),
            "verdictOrder": list(VERDICTS),
            "alwaysAllow": {"ttlMs": ALWAYS_ALLOW_TTL_MS, "entries": len(self.cache)},
            "agentApprovals": {
                "windowMs": AGENT_APPROVAL_WINDOW_MS,
                "usesPerApproval": AGENT_APPROVAL_USES,
                "entries": len(self.agent_approvals),
            },
            "decisions": dict(self.counters),
            "sessions": sessions,
        }

    def snapshot(self) -> dict[str, Any]:
        """Counters and table sizes (for ``/daemon/status``)."""
        return {
            "decisions": dict(self.counters),
            "alwaysAllowEntries": len(self.cache),
            "agentApprovals": len(self.agent_approvals),
            "inflight": len(self._inflight),
        }


def _originator(session: EffectSession) -> str | None:
    active = session.active
    cid = active.client_id if active is not None else None
    return cid if isinstance(cid, str) and cid else None


def _absolute(path: str, *, field: str = "path") -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise HandlerError(
            INVALID_PARAMS, f"{field} must be an absolute path: {path!r}", {field: path}
        )
    return path
