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
import shlex
from collections.abc import Mapping, Sequence

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
    "classify_acp_request",
    "classify_read",
    "classify_terminal",
    "classify_write",
    "command_config_reason",
    "decide",
    "describe_policy",
    "effect_fingerprint",
    "max_verdict",
    "mode_verdict",
    "path_in_workspace",
    "policy_fingerprint",
    "sensitive_reason",
]

TOOL_READ = "read_text_file"
TOOL_WRITE = "write_text_file"
TOOL_TERMINAL = "terminal"

_VRANK = {v: i for i, v in enumerate(VERDICTS)}
_RRANK = {r: i for i, r in enumerate(RISKS)}


def max_verdict(*verdicts: Verdict) -> Verdict:
    """The strictest of ``verdicts`` (``auto`` if none)."""
    return max(verdicts, key=_VRANK.__getitem__, default="auto")


def _max_risk(a: Risk, b: Risk) -> Risk:
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


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path else path


def _within(path: str, root: str) -> bool:
    root = _norm(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def path_in_workspace(path: str, workspace_roots: Sequence[str]) -> bool:
    """Lexically, is absolute ``path`` inside one of ``workspace_roots``? Relative: no."""
    if not path.startswith("/"):
        return False
    p = _norm(path)
    return any(_within(p, r) for r in workspace_roots if r.startswith("/"))


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
    p = _norm(path)
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
            "fs.read", TOOL_READ, _norm(path), in_ws, True, "high", floor="prompt",
            floor_rule=why, floor_reason=f"reading a sensitive file ({why})", subject=_norm(path),
        )  # fmt: skip
    if not in_ws:
        return Effect(
            "fs.read", TOOL_READ, _norm(path), False, False, "medium", floor="prompt",
            floor_rule="outside_workspace", floor_reason="reading outside the workspace",
            subject=_norm(path),
        )  # fmt: skip
    return Effect("fs.read", TOOL_READ, _norm(path), True, False, "low")


#: Files the daemon itself reads commands from (``serve/mcp/config.py``: the MCP servers the
#: pool starts), wherever they are (a workspace's or HOME's). Writing one is running a command.
COMMAND_CONFIG_TAILS: tuple[str, ...] = (".qwen/settings.json",)


def command_config_reason(path: str) -> str | None:
    """``command_config:<tail>`` when ``path`` is a file the daemon runs commands from."""
    p = _norm(path)
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
            "terminal.exec", TOOL_WRITE, _norm(path), in_ws, True, "high", floor="prompt",
            floor_rule=cmd, subject=_norm(path),
            floor_reason=f"writing a file the daemon runs commands from ({cmd})",
        )  # fmt: skip
    why = sensitive_reason(path)
    if why is not None:
        return Effect(
            "fs.write", TOOL_WRITE, _norm(path), in_ws, True, "high", floor="prompt",
            floor_rule=why, floor_reason=f"writing a sensitive file ({why})", subject=_norm(path),
        )  # fmt: skip
    if not in_ws:
        return Effect(
            "fs.write", TOOL_WRITE, _norm(path), False, False, "high", floor="prompt",
            floor_rule="outside_workspace", floor_reason="writing outside the workspace",
            subject=_norm(path),
        )  # fmt: skip
    return Effect("fs.write", TOOL_WRITE, _norm(path), True, False, "medium")


# -- terminal guard ------------------------------------------------------------------------

_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish", "ash", "csh", "tcsh"})
# interpreters / build tools: running them executes workspace (project) code
_CODE_RUNNERS = frozenset(
    {
        "python", "python2", "python3", "pypy", "pypy3", "node", "nodejs", "deno", "bun",
        "bunx", "ruby", "perl", "php", "lua", "java", "make", "gmake", "cmake", "ninja",
        "bazel", "meson", "pytest", "py.test", "tox", "nox", "gradle", "gradlew", "mvn",
        "mvnw", "dotnet", "swift", "mix", "elixir", "julia", "rscript", "npm", "npx",
        "pnpm", "yarn", "rake", "bundle", "composer", "source", ".", "just", "task",
        "invoke", "pre-commit", "jest", "vitest", "tsc", "ts-node", "tsx",
    }
)  # fmt: skip
# tools that run project code only for some subcommands
_CODE_SUBCOMMANDS: dict[str, frozenset[str]] = {
    "cargo": frozenset({"run", "test", "build", "bench", "check", "clippy", "install", "doc"}),
    "go": frozenset({"run", "test", "build", "generate", "install"}),
    "pip": frozenset({"install", "wheel", "download"}),
    "pip3": frozenset({"install", "wheel", "download"}),
    "uv": frozenset({"run", "pip", "sync", "build", "tool"}),
    "poetry": frozenset({"run", "install", "build"}),
    "git": frozenset(  # these run repository hooks
        {"commit", "push", "merge", "rebase", "checkout", "switch", "pull", "am", "cherry-pick"}
    ),
}
# a cached always-allow covers "<head> <subcommand>" for these, "<head>" for the rest
_SUBJECT_WITH_SUB = frozenset(
    {*_CODE_SUBCOMMANDS, "npm", "pnpm", "yarn", "npx", "bunx", "make", "docker", "kubectl",
     "dotnet", "gradle", "mvn", "just", "task"}
)  # fmt: skip
_PRIVILEGE = frozenset({"sudo", "su", "doas", "pkexec"})
_NETWORK = frozenset(
    {"curl", "wget", "nc", "ncat", "netcat", "socat", "ssh", "scp", "sftp", "rsync", "ftp",
     "telnet"}
)  # fmt: skip
_DANGEROUS = frozenset(
    {"dd", "kill", "pkill", "killall", "eval", "crontab", "systemctl", "launchctl", "iptables",
     "mount", "umount", "chattr", "shred", "truncate", "mkfifo"}
)  # fmt: skip
_HARDLINE_HEADS = frozenset(
    {"shutdown", "reboot", "halt", "poweroff", "fdisk", "sfdisk", "parted", "wipefs"}
)
_WRAPPERS = frozenset({"nohup", "time", "nice", "command", "builtin", "exec", "xargs", "stdbuf"})
_NEUTRAL_PATHS = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/zero", "/tmp")
_FORK_BOMB = re.compile(r":\s*\(\s*\)\s*\{[^}]*:\s*\|\s*:\s*&")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEP_TOKENS = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&", ";;", "\n"})
_REDIRECTS = frozenset({">", ">>", "<", ">|", "&>", "&>>", "2>", "2>>", "<<<"})


# findings whose always-allow may cover a command class (its heads); any other finding
# binds a cached allow to the exact command text
_CLASS_RULES = frozenset({"workspace_code"})


class _Finding(msgspec.Struct, frozen=True):
    risk: Risk
    rule: str
    reason: str


def _tokens(text: str) -> list[str]:
    text = text.replace("$(", " ( ").replace("`", " ; ")
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = ""
        return list(lex)
    except ValueError:  # unbalanced quotes: fall back to a conservative split
        return re.findall(r"[;&|()<>]+|[^\s;&|()<>]+", text)


def _segments(text: str) -> tuple[list[list[str]], list[str]]:
    """Split a shell text into simple commands, and collect redirect targets."""
    segs: list[list[str]] = [[]]
    redirect_targets: list[str] = []
    toks = _tokens(text)
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok in _SEP_TOKENS or (tok and set(tok) <= set(";&|()")):
            segs.append([])
        elif tok in _REDIRECTS or (tok and set(tok) <= set("<>&")):
            if i + 1 < len(toks) and tok not in ("<", "<<<"):
                redirect_targets.append(toks[i + 1])
            i += 1
        else:
            segs[-1].append(tok)
        i += 1
    return [s for s in segs if s], redirect_targets


def _is_pathlike(tok: str) -> bool:
    return tok.startswith(("/", "~", "$HOME", "${HOME}")) or "/" in tok or tok.startswith(".")


def _resolve(tok: str, cwd: str) -> str:
    if tok.startswith(("~", "$HOME", "${HOME}")):
        return "/~home"  # never inside a workspace
    return _norm(tok if tok.startswith("/") else posixpath.join(cwd, tok))


def _path_findings(tok: str, cwd: str, roots: Sequence[str]) -> list[_Finding]:
    if "=" in tok and tok.startswith("-"):
        tok = tok.split("=", 1)[1]
    tok = tok.lstrip("@")
    if not tok:
        return []
    why = sensitive_reason(tok)
    if why is not None:
        return [_Finding("high", why, f"the command touches a sensitive file ({tok})")]
    if not _is_pathlike(tok):
        return []
    path = _resolve(tok, cwd)
    if any(_within(path, n) for n in _NEUTRAL_PATHS):
        return []
    if not path_in_workspace(path, roots):
        return [_Finding("high", "outside_workspace", f"the command touches {tok} outside")]
    return []


def _is_root_target(tok: str) -> bool:
    if tok in ("~", "~/", "$HOME", "${HOME}", "/*", "~/*", "$HOME/", "${HOME}/"):
        return True
    if tok.startswith("/"):
        p = _norm(tok)
        return p == "/" or p.count("/") == 1  # "/" or a top-level directory such as /etc
    return False


def _short_flags(args: list[str]) -> str:
    return "".join(a[1:] for a in args if a.startswith("-") and not a.startswith("--"))


def _segment_findings(
    seg: list[str], cwd: str, roots: Sequence[str], depth: int
) -> tuple[list[_Finding], str]:
    """Findings for one simple command, and its subject ("git commit", "ls").

    Leading ``VAR=x`` assignments, ``env`` and privilege escalation are findings of their
    own; wrappers (``nohup``, ``time``, ``xargs``...) are skipped. Because a wrapper's own
    options cannot be told from the wrapped command without knowing every wrapper, after a
    wrapper every later word is also tried as the head (bounded), so ``nice -n 5 rm -rf /``
    is still seen as ``rm -rf /``.
    """
    out: list[_Finding] = []
    wrapped = False
    i = 0
    while i < len(seg):
        tok = seg[i]
        base = posixpath.basename(tok)
        if _ASSIGN.match(tok):
            out.append(_Finding("high", "env_overlay", f"the command sets {tok.split('=')[0]}"))
        elif base in _PRIVILEGE:
            out.append(_Finding("high", "privilege", f"the command escalates with {tok}"))
            wrapped = True
        elif base == "env":
            out.append(_Finding("high", "env_overlay", "the command runs under env"))
            wrapped = True
        elif base in _WRAPPERS or base == "timeout":
            wrapped = True
        elif not (wrapped and tok.startswith("-")):
            break
        i += 1
    if i >= len(seg):
        return out, ""
    for a in seg[i + 1 :]:
        out += _path_findings(a, cwd, roots)
    found, subject = _command_findings(seg[i:], cwd, roots, depth)
    out += found
    if wrapped:
        subject = shlex.join(seg)  # wrapper options are opaque: cache the exact command
        heads = [k for k in range(i + 1, len(seg)) if not seg[k].startswith("-")][:16]
        for k in heads:
            out += _command_findings(seg[k:], cwd, roots, depth)[0]
    return out, subject


def _command_findings(
    cmd: list[str], cwd: str, roots: Sequence[str], depth: int
) -> tuple[list[_Finding], str]:
    out: list[_Finding] = []
    raw_head, args = cmd[0], cmd[1:]
    head = posixpath.basename(raw_head).lower()
    sub = next((a for a in args if not a.startswith("-")), "")
    subject = f"{head} {sub}" if head in _SUBJECT_WITH_SUB and sub else head
    version_probe = args in (["--version"], ["-V"], ["-v"], ["version"], ["--help"])

    if head in _HARDLINE_HEADS or head.startswith("mkfs") or (head == "init" and sub in ("0", "6")):
        out.append(_Finding("critical", f"hardline:{head}", f"{head} is never allowed"))
    elif head == "rm":
        short = _short_flags(args)
        recursive = "r" in short or "R" in short or "--recursive" in args
        force = "f" in short or "--force" in args
        targets = [a for a in args if not a.startswith("-")]
        if recursive and any(_is_root_target(t) for t in targets):
            out.append(_Finding("critical", "hardline:rm_root", "recursive rm of a root path"))
        elif recursive or force:
            out.append(_Finding("high", "destructive", "recursive or forced rm"))
    elif head in ("chmod", "chown", "chgrp"):
        targets = [a for a in args if not a.startswith("-")]
        if "R" in _short_flags(args) or "--recursive" in args:
            if any(_is_root_target(t) for t in targets[1:]):
                out.append(_Finding("critical", f"hardline:{head}_root", f"{head} -R on a root"))
            else:
                out.append(_Finding("high", "destructive", f"recursive {head}"))
    elif head == "dd" and any(a.startswith("of=/dev/") for a in args):
        out.append(_Finding("critical", "hardline:dd_device", "dd onto a device"))
    elif head in _SHELLS:
        if "-c" in args:
            k = args.index("-c")
            if k + 1 < len(args) and depth < 4:
                inner, subj = _text_findings(args[k + 1], cwd, roots, depth + 1)
                return out + inner, subj
        elif not sub:
            out.append(_Finding("high", "shell_stdin", f"{head} reads commands from its input"))
        if sub:
            out.append(_Finding("high", "workspace_code", f"{head} runs the script {sub}"))
    elif version_probe:
        pass
    elif head in _CODE_RUNNERS:
        out.append(_Finding("high", "workspace_code", f"{head} runs workspace code"))
    elif head in _CODE_SUBCOMMANDS and sub in _CODE_SUBCOMMANDS[head]:
        out.append(_Finding("high", "workspace_code", f"{head} {sub} runs workspace code"))
    elif head == "git" and (
        (sub == "reset" and "--hard" in args)
        or (sub == "clean" and ("f" in _short_flags(args) or "--force" in args))
        or (sub == "push" and ("f" in _short_flags(args) or "--force" in args))
    ):
        out.append(_Finding("high", "destructive", f"git {sub} discards work"))
    elif raw_head.startswith(("./", "../")) or (
        raw_head.startswith("/") and path_in_workspace(raw_head, roots)
    ):
        out.append(_Finding("high", "workspace_code", f"{raw_head} is a workspace program"))
    elif head in _NETWORK:
        out.append(_Finding("high", "network", f"{head} talks to the network"))
    elif head in _PRIVILEGE or head in _DANGEROUS:
        out.append(_Finding("high", "dangerous", f"{head} is a dangerous command"))
    return out, subject


def _text_findings(
    text: str, cwd: str, roots: Sequence[str], depth: int = 0
) -> tuple[list[_Finding], str]:
    out: list[_Finding] = []
    if _FORK_BOMB.search(text):
        out.append(_Finding("critical", "hardline:fork_bomb", "a fork bomb"))
    segs, redirects = _segments(text)
    for t in redirects:
        out += _path_findings(t, cwd, roots)
        if t.startswith("/dev/") and not any(_within(_norm(t), n) for n in _NEUTRAL_PATHS):
            out.append(_Finding("critical", "hardline:device_write", f"redirect onto {t}"))
    subjects: list[str] = []
    for seg in segs:
        found, subj = _segment_findings(seg, cwd, roots, depth)
        out += found
        if subj:
            subjects.append(subj)
    return out, ",".join(dict.fromkeys(subjects))


def classify_terminal(
    command: str,
    args: Sequence[str] = (),
    *,
    cwd: str | None,
    workspace_roots: Sequence[str],
    env_names: Sequence[str] = (),
    secrets: Sequence[str] = (),
) -> Effect:
    """``terminal/create`` → ``terminal.exec`` with the terminal guard's floor.

    Guard outcomes (the seed's): *allow/low* (nothing found: the approval mode decides);
    *prompt/high* (runs workspace/project code — interpreters, build tools, ``./script``,
    git commands that fire hooks —, passes an explicit environment overlay, escalates
    privilege, talks to the network, is destructive, or touches sensitive or
    outside-workspace paths); *deny/critical* (hardline: ``rm -rf /``, ``mkfs``, ``dd`` onto
    a device, fork bombs, shutdown...). ``cwd=None`` means the session's cwd (in the
    workspace). ``command`` may be a shell text (``args`` empty) or an argv head.
    """
    home = workspace_roots[0] if workspace_roots else "/"
    run_dir = _norm(cwd) if cwd else home
    in_ws = cwd is None or path_in_workspace(cwd, workspace_roots)
    text = command if not args else shlex.join([command, *args])
    findings, subject = _text_findings(text, run_dir, workspace_roots)
    if env_names:
        findings.append(
            _Finding("high", "env_overlay", f"explicit environment: {', '.join(env_names)}")
        )
    if not in_ws:
        findings.append(_Finding("high", "outside_workspace", "cwd is outside the workspace"))
    risk: Risk = "low"
    for f in findings:
        risk = _max_risk(risk, f.risk)
    worst = next((f for f in findings if f.risk == risk), None)
    if any(f.rule not in _CLASS_RULES for f in findings):
        subject = text  # paths, environments, privilege: an always-allow covers this exact text
    floor: Verdict = "deny" if risk == "critical" else "prompt" if risk == "high" else "auto"
    return Effect(
        capability="terminal.exec",
        tool=TOOL_TERMINAL,
        target=text,
        in_workspace=in_ws,
        sensitive=any(f.rule.startswith("sensitive") for f in findings),
        risk=risk,
        env_names=tuple(env_names),
        secrets=tuple(secrets),
        floor=floor,
        floor_rule=worst.rule if worst else "none",
        floor_reason=worst.reason if worst else "",
        subject=subject,
    )


def classify_acp_request(
    method: str, params: Mapping[str, object], workspace_roots: Sequence[str]
) -> Effect:
    """Classify an agent→client ACP request. ``ValueError`` names the agent's bad param."""

    def text(name: str, *, required: bool = True) -> str | None:
        v = params.get(name)
        if v is None and not required:
            return None
        if not isinstance(v, str) or not v:
            raise ValueError(f"agent sent {method} with invalid {name!r}: {v!r}")
        return v

    if method == "fs/read_text_file":
        return classify_read(text("path") or "", workspace_roots)
    if method == "fs/write_text_file":
        return classify_write(text("path") or "", workspace_roots)
    if method == "terminal/create":
        args = params.get("args") or []
        env = params.get("env") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"agent sent {method} with invalid 'args': {args!r}")
        if not isinstance(env, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) for e in env
        ):
            raise ValueError(f"agent sent {method} with invalid 'env': {env!r}")
        return classify_terminal(
            text("command") or "",
            args,
            cwd=text("cwd", required=False),
            workspace_roots=workspace_roots,
            env_names=[str(e["name"]) for e in env],
        )
    raise ValueError(f"no effect classification for ACP method {method!r}")


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
