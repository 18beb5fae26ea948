"""What each public route takes and answers: the hand-written half of the OpenAPI document.

The route table itself is *not* kept here: :mod:`serve.http.openapi.document` walks the app's
``url_map`` at request time, so a route exists in the document iff it is registered. This
module maps a registered ``(METHOD, Quart rule)`` (the same pair :class:`~serve.http.capabilities.
Feature` uses) to an :class:`Operation`: a summary, the request body type, query and
header parameters, and the replies its handler gives on purpose, with their body types
(msgspec Structs from :mod:`serve.http.openapi.types` or the route modules' own wire
Structs). The statuses every route of a kind can answer (the security front's refusals, the
error table's families) are *not* listed here: :mod:`serve.http.openapi.replies` derives
them. A registered route without an entry still gets an operation (summary from its
handler's docstring, an open JSON 200, its families and the front's replies), so the
document is complete even when this table lags behind a new route; :func:`missing` lists
such routes.

Path parameters are not listed here: the document derives them from the rule
(``<session_id>`` → ``{session_id}``) and describes them from :data:`PATH_PARAMS`.

The vocabulary it is written in (:class:`Operation`, ``ok``, ``err``, the shared replies)
is :mod:`serve.http.openapi.operation`.

Pure data; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import msgspec

from serve.acpfront.jsonrpc import ErrorReply
from serve.http.openapi import types as t
from serve.http.openapi.operation import (
    ACP_CONNECTION,
    ACP_SESSION,
    AGENT_START,
    BAD_REQUEST,
    CLIENT_ID,
    FLAG,
    HTML,
    NO_SESSION,
    OPEN_OBJECT,
    SSE,
    STRING,
    TEXT,
    UNAVAILABLE,
    Operation,
    Param,
    err,
    file_err,
    h,
    ok,
    q,
)
from serve.http.openapi.replies import Reply
from serve.status.env import EnvCell
from serve.status.preflight import PreflightCell
from serve.tenant_claim import BindRequest
from serve.webhooks.model import WebhookCreated, WebhookList, WebhookRequest
from serve.workspaces.files.results import (
    EditResult,
    GlobResult,
    ListResult,
    ReadBytesResult,
    ReadTextResult,
    StatResult,
    WriteResult,
)

__all__ = [
    "CATALOG",
    "PATH_PARAMS",
    "Operation",
    "Param",
    "Reply",
    "lookup",
    "missing",
]

#: Descriptions of the path parameters the rules use, by name.
PATH_PARAMS: Final[dict[str, str]] = {
    "session_id": "The session id (from POST /session).",
    "request_id": "The request id (`requestId` of the `permission_request` or "
    "`elicitation_request` event).",
    "workspace": "A workspace id or the URL-encoded absolute workspace path.",
    "name": "The tool name.",
    "server": "The MCP server name (a key of `mcpServers`).",
    "flow_id": "The device flow id (`deviceFlowId`).",
    "prompt_id": "The prompt id (`promptId` from the prompt's 202 answer).",
    "webhook_id": "The webhook subscription id (`id` of POST /webhooks).",
}

_INCLUDE_PERSISTED = q(
    "include",
    {"type": "string", "enum": ["persisted"]},
    "`persisted`: also the journaled sessions not loaded (`activeWorkState: persisted`).",
)
_RESTORE = Operation(
    "Attach to a live session or restore it from the agent's store",
    (
        ok(t.RestoreResponse),
        BAD_REQUEST,
        NO_SESSION,
        AGENT_START,
        err(504, "The agent did not answer in time (`init_timeout`, `session_restore_timeout`)."),
    ),
    body=t.RestoreRequest,
    params=(CLIENT_ID,),
)

_VOTE_REPLIES = (
    ok(t.VoteAccepted, "The vote resolved the request or was recorded."),
    err(400, "Malformed `outcome`, unknown `optionId` or client id."),
    err(403, "`permission_forbidden` (designated voter or loopback-only policy)."),
    err(404, "No pending permission request with that id (already resolved, or unknown)."),
)

_SNAPSHOT = (ok(t.StatusSnapshot),)

CATALOG: Final[dict[tuple[str, str], Operation]] = {
    # -- health, capabilities, status ---------------------------------------------------------
    ("GET", "/health"): Operation(
        "Liveness",
        (ok(t.HealthResponse), Reply(503, "Deep check failed (`status: degraded`).", OPEN_OBJECT)),
        params=(
            q(
                "deep",
                STRING,
                "`1`, `true` or empty: add counters (sessions, prompts, ...); any other "
                "value: the shallow answer.",
            ),
        ),
        public=True,
    ),
    ("GET", "/readyz"): Operation(
        "Readiness (503 while starting, draining, at session capacity, or while the primary "
        "workspace's agent keeps failing)",
        (
            ok(t.ReadyResponse, "Ready."),
            Reply(503, "Not ready (`reason`; `Retry-After`).", t.ReadyResponse),
        ),
        public=True,
    ),
    ("GET", "/capabilities"): Operation(
        "Feature tags, protocol versions and limits", (ok(t.CapabilitiesEnvelope),)
    ),
    ("GET", "/daemon/status"): Operation(
        "Daemon status snapshot",
        (ok(OPEN_OBJECT), err(400, "`invalid_detail`."), err(500, "`daemon_status_failed`.")),
        params=(q("detail", {"type": "string", "enum": ["summary", "full"]}),),
        description="`isolation`: the agent children's resource limits (`backend` "
        "cgroup-v2 | cgroup-v1 | watchdog | off, `reason`, `limits`, `ceiling`, "
        "`agentOomTotal`, `children[]` with `memoryCurrentBytes`, `memoryPeakBytes`, "
        "`pidsCurrent`). `isolation.groups` (cgroup backends): the agents' parent (`name`, "
        "`paths`) and what the start-up sweep did to other daemons' groups "
        "(`removedAtStart[]`, `leftAlone[]` with `path`, `why`, `owner`; `liveOthers`).",
    ),
    ("POST", "/daemon/bind"): Operation(
        "Late binding: install the tenant's token, workspace, agent variables and credentials",
        (
            ok(OPEN_OBJECT),
            BAD_REQUEST,
            err(409, "`already_bound`, `bind_in_progress` or `not_late_bound`."),
            err(422, "`bind_failed`: the clone or a write failed; nothing kept, still unbound."),
        ),
        body=BindRequest,
        body_required=True,
        description="Only with the bootstrap token, once (`--bootstrap-token`).",
    ),
    ("POST", "/daemon/drain"): Operation(
        "Drain before a suspend: finish or cancel running turns, flush the journal",
        (
            ok(OPEN_OBJECT),
            BAD_REQUEST,
            err(503, "`drain_incomplete` (call again) or `journal_io`."),
        ),
        body=OPEN_OBJECT,
        description="Body `{timeoutMs?}`; the daemon stays draining until it stops.",
    ),
    # -- multi-user (docs/multi-user.md; tag `multi_user_auth`) --------------------------------
    ("GET", "/session/<session_id>/members"): Operation(
        "The session's owner and members (role observer)",
        (ok(OPEN_OBJECT, "`{sessionId, owner, members}`."), NO_SESSION),
    ),
    ("PUT", "/session/<session_id>/members"): Operation(
        "Share the session: `{members: {<principal id> | group:<name>: observer | "
        "collaborator}}` (role owner)",
        (ok(OPEN_OBJECT, "`{sessionId, owner, members}`."), BAD_REQUEST, NO_SESSION),
        body=OPEN_OBJECT,
        body_required=True,
    ),
    ("GET", "/daemon/audit"): Operation(
        "The audit log, newest first (admin; `limit` <= 500, `before` = a `seq`)",
        (
            ok(OPEN_OBJECT, "`{entries, nextBefore, dropped, refused}`."),
            BAD_REQUEST,
            err(404, "The audit log is off (`audit_log_off`: no multi-user auth)."),
        ),
        params=(
            q("limit", {"type": "integer", "minimum": 1}),
            q("before", {"type": "integer", "minimum": 0}),
        ),
    ),
    # -- sessions -----------------------------------------------------------------------------
    ("POST", "/session"): Operation(
        "Create a session, or attach to the workspace's single-scope session",
        (
            ok(t.SessionResponse),
            BAD_REQUEST,
            AGENT_START,
            err(504, "The agent did not start in time (`init_timeout`)."),
        ),
        body=t.CreateSessionRequest,
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/load"): _RESTORE,
    ("POST", "/session/<session_id>/resume"): _RESTORE,
    ("GET", "/workspace/<path:workspace>/sessions"): Operation(
        "List the live sessions of a workspace",
        (ok(t.SessionList), err(400, "`workspace_mismatch`.")),
        params=(_INCLUDE_PERSISTED,),
    ),
    ("GET", "/workspace//<path:workspace>/sessions"): Operation(
        "List the live sessions of a workspace (absolute path, %2F-encoded)",
        (ok(t.SessionList), err(400, "`workspace_mismatch`.")),
        params=(_INCLUDE_PERSISTED,),
    ),
    ("POST", "/session/<session_id>/prompt"): Operation(
        "Submit a prompt (blocking, or `Prefer: respond-async` for 202)",
        (
            ok(t.PromptResult, "The turn finished (blocking mode)."),
            ok(t.PromptAccepted, "Admitted; output arrives on the event stream.", 202),
            BAD_REQUEST,
            NO_SESSION,
            err(500, "The agent failed the prompt (JSON-RPC `code`, `promptId`)."),
            UNAVAILABLE,
        ),
        body=t.PromptRequest,
        body_required=True,
        params=(
            h(
                "Prefer",
                STRING,
                "`respond-async`: answer 202 at once (other preferences: ignored).",
            ),
            CLIENT_ID,
        ),
    ),
    ("GET", "/session/<session_id>/pending-prompts"): Operation(
        "The running prompt and the queued ones",
        (ok(t.PendingPrompts), BAD_REQUEST, NO_SESSION),
        params=(CLIENT_ID,),
    ),
    ("DELETE", "/session/<session_id>/pending-prompts/<prompt_id>"): Operation(
        "Remove a queued prompt",
        (
            Reply(204, "Removed (`prompt_cancelled` is published)."),
            BAD_REQUEST,
            err(404, "`session_not_found` or `prompt_not_found`."),
            err(409, "`prompt_running`: cancel it instead."),
        ),
        params=(CLIENT_ID,),
    ),
    ("PUT", "/session/<session_id>/pending-prompts/<prompt_id>"): Operation(
        "Replace a queued prompt's content (its id and place stay)",
        (
            ok(t.PendingPromptUpdated, "Replaced (`pending_prompt_updated` is published)."),
            err(400, "A bad prompt, or `invalid_pending_prompt` (a field other than those)."),
            err(404, "`session_not_found` or `prompt_not_found`."),
            err(409, "`prompt_running`: steer or cancel it instead."),
        ),
        body=t.PendingPromptEdit,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/cancel"): Operation(
        "Cancel the running prompt (queued prompts still run)",
        (Reply(204, "Cancelled (or nothing was running)."), BAD_REQUEST, NO_SESSION),
        params=(CLIENT_ID,),
    ),
    ("DELETE", "/session/<session_id>"): Operation(
        "Close a session (its agent is stopped; `session_closed` is published)",
        (Reply(204, "Closed."), BAD_REQUEST, NO_SESSION),
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/detach"): Operation(
        "Release this client's attachment; the last one closes an idle session",
        (Reply(204, "Detached (also when the session does not exist)."), BAD_REQUEST),
        params=(CLIENT_ID,),
    ),
    ("PATCH", "/session/<session_id>/metadata"): Operation(
        "Rename a session",
        (ok(t.MetadataResponse), BAD_REQUEST, NO_SESSION),
        body=t.MetadataRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("GET", "/session/<session_id>/budget"): Operation(
        "The session's token and cost usage and budget (tag `session_budget`)",
        (
            ok(OPEN_OBJECT, "`{sessionId, unbudgeted, usage, budget, exhausted, warnAt}`."),
            BAD_REQUEST,
            NO_SESSION,
        ),
        params=(CLIENT_ID,),
        description="Events: `budget_warning {dimension, spent, limit, fraction}` at 80% of a "
        "limit, `budget_exhausted {dimension, spent, limit}` at 100% (the running turn ends "
        'with `turn_error {code: "budget_exhausted"}`, prompts answer 402), '
        "`budget_updated` (the snapshot) after a PATCH. Agents that report no usage "
        "(`usage_update`, the prompt response's `usage`) are `unbudgeted: true`.",
    ),
    ("PATCH", "/session/<session_id>/budget"): Operation(
        "Set the session's budget: `maxTokens`, `maxCost` (null = no limit), `currency`",
        (ok(OPEN_OBJECT, "The budget snapshot."), BAD_REQUEST, NO_SESSION),
        body=OPEN_OBJECT,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/heartbeat"): Operation(
        "Mark this client alive (keeps the session from the idle reaper)",
        (ok(t.HeartbeatResponse), BAD_REQUEST, NO_SESSION),
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/model"): Operation(
        "Switch the session's model",
        (ok(OPEN_OBJECT, "The agent's answer."), BAD_REQUEST, NO_SESSION),
        body=t.SetModelRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/approval-mode"): Operation(
        "Change the session's approval mode",
        (ok(t.ApprovalModeResponse), BAD_REQUEST, NO_SESSION),
        body=t.ApprovalModeRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("GET", "/session/<session_id>/events"): Operation(
        "The session's event stream (Server-Sent Events)",
        (
            Reply(200, "`text/event-stream` of DaemonEvent envelopes.", t.SseEvent, SSE),
            err(400, "`invalid_max_queued` or `invalid_client_id`."),
            NO_SESSION,
            err(429, "`subscriber_limit_exceeded` (64 streams per session)."),
            err(503, "`connection_limit_exceeded` (`--max-connections` event streams)."),
        ),
        params=(
            q("maxQueued", {"type": "integer", "minimum": 16, "maximum": 2048}),
            q("snapshot", STRING, "`1` or `true`: send `session_snapshot` first (else not)."),
            h("Last-Event-ID", STRING, "Replay events after this id."),
            h(
                "X-Qwen-Event-Epoch",
                STRING,
                "The stream epoch `Last-Event-ID` counts in (`[A-Za-z0-9_-]{1,64}`; anything "
                "else is ignored).",
            ),
            CLIENT_ID,
        ),
        description="Each frame: `id: N`, `event: <type>`, `data: <DaemonEvent JSON>`; "
        "`: heartbeat` every 15 s. Reconnect with `Last-Event-ID` and `X-Qwen-Event-Epoch`. "
        "Agent pool events (tag `agent_idle_release`): `agent_released` "
        "(data `AgentReleasedEvent`) when an idle session lets its agent go, "
        "`agent_rebound` (data `AgentReboundEvent`) when it has one again. "
        "`agent_oom` (data `AgentOomEvent`): the agent child was killed for memory "
        "(`--agent-memory-max-mb`); the running prompt ends with `turn_error {code: "
        '"agent_oom"}`, then `session_restarted {reason: "agent_oom"}` or, past the restart '
        'intensity, `session_died {reason: "agent_oom"}`. '
        "`prompt_steered` (data `PromptSteeredEvent`): where a steer went; "
        "`pending_prompt_updated` (data `PendingPromptUpdatedEvent`): a queued prompt was "
        "replaced.",
    ),
    ("GET", "/session/<session_id>/context"): Operation(
        "The session's models, modes and config options",
        (ok(t.SessionContext), BAD_REQUEST, NO_SESSION),
        params=(CLIENT_ID,),
    ),
    ("GET", "/session/<session_id>/supported-commands"): Operation(
        "The agent's slash commands and the project skills",
        (ok(t.SupportedCommands), BAD_REQUEST, NO_SESSION),
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/branch"): Operation(
        "Branch the session: a new session with its conversation so far (tag `session_branch`)",
        (
            ok(OPEN_OBJECT, "The new session (`sessionId`, `branchedFrom`, ...).", 201),
            err(502, "`agent_error`: the agent's branch answer names no new session."),
        ),
        body=OPEN_OBJECT,
        params=(CLIENT_ID,),
    ),
    # -- permissions --------------------------------------------------------------------------
    ("POST", "/session/<session_id>/permission/<request_id>"): Operation(
        "Vote on a pending permission request of this session",
        (*_VOTE_REPLIES, NO_SESSION),
        body=t.PermissionVoteRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/permission/<request_id>"): Operation(
        "Vote on a pending permission request (legacy; session found from the id)",
        _VOTE_REPLIES,
        body=t.PermissionVoteRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/session/<session_id>/elicitation/<request_id>"): Operation(
        "Answer an agent's elicitation (ACP `elicitation/create`) of this session",
        (
            ok(t.VoteAccepted, "The answer resolved the request or was recorded (consensus)."),
            err(400, "`invalid_elicitation_response`: the answer does not fit the request."),
            err(403, "`elicitation_forbidden` (designated voter or loopback-only policy)."),
            err(404, "No pending elicitation with that id (already resolved, or unknown)."),
            NO_SESSION,
        ),
        body=t.ElicitationAnswer,
        body_required=True,
        params=(CLIENT_ID,),
        description="The request came as `elicitation_request {requestId, sessionId, mode, "
        "message, requestedSchema | url + elicitationId, toolCallId?}`; the mediation policy "
        "decides as for permissions (consensus counts equal contents together); the outcome "
        "is `elicitation_resolved {requestId, sessionId, action, content?, voterClientId?, "
        "reason?}`. Unanswered (timeout, cancelled or ended turn, closed session) the agent "
        'gets `{action: "cancel"}`. Tag `session_elicitation`.',
    ),
    # -- workspace files ----------------------------------------------------------------------
    ("GET", "/file"): Operation(
        "Read a text file (windowed by bytes or lines)",
        (ok(ReadTextResult),),
        params=(
            q("path", STRING, "Workspace-relative or absolute path inside it.", required=True),
            q("maxBytes", {"type": "integer", "minimum": 1, "maximum": 262144}),
            q("line", {"type": "integer", "minimum": 1}),
            q("limit", {"type": "integer", "minimum": 1, "maximum": 2000}),
        ),
    ),
    ("GET", "/file/bytes"): Operation(
        "Read a window of a file's bytes (base64)",
        (ok(ReadBytesResult), file_err(409, "The file changed during the read.")),
        params=(
            q("path", STRING, required=True),
            q("offset", {"type": "integer", "minimum": 0}),
            q("maxBytes", {"type": "integer", "minimum": 1, "maximum": 262144}),
        ),
    ),
    ("GET", "/stat"): Operation(
        "lstat a path", (ok(StatResult),), params=(q("path", STRING, required=True),)
    ),
    ("GET", "/list"): Operation(
        "List a directory",
        (ok(ListResult),),
        params=(q("path", STRING), q("includeIgnored", FLAG)),
    ),
    ("GET", "/glob"): Operation(
        "Find files by glob pattern",
        (ok(GlobResult),),
        params=(
            q("pattern", STRING, required=True),
            q("cwd", STRING),
            q("includeIgnored", FLAG),
            q("maxResults", {"type": "integer", "minimum": 1, "maximum": 50000}),
        ),
    ),
    ("POST", "/file/write"): Operation(
        "Create or replace a text file (atomic; `workspace_file_changed` event)",
        (
            ok(WriteResult, "Replaced."),
            ok(WriteResult, "Created.", 201),
            file_err(409, "`hash_mismatch` or `file_already_exists`."),
        ),
        body=t.FileWriteRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/file/edit"): Operation(
        "Replace one occurrence of a text in a file",
        (ok(EditResult), file_err(409, "`hash_mismatch`.")),
        body=t.FileEditRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    # -- workspace status and mutations -------------------------------------------------------
    ("GET", "/workspace/env"): Operation(
        "Runtime, platform, sandbox and proxy cells", (ok(t.StatusSnapshot),)
    ),
    ("GET", "/workspace/preflight"): Operation("Daemon and agent preflight cells", _SNAPSHOT),
    ("GET", "/workspace/mcp"): Operation("Configured MCP servers and budget cells", _SNAPSHOT),
    ("GET", "/workspace/skills"): Operation("Project skills", _SNAPSHOT),
    ("GET", "/workspace/providers"): Operation("The agent's models and auth methods", _SNAPSHOT),
    ("GET", "/workspace/permissions"): Operation(
        "Effective grants, approval policy and decision counters (read-only)",
        (ok(OPEN_OBJECT), BAD_REQUEST),
        params=(CLIENT_ID,),
    ),
    ("POST", "/workspace/init"): Operation(
        "Create the workspace memory file (QWEN.md)",
        (ok(t.InitResponse), BAD_REQUEST, err(409, "`workspace_init_conflict`.")),
        body=t.InitRequest,
        params=(CLIENT_ID,),
    ),
    ("POST", "/workspace/tools/<name>/enable"): Operation(
        "Enable or disable a tool (persisted in .qwen/settings.json)",
        (ok(t.ToolToggleResponse), BAD_REQUEST),
        body=t.ToolToggleRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("POST", "/workspace/mcp/<server>/restart"): Operation(
        "Restart an MCP server",
        (
            ok(t.McpRestartResponse),
            BAD_REQUEST,
            err(404, "`mcp_server_not_found` or `mcp_pool_entry_not_found`."),
            err(502, "`mcp_server_restart_failed`."),
            err(503, "`mcp_pool_unavailable`."),
        ),
        params=(q("entryIndex", STRING, "A pool entry index or `*`."), CLIENT_ID),
    ),
    # -- device flow --------------------------------------------------------------------------
    ("POST", "/workspace/auth/device-flow"): Operation(
        "Start (201) or attach to (200) a provider's device authorization flow",
        (
            ok(t.DeviceFlowView, "Attached to the pending flow."),
            ok(t.DeviceFlowView, "Started.", 201),
            BAD_REQUEST,
            err(409, "`too_many_active_flows`."),
            err(502, "`upstream_error`."),
            err(503, "`device_flow_unavailable`."),
        ),
        body=t.DeviceFlowStartRequest,
        body_required=True,
        params=(CLIENT_ID,),
    ),
    ("GET", "/workspace/auth/device-flow/<flow_id>"): Operation(
        "A device flow's state",
        (ok(t.DeviceFlowView), BAD_REQUEST, err(404, "`device_flow_not_found`.")),
        params=(CLIENT_ID,),
    ),
    ("DELETE", "/workspace/auth/device-flow/<flow_id>"): Operation(
        "Cancel a device flow",
        (Reply(204, "Cancelled."), BAD_REQUEST, err(404, "`device_flow_not_found`.")),
        params=(CLIENT_ID,),
    ),
    ("GET", "/workspace/auth/status"): Operation(
        "Pending device flows and supported providers",
        (ok(t.WorkspaceAuthStatus), BAD_REQUEST),
        params=(CLIENT_ID,),
    ),
    # -- this API's own description and pages (serve.http.routes.docs) -----------------------
    ("GET", "/openapi.json"): Operation(
        "This OpenAPI 3.1 document",
        (ok(OPEN_OBJECT, "The document (`x-advertised` per tag)."),),
        public=True,
    ),
    ("GET", "/doc"): Operation(
        "The API reference page (renders /openapi.json)",
        (Reply(200, "HTML.", str, HTML),),
        public=True,
    ),
    ("GET", "/demo"): Operation(
        "The demo client page (token pasted by the user)",
        (Reply(200, "HTML.", str, HTML),),
        public=True,
    ),
    ("GET", "/favicon.ico"): Operation("No icon", (Reply(204, "Nothing.", None),), public=True),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics (text exposition format 0.0.4)",
        (Reply(200, "The metrics.", str, TEXT),),
    ),
    # -- ACP over HTTP (serve.http.routes.acp); the twins under /workspaces/{workspace} share
    # these entries. Errors are JSON-RPC error replies (replies.py, family `acp`).
    ("POST", "/acp"): Operation(
        "Send one ACP JSON-RPC message (`initialize` answers inline; the others 202, or 200 "
        "with their reply on a qwen SDK connection)",
        (
            Reply(
                200,
                "The `initialize` result; the connection id in `Acp-Connection-Id`.",
                t.RpcResultReply,
                headers=("Acp-Connection-Id",),
            ),
            Reply(
                200,
                "On a connection of the published qwen SDK (`clientInfo.name` "
                "`qwen-code-sdk`): the request's JSON-RPC reply, result or error.",
                (t.RpcResultReply, ErrorReply),
            ),
            Reply(
                202,
                "Accepted: the reply comes on the connection or session stream (a "
                "notification, or any message of another client).",
            ),
            Reply(415, "`Content-Type` is not `application/json`.", ErrorReply),
            Reply(501, "A JSON-RPC batch (not supported).", ErrorReply),
        ),
        body=OPEN_OBJECT,
        body_required=True,
        params=(ACP_CONNECTION, ACP_SESSION),
    ),
    ("GET", "/acp"): Operation(
        "The connection stream, or with `Acp-Session-Id` a session stream (SSE)",
        (
            Reply(
                200,
                "`text/event-stream`: `data:` lines of JSON-RPC messages (`id: N` on session "
                "streams), `: heartbeat` every 15 s.",
                t.SseEvent,
                SSE,
                headers=("Acp-Connection-Id",),
            ),
            Reply(406, "`Accept` does not include `text/event-stream`.", ErrorReply),
        ),
        params=(
            ACP_CONNECTION,
            ACP_SESSION,
            h("Last-Event-ID", STRING, "Resume a session stream after this id."),
            h("X-Qwen-Event-Epoch", STRING),
        ),
    ),
    ("DELETE", "/acp"): Operation(
        "End an ACP connection and release what it held",
        (Reply(202, "Ended; its streams close."),),
        params=(ACP_CONNECTION,),
    ),
    ("POST", "/webhooks"): Operation(
        "Subscribe to signed webhooks (tag `webhooks`, docs/webhooks.md)",
        (
            ok(WebhookCreated, "The subscription with its `secret` (shown once).", 201),
            err(400, "`invalid_webhook` (`field`), or malformed JSON."),
            err(403, "`webhook_target_forbidden`: the allow-list refuses the URL's address."),
            err(404, "`session_not_found`: `sessionId` is not a live session of the caller."),
            err(409, "`webhook_limit`: too many subscriptions."),
        ),
        body=WebhookRequest,
        body_required=True,
    ),
    ("GET", "/webhooks"): Operation(
        "The caller's webhook subscriptions (an admin's: all), without secrets",
        (ok(WebhookList),),
    ),
    ("DELETE", "/webhooks/<webhook_id>"): Operation(
        "Remove a webhook subscription and the deliveries it is owed",
        (
            Reply(204, "Removed."),
            err(404, "`webhook_not_found` (also someone else's)."),
            err(409, "`webhook_from_config`: removed in the config file only."),
        ),
    ),
}

#: Wire types referenced outside operations (listed in ``components.schemas``).
EXTRA_SCHEMAS: Final = (
    t.DaemonEvent,
    EnvCell,
    PreflightCell,
    t.AgentReleasedEvent,
    t.AgentReboundEvent,
    t.AgentOomEvent,
    t.PromptSteeredEvent,
    t.PendingPromptUpdatedEvent,
)


_PLURAL: Final = re.compile(r"^/workspaces//?<path:workspace>(?P<rest>/.*)$")


def lookup(method: str, rule: str) -> Operation | None:
    """The entry for a route; a workspace-qualified twin (``/workspaces/<workspace>/X``)
    shares the entry of its primary-workspace route (``/X``, ``/workspace/X`` or
    ``/workspace/<workspace>/X``)."""
    found = CATALOG.get((method, rule))
    if found is not None:
        return found
    match = _PLURAL.match(rule)
    if match is None:
        return None
    rest = match["rest"]
    for twin in (rest, "/workspace" + rest, "/workspace/<path:workspace>" + rest):
        found = CATALOG.get((method, twin))
        if found is not None:
            return msgspec.structs.replace(
                found,
                summary=found.summary + " (in the named workspace)",
                description=f"The workspace-qualified form of `{method} {twin}`."
                + (" " + found.description if found.description else ""),
            )
    return None


def missing(routes: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The registered ``routes`` with no entry (documented generically)."""
    return sorted(r for r in routes if lookup(*r) is None)
