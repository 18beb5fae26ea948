"""The durable outbox and the API subscriptions on disk: blocking functions, run by the
service in worker threads (``serve.threads.webhooks_limiter``).

Layout under ``<state dir>/webhooks/`` (directory mode 0700, files 0600, they hold
secrets)::

    subscriptions.json     the API subscriptions (the config file's are not stored)
    outbox/<seq>.msg       one message owed to one subscription (msgspec JSON)

fsync policy: a message is written to a temporary file, ``fsync``ed, renamed into place
and the directory ``fsync``ed *before* the service queues it for delivery, so a message
the service accepted survives a crash or SIGKILL. A delivered (or expired) message's file
is unlinked without an fsync: after a crash it may be delivered again (at least once;
receivers deduplicate on ``webhook-id``). The attempt count is not written back: after a
restart a message is retried until ``maxAttempts`` again, still bounded by ``maxAgeS``
from its creation. ``subscriptions.json`` is replaced atomically the same way.
"""

from __future__ import annotations

import contextlib
import os

import msgspec

from serve.webhooks.model import Subscription

__all__ = [
    "Loaded",
    "Message",
    "load",
    "load_subscriptions",
    "remove",
    "save_subscriptions",
    "write",
]


class Message(msgspec.Struct, frozen=True):
    """One message owed: ``created`` (Unix seconds) bounds its retries."""

    seq: int
    sub_id: str
    msg_id: str
    type: str
    body: bytes
    created: float


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(Message)
_subs = msgspec.json.Decoder(list[Subscription])


def _dir(root: str) -> str:
    path = os.path.join(root, "outbox")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write(root: str, message: Message) -> None:
    _atomic(os.path.join(_dir(root), f"{message.seq:020d}.msg"), _enc.encode(message))


def remove(root: str, seq: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, "outbox", f"{seq:020d}.msg"))


class Loaded(msgspec.Struct, frozen=True):
    """What :func:`load` found: the messages (oldest first), the highest sequence number
    of any message file (also those left for later), the unreadable files removed."""

    messages: list[Message]
    last_seq: int
    bad: int


def load(root: str, max_entries: int) -> Loaded:
    """The messages owed, oldest first, at most ``max_entries`` (the rest stay on disk for
    a later start)."""
    path = _dir(root)
    bad = 0
    out: list[Message] = []
    names = sorted(os.listdir(path))
    last = 0
    for name in names:
        if name.endswith(".msg") and name[:-4].isdigit():
            last = max(last, int(name[:-4]))
    for name in names:
        full = os.path.join(path, name)
        if not name.endswith(".msg"):
            with contextlib.suppress(OSError):
                os.unlink(full)  # a temporary file of a write that did not finish
            continue
        try:
            with open(full, "rb") as f:
                out.append(_dec.decode(f.read()))
        except (OSError, msgspec.DecodeError):
            bad += 1
            with contextlib.suppress(OSError):
                os.unlink(full)
        if len(out) >= max_entries:
            break
    return Loaded(out, last, bad)


def load_subscriptions(root: str) -> list[Subscription]:
    try:
        with open(os.path.join(root, "subscriptions.json"), "rb") as f:
            return _subs.decode(f.read())
    except FileNotFoundError:
        return []


def save_subscriptions(root: str, subs: list[Subscription]) -> None:
    os.makedirs(root, mode=0o700, exist_ok=True)
    _atomic(os.path.join(root, "subscriptions.json"), _enc.encode(subs))
