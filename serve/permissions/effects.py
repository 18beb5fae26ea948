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
4. **prompt** → the prompt stage (:mod:`serve.permissions.prompt_stage`): already approved
   by the agent's own question, a live ``always_allow_for_session`` entry, or one request
   through the PermissionMediator shared by identical concurrent requests: a synthetic tool
   call (``toolCallId: "host_…"``, kind ``read``/``edit``/``execute``,
   ``_meta["qwen.daemon.effect"]``; :mod:`serve.permissions.host_request`) with options
   ``allow_once``, ``allow_always`` (only when the answer may be cached) and
   ``reject_once``, published as the usual ``permission_request`` event and voted on under
   the daemon's mediation policy. Allowed runs it; ``reject_once`` and ``cancelled``
   (timeout, session cancel/close, mediator crash) refuse it like a deny (``effect_denied``
   with rule ``permission:rejected`` / ``permission:cancelled``).
5. **auto** (or approved) → run. Targets inside the workspace go through the shared
   :mod:`serve.workspaces.files` boundary (the same
   :class:`~serve.workspaces.files.Workspace` as the HTTP file routes, so writes serialise
   with clients' writes and a symlink swapped in after the check fails with
   ``symlink_escape``); targets outside the workspace, which only an ``any``-scoped grant
   allows, use plain file I/O in a worker thread.

What the Host remembers between effects (the always-allow cache bound to the prompt
originator, the agent's approvals, the questions in flight, the per-incarnation session
token) is the prompt stage's state: :mod:`serve.permissions.prompt_stage`. Not asking twice:
an allowed agent ``session/request_permission`` covers the matching Host effects of its
prompt (:mod:`serve.permissions.agent_approvals`). The request clients vote on, and the
agent's error codes: :mod:`serve.permissions.host_request`.

Ownership and errors: all state (the prompt stage's, the counters) is touched only from
the trio thread and never across an ``await``, so the handler tasks of every session can
share one gate. Blocking work (``realpath``, file I/O) runs in worker threads. If the
mediator is unavailable the request resolves ``cancelled`` (refused), never hanging the
agent. The session is read through :class:`~serve.permissions.effect_session.EffectSession`.
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, NoReturn

import msgspec

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
    agent_approval_from,
    agent_effect,
    option_of,
    terminal_texts,
)
from serve.permissions.approval import (
    Effect,
    classify_read,
    classify_write,
    decide,
    describe_policy,
    policy_fingerprint,
)
from serve.permissions.cache import ALWAYS_ALLOW_TTL_MS, ApprovalCache, cache_key
from serve.permissions.config import APPROVAL_MODES, VERDICTS, ApprovalMode
from serve.permissions.counters import DecisionCounters
from serve.permissions.effect_session import ConfigSource, EffectSession, PermissionSections
from serve.permissions.grants import EffectiveGrants, resolve_grants
from serve.permissions.host_request import EFFECT_DENIED, ask_clients, fs_error
from serve.permissions.modes import qwen_equivalent
from serve.permissions.prompt_stage import PromptStage, originator
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


def _wall_ms() -> int:
    return int(time.time() * 1000)


# -- the gate -------------------------------------------------------------------------------


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
        self._live = live_sessions
        self._clock = clock_ms
        self.counters = DecisionCounters()
        #: The prompt stage: what the Host remembers of earlier answers, questions in flight.
        self.prompt_stage = PromptStage(
            functools.partial(ask_clients, mediator),
            counters=self.counters,
            live_sessions=live_sessions,
            clock_ms=clock_ms,
            agent_approvals=agent_approvals,
            cache=cache,
        )
        self.cache = self.prompt_stage.cache
        self.agent_approvals = self.prompt_stage.agent_approvals
        self.tool_calls = self.prompt_stage.tool_calls

    # ---- per-session policy ------------------------------------------------------------

    def session_key(self, session: EffectSession) -> str:
        """The session incarnation's token (a session replaced under its id gets a new one)."""
        return self.prompt_stage.session_key(session)

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
        principal = originator(session)
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
            self.prompt_stage.remember(
                cache_key(skey, principal, fingerprint, decision), now_ms=now
            )

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
            self.counters.count(session.session_id, "denied")
            await self._refuse(session, effect, decision.rule, decision.reason)
        if decision.verdict == "auto":
            self.counters.count(session.session_id, "auto")
            return
        outcome = await self.prompt_stage.resolve(
            session,
            effect,
            decision,
            policy_fingerprint(grants, approval_cfg, mode),
            paths=paths,
            commands=commands,
            content=content,
            cwd=cwd,
        )
        if outcome == "allowed":
            return
        self.counters.count(session.session_id, outcome)
        rule = f"permission:{outcome}"
        why = (
            "a client rejected the request"
            if outcome == "rejected"
            else "the permission request was cancelled"
        )
        await self._refuse(session, effect, rule, why)

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
        same id (the prompt stage's ``ToolCallLog``); it is classified and decided exactly
        like the Host effect it announces. ``deny``: the agent gets its reject option
        (``reject_once``, else ``reject_always``; none: cancelled) and the log gets
        ``effect_denied``; no client sees the request. ``auto``: the agent gets its allow
        option (``allow_once`` preferred). ``prompt``, or a tool call we cannot map: None,
        the clients are asked as before.
        """
        effect = await self._agent_effect(session, params)
        if effect is None:
            return None
        decision = decide(
            effect, self.grants_for(session), self.config.approval, self.approval_mode(session)
        )
        if decision.verdict == "deny":
            self.counters.count(session.session_id, "denied")
            await self._announce_denied(session, effect, decision.rule, decision.reason)
            option = option_of(params, ("reject_once", "reject_always"))
            if option is None:
                return CancelledPermissionOutcome()
            return SelectedPermissionOutcome(option_id=option)
        if decision.verdict == "auto":
            option = option_of(params, ("allow_once", "allow_always"))
            if option is None:
                return None
            self.counters.count(session.session_id, "auto")
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

    @property
    def config(self) -> PermissionSections:
        """The config in force (the cell's current value)."""
        return self._config.current

    # ---- read models -------------------------------------------------------------------

    def describe(self, workspace: str | None = None) -> dict[str, Any]:
        """``GET /workspace/permissions``: effective grants and approval policy, no secrets."""
        self.prompt_stage.sweep(self._clock())
        caps = self.config.capabilities
        settings = self._settings
        sessions = []
        for session in self._live():
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
            "inflight": len(self.prompt_stage),
        }


def _absolute(path: str, *, field: str = "path") -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise HandlerError(
            INVALID_PARAMS, f"{field} must be an absolute path: {path!r}", {field: path}
        )
    return path
