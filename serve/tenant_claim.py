"""Late binding (``--bootstrap-token``): a warm daemon that a claimer gives its tenant once.

Theory of operation
-------------------
A pod of an agent-sandbox warm pool starts before anyone claims it, from a template every
pod of the pool shares: it cannot carry a tenant's token, repository or API keys (and a
claim that carries ``env`` or volumes bypasses the warm pool). So the daemon starts with a
pool-scoped *bootstrap token* and :class:`Binding` ``pending``: the security front accepts
only that token, and only for the probes and ``POST /daemon/bind``. The bind, given once
by the claimer, carries the tenant's token, the workspace (a path already on the sandbox's
volume, or a git repository cloned into the empty workspace), variables for the agents
(:class:`~serve.agents.pool.InstallAgentEnv`) and credential files for the agents' home.

Everything is validated first (:func:`plan_bind` raises :class:`BindRefused`, naming the
field), then applied (:func:`apply_files`: clone into a temporary directory inside the
workspace, moved into place only when it succeeded; credential files written to temporary
names, renamed when all are written), and only then is the tenant's token installed and
the bootstrap token revoked (:meth:`Binding.complete`). A bind that fails before that
point leaves the daemon unbound, with nothing of it on disk, so the claimer may retry; one
bind at a time (:meth:`Binding.begin`), and never a second once bound.

This module knows no HTTP: the route (``serve/http/routes/bind.py``) decodes the body into
:class:`BindRequest`, maps :class:`BindRefused` / :class:`BindFailed` to error envelopes,
and tells the agent pools; the security front reads :meth:`Binding.digest` per request.
The cell holds only digests of tokens, never a token.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Annotated
from urllib.parse import urlsplit

import msgspec
import trio

from serve import threads

__all__ = [
    "CLONE_TIMEOUT_S",
    "MAX_AGENT_ENV_BYTES",
    "MAX_AGENT_ENV_VARS",
    "MAX_CREDENTIAL_BYTES",
    "MAX_CREDENTIAL_FILES",
    "BindFailed",
    "BindPlan",
    "BindRefused",
    "BindRequest",
    "Binding",
    "apply_files",
    "plan_bind",
]

#: Longest a ``git clone`` of the bind may take (seconds); then it is killed and the bind fails.
CLONE_TIMEOUT_S = 300.0
#: Bytes of git's stderr kept for the error message.
CLONE_STDERR_BYTES = 2048
MAX_AGENT_ENV_VARS = 256
#: Total bytes of the agent variables' names and values.
MAX_AGENT_ENV_BYTES = 64 * 1024
MAX_CREDENTIAL_FILES = 32
#: Total bytes of the credential files' contents.
MAX_CREDENTIAL_BYTES = 1024 * 1024
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
#: Variables the daemon sets itself for its agents; a bind cannot override them.
RESERVED_ENV = frozenset({"QWEN_CODE_NO_RELAUNCH", "QWEN_SERVER_TOKEN", "PATH"})
_RESERVED_ENV_PREFIXES = ("ACP_SCRIPTED_", "QWEN_SERVE_", "ACP_SERVE_", "LD_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
#: Transports git may use for a bind's clone (``GIT_ALLOW_PROTOCOL``): never ``ext::``.
_GIT_PROTOCOLS = "https:ssh:file"
#: Entries a fresh volume may hold that do not make a workspace non-empty.
_IGNORED_ENTRIES = frozenset({"lost+found"})


class BindRefused(ValueError):
    """The bind's input is wrong; ``field`` names the member (nothing was changed)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class BindFailed(RuntimeError):
    """Applying a valid bind failed (the clone, a write); nothing of it was kept."""


class WorkspaceSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    #: An existing directory: one of the daemon's ``--workspace`` roots.
    path: str | None = None
    #: A git repository cloned into the (empty) workspace: ``https://``, ``ssh://``,
    #: ``file://`` or an absolute local path.
    repository: str | None = None
    #: The branch or tag to check out (default: the remote's HEAD).
    ref: str | None = None


class CredentialFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    #: Relative to the agents' home directory (``HOME``); no ``..``.
    path: str
    content: str


class BindRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The body of ``POST /daemon/bind``."""

    token: Annotated[str, msgspec.Meta(min_length=1)]
    workspace: WorkspaceSpec | None = None
    agent_env: dict[str, str] = msgspec.field(default_factory=dict)
    credentials: list[CredentialFile] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class BindPlan:
    """A validated bind: what :func:`apply_files` and :meth:`Binding.complete` do."""

    token_digest: bytes
    workspace: str
    repository: str | None
    ref: str | None
    agent_env: dict[str, str]
    #: (absolute path, content) of every credential file.
    credentials: tuple[tuple[Path, bytes], ...]
    secrets: tuple[str, ...] = field(repr=False, default=())

    def summary(self) -> dict[str, object]:
        """What a bind answers (no secret): the workspace, whether it was cloned, the
        names of the agent variables and the credential files' paths."""
        return {
            "bound": True,
            "workspace": self.workspace,
            "cloned": self.repository is not None,
            "agentEnv": sorted(self.agent_env),
            "credentials": [str(p) for p, _ in self.credentials],
        }


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Binding:
    """The credential the daemon accepts now, and whether the daemon still awaits its bind.

    One per daemon (``host.binding``), touched only from the trio thread. ``digest()`` is
    the SHA-256 of the accepted token: the bootstrap token while ``pending``, the tenant's
    after :meth:`complete`, the configured one on a daemon without late binding.
    """

    def __init__(self, token: str | None, *, bootstrap: bool) -> None:
        self._digest = _digest(token) if token else None
        self.pending = bootstrap
        self.late = bootstrap
        self._busy = False
        self.bound_at: float | None = None
        self.workspace: str | None = None

    def digest(self) -> bytes | None:
        return self._digest

    def begin(self) -> bool:
        """Claim the one bind: False when bound, not late-bound, or a bind is running."""
        if not self.pending or self._busy:
            return False
        self._busy = True
        return True

    def abort(self) -> None:
        """The running bind failed: the daemon stays unbound (the bootstrap token works)."""
        self._busy = False

    def complete(self, plan: BindPlan, now: float) -> None:
        """Install the tenant's token; the bootstrap token is revoked with it."""
        self._digest = plan.token_digest
        self.pending = False
        self._busy = False
        self.bound_at = now
        self.workspace = plan.workspace


def _token(value: str) -> str:
    token = value.strip()
    if len(token) < MIN_TOKEN_CHARS or len(token) > MAX_TOKEN_CHARS:
        raise BindRefused(
            f"token must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters", "token"
        )
    if not all(0x21 <= ord(ch) <= 0x7E for ch in token):
        raise BindRefused("token must be printable ASCII without spaces", "token")
    return token


def _repository(url: str) -> str:
    if url.startswith("-") or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise BindRefused("workspace.repository is not a repository URL", "workspace.repository")
    if url.startswith("/"):
        return url
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("https", "ssh", "file") or "::" in url.split("/", 1)[0]:
        raise BindRefused(
            "workspace.repository must be an https://, ssh:// or file:// URL or an absolute path",
            "workspace.repository",
        )
    return url


def _is_empty(path: str) -> bool:
    return all(entry in _IGNORED_ENTRIES for entry in os.listdir(path))


def _agent_env(env: Mapping[str, str]) -> dict[str, str]:
    if len(env) > MAX_AGENT_ENV_VARS:
        raise BindRefused(f"agentEnv has more than {MAX_AGENT_ENV_VARS} variables", "agentEnv")
    total = 0
    for name, value in env.items():
        if _ENV_NAME.fullmatch(name) is None:
            raise BindRefused(f"agentEnv: {name!r} is not a variable name", "agentEnv")
        if name in RESERVED_ENV or name.startswith(_RESERVED_ENV_PREFIXES):
            raise BindRefused(f"agentEnv: {name} is set by the daemon", "agentEnv")
        if "\0" in value:
            raise BindRefused(f"agentEnv: {name} contains a NUL character", "agentEnv")
        total += len(name.encode()) + len(value.encode("utf-8", "surrogatepass"))
    if total > MAX_AGENT_ENV_BYTES:
        raise BindRefused(f"agentEnv is larger than {MAX_AGENT_ENV_BYTES} bytes", "agentEnv")
    return dict(env)


def _credentials(files: list[CredentialFile], home: str) -> tuple[tuple[Path, bytes], ...]:
    if len(files) > MAX_CREDENTIAL_FILES:
        raise BindRefused(f"credentials has more than {MAX_CREDENTIAL_FILES} files", "credentials")
    root = Path(home)
    out: list[tuple[Path, bytes]] = []
    seen: set[Path] = set()
    total = 0
    for item in files:
        rel = PurePosixPath(item.path)
        if (
            not item.path
            or rel.is_absolute()
            or ".." in rel.parts
            or "\0" in item.path
            or rel.parts in ((), (".",))
        ):
            raise BindRefused(
                f"credentials: {item.path!r} must be a relative path inside the agents' home",
                "credentials",
            )
        target = root.joinpath(*rel.parts)
        if target in seen:
            raise BindRefused(f"credentials: {item.path!r} given twice", "credentials")
        if target.is_symlink() or target.is_dir():
            raise BindRefused(f"credentials: {item.path!r} is a link or a directory", "credentials")
        seen.add(target)
        data = item.content.encode("utf-8", "surrogatepass")
        total += len(data)
        out.append((target, data))
    if total > MAX_CREDENTIAL_BYTES:
        raise BindRefused(
            f"credentials are larger than {MAX_CREDENTIAL_BYTES} bytes", "credentials"
        )
    return tuple(out)


def plan_bind(request: BindRequest, *, workspaces: tuple[str, ...], home: str | None) -> BindPlan:
    """Validate ``request`` for a daemon serving ``workspaces`` whose agents' home is
    ``home``; raises :class:`BindRefused` (reads the file system, changes nothing)."""
    token = _token(request.token)
    agent_env = _agent_env(request.agent_env)
    home = agent_env.get("HOME", home)
    if request.credentials and not home:
        raise BindRefused("credentials need a HOME for the agents", "credentials")
    credentials = _credentials(request.credentials, home or "")
    spec = request.workspace or WorkspaceSpec()
    if spec.path is not None and spec.repository is not None:
        raise BindRefused("workspace takes path or repository, not both", "workspace")
    workspace = workspaces[0]
    repository = None
    ref = None
    if spec.path is not None:
        real = os.path.realpath(spec.path)
        if not os.path.isdir(real):
            raise BindRefused(f"workspace.path {spec.path!r} is not a directory", "workspace.path")
        if real not in workspaces:
            raise BindRefused(
                f"workspace.path {spec.path!r} is not one of the daemon's workspaces",
                "workspace.path",
            )
        workspace = real
    if spec.ref is not None and spec.repository is None:
        raise BindRefused("workspace.ref needs workspace.repository", "workspace.ref")
    if spec.repository is not None:
        repository = _repository(spec.repository)
        if spec.ref is not None:
            if _REF.fullmatch(spec.ref) is None or ".." in spec.ref:
                raise BindRefused("workspace.ref is not a branch or tag name", "workspace.ref")
            ref = spec.ref
        if not _is_empty(workspace):
            raise BindRefused(
                f"workspace.repository: the workspace {workspace} is not empty",
                "workspace.repository",
            )
        if shutil.which("git") is None:
            raise BindRefused("workspace.repository: git is not installed", "workspace.repository")
    return BindPlan(
        token_digest=_digest(token),
        workspace=workspace,
        repository=repository,
        ref=ref,
        agent_env=agent_env,
        credentials=credentials,
        secrets=(token, *agent_env.values()),
    )


async def apply_files(plan: BindPlan) -> None:
    """The bind's effects on disk: the clone, then the credential files; all or nothing
    (raises :class:`BindFailed` after removing what it made)."""
    limiter = threads.file_routes_limiter()
    clone_dir: str | None = None
    if plan.repository is not None:
        clone_dir = await _clone(plan)
    try:
        await threads.run_sync(limiter, _write_credentials, plan.credentials)
    except OSError as exc:
        if clone_dir is not None:
            await threads.run_sync(limiter, _rmtree, clone_dir)
        raise BindFailed(f"writing the credential files failed: {exc.strerror or exc}") from None
    if clone_dir is not None:
        await threads.run_sync(limiter, _move_into, clone_dir, plan.workspace)


async def _clone(plan: BindPlan) -> str:
    assert plan.repository is not None
    tmp = os.path.join(plan.workspace, f".acp-serve-bind-{secrets.token_hex(6)}")
    argv = ["git", "-c", "core.hooksPath=/dev/null", "clone", "--quiet"]
    if plan.ref is not None:
        argv += ["--branch", plan.ref, "--single-branch"]
    argv += ["--", plan.repository, tmp]
    env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": _GIT_PROTOCOLS,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    failure: str | None = None
    # git's stderr goes to an unlinked temporary file (bounded by the disk, not by memory);
    # only its tail is read back for the message.
    with tempfile.TemporaryFile() as err:
        with trio.move_on_after(CLONE_TIMEOUT_S) as scope:
            result = await trio.run_process(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                check=False,
            )
            if result.returncode != 0:
                tail = await threads.run_sync(threads.file_routes_limiter(), _tail, err)
                failure = f"git clone failed (exit {result.returncode}): {tail}"
        if scope.cancelled_caught:
            failure = f"git clone did not finish within {CLONE_TIMEOUT_S:.0f} s"
    if failure is not None:
        await threads.run_sync(threads.file_routes_limiter(), _rmtree, tmp)
        raise BindFailed(failure)
    return tmp


def _tail(fh: IO[bytes]) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - CLONE_STDERR_BYTES))
    return fh.read().decode("utf-8", "replace").strip()


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _move_into(src: str, dest: str) -> None:
    for entry in os.listdir(src):
        os.rename(os.path.join(src, entry), os.path.join(dest, entry))
    os.rmdir(src)


def _write_credentials(files: tuple[tuple[Path, bytes], ...]) -> None:
    """Each file written to a temporary name (mode 0600, parents 0700), then all renamed."""
    written: list[tuple[Path, Path]] = []
    made: list[Path] = []
    try:
        for target, data in files:
            missing = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
            for parent in reversed(missing):
                parent.mkdir(mode=0o700)
                made.append(parent)
            tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            written.append((tmp, target))
    except OSError:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        for parent in reversed(made):
            try:
                parent.rmdir()
            except OSError:
                pass
        raise
    for tmp, target in written:
        os.replace(tmp, target)
