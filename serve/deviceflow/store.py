"""Persisting device-flow credentials under the state directory (0700 dir, 0600 file).

``<state-dir>/credentials/<providerId>.json`` holds the last token set a flow obtained
for that provider::

    {"v": 1, "providerId": "...", "accessToken": "...", "tokenType": "Bearer",
     "refreshToken"?: "...", "idToken"?: "...", "scope"?: "...", "resourceUrl"?: "...",
     "expiresAt"?: <epoch ms>, "obtainedAt": <epoch ms>}

The write is atomic and private: a temporary file created ``O_EXCL`` with mode 0600 in
the same directory, written, fsynced, renamed over the old file, then the directory is
fsynced. Nothing here logs a token. Every failure (EACCES, EROFS, ENOSPC, a path that is
not a directory, ...) becomes :class:`PersistError`, which the poller reports as
``persist_failed``. Blocking: call :func:`save_credentials` in a worker thread.
"""

from __future__ import annotations

import os
from typing import Any, Final

import msgspec

CREDENTIALS_DIR: Final = "credentials"


class PersistError(Exception):
    """The credentials could not be written; ``path`` is where (kept out of the message,
    which reaches clients as a hint)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def credentials_path(state_dir: str, provider_id: str) -> str:
    return os.path.join(state_dir, CREDENTIALS_DIR, f"{provider_id}.json")


def credential_record(provider_id: str, tokens: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """The stored document from the IdP's token answer (unknown fields are dropped)."""
    record: dict[str, Any] = {
        "v": 1,
        "providerId": provider_id,
        "accessToken": tokens["access_token"],
        "tokenType": tokens.get("token_type") or "Bearer",
    }
    for source, target in (
        ("refresh_token", "refreshToken"),
        ("id_token", "idToken"),
        ("scope", "scope"),
        ("resource_url", "resourceUrl"),
    ):
        value = tokens.get(source)
        if isinstance(value, str) and value:
            record[target] = value
    expires_in = tokens.get("expires_in")
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and expires_in > 0:
        record["expiresAt"] = now_ms + round(expires_in * 1000)
    record["obtainedAt"] = now_ms
    return record


def save_credentials(state_dir: str, provider_id: str, tokens: dict[str, Any], now_ms: int) -> str:
    """Write the credentials atomically with mode 0600; returns the path."""
    path = credentials_path(state_dir, provider_id)
    directory = os.path.dirname(path)
    data = msgspec.json.encode(credential_record(provider_id, tokens, now_ms))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PersistError(f"cannot store the credentials: {exc.strerror or exc}", path) from None
    return path
