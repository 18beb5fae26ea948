"""Per-principal uids: each principal's agents run under a uid of their own.

Theory of operation
-------------------
``--agent-uid-range off|auto|START:COUNT`` (default ``auto``: ``off`` in single-user mode;
in multi-user mode (``--auth-*``) :data:`AUTO_RANGE` when the daemon is root, else off).
With a range, :func:`uid_for` maps a principal id to a uid of ``[START, START+COUNT)``: a
pure function (SHA-256 of the id, modulo ``COUNT``), so a principal keeps its uid across
restarts and daemons with no table to keep. Its gid is the same number (a group of its own).
Two principals that hash to one uid would share file permissions: :class:`UidMap` remembers
the principals it has seen and refuses the second (:class:`UidCollision`: the spawn fails
with that message; the operator widens or moves the range).

Where the uid applies: the spawn points take a :class:`RunAs` (``spawn_limited(...,
run_as=...)``, ``sandbox.prepare(..., run_as=...)``); the exec wrapper drops to it in the
agent's own process, after its sandbox was applied (``acp/confine.py``). Terminals and the
session shell of that agent run under it too (they share its confinement).

Needs root (``setresuid``). A daemon that is not root and is given a range refuses to start
(``serve.settings.values.check_uid_range``): a delegated subordinate range (``/etc/subuid``
with ``newuidmap``) is not used (yet).

The agent's places (what the daemon does, :func:`grant`): before the spawn, in a worker
thread, the child's private temp directory is **chowned** to the uid (it is that child's
alone); each other write root (the workspace, ``HOME``, the scripted agent's store, the
operator's grants, additional directories) gets a POSIX ACL entry ``user:<uid>:rwx`` (and
the same as a default entry, inherited by what is created in it later) on itself and its
existing entries (at most :data:`ACL_WALK_MAX` of them; more are logged, not granted; once per
uid and root in a daemon's life: what is created later inherits the default entry); and
every directory above one of those places that the uid could not search gets
``user:<uid>:--x`` (search, not list). Files the agent creates are owned by its uid.
Everything else keeps its mode: another principal's ``0600`` file stays unreadable.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import os
import stat
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from serve.settings.values import AUTO_UID_RANGE as AUTO_RANGE
from serve.settings.values import check_uid_range as check_range
from serve.settings.values import parse_uid_range as parse_range

if TYPE_CHECKING:
    from serve.settings import Settings

log = logging.getLogger(__name__)

#: Entries of one write root that get the ACL at most (a walk per spawn: bounded).
ACL_WALK_MAX: Final = 10_000
#: Principals a :class:`UidMap` remembers at most (one entry per principal with agents).
MAX_PRINCIPALS: Final = 100_000


class UidCollision(OSError):
    """Two principals map to one uid."""


@dataclass(frozen=True)
class RunAs:
    """Who an agent child runs as: ``principal``'s ``uid`` and ``gid``."""

    principal: str
    uid: int
    gid: int


def run_as_for(settings: Settings, principal: str | None) -> RunAs | None:
    """The entry point of the spawn points: who ``principal``'s agents run as (None: no
    range in force, or no principal: the daemon's own uid). Raises :class:`UidCollision`."""
    rng = settings.agent_uid_range
    if rng is None or principal is None:
        return None
    return _uid_map(*rng).run_as(principal)


def status(settings: Settings) -> dict[str, Any]:
    """``/daemon/status`` ``isolation.uids``: the range in force and how many principals
    have a uid so far."""
    rng = settings.agent_uid_range
    if rng is None:
        return {
            "active": False,
            "range": None,
            "reason": "--agent-uid-range off (or auto in single-user mode or not root)",
        }
    return {
        "active": True,
        "range": {"start": rng[0], "count": rng[1]},
        "map": "sha256(principal) mod count + start; gid = uid",
        "principals": len(_uid_map(*rng)),
        "places": "temp chowned; workspace, HOME, store: ACL user:<uid>:rwx",
    }


@functools.cache
def _uid_map(start: int, count: int) -> UidMap:
    return UidMap(start, count)


def uid_for(principal: str, start: int, count: int) -> int:
    """The uid of ``principal`` in ``[start, start + count)``: pure and stable."""
    digest = hashlib.sha256(principal.encode("utf-8")).digest()
    return start + int.from_bytes(digest[:8], "big") % count


class UidMap:
    """The principals seen so far and their uids (refuses a collision). Thread-safe."""

    def __init__(self, start: int, count: int) -> None:
        self.start = start
        self.count = count
        self._by_uid: dict[int, str] = {}
        self._lock = threading.Lock()

    def run_as(self, principal: str) -> RunAs:
        uid = uid_for(principal, self.start, self.count)
        with self._lock:
            seen = self._by_uid.get(uid)
            if seen is None and len(self._by_uid) < MAX_PRINCIPALS:
                self._by_uid[uid] = principal
            elif seen is not None and seen != principal:
                raise UidCollision(
                    errno.EEXIST,
                    f"principals {seen!r} and {principal!r} both map to uid {uid} of "
                    f"--agent-uid-range {self.start}:{self.count}: widen or move the range",
                )
        return RunAs(principal, uid, uid)

    def __len__(self) -> int:
        return len(self._by_uid)


# ---- POSIX ACLs (the system.posix_acl_* extended attributes) --------------------------------

_ACL_VERSION: Final = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED: Final = 0xFFFFFFFF
ACCESS: Final = "system.posix_acl_access"
DEFAULT: Final = "system.posix_acl_default"

Entries = dict[tuple[int, int], int]  # (tag, id) -> perm bits (rwx = 4|2|1)


def _decode(raw: bytes) -> Entries:
    (version,) = struct.unpack_from("<I", raw)
    if version != _ACL_VERSION:
        raise OSError(errno.EINVAL, f"ACL version {version}")
    return {
        (tag, ident): perm
        for tag, perm, ident in struct.iter_unpack("<HHI", raw[4 : 4 + (len(raw) - 4) // 8 * 8])
    }


def _encode(entries: Entries) -> bytes:
    out = struct.pack("<I", _ACL_VERSION)
    for (tag, ident), perm in sorted(entries.items()):
        out += struct.pack("<HHI", tag, perm, ident)
    return out


def _from_mode(mode: int) -> Entries:
    return {
        (_USER_OBJ, _UNDEFINED): (mode >> 6) & 7,
        (_GROUP_OBJ, _UNDEFINED): (mode >> 3) & 7,
        (_OTHER, _UNDEFINED): mode & 7,
    }


def _add_user(entries: Entries, uid: int, perm: int) -> bool:
    """Give ``uid`` at least ``perm`` (and widen the mask to it); True when changed."""
    key = (_USER, uid)
    old = entries.get(key, 0)
    mask = entries.get((_MASK, _UNDEFINED))
    new_mask = (entries.get((_GROUP_OBJ, _UNDEFINED), 0) if mask is None else mask) | perm
    if old | perm == old and mask is not None and mask | perm == mask:
        return False
    entries[key] = old | perm
    entries[(_MASK, _UNDEFINED)] = new_mask
    return True


def _acl_add(path: str, uid: int, perm: int, *, default: bool = False) -> None:
    """Add ``user:uid:perm`` to ``path``'s access ACL (and its default ACL)."""
    st = os.stat(path, follow_symlinks=False)
    for name in (ACCESS, DEFAULT) if default else (ACCESS,):
        try:
            entries = _decode(os.getxattr(path, name, follow_symlinks=False))
        except OSError as exc:
            if exc.errno != errno.ENODATA:
                raise
            entries = _from_mode(st.st_mode)
        if _add_user(entries, uid, perm):
            os.setxattr(path, name, _encode(entries), follow_symlinks=False)


def _can_search(st: os.stat_result, uid: int, gid: int) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def _ancestors(path: str) -> Iterable[str]:
    parent = os.path.dirname(path)
    while parent and parent != path:
        yield parent
        path, parent = parent, os.path.dirname(parent)


def grant(run_as: RunAs, *, own: Iterable[str] = (), share: Iterable[str] = ()) -> None:
    """Let ``run_as`` work in its places (see the module docstring): ``own`` is chowned to it
    (the child's private temp directory), ``share`` gets ``user:<uid>:rwx`` ACL entries, and
    the directories above both get ``user:<uid>:--x`` where it could not search them.
    Blocking (a bounded walk): run it in a worker thread. Raises OSError (e.g. a file system
    without ACLs: the spawn fails rather than start an agent that cannot work)."""
    uid, gid = run_as.uid, run_as.gid
    places: list[str] = []
    for path in own:
        real = os.path.realpath(path)
        os.chown(real, uid, gid)
        places.append(real)
    for path in share:
        real = os.path.realpath(path)
        if not os.path.isdir(real):
            continue
        _share_tree(real, uid)
        places.append(real)
    done: set[str] = set()
    for place in places:
        for parent in _ancestors(place):
            if parent in done:
                break
            done.add(parent)
            if not _can_search(os.stat(parent), uid, gid):
                _acl_add(parent, uid, 0o1)


#: (uid, root) pairs whose existing entries were walked: later entries inherit the default
#: ACL, so a root is walked once per uid per daemon (bounded: :data:`MAX_PRINCIPALS`).
_walked: set[tuple[int, str]] = set()
_walked_lock = threading.Lock()


def _share_tree(root: str, uid: int) -> None:
    _acl_add(root, uid, 0o7, default=True)
    with _walked_lock:
        if (uid, root) in _walked:
            return
        if len(_walked) >= MAX_PRINCIPALS:
            _walked.clear()
        _walked.add((uid, root))
    budget = ACL_WALK_MAX
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            if budget <= 0:
                log.warning(
                    "%s: more than %d entries; uid %d was granted the first only",
                    root,
                    ACL_WALK_MAX,
                    uid,
                )
                return
            budget -= 1
            path = os.path.join(top, name)
            st = os.stat(path, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _acl_add(path, uid, 0o7, default=True)
            elif stat.S_ISREG(st.st_mode):  # executable for it only where it is for the owner
                _acl_add(path, uid, 0o6 | (st.st_mode >> 6) & 0o1)


__all__ = [
    "ACL_WALK_MAX",
    "AUTO_RANGE",
    "RunAs",
    "UidCollision",
    "UidMap",
    "check_range",
    "grant",
    "parse_range",
    "run_as_for",
    "status",
    "uid_for",
]
