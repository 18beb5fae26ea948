"""``--auth-tokens-file``: scoped static tokens by SHA-256, and whether the file is usable.

The file is a JSON array (or JSON lines) of ``{"id", "sha256", "principal", "roles"?,
"groups"?}``; a presented token is looked up by its SHA-256 (hex). :class:`TokensFile` owns
the table the security front asks (:meth:`TokensFile.lookup`). It looks at the file at most
once per :data:`RELOAD_CHECK_S` (on a lookup, and when ``/readyz`` or ``/daemon/status``
asks: :meth:`TokensFile.refresh`), in a worker thread, and reads it again when its inode,
size, mtime or ctime changed, or while it is unusable.

**Fail closed.** A file that is missing, unreadable (permissions, I/O), larger than
:data:`MAX_FILE_BYTES` or malformed (not JSON, a bad entry, a principal named ``operator``
or like a group key ``group:<name>``) empties the table: no token from it is accepted
until the file is good again (deleting the file revokes every token in it; a half-written
edit locks its users out rather than keeping tokens the operator meant to remove). The
change is logged once (a warning naming why; an info line when the file is good again)
and reported by :meth:`TokensFile.status` (``/daemon/status`` ``auth.tokensFile`` and an
``auth_tokens_file_unusable`` issue; ``/readyz`` ``503 auth_tokens_file_unusable``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import time
from typing import Any, Final

import trio

from serve.access.principal import DAEMON_ROLES, USER, Principal

__all__ = [
    "GROUP_PREFIX",
    "MAX_FILE_BYTES",
    "MAX_TOKENS",
    "RELOAD_CHECK_S",
    "TokensFile",
    "parse_tokens",
    "reserved_principal",
]

log = logging.getLogger(__name__)

#: The file is looked at for changes at most this often (seconds).
RELOAD_CHECK_S: Final = 1.0
#: Most entries read from a tokens file.
MAX_TOKENS: Final = 10_000
#: Largest tokens file read, in bytes (10,000 entries of about 200 bytes fit four times).
MAX_FILE_BYTES: Final = 8 * 1024 * 1024
#: How a session's members and the config name a group (``serve/access/roles.py``): no
#: principal may be named so, or it would hold the group's grants without being in it.
GROUP_PREFIX: Final = "group:"

_Signature = tuple[int, int, int, int]


def reserved_principal(name: str) -> str | None:
    """Why ``name`` may not name a principal from a JWT or a tokens file (None: it may)."""
    if name == "operator":
        return "operator is the operator token's"
    if name.startswith(GROUP_PREFIX):
        return f"{GROUP_PREFIX}<name> names a group"
    return None


def parse_tokens(data: bytes) -> dict[str, Principal]:
    """A tokens file's table (``ValueError`` naming the bad entry)."""
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return {}
    try:
        entries = (
            json.loads(text)
            if text.startswith("[")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(entries, list) or len(entries) > MAX_TOKENS:
        raise ValueError(f"expected a list of at most {MAX_TOKENS} entries")
    out: dict[str, Principal] = {}
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {n} is not an object")
        digest, name = entry.get("sha256"), entry.get("principal")
        roles = entry.get("roles", [USER])
        groups = entry.get("groups", [])
        if not (isinstance(digest, str) and len(digest) == 64):
            raise ValueError(f"entry {n}: sha256 must be 64 hex digits")
        if not isinstance(name, str) or not name:
            raise ValueError(f"entry {n}: principal must be a name")
        if (why := reserved_principal(name)) is not None:
            raise ValueError(f"entry {n}: principal {name!r} is reserved ({why})")
        if not isinstance(roles, list) or not all(r in DAEMON_ROLES for r in roles) or not roles:
            raise ValueError(f"entry {n}: roles must be some of {list(DAEMON_ROLES)}")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ValueError(f"entry {n}: groups must be a list of names")
        out[digest.lower()] = Principal(name, "token", tuple(roles), tuple(groups))
    return out


class _Read:
    """What one look at the file found (made in a worker thread)."""

    __slots__ = ("problem", "signature", "state", "table")

    def __init__(
        self,
        state: str,
        signature: _Signature | None = None,
        table: dict[str, Principal] | None = None,
        problem: str | None = None,
    ) -> None:
        self.state = state  # "same" | "ok" | "missing" | "unreadable" | "malformed"
        self.signature = signature
        self.table = table
        self.problem = problem


class TokensFile:
    """Scoped static tokens by SHA-256 (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.by_digest: dict[str, Principal] = {}
        #: ``ok``, or why no token from the file is accepted (``unread`` before the
        #: first look, ``missing``, ``unreadable``, ``malformed``).
        self.state = "unread"
        self.problem: str | None = None
        self.reloads = 0
        self._since = time.time()
        self._signature: _Signature | None = None
        self._checked = -RELOAD_CHECK_S
        self._lock = trio.Lock()

    @property
    def usable(self) -> bool:
        return self.state == "ok"

    async def refresh(self, *, force: bool = False) -> None:
        """Look at the file (at most once per :data:`RELOAD_CHECK_S` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        async with self._lock:
            found = await trio.to_thread.run_sync(self._read, self._signature, self.usable)
            self._apply(found)

    async def lookup(self, credential: str) -> Principal | None:
        await self.refresh()
        return self.by_digest.get(hashlib.sha256(credential.encode()).hexdigest())

    def _read(self, known: _Signature | None, usable: bool) -> _Read:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return _Read("missing", problem="the file does not exist")
        except OSError as exc:
            return _Read("unreadable", problem=f"cannot stat it: {exc.strerror}")
        signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if signature == known and usable:
            return _Read("same", signature)
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            return _Read("unreadable", signature, problem=f"cannot read it: {exc.strerror}")
        if len(data) > MAX_FILE_BYTES:
            return _Read("malformed", signature, problem=f"larger than {MAX_FILE_BYTES} bytes")
        try:
            return _Read("ok", signature, parse_tokens(data))
        except ValueError as exc:
            return _Read("malformed", signature, problem=str(exc))

    def _apply(self, found: _Read) -> None:
        if found.state == "same":
            return
        self._signature = found.signature
        if found.table is not None:
            self.by_digest = found.table
            self.reloads += 1
            if self.state != "ok":
                self._since = time.time()
                again = "" if self.state == "unread" else " again"
                log.info("tokens file %s usable%s: %d tokens", self.path, again, len(found.table))
            self.state, self.problem = "ok", None
            return
        self.by_digest = {}
        if (found.state, found.problem) != (self.state, self.problem):
            self._since = time.time()
            log.warning(
                "tokens file %s unusable (%s: %s): no token from it is accepted until it is fixed",
                self.path,
                found.state,
                found.problem,
            )
        self.state, self.problem = found.state, found.problem

    def status(self) -> dict[str, Any]:
        """``/daemon/status`` ``auth.tokensFile``."""
        since = datetime.datetime.fromtimestamp(self._since, datetime.UTC)
        return {
            "path": self.path,
            "state": self.state,
            "tokens": len(self.by_digest),
            "error": self.problem,
            "since": since.isoformat(timespec="seconds"),
        }
