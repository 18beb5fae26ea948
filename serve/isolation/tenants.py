"""Each principal's places for its agents, and the files the daemon trusts.

Theory of operation
-------------------
An agent runs the shell commands its user typed: in multi-user mode (any ``--auth-*``) it is
treated as that user. Every agent child belongs to one principal, its **tenant**, for its whole
life (the agent pool keys its children by tenant, :mod:`serve.agents.slots`), and a tenant's
children get places of their own, under the daemon's state directory, or under
``--shared-dir DIR`` when it is given (:func:`places_dir`)::

    <state>/tenants/<name>/home       HOME (the agent's own store, caches, settings)
    <state>/tenants/<name>/scripted   the built-in scripted agent's conversation store

``--shared-dir`` is for a cluster (several daemons on one journal, docs/postgres-journal.md):
each daemon keeps its own state directory (its daemon id, journal files, the agents' temp
directories), and the places an agent keeps its sessions in are in the directory all of them
share, so an agent started on another daemon finds the session it must load.

``<name>`` is :func:`dir_name`: a readable, escaped prefix of the principal id and a hash of
it, so ``../x``, ``group:eng`` or a 4 KiB id map to one safe directory name each, and two ids
never share one. The state directory is carved out of every child's sandbox (neither read nor
written, :mod:`serve.isolation.sandbox`); a child's own places are granted inside it by the
more specific rule, so every *other* tenant's places stay protected without being listed.
The shared directory is carved out the same way (its places are granted the same way).
Each child's private temp directory is its own already (``<state>/agent-tmp/...``).

A tenant's HOME starts with the operator's agent set-up: the files of :data:`HOME_SEED` (the
agents' credential and settings files, relative to the daemon's own ``HOME``) that exist are
**copied** (``0600``) into it when it is made, and again whenever the operator's copy is newer
(a rotated credential reaches every tenant at its next spawn). They are copies, not links: an
agent that refreshes its token writes its own copy, never the operator's file. Variables of
the daemon's environment that point into the operator's HOME (``XDG_CONFIG_HOME``,
``CODEX_HOME``, ...) are re-rooted in the tenant's HOME (:func:`tenant_env`).

Without ``--auth-*`` there is one principal, the operator, and its agents keep the daemon's
own HOME and ``<state>/scripted`` (``DIR/scripted`` with ``--shared-dir``:
:func:`scripted_store`; :func:`places` answers ``None``: as before).

:func:`trusted_files` lists the files the daemon trusts wherever the operator put them (the
tokens file, the JWKS file, the config file, the audit log and its rotations, the TLS key and
certificate, the token file): the sandbox protects them from every agent, in every mode.

Blocking (``mkdir``, ``copy``): :func:`places` runs in a worker thread (the sandbox's
``prepare``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from serve.settings import Settings

__all__ = [
    "HOME_SEED",
    "OPERATOR_TENANT",
    "TENANTS_SUBDIR",
    "Places",
    "dir_name",
    "multi_user",
    "places",
    "places_dir",
    "scripted_store",
    "tenant_env",
    "trusted_files",
]

#: The tenant of single-user mode (and of sessions made with the operator token).
OPERATOR_TENANT: Final = "operator"
#: Under the state directory (or the shared one): one directory per tenant.
TENANTS_SUBDIR: Final = "tenants"
#: Under the state directory (or the shared one): the scripted agent's store, single-user mode.
SCRIPTED_SUBDIR: Final = "scripted"
#: Characters kept as they are in a tenant's directory name (the rest become ``_``).
_SAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
#: Length of the readable prefix of a tenant's directory name (characters).
_PREFIX_CHARS: Final = 32

#: The operator's agent set-up copied into each tenant's HOME (relative to the daemon's
#: HOME; missing ones are skipped): the agents' credentials and their settings files.
HOME_SEED: Final = (
    ".claude/.credentials.json",
    ".claude/settings.json",
    ".qwen/settings.json",
    ".qwen/oauth_creds.json",
    ".codex/auth.json",
    ".codex/config.toml",
    ".gemini/settings.json",
    ".gemini/oauth_creds.json",
    ".config/opencode/opencode.json",
    ".local/share/opencode/auth.json",
    ".kimi/config.toml",
)

#: Variables whose value, when it lies in the operator's HOME, is re-rooted in the tenant's.
_HOME_VARS: Final = (
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "CODEX_HOME",
    "CLAUDE_CONFIG_DIR",
    "GEMINI_CLI_HOME",
    "KIMI_SHARE_DIR",
    "PI_CODING_AGENT_DIR",
)


@dataclass(frozen=True)
class Places:
    """One tenant's places (absolute, real paths; made by :func:`places`)."""

    tenant: str
    root: str
    home: str
    store: str


def multi_user(settings: Settings) -> bool:
    """Whether principals other than the operator exist (``--auth-*``)."""
    return settings.auth.configured


def dir_name(tenant: str) -> str:
    """A safe, unique directory name for ``tenant`` (never ``.``/``..``, never a ``/``)."""
    digest = hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    readable = _SAFE.sub("_", tenant)[:_PREFIX_CHARS].strip(".") or "_"
    return f"{readable}-{digest}"


def places_dir(settings: Settings) -> str:
    """Where the agents' places are: ``--shared-dir`` when given, else the state directory."""
    return settings.shared_dir or settings.state_dir


def scripted_store(settings: Settings) -> str:
    """The scripted agent's store in single-user mode (``ACP_SCRIPTED_STATE_DIR``)."""
    return os.path.join(places_dir(settings), SCRIPTED_SUBDIR)


def tenant_root(settings: Settings, tenant: str) -> str:
    return os.path.join(places_dir(settings), TENANTS_SUBDIR, dir_name(tenant))


def places(settings: Settings, tenant: str | None) -> Places | None:
    """``tenant``'s places, made (``0700``) and seeded when missing; None in single-user
    mode or for no tenant (the daemon's own HOME and store, as before). Blocking."""
    if tenant is None or not multi_user(settings):
        return None
    root = tenant_root(settings, tenant)
    home = os.path.join(root, "home")
    store = os.path.join(root, SCRIPTED_SUBDIR)
    for path in (places_dir(settings), os.path.dirname(root), root, home, store):
        os.makedirs(path, mode=0o700, exist_ok=True)
    _seed(home)
    return Places(tenant, os.path.realpath(root), os.path.realpath(home), os.path.realpath(store))


def _seed(home: str) -> None:
    """Copy the operator's agent set-up (:data:`HOME_SEED`) into ``home`` where newer."""
    source_home = os.environ.get("HOME")
    if not source_home or not os.path.isabs(source_home):
        return
    for rel in HOME_SEED:
        src = os.path.join(source_home, rel)
        dst = os.path.join(home, rel)
        try:
            st = os.stat(src)
        except OSError:
            continue
        try:
            if os.stat(dst).st_mtime >= st.st_mtime:
                continue
        except OSError:
            pass
        try:
            os.makedirs(os.path.dirname(dst), mode=0o700, exist_ok=True)
            # (unique: daemons sharing the directory may have the same pid in their pods)
            tmp = f"{dst}.seed-{os.getpid()}-{os.urandom(4).hex()}"
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o600)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, dst)
        except OSError:
            continue  # (an unreadable seed is the operator's business: the agent says so)


def tenant_env(env: Mapping[str, str], box: Places) -> dict[str, str]:
    """``env`` for a child of ``box``'s tenant: its HOME, and the variables that pointed into
    the operator's HOME re-rooted in the tenant's."""
    out = dict(env)
    operator_home = env.get("HOME")
    out["HOME"] = box.home
    for name in _HOME_VARS:
        value = out.get(name)
        if value is None:
            continue
        if operator_home and os.path.isabs(operator_home):
            rel = os.path.relpath(value, operator_home) if os.path.isabs(value) else ".."
            if not rel.startswith(".."):
                out[name] = os.path.normpath(os.path.join(box.home, rel))
                continue
        if name.startswith("XDG_"):
            out.pop(name)  # (elsewhere: the agent's default under its HOME)
    return out


def trusted_files(settings: Settings) -> list[str]:
    """The files the daemon trusts (absolute), wherever the operator put them; some may not
    exist (yet): protecting a missing path still hides it from the children."""
    out: list[str] = []
    auth = settings.auth
    candidates = [
        settings.config_file,
        auth.tokens_file,
        auth.jwks_file,
        settings.tls_key,
        settings.tls_cert,
        settings.token_file,
    ]
    if auth.audit_log:
        candidates.append(auth.audit_log)
        candidates.extend(f"{auth.audit_log}.{n}" for n in range(1, 4))
    for path in candidates:
        if path:
            out.append(os.path.abspath(path))
    return out
