"""Loads answered from the journal: a journaled session comes back without waking an agent.

Theory of operation
-------------------
A ``load`` or ``resume`` of a session id the daemon has a journal for (after a daemon
restart, or of a closed session whose journal is kept) rebuilds the session's event log
from the journal and answers at once: the session starts *released*, exactly as after an
idle release (``--agent-idle-release-ms``). Its first prompt, model or mode change, or
vendor call binds an agent through the rebind path (``session/resume`` where the agent
offers it, else ``session/load`` with its replay dropped, since the log already holds the
history; ``agent_rebound {trigger}``). So 32 sessions loaded after a restart cost 32 journal
reads, not 32 agent spawns, and a client reading an old conversation never wakes an agent.

What the answer needs without an agent is kept in the journal's meta (``JournalMeta.attrs``),
written once when an agent first set the session up (:func:`agent_attrs`):

* ``agent.setup``: the setup the agent answered with (``models``, ``modes``,
  ``configOptions``, ``_meta``), which the load answers with as ``state``; the current
  model and mode are brought up to date from the journal's last ``model_switched`` /
  ``approval_mode_changed`` events;
* ``agent.restore``: how that agent restores a session (``resume`` or ``load``); only a
  session its agent can restore is loaded lazily, and ``resume`` only when it can resume;
* ``agent.command``: a fingerprint of the agent command. A journal made behind another
  command loads through the agent (the eager path), as does a journal without these
  attributes (written before them), an empty one, or any journal under ``--no-journal``.

The journal is read and opened for appending in one pass (:meth:`Journal.reopen`: one scan,
one worker-thread call, one meta write); the eager path reuses that log
(:meth:`JournalLink.keep`) and writer, so deciding costs no second read.

A lazily loaded session whose agent no longer knows it learns so on its first bind: the
prompt answers ``404`` and the session ends with ``session_died {reason:
"agent_session_not_found"}``, as a released session does.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from acp.schema import SessionSetup, decode_session_setup
from serve.events import EventLog
from serve.journal import JournalBusy, JournalError, JournalMeta, JournalNotFound, Replay
from serve.sessions import turn_record
from serve.sessions.agent_link import AgentLink
from serve.sessions.errors import SessionOwnedElsewhere
from serve.sessions.journal_link import JournalLink, log_from_replay

if TYPE_CHECKING:
    from serve.settings import Settings

log = logging.getLogger(__name__)

ATTR_SETUP = "agent.setup"
ATTR_RESTORE = "agent.restore"
ATTR_COMMAND = "agent.command"
#: The largest setup kept in the meta (bytes of JSON); a larger one is not kept (the
#: session then loads through its agent): ``meta.json`` stays small.
MAX_SETUP_BYTES = 256 * 1024

#: Events whose last occurrence updates the stored setup's current model / mode.
_MODEL_EVENT = "model_switched"
_MODE_EVENT = "approval_mode_changed"


class LazyStart(msgspec.Struct, frozen=True):
    """What a session needs to start released: its rebuilt log and the setup to show."""

    log: EventLog
    setup: SessionSetup


def command_fingerprint(settings: Settings) -> str:
    """The agent command's fingerprint (sha256 of its argv, 16 hex digits)."""
    joined = "\0".join(settings.agent_argv).encode("utf-8", "surrogatepass")
    return hashlib.sha256(joined).hexdigest()[:16]


def agent_attrs(settings: Settings, link: AgentLink) -> dict[str, str]:
    """The meta attributes a later lazy load needs, from the link's agent and setup
    (empty when the agent cannot restore sessions, or the setup is too large to keep)."""
    conn, setup = link.conn, link.setup
    info = conn.info if conn is not None else None
    if info is None or setup is None:
        return {}
    restore = "resume" if info.supports_resume else "load" if info.load_session else ""
    raw = bytes(setup.raw) if setup.raw else b"{}"
    if not restore or len(raw) > MAX_SETUP_BYTES:
        return {}
    return {
        ATTR_SETUP: raw.decode("utf-8", "replace"),
        ATTR_RESTORE: restore,
        ATTR_COMMAND: command_fingerprint(settings),
    }


def _eager_reason(attrs: dict[str, str], settings: Settings, action: str) -> str | None:
    """Why a journal with records cannot answer ``action`` without the agent (None: it can)."""
    if ATTR_SETUP not in attrs:
        return "no agent setup kept in its meta"
    if attrs.get(ATTR_COMMAND) != command_fingerprint(settings):
        return "journaled behind another agent command"
    restore = attrs.get(ATTR_RESTORE)
    if action == "resume" and restore != "resume":
        return "its agent cannot resume"
    if action == "load" and restore not in ("load", "resume"):
        return "its agent cannot restore sessions"
    return None


async def read(
    journal_link: JournalLink,
    nursery: trio.Nursery,
    session_id: str,
    *,
    settings: Settings,
    action: str,
    workspace: str,
    ring_size: int,
    ring_bytes: int,
) -> LazyStart | None:
    """Read the session's journal and open it for appending (one pass,
    :meth:`Journal.reopen`); a :class:`LazyStart` when the session can start released,
    else None, the log kept on ``journal_link`` for the eager path's restore."""
    journal = journal_link.journal
    if journal is None or action not in ("load", "resume"):
        return None
    epoch = str(uuid.uuid4())  # the restored log's, unless the journal was closed cleanly
    created_at_ms = int(time.time() * 1000)

    def meta_for(replay: Replay) -> JournalMeta:
        return JournalMeta(
            session_id=session_id,
            epoch=replay.meta.epoch if replay.clean else epoch,
            workspace=workspace,
            acp_session_id=session_id,
            origin="resume" if action == "resume" else "load",
            created_at_ms=created_at_ms,
            attrs=dict(replay.meta.attrs),
        )

    try:
        replay, writer = await journal.reopen(session_id, tail=ring_size, meta_for=meta_for)
    except JournalNotFound:
        log.info("session %s has no journal: its %s goes through the agent", session_id, action)
        return None
    except JournalBusy as exc:  # a shared journal: another live daemon owns it
        raise SessionOwnedElsewhere(session_id, str(exc)) from None
    except JournalError as exc:
        log.warning("journal of session %s not reopened: %s", session_id, exc)
        return None
    restored = log_from_replay(session_id, replay, ring_size, ring_bytes, epoch=writer.meta.epoch)
    await journal_link.adopt(nursery, restored, writer)  # kept when it is opened again
    journal_link.on_record = turn_record.scan(replay)  # settled once the log is in place
    attrs = journal_link.attrs
    why = "no records" if not replay.records else _eager_reason(attrs, settings, action)
    if why is not None:
        log.info(
            "journal of session %s: its %s goes through the agent (%s)", session_id, action, why
        )
        journal_link.keep(restored, bool(replay.records))
        return None
    try:
        setup = decode_session_setup(msgspec.Raw(attrs[ATTR_SETUP].encode()))
    except (msgspec.DecodeError, ValueError) as exc:
        log.warning("session %s: stored setup unreadable (%s): load via the agent", session_id, exc)
        journal_link.keep(restored, True)
        return None
    return LazyStart(restored, _with_current(setup, *_last_switches(replay)))


_Envelope = msgspec.json.Decoder(dict[str, Any])


def _last_switches(replay: Replay) -> tuple[str | None, str | None]:
    """The model and mode the journal's last switches set (None: no switch journaled)."""
    model = mode = None
    for record in reversed(replay.records):
        if record.event_type not in (_MODEL_EVENT, _MODE_EVENT):
            continue
        if (model if record.event_type == _MODEL_EVENT else mode) is not None:
            continue
        data = _frame_data(record.frame)
        if record.event_type == _MODEL_EVENT and isinstance(data.get("modelId"), str):
            model = data["modelId"]
        elif record.event_type == _MODE_EVENT and isinstance(data.get("next"), str):
            mode = data["next"]
        if model is not None and mode is not None:
            break
    return model, mode


def _frame_data(frame: bytes) -> dict[str, Any]:
    start = frame.find(b"\ndata: ")
    if start < 0:
        return {}
    try:
        envelope = _Envelope.decode(frame[start + 7 :].rstrip(b"\n"))
    except (msgspec.DecodeError, RecursionError):
        return {}
    data = envelope.get("data")
    return data if isinstance(data, dict) else {}


def _with_current(setup: SessionSetup, model: str | None, mode: str | None) -> SessionSetup:
    """``setup`` with its raw ``models.currentModelId`` / ``modes.currentModeId`` set to the
    journaled switches (what the agent would answer a load with)."""
    if model is None and mode is None:
        return setup
    try:
        raw = msgspec.json.decode(bytes(setup.raw))
    except (msgspec.DecodeError, RecursionError):
        return setup
    if not isinstance(raw, dict):
        return setup
    if model is not None and isinstance(raw.get("models"), dict):
        raw["models"]["currentModelId"] = model
    if mode is not None and isinstance(raw.get("modes"), dict):
        raw["modes"]["currentModeId"] = mode
    return decode_session_setup(msgspec.Raw(msgspec.json.encode(raw)))


async def remember(journal_link: JournalLink, settings: Settings, link: AgentLink) -> None:
    """After an agent set the session up: keep what a later lazy load needs in the meta
    (a write only when it changed: a session loaded through its agent, an old journal)."""
    attrs = agent_attrs(settings, link)
    if attrs:
        await journal_link.remember(attrs)


__all__ = [
    "LazyStart",
    "agent_attrs",
    "command_fingerprint",
    "read",
    "remember",
]
