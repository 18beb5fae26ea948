"""The scripted agent's on-disk session store: one JSON file per session.

``<state_dir>/sessions/<sessionId>.json`` holds a :class:`SessionRecord`: cwd, title, mode,
model, timestamps and the history (``user`` / ``agent`` / ``thought`` text entries, consecutive
entries of one role coalesced). Files are written atomically (temporary file + ``rename``), so
a crash mid-write leaves the previous version. The store is used from several threads; callers
serialise writes per session.

The store is bounded on disk: :meth:`Store.prune` (at start and at most once a minute after a
save) deletes session files not written for ``retention_ms`` (``ACP_SCRIPTED_RETENTION_MS``,
default 7 days, ``0`` = keep; acp-serve passes its ``--journal-retention-ms``), then, while
the files together exceed ``max_bytes`` (``ACP_SCRIPTED_MAX_STORE_BYTES``, default 256 MiB),
the least recently written ones. Leftover temporary files older than an hour go too.

A session that any live process holds is never pruned, by that process or by another one
sharing the directory (a warm spare, a refill, a packed sibling started after it): the holder
keeps a shared ``flock`` on ``<sessionId>.lease`` from its first save or restore until it
closes the session or exits (the kernel drops the lock with the process, so a crashed holder
leaves nothing held). The pruner deletes a file only while it holds that lease exclusively. At
most one lease file per session file exists; orphaned, unheld leases are pruned too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
import time
from typing import Final

import msgspec

_SESSION_ID_RE: Final = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
DEFAULT_RETENTION_MS: Final = 7 * 24 * 3600 * 1000
DEFAULT_MAX_STORE_BYTES: Final = 256 * 1024 * 1024
PRUNE_INTERVAL_S: Final = 60.0
STALE_TMP_S: Final = 3600.0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        return default
    return value if value >= 0 else default


class HistoryEntry(msgspec.Struct, frozen=True):
    role: str  # user | agent | thought
    text: str


class SessionRecord(msgspec.Struct, kw_only=True):
    session_id: str
    cwd: str
    title: str | None = None
    created_at: str
    updated_at: str
    mode_id: str = "default"
    model_id: str = "scripted-fast"
    history: list[HistoryEntry] = []

    def add(self, role: str, text: str) -> None:
        if not text:
            return
        if self.history and self.history[-1].role == role:
            last = self.history[-1]
            self.history[-1] = HistoryEntry(role, last.text + text)
        else:
            self.history.append(HistoryEntry(role, text))


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def default_state_dir() -> str:
    env = os.environ.get("ACP_SCRIPTED_STATE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "acp-serve", "scripted-agent")


def valid_session_id(session_id: str) -> bool:
    return bool(_SESSION_ID_RE.match(session_id))


class Store:
    def __init__(
        self,
        state_dir: str,
        *,
        retention_ms: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.dir = os.path.join(state_dir, "sessions")
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(SessionRecord)
        self.retention_ms = (
            _env_int("ACP_SCRIPTED_RETENTION_MS", DEFAULT_RETENTION_MS)
            if retention_ms is None
            else retention_ms
        )
        self.max_bytes = (
            _env_int("ACP_SCRIPTED_MAX_STORE_BYTES", DEFAULT_MAX_STORE_BYTES)
            if max_bytes is None
            else max_bytes
        )
        self._mine: dict[str, int] = {}  # session id -> fd of its held lease (one per session)
        self._lock = threading.Lock()
        self._next_prune = 0.0
        self.pruned = 0
        self.prune()

    def prune(self, now: float | None = None) -> int:
        """Apply the retention and the byte bound; returns how many session files went."""
        now = time.time() if now is None else now
        with self._lock:
            self._next_prune = time.monotonic() + PRUNE_INTERVAL_S
            mine = set(self._mine)
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return 0
        files: list[tuple[float, int, str]] = []
        total = 0
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if entry.name.endswith(".tmp"):
                if now - st.st_mtime > STALE_TMP_S:
                    _unlink(entry.path)
                continue
            if entry.name.endswith(".lease"):
                stem = entry.name[: -len(".lease")]
                if stem not in mine and not os.path.exists(self._path(stem)):
                    _remove_unheld(entry.path, ())
                continue
            if not entry.name.endswith(".json"):
                continue
            total += st.st_size
            if entry.name[: -len(".json")] not in mine:
                files.append((st.st_mtime, st.st_size, entry.path))
        files.sort()
        removed = 0
        for mtime, size, path in files:
            expired = bool(self.retention_ms) and (now - mtime) * 1000 > self.retention_ms
            over = bool(self.max_bytes) and total > self.max_bytes
            if (expired or over) and _remove_unheld(path[: -len(".json")] + ".lease", (path,)):
                total -= size
                removed += 1
        self.pruned += removed
        return removed

    def _path(self, session_id: str) -> str:
        return os.path.join(self.dir, session_id + ".json")

    def hold(self, session_id: str) -> None:
        """Keep ``session_id`` from every pruner sharing the directory until :meth:`release`."""
        with self._lock:
            if session_id in self._mine:
                return
        os.makedirs(os.path.dirname(self.dir), mode=0o700, exist_ok=True)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        lease = os.path.join(self.dir, session_id + ".lease")
        while True:
            fd = os.open(lease, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)  # shared: packed siblings may hold one session
            try:
                current = os.stat(lease)
            except FileNotFoundError:
                current = None
            if current is not None and current.st_ino == os.fstat(fd).st_ino:
                break
            os.close(fd)  # a pruner unlinked this lease while we waited: take a fresh one
        with self._lock:
            if session_id in self._mine:
                os.close(fd)
            else:
                self._mine[session_id] = fd

    def release(self, session_id: str) -> None:
        """This process no longer serves ``session_id``: its file may be pruned again."""
        with self._lock:
            fd = self._mine.pop(session_id, None)
        if fd is not None:
            os.close(fd)

    def save(self, record: SessionRecord) -> None:
        # Private: a conversation is the user's (0700 folder, 0600 files, whatever the umask).
        os.makedirs(os.path.dirname(self.dir), mode=0o700, exist_ok=True)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        path = self._path(record.session_id)
        # (unique: agents of daemons sharing the directory may have the same pid in their pods)
        tmp = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(self._encoder.encode(record))
        os.replace(tmp, path)
        self.hold(record.session_id)
        with self._lock:
            due = time.monotonic() >= self._next_prune
        if due:
            self.prune()

    def load(self, session_id: str) -> SessionRecord | None:
        if not valid_session_id(session_id):
            return None
        try:
            with open(self._path(session_id), "rb") as f:
                return self._decoder.decode(f.read())
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def list(self) -> list[SessionRecord]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        records = []
        for name in names:
            if name.endswith(".json"):
                record = self.load(name[: -len(".json")])
                if record is not None:
                    records.append(record)
        records.sort(key=lambda r: (r.updated_at, r.session_id), reverse=True)
        return records


def _remove_unheld(lease: str, paths: tuple[str, ...]) -> bool:
    """Delete ``paths`` and then ``lease``, unless a live process holds the lease.

    True when something was deleted: every one of ``paths``, or with no ``paths`` (an orphaned
    lease) the lease itself. A session file without a lease (never held) is not protected.
    """
    try:
        fd: int | None = os.open(lease, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live process serves this session
        gone = all([_unlink(p) for p in paths])
        lease_gone = fd is not None and _unlink(lease)
        return gone if paths else lease_gone
    finally:
        if fd is not None:
            os.close(fd)


def _unlink(path: str) -> bool:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        return True
    return False
