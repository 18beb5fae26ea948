"""The scripted agent's on-disk session store: one JSON file per session.

``<state_dir>/sessions/<sessionId>.json`` holds a :class:`SessionRecord`: cwd, title, mode,
model, timestamps and the history (``user`` / ``agent`` / ``thought`` text entries, consecutive
entries of one role coalesced). Files are written atomically (temporary file + ``rename``), so
a crash mid-write leaves the previous version. The store is used from several threads; callers
serialise writes per session.
"""

from __future__ import annotations

import os
import re
import time
from typing import Final

import msgspec

_SESSION_ID_RE: Final = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


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
    def __init__(self, state_dir: str) -> None:
        self.dir = os.path.join(state_dir, "sessions")
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(SessionRecord)

    def _path(self, session_id: str) -> str:
        return os.path.join(self.dir, session_id + ".json")

    def save(self, record: SessionRecord) -> None:
        os.makedirs(self.dir, exist_ok=True)
        path = self._path(record.session_id)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(self._encoder.encode(record))
        os.replace(tmp, path)

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
