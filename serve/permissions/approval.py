"""Approval policy: does a granted effect run automatically, need a human, or get refused?

Theory of operation
-------------------
Every effect an agent asks of the daemon (``fs/read_text_file``, ``fs/write_text_file``,
``terminal/create``, later MCP connects...) is first *classified* into an ``Effect``: the
capability it needs, its target, whether the target lies in the workspace, whether it is
sensitive, its risk (``low < medium < high < critical``) and a *guard floor*, the minimum
verdict the classifier itself demands (a sensitive read is at least ``prompt``; a command
that runs workspace code or passes an explicit environment is at least ``prompt``/high; a
hardline command such as ``rm -rf /`` is ``deny``/critical).

``decide(effect, grants, approval, mode)`` then computes the verdict, ordered
``auto < prompt < deny``:

1. the capability (and every ``secret.bind:<ENV>`` the effect binds) must be granted for the
   target's scope, else ``deny`` (rule ``grant:<capability>``);
2. otherwise the verdict is the **maximum** of, in this order: the guard floor; the approval
   mode (``plan``: writes/exec denied; ``default``: writes/exec prompt; ``auto-edit``:
   in-workspace writes auto; ``auto``/``yolo``: auto); ``approval.default``;
   ``approval.tools[tool]``; every ``approval.capabilities`` key matching the capability
   (exact or prefix wildcard); every ``approval.risks`` entry at or below the effect's risk;
   and ``prompt`` when a secret is bound (a secret always needs a one-time approval).

Taking the maximum makes the policy monotonic: a later ``auto`` (config default, ``yolo``
mode) can never weaken a ``prompt`` or ``deny`` from anywhere else. The decisive ``rule`` is
the first component (in the order above) that reached the final verdict; together with the
effect's ``subject`` it forms ``Decision.cache_rule`` for ``always_allow_for_session``.

Paths are compared lexically (``posixpath.normpath``): callers must pass paths already
resolved with ``realpath`` (that is I/O, done by the caller in a thread) so a symlink cannot
escape. A relative path is treated as outside the workspace (ACP requires absolute paths).
Everything here is pure; classification errors (malformed ACP params) raise ``ValueError``
naming the agent's bad field.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Sequence

import msgspec

from serve.permissions.config import (
    RISKS,
    VERDICTS,
    ApprovalConfig,
    ApprovalMode,
    Risk,
    Verdict,
)
from serve.permissions.grants import SECRET_PREFIX, EffectiveGrants

__all__ = [
    "SENSITIVE_BASENAMES",
    "TOOL_READ",
    "TOOL_TERMINAL",
    "TOOL_WRITE",
    "Decision",
    "Effect",
    "classify_read",
    "classify_write",
    "command_config_reason",
    "decide",
    "describe_policy",
    "effect_fingerprint",
    "max_risk",
    "max_verdict",
    "mode_verdict",
    "norm",
    "path_in_workspace",
    "policy_fingerprint",
    "sensitive_reason",
    "within",
]

TOOL_READ = "read_text_file"
TOOL_WRITE = "write_text_file"
TOOL_TERMINAL = "terminal"

_VRANK = {v: i for i, v in enumerate(VERDICTS)}
_RRANK = {r: i for i, r in enumerate(RISKS)}


def max_verdict(*verdicts: Verdict) -> Verdict:
    """The strictest of ``verdicts`` (``auto`` if none)."""
    return max(verdicts, key=_VRANK.__getitem__, default="auto")


def max_risk(a: Risk, b: Risk) -> Risk:
    return a if _RRANK[a] >= _RRANK[b] else b


class Effect(msgspec.Struct, frozen=True):
    """One classified effect. ``floor`` is the classifier's minimum verdict."""

    capability: str
    tool: str
    target: str | None = None
    in_workspace: bool = True
    sensitive: bool = False
    risk: Risk = "low"
    env_names: tuple[str, ...] = ()  # explicit environment overlay (names only)
    secrets: tuple[str, ...] = ()  # Host env secrets to bind: each needs secret.bind:<NAME>
    floor: Verdict = "auto"
    floor_rule: str = "none"
    floor_reason: str = ""
    subject: str = ""  # what an always-allow covers: "" (the class), a path, command heads


class Decision(msgspec.Struct, frozen=True):
    """The verdict for one effect, the rule that decided it and why."""

    verdict: Verdict
    rule: str
    reason: str
    capability: str
    risk: Risk
    cacheable: bool  # may an allow_always answer be cached for the session?
    cache_rule: str  # the rule key an always_allow_for_session is bound to


# -- paths ---------------------------------------------------------------------------------


def norm(path: str) -> str:
    return posixpath.normpath(path) if path else path


def within(path: str, root: str) -> bool:
    root = norm(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def path_in_workspace(path: str, workspace_roots: Sequence[str]) -> bool:
    """Lexically, is absolute ``path`` inside one of ``workspace_roots``? Relative: no."""
    if not path.startswith("/"):
        return False
    p = norm(path)
    return any(within(p, r) for r in workspace_roots if r.startswith("/"))


SENSITIVE_BASENAMES: frozenset[str] = frozenset(
    {
        ".env",
        ".netrc",
        "_netrc",
        ".git-credentials",
        ".npmrc",
        ".pypirc",
        ".pgpass",
        ".htpasswd",
        ".bash_history",
        ".zsh_history",
        "id_rsa",
        "id_dsa",
        "id_ecdsa",
        "id_ed25519",
        "credentials.json",
        "authorized_keys",
        "shadow",
        "gshadow",
        "sudoers",
    }
)
_SENSITIVE_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".kdbx", ".ppk")
_SENSITIVE_DIRS = frozenset({".ssh", ".gnupg", ".aws", ".kube", "sudoers.d"})
_SENSITIVE_TAILS = (
    ".git/config",
    ".docker/config.json",
    ".config/gh/hosts.yml",
    ".config/gcloud",
    "ssl/private",
)
_ENV_TEMPLATES = (".example", ".sample", ".template", ".dist", ".defaults")
_PROC_ENVIRON = re.compile(r"^/proc/[^/]+/environ$")


def sensitive_reason(path: str) -> str | None:
    """Why ``path`` is sensitive (a short rule name), or ``None``. Works on relative paths.

    Covers env files (``.env``, ``.env.local``; not ``.env.example``), SSH/GPG/cloud
    credentials, private keys and certificates, ``.git/config`` (remote URLs may embed
    credentials), ``.netrc``-style files, ``/etc/shadow`` and ``/proc/*/environ``.
    """
    p = norm(path)
    parts = [c for c in p.split("/") if c not in ("", ".")]
    if not parts:
        return None
    base = parts[-1]
    if _PROC_ENVIRON.match(p):
        return "proc_environ"
    if base in SENSITIVE_BASENAMES:
        return f"sensitive_file:{base}"
    if base.startswith(".env.") and not base.endswith(_ENV_TEMPLATES):
        return "sensitive_file:.env.*"
    if base.endswith(_SENSITIVE_SUFFIXES):
        return f"sensitive_file:*{posixpath.splitext(base)[1]}"
    for d in parts[:-1]:
        if d in _SENSITIVE_DIRS:
            return f"sensitive_dir:{d}/"
    if base in _SENSITIVE_DIRS:
        return f"sensitive_dir:{base}/"
    joined = "/".join(parts)
    for tail in _SENSITIVE_TAILS:
        if joined == tail or joined.endswith("/" + tail) or ("/" + tail + "/") in ("/" + joined):
            return f"sensitive_path:{tail}"
    return None


# -- file effects --------------------------------------------------------------------------


def classify_read(path: str, workspace_roots: Sequence[str]) -> Effect:
    """``fs/read_text_file`` → ``fs.read``; outside or sensitive → at least ``prompt``."""
    in_ws = path_in_workspace(path, workspace_roots)
    why = sensitive_reason(path)
    if why is not None:
        return Effect(
            "fs.read", TOOL_READ, norm(path), in_ws, True, "high", floor="prompt",
            floor_rule=why, floor_reason=f"reading a sensitive file ({why})", subject=norm(path),
        )  # fmt: skip
    if not in_ws:
        return Effect(
            "fs.read", TOOL_READ, norm(path), False, False, "medium", floor="prompt",
            floor_rule="outside_workspace", floor_reason="reading outside the workspace",
            subject=norm(path),
        )  # fmt: skip
    return Effect("fs.read", TOOL_READ, norm(path), True, False, "low")


#: Files the daemon itself reads commands from (``serve/mcp/config.py``: the MCP servers the
#: pool starts), wherever they are (a workspace's or HOME's). Writing one is running a command.
COMMAND_CONFIG_TAILS: tuple[str, ...] = (".qwen/settings.json",)


def command_config_reason(path: str) -> str | None:
    """``command_config:<tail>`` when ``path`` is a file the daemon runs commands from."""
    p = norm(path)
    for tail in COMMAND_CONFIG_TAILS:
        if p == tail or p.endswith("/" + tail):
            return f"command_config:{tail}"
    return None


def classify_write(path: str, workspace_roots: Sequence[str]) -> Effect:
    """``fs/write_text_file`` → ``fs.write``; outside (if granted at all) or sensitive →
    at least ``prompt``/high. Without an ``any``-scoped grant an outside write is denied.

    A file the daemon reads commands from (:data:`COMMAND_CONFIG_TAILS`) is
    ``terminal.exec``, high, with a ``prompt`` floor in every approval mode: only a client's
    explicit answer (once, or always for that path) lets it through."""
    in_ws = path_in_workspace(path, workspace_roots)
    cmd = command_config_reason(path)
    if cmd is not None:
        return Effect(
            "terminal.exec", TOOL_WRITE, norm(path), in_ws, True, "high", floor="prompt",
            floor_rule=cmd, subject=norm(path),
            floor_reason=f"writing a file the daemon runs commands from ({cmd})",
        )  # fmt: skip
    why = sensitive_reason(path)
    if why is not None:
        return Effect(
            "fs.write", TOOL_WRITE, norm(path), in_ws, True, "high", floor="prompt",
            floor_rule=why, floor_reason=f"writing a sensitive file ({why})", subject=norm(path),
        )  # fmt: skip
    if not in_ws:
        return Effect(
            "fs.write", TOOL_WRITE, norm(path), False, False, "high", floor="prompt",
            floor_rule="outside_workspace", floor_reason="writing outside the workspace",
            subject=norm(path),
        )  # fmt: skip
    return Effect("fs.write", TOOL_WRITE, norm(path), True, False, "medium")


# -- decision ------------------------------------------------------------------------------


def mode_verdict(mode: ApprovalMode, effect: Effect) -> Verdict:
    """What the session's approval mode alone says about ``effect``."""
    cap = effect.capability
    if cap == "fs.read":
        return "auto"
    if mode in ("auto", "yolo"):
        return "auto"
    if mode == "plan":
        return "deny" if cap in ("fs.write", "terminal.exec") else "prompt"
    if mode == "auto-edit" and cap == "fs.write" and effect.in_workspace:
        return "auto"
    return "prompt"


def _approval_cap_matches(key: str, capability: str) -> bool:
    return key == capability or (key.endswith("*") and capability.startswith(key[:-1]))


def decide(
    effect: Effect, grants: EffectiveGrants, approval: ApprovalConfig, mode: ApprovalMode
) -> Decision:
    """The verdict for ``effect`` (see the module docstring for the exact order)."""
    checks = [grants.check(effect.capability, in_workspace=effect.in_workspace)]
    checks += [grants.check(SECRET_PREFIX + s) for s in effect.secrets]
    for chk in checks:
        if not chk.granted:
            rule = f"grant:{chk.capability}"
            return Decision("deny", rule, chk.reason, effect.capability, effect.risk, False, rule)

    comps: list[tuple[str, Verdict, str]] = [
        (f"guard:{effect.floor_rule}", effect.floor, effect.floor_reason or "classifier floor"),
        (f"mode:{mode}", mode_verdict(mode, effect), f"approval mode {mode}"),
    ]
    if approval.default is not None:
        comps.append(("approval.default", approval.default, "approval.default"))
    if effect.tool in approval.tools:
        comps.append(
            (f"approval.tools.{effect.tool}", approval.tools[effect.tool], "approval.tools")
        )
    caps = [effect.capability, *(SECRET_PREFIX + s for s in effect.secrets)]
    for key, verdict in approval.capabilities.items():
        if any(_approval_cap_matches(key, c) for c in caps):
            comps.append((f"approval.capabilities.{key}", verdict, "approval.capabilities"))
    for level in RISKS[: _RRANK[effect.risk] + 1]:
        if level in approval.risks:
            comps.append((f"approval.risks.{level}", approval.risks[level], "approval.risks"))
    if effect.secrets:
        comps.append(("secret.bind", "prompt", "binding a Host secret needs a one-time approval"))

    verdict = max_verdict(*(v for _, v, _ in comps))
    rule, _, reason = next(c for c in comps if c[1] == verdict)
    if rule.startswith("guard:") and verdict != "auto":
        reason = effect.floor_reason or reason
    cacheable = (
        verdict == "prompt"
        and not effect.secrets
        and not effect.capability.startswith(SECRET_PREFIX)
    )
    cache_rule = f"{effect.capability}|{rule}|{effect.subject}"
    if effect.secrets:  # marks the rule so ApprovalCache.remember refuses it
        cache_rule += "|" + ",".join(SECRET_PREFIX + x for x in effect.secrets)
    return Decision(verdict, rule, reason, effect.capability, effect.risk, cacheable, cache_rule)


# -- fingerprints and views ----------------------------------------------------------------

_ENC = msgspec.json.Encoder(order="sorted")


def policy_fingerprint(
    grants: EffectiveGrants, approval: ApprovalConfig, mode: ApprovalMode
) -> str:
    """A stable hash of the effective policy; any change invalidates cached allows."""
    blob = _ENC.encode({"v": 1, "grants": grants.table, "approval": approval, "mode": mode})
    return hashlib.sha256(blob).hexdigest()[:32]


def effect_fingerprint(effect: Effect) -> str:
    """A stable hash of one effect (for sharing a decision among identical requests)."""
    return hashlib.sha256(_ENC.encode(effect)).hexdigest()[:32]


def describe_policy(
    grants: EffectiveGrants, approval: ApprovalConfig, mode: ApprovalMode
) -> dict[str, object]:
    """JSON-ready effective policy for ``GET /workspace/permissions`` (no secret values)."""
    return {
        "approvalMode": mode,
        "grants": grants.to_public(),
        "approval": msgspec.to_builtins(approval),
        "fingerprint": policy_fingerprint(grants, approval, mode),
    }
