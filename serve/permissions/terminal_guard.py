"""The terminal guard: what a ``terminal/create`` (or a shell text) may touch, as an Effect.

:func:`classify_terminal` tokenises the command (shell separators, redirections, wrappers
such as ``nohup``/``xargs``), and finds, per segment: workspace code it runs (interpreters,
build tools, ``./script``, git commands that fire hooks), privilege escalation, network
tools, destructive commands, sensitive or outside-workspace paths, and hardline commands
(``rm -rf /``, ``mkfs``, ``dd`` onto a device, fork bombs). The worst finding sets the
effect's risk and guard floor; :func:`serve.permissions.approval.decide` does the rest.
:func:`classify_acp_request` classifies any agent → client ACP request (file requests
through :mod:`serve.permissions.approval`). Pure; malformed params raise ``ValueError``.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence

import msgspec

from serve.permissions.approval import (
    TOOL_TERMINAL,
    Effect,
    classify_read,
    classify_write,
    max_risk,
    norm,
    path_in_workspace,
    sensitive_reason,
    within,
)
from serve.permissions.config import Risk, Verdict

__all__ = ["classify_acp_request", "classify_terminal"]

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
    return norm(tok if tok.startswith("/") else posixpath.join(cwd, tok))


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
    if any(within(path, n) for n in _NEUTRAL_PATHS):
        return []
    if not path_in_workspace(path, roots):
        return [_Finding("high", "outside_workspace", f"the command touches {tok} outside")]
    return []


def _is_root_target(tok: str) -> bool:
    if tok in ("~", "~/", "$HOME", "${HOME}", "/*", "~/*", "$HOME/", "${HOME}/"):
        return True
    if tok.startswith("/"):
        p = norm(tok)
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
        if t.startswith("/dev/") and not any(within(norm(t), n) for n in _NEUTRAL_PATHS):
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
    run_dir = norm(cwd) if cwd else home
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
        risk = max_risk(risk, f.risk)
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
