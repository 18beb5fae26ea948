"""The access rule of every REST route and every ``/acp`` method, in one table.

Enforcement reads this table and nothing else: the REST gate (``serve/http/access.py``,
a ``before_request`` hook installed only with multi-user auth) looks up the matched
``(METHOD, Quart rule)``; the ``/acp`` dispatch looks up the method. A route or method
missing here is refused (fail closed) and ``tests/access/test_rules.py`` fails, so a route
cannot ship without a rule; ``docs/access-rules.md`` is this table rendered
(:func:`markdown`), and the same test keeps the two equal.

Rules (what the caller needs):

``public``        nothing (probes, the API description, the capabilities preflight);
``any``           any authenticated principal (what it gets is its own: a new session);
``listing``       access to the workspace; the answer shows only what the caller may see;
``workspace``     access to the addressed workspace (files, shell-free reads);
``observer`` / ``collaborator`` / ``owner``
                  at least that role on the session the route or params name (someone
                  else's session: 404; a known one without the right: 403 ``need``);
``vote``          ``collaborator`` on the session the permission request belongs to;
``connection``    the ``/acp`` transport itself: each message is checked by its method;
``admin``         the daemon role ``admin`` (workspace- and daemon-wide mutations).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACP_READS",
    "ACP_RULES",
    "ADMIN",
    "ANY",
    "CONNECTION",
    "LISTING",
    "PROTECTS",
    "PUBLIC",
    "ROUTE_RULES",
    "RULES",
    "SESSION_RULES",
    "VOTE",
    "WORKSPACE",
    "canonical",
    "markdown",
]

PUBLIC = "public"
ANY = "any"
LISTING = "listing"
WORKSPACE = "workspace"
OBSERVER = "observer"
COLLABORATOR = "collaborator"
OWNER = "owner"
VOTE = "vote"
CONNECTION = "connection"
ADMIN = "admin"
RULES = (PUBLIC, ANY, LISTING, WORKSPACE, OBSERVER, COLLABORATOR, OWNER, VOTE, CONNECTION, ADMIN)
SESSION_RULES = frozenset({OBSERVER, COLLABORATOR, OWNER})

_S = "/session/<session_id>"
_W = "/workspaces/<path:workspace>"

ROUTE_RULES: Final[dict[tuple[str, str], str]] = {
    # probes, docs, preflight
    ("GET", "/health"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/capabilities"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/doc"): PUBLIC,
    ("GET", "/demo"): PUBLIC,
    ("GET", "/favicon.ico"): PUBLIC,
    # daemon-wide
    ("GET", "/metrics"): ADMIN,
    ("GET", "/daemon/status"): ADMIN,
    ("GET", "/daemon/audit"): ADMIN,
    ("POST", "/daemon/drain"): ADMIN,
    ("POST", "/daemon/bind"): ADMIN,
    # webhooks: any principal; the route checks the session it names is its own, and a
    # principal sees and removes only its own subscriptions (an admin: all)
    ("POST", "/webhooks"): ANY,
    ("GET", "/webhooks"): ANY,
    ("DELETE", "/webhooks/<webhook_id>"): ANY,
    # sessions
    ("POST", "/session"): ANY,
    ("GET", "/workspace/<path:workspace>/sessions"): LISTING,
    ("GET", f"{_W}/sessions"): LISTING,
    ("POST", f"{_S}/load"): OBSERVER,
    ("POST", f"{_S}/resume"): OBSERVER,
    ("GET", f"{_S}/events"): OBSERVER,
    ("GET", f"{_S}/context"): OBSERVER,
    ("GET", f"{_S}/context-usage"): OBSERVER,
    ("GET", f"{_S}/stats"): OBSERVER,
    ("GET", f"{_S}/tasks"): OBSERVER,
    ("GET", f"{_S}/lsp"): OBSERVER,
    ("GET", f"{_S}/hooks"): OBSERVER,
    ("GET", f"{_S}/rewind/snapshots"): OBSERVER,
    ("GET", f"{_S}/supported-commands"): OBSERVER,
    ("GET", f"{_S}/pending-prompts"): OBSERVER,
    ("GET", f"{_S}/budget"): OBSERVER,
    ("GET", f"{_S}/members"): OBSERVER,
    ("POST", f"{_S}/heartbeat"): OBSERVER,
    ("POST", f"{_S}/detach"): OBSERVER,
    ("POST", f"{_S}/prompt"): COLLABORATOR,
    ("POST", f"{_S}/cancel"): COLLABORATOR,
    ("PUT", f"{_S}/pending-prompts/<prompt_id>"): COLLABORATOR,
    ("DELETE", f"{_S}/pending-prompts/<prompt_id>"): COLLABORATOR,
    ("POST", f"{_S}/permission/<request_id>"): COLLABORATOR,
    ("POST", f"{_S}/elicitation/<request_id>"): COLLABORATOR,
    ("POST", f"{_S}/btw"): COLLABORATOR,
    ("POST", f"{_S}/recap"): COLLABORATOR,
    ("POST", f"{_S}/branch"): COLLABORATOR,
    ("POST", f"{_S}/shell"): COLLABORATOR,
    ("DELETE", _S): OWNER,
    ("PATCH", f"{_S}/metadata"): OWNER,
    ("POST", f"{_S}/model"): OWNER,
    ("POST", f"{_S}/approval-mode"): OWNER,
    ("POST", f"{_S}/language"): OWNER,
    ("POST", f"{_S}/rewind"): OWNER,
    ("PATCH", f"{_S}/budget"): OWNER,
    ("PUT", f"{_S}/members"): OWNER,
    ("POST", "/permission/<request_id>"): VOTE,
    ("GET", "/workspace/permissions"): LISTING,
    # the workspace: reads and the files
    ("GET", "/file"): WORKSPACE,
    ("GET", "/file/bytes"): WORKSPACE,
    ("GET", "/stat"): WORKSPACE,
    ("GET", "/list"): WORKSPACE,
    ("GET", "/glob"): WORKSPACE,
    ("POST", "/file/write"): WORKSPACE,
    ("POST", "/file/edit"): WORKSPACE,
    ("GET", "/workspace/env"): WORKSPACE,
    ("GET", "/workspace/preflight"): WORKSPACE,
    ("GET", "/workspace/mcp"): WORKSPACE,
    ("GET", "/workspace/skills"): WORKSPACE,
    ("GET", "/workspace/providers"): WORKSPACE,
    ("GET", "/workspace/memory"): WORKSPACE,
    ("GET", "/workspace/settings"): WORKSPACE,
    ("GET", "/workspace/auth/status"): WORKSPACE,
    # workspace-wide mutations: what every agent of the workspace runs or knows
    ("POST", "/workspace/settings"): ADMIN,
    ("POST", "/workspace/memory"): ADMIN,
    ("POST", "/workspace/reload"): ADMIN,
    ("POST", "/workspace/init"): ADMIN,
    ("POST", "/workspace/tools/<name>/enable"): ADMIN,
    ("POST", "/workspace/mcp/<server>/restart"): ADMIN,
    ("POST", "/workspace/auth/device-flow"): ADMIN,
    ("GET", "/workspace/auth/device-flow/<flow_id>"): ADMIN,
    ("DELETE", "/workspace/auth/device-flow/<flow_id>"): ADMIN,
    # the workspace-qualified forms of the same routes
    ("GET", f"{_W}/file"): WORKSPACE,
    ("GET", f"{_W}/file/bytes"): WORKSPACE,
    ("GET", f"{_W}/stat"): WORKSPACE,
    ("GET", f"{_W}/list"): WORKSPACE,
    ("GET", f"{_W}/glob"): WORKSPACE,
    ("POST", f"{_W}/file/write"): WORKSPACE,
    ("POST", f"{_W}/file/edit"): WORKSPACE,
    ("GET", f"{_W}/env"): WORKSPACE,
    ("GET", f"{_W}/preflight"): WORKSPACE,
    ("GET", f"{_W}/mcp"): WORKSPACE,
    ("GET", f"{_W}/skills"): WORKSPACE,
    ("GET", f"{_W}/providers"): WORKSPACE,
    ("POST", f"{_W}/init"): ADMIN,
    ("POST", f"{_W}/tools/<name>/enable"): ADMIN,
    # ACP transport: every message is checked by its method (ACP_RULES)
    ("POST", "/acp"): CONNECTION,
    ("GET", "/acp"): CONNECTION,
    ("DELETE", "/acp"): CONNECTION,
    ("WS", "/acp"): CONNECTION,
    ("POST", f"{_W}/acp"): CONNECTION,
    ("GET", f"{_W}/acp"): CONNECTION,
    ("DELETE", f"{_W}/acp"): CONNECTION,
    ("WS", f"{_W}/acp"): CONNECTION,
}

ACP_RULES: Final[dict[str, str]] = {
    "initialize": ANY,
    "session/new": ANY,
    "session/list": LISTING,
    "session/load": OBSERVER,
    "session/resume": OBSERVER,
    "_qwen/session/heartbeat": OBSERVER,
    "_qwen/session/detach": OBSERVER,
    "_qwen/session/context": OBSERVER,
    "_qwen/session/supported_commands": OBSERVER,
    "session/prompt": COLLABORATOR,
    "session/cancel": COLLABORATOR,
    "_session/steering": COLLABORATOR,
    "session/fork": COLLABORATOR,
    "session/permission": VOTE,
    "session/set_mode": OWNER,
    "session/set_model": OWNER,
    "session/set_config_option": OWNER,
    "_qwen/session/update_metadata": OWNER,
    "session/close": OWNER,
    "session/delete": OWNER,
    "authenticate": ADMIN,
    "logout": ADMIN,
    "_qwen/status": ADMIN,
    "_qwen/health": ANY,
    "_qwen/file/read": WORKSPACE,
    "_qwen/file/read_bytes": WORKSPACE,
    "_qwen/file/stat": WORKSPACE,
    "_qwen/file/list": WORKSPACE,
    "_qwen/file/glob": WORKSPACE,
    "_qwen/file/write": WORKSPACE,
    "_qwen/file/edit": WORKSPACE,
    "_qwen/workspace/env": WORKSPACE,
    "_qwen/workspace/preflight": WORKSPACE,
    "_qwen/workspace/mcp": WORKSPACE,
    "_qwen/workspace/skills": WORKSPACE,
    "_qwen/workspace/providers": WORKSPACE,
}


#: ACP methods that change nothing (the audit log records every other message's outcome).
ACP_READS: Final = frozenset(
    {
        "session/list",
        "_qwen/session/heartbeat",
        "_qwen/session/context",
        "_qwen/session/supported_commands",
        "_qwen/status",
        "_qwen/health",
        "_qwen/file/read",
        "_qwen/file/read_bytes",
        "_qwen/file/stat",
        "_qwen/file/list",
        "_qwen/file/glob",
        "_qwen/workspace/env",
        "_qwen/workspace/preflight",
        "_qwen/workspace/mcp",
        "_qwen/workspace/skills",
        "_qwen/workspace/providers",
    }
)


def canonical(rule: str) -> str:
    """A Quart rule as the table spells it: the ``%2F``-encoded twins (``//<path:...>``)
    share their rule with the plain form."""
    return rule.replace("/workspaces//<path:workspace>", _W).replace(
        "/workspace//<path:workspace>", "/workspace/<path:workspace>"
    )


def markdown() -> str:
    """``docs/access-rules.md``: both tables, in the order above."""
    lines = [
        "# Access rules: every route and ACP method, and what it needs",
        "",
        "Generated from `serve/access/rules.py` (`python -m serve.access.rules > "
        "docs/access-rules.md`); `tests/access/test_rules.py` fails when a route or an ACP "
        "method has no rule or this page differs. Rules apply only with multi-user auth "
        "(`--auth-*`); without it the one token is `admin`. See "
        "[multi-user.md](multi-user.md) for what each rule means.",
        "",
        "| rule | what it protects |",
        "|---|---|",
        *(f"| {rule} | {why} |" for rule, why in PROTECTS.items()),
        "",
        "| method | route | rule |",
        "|---|---|---|",
    ]
    lines += [f"| {m} | `{r}` | {rule} |" for (m, r), rule in ROUTE_RULES.items()]
    lines += ["", "| ACP method | rule |", "|---|---|"]
    lines += [f"| `{m}` | {rule} |" for m, rule in ACP_RULES.items()]
    return "\n".join(lines) + "\n"


#: What each rule protects (the first table of ``docs/access-rules.md``; the details in
#: ``docs/multi-user.md``).
PROTECTS: Final[dict[str, str]] = {
    PUBLIC: "nothing: probes and descriptions; `/health?deep=1`'s daemon-wide counts are "
    'shown to `admin` only (others get `{"status":"ok"}`)',
    ANY: "the daemon from anonymous callers; what is made (a session) is the caller's own, "
    "charged to its own quotas",
    LISTING: "other users' sessions: only what the caller holds a role on is listed, and "
    "the permission counters are those of the caller's sessions",
    WORKSPACE: "a restricted workspace (`access.workspaces`): to a principal without access "
    "it answers exactly as one the daemon does not serve; writes of files that steer agents "
    "(`QWEN.md`, `AGENTS.md`, `.qwen/` ...: `serve/access/steering_files.py`) need `admin`, "
    "as the memory and settings routes",
    OBSERVER: "a session's events, context and files: someone else's session answers as an "
    "unknown id (`404 session_not_found`; detach: the no-op `204`; `/acp`: "
    "`session_not_owned`); its streams end when the role is removed or the token revoked",
    COLLABORATOR: "a session's turns, queue, votes and shell from observers; each turn, "
    "steer and model query is charged to the principal's quotas and budgets",
    OWNER: "a session's settings, members, budget and life (close, delete, rewind)",
    VOTE: "a permission request by id: another user's answers as an unknown request",
    CONNECTION: "an `/acp` connection: bound to its creator's address and credential; each "
    "message checked by its method; its end is audited with the sessions it released",
    ADMIN: "what every user's agents run or know (settings, memory, tools, MCP, login) and "
    "the daemon itself (status, metrics, audit log, drain, bind)",
}


if __name__ == "__main__":
    print(markdown(), end="")
