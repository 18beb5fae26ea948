"""Spawn and supervise one agent child process (its own process group, pipes, stderr tail).

Theory of operation
-------------------
:meth:`AgentProcess.spawn` starts ``argv`` with ``cwd`` and a scrubbed environment in a new
session (so its pgid equals its pid and every grandchild it forks shares that group), with
stdin/stdout/stderr pipes, and starts :meth:`AgentProcess._supervise` in the caller's nursery.
That one task owns the child:

* it drains stderr into a bounded tail (``stderr_tail_bytes``, default 64 KiB; older bytes are
  dropped), so a chatty agent can never block on a full pipe;
* it waits for the exit (trio uses a pidfd; the child is reaped by that wait), then kills what
  is left of the process group (grandchildren orphaned by the exit: SIGTERM, a short grace,
  SIGKILL) and reaps any that were re-parented to us (only when the daemon is a child
  subreaper, see :func:`become_subreaper`);
* it publishes an :class:`ExitInfo` (code or signal, the redacted stderr tail) and sets the
  ``exited`` event that :meth:`wait` waits on.

If the owning nursery is cancelled, ``_supervise`` runs the full stop escalation under a shield
with its own deadline before it lets the cancellation through: no child outlives its owner.

:meth:`stop` is the polite path: close stdin (ACP's shutdown signal) -> wait ``grace_s`` ->
SIGTERM the group -> wait ``grace_s`` -> SIGKILL the group -> wait for the reap. It is shielded
and bounded, idempotent, and safe to call from a cancelled scope.

The stdout pipe is *not* read here: :class:`acp.client.AgentConnection` owns it. stdin is
written by the connection's writer task; :meth:`stop` closes it.

Environment: :func:`scrub_env` drops the daemon's own secrets (``QWEN_SERVER_TOKEN`` and
friends) but keeps the agent's model credentials, which it needs. Anything in the stderr tail
that looks like a credential, and the literal values of secret-looking variables passed to the
child, are replaced by ``[REDACTED]`` before the tail is shown to anyone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec
import trio
import trio.lowlevel

from acp import procfs
from acp.children import (
    MARKER_ENV,
    agent_marker,
    become_subreaper,
    marked_descendants,
    open_process,
    reap_adopted,
    scan_limiter,
)
from acp.confine import Confinement

log = logging.getLogger(__name__)

STDERR_TAIL_BYTES: Final = 64 * 1024
DEFAULT_GRACE_S: Final = 2.0
KILL_REAP_TIMEOUT_S: Final = 5.0
LEFTOVER_GRACE_S: Final = 0.5

# The daemon's own secrets: never forwarded to an agent.
_DENY_EXACT: Final = frozenset(
    {"QWEN_SERVER_TOKEN", "QWEN_SERVE_TOKEN", "ACP_SERVE_TOKEN", "ACP_SERVER_TOKEN"}
)
_DENY_PREFIXES: Final = ("ACP_SERVE_", "QWEN_SERVER_", "QWEN_SERVE_")
_SECRET_NAME: Final = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|PRIVATE", re.I)

_CREDENTIAL_PATTERNS: Final = re.compile(
    r"""
    (?P<bearer>\b(?:Bearer|Basic|Token)\s+)[A-Za-z0-9._~+/=-]{8,}
    | \bsk-[A-Za-z0-9_-]{12,}
    | \bgh[pousr]_[A-Za-z0-9]{20,}
    | \bxox[abprs]-[A-Za-z0-9-]{10,}
    | \bAKIA[0-9A-Z]{16}\b
    | \beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*
    | (?P<kv>\b[\w.-]*(?:api[_-]?key|token|secret|passw(?:or)?d|authorization)[\w.-]*
         ["']?\s*[:=]\s*["']?(?:(?:Bearer|Basic|Token)\s+)?)[^\s"',;]{4,}
    """,
    re.I | re.X,
)


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` without the daemon's own secrets (``QWEN_SERVER_TOKEN`` etc.).

    Variables under the daemon's prefixes (``ACP_SERVE_*``, ``QWEN_SERVER_*``) are dropped when
    their name looks secret; the agent's own credentials (``OPENAI_API_KEY``...) are kept."""
    out: dict[str, str] = {}
    for name, value in env.items():
        if name in _DENY_EXACT:
            continue
        if name.startswith(_DENY_PREFIXES) and _SECRET_NAME.search(name):
            continue
        out[name] = value
    return out


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """Replace credential-looking substrings and the literal ``secrets`` with ``[REDACTED]``."""
    for secret in secrets:
        if len(secret) >= 6:
            text = text.replace(secret, "[REDACTED]")

    def sub(m: re.Match[str]) -> str:
        prefix = m.group("bearer") or m.group("kv") or ""
        return prefix + "[REDACTED]"

    return _CREDENTIAL_PATTERNS.sub(sub, text)


class ExitInfo(msgspec.Struct, frozen=True, kw_only=True):
    """How the child ended. ``returncode`` is Popen's (negative = killed by that signal)."""

    returncode: int | None
    exit_code: int | None
    signal: int | None
    stderr_tail: str

    @classmethod
    def from_returncode(cls, rc: int | None, stderr_tail: str) -> ExitInfo:
        if rc is None:
            return cls(returncode=None, exit_code=None, signal=None, stderr_tail=stderr_tail)
        if rc < 0:
            return cls(returncode=rc, exit_code=None, signal=-rc, stderr_tail=stderr_tail)
        return cls(returncode=rc, exit_code=rc, signal=None, stderr_tail=stderr_tail)

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            what = f"agent killed by {name}"
        elif self.exit_code is not None:
            what = f"agent exited with status {self.exit_code}"
        else:
            what = "agent exit status unknown"
        last = self.stderr_tail.strip().splitlines()[-1:] if self.stderr_tail else []
        return f"{what}; last stderr: {last[0][:200]!r}" if last else what


def live_group_members(pgid: int) -> list[int]:
    """Pids of the non-zombie processes in process group ``pgid`` (Linux ``/proc`` scan)."""
    return [pid for pid, state, _ppid, group in procfs.stats() if state != b"Z" and group == pgid]


def _killpg(pgid: int, sig: int) -> bool:
    """Signal the group; False when no such group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("not permitted to signal process group %d with %s", pgid, sig)
        return False


def _reap_adopted(pgid: int) -> None:
    """Reap zombies of group ``pgid`` re-parented to us (only happens as a subreaper)."""
    while True:
        try:
            res = os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return
        if res is None:
            return


class _Tail:
    """The last ``limit`` bytes written to it."""

    __slots__ = ("_buf", "limit", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.total = 0

    def append(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        self._buf += data
        excess = len(self._buf) - self.limit
        if excess > 0:
            del self._buf[:excess]

    def text(self) -> str:
        return self._buf.decode("utf-8", "replace")


class AgentProcess:
    """One supervised agent child. Create with :meth:`spawn`; see the module docstring."""

    def __init__(
        self, proc: trio.Process, *, argv: Sequence[str], secrets: Sequence[str], tail_bytes: int
    ) -> None:
        self._proc = proc
        self.argv = tuple(argv)
        self.pid: int = proc.pid
        self.pgid: int = proc.pid  # start_new_session: the child leads its own group
        #: The MARKER_ENV value given to the child (None when it was spawned elsewhere).
        self.marker: str | None = None
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.stdin: trio.abc.SendStream = proc.stdin
        self.stdout: trio.abc.ReceiveStream = proc.stdout
        self._stderr: trio.abc.ReceiveStream = proc.stderr
        self._secrets = tuple(secrets)
        self._tail = _Tail(tail_bytes)
        self._exited = trio.Event()
        self._exit: ExitInfo | None = None
        self._stdin_closed = False
        self._stderr_eof = trio.Event()
        self._stopping = False
        self._cancel_grace_s = DEFAULT_GRACE_S
        self._started = False

    # -- construction -------------------------------------------------------------------------

    @classmethod
    async def spawn(
        cls,
        nursery: trio.Nursery,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        stderr_tail_bytes: int = STDERR_TAIL_BYTES,
        cancel_grace_s: float = DEFAULT_GRACE_S,
        confine: Confinement | None = None,
    ) -> AgentProcess:
        """Start ``argv`` and its supervising task in ``nursery`` (:meth:`open` + :meth:`start`).

        ``env=None`` means this process's environment; either way it goes through
        :func:`scrub_env`. ``cancel_grace_s`` is the grace per escalation step used when the
        nursery is cancelled. Raises ``OSError`` (e.g. ``FileNotFoundError``) if it cannot
        start."""
        self = await cls.open(
            argv,
            cwd=cwd,
            env=env,
            stderr_tail_bytes=stderr_tail_bytes,
            cancel_grace_s=cancel_grace_s,
            confine=confine,
        )
        self.start(nursery)
        return self

    @classmethod
    async def open(
        cls,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        stderr_tail_bytes: int = STDERR_TAIL_BYTES,
        cancel_grace_s: float = DEFAULT_GRACE_S,
        confine: Confinement | None = None,
    ) -> AgentProcess:
        """Start the child without its supervising task; the caller must call :meth:`start`
        right away (or :meth:`stop`, which then reaps it inline).

        ``confine`` starts it through the wrapper of :mod:`acp.confine` (its cgroups, OOM
        score and file sandbox applied before the ``exec``; same pid), with
        ``confine.env`` added to its environment."""
        if not argv:
            raise ValueError("empty agent command")
        child_env = scrub_env(os.environ if env is None else env)
        secrets = [v for k, v in child_env.items() if _SECRET_NAME.search(k)]
        marker = agent_marker()  # inherited by every descendant, even one that leaves the group
        child_env[MARKER_ENV] = marker
        command = list(argv)
        if confine is not None and not confine.empty:
            # The wrapper always starts; keep "no such command" an OSError here, as unwrapped.
            if shutil.which(command[0], path=child_env.get("PATH", os.defpath)) is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", command[0])
            child_env.update(confine.env)
            command = confine.wrap(command)
        elif confine is not None:
            child_env.update(confine.env)
        proc = await open_process(
            command,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self = cls(proc, argv=argv, secrets=secrets, tail_bytes=stderr_tail_bytes)
        self.marker = marker
        self._cancel_grace_s = cancel_grace_s
        return self

    def start(self, nursery: trio.Nursery) -> None:
        """Start the supervising task (stderr drain, exit watch, group kill) in ``nursery``."""
        if self._started:
            raise RuntimeError("AgentProcess.start() called twice")
        self._started = True
        nursery.start_soon(self._supervise, name=f"acp-process-{self.pid}")

    # -- observation --------------------------------------------------------------------------

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    @property
    def exit_info(self) -> ExitInfo | None:
        return self._exit

    def stderr_tail(self) -> str:
        """The redacted last ``stderr_tail_bytes`` of the child's stderr so far."""
        return redact(self._tail.text(), self._secrets)

    async def wait(self) -> ExitInfo:
        """Wait until the child has exited and been reaped."""
        await self._exited.wait()
        assert self._exit is not None
        return self._exit

    # -- control ------------------------------------------------------------------------------

    async def close_stdin(self) -> None:
        if self._stdin_closed:
            return
        self._stdin_closed = True
        with trio.CancelScope(shield=True):
            try:
                await self.stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the whole process group; False if the group is gone."""
        return _killpg(self.pgid, sig)

    async def stop(
        self, grace_s: float = DEFAULT_GRACE_S, *, eof_grace_s: float | None = None
    ) -> ExitInfo:
        """Stop by escalation (close stdin, SIGTERM group, SIGKILL group), reap, return how it
        ended. Shielded, bounded by about ``2 * grace_s + 5`` s, idempotent.

        ``eof_grace_s`` (default ``grace_s``) is the wait after stdin EOF: an idle agent has
        nothing to finish, so its owner may pass a short one and go on to SIGTERM sooner."""
        eof_wait_s = grace_s if eof_grace_s is None else min(eof_grace_s, grace_s)
        if not self._started:  # never supervised: escalate and reap inline
            with trio.CancelScope(shield=True):
                await self._escalate_inline(grace_s)
                info = ExitInfo.from_returncode(self._proc.returncode, self.stderr_tail())
                self._exit = info
                self._exited.set()
            return info
        with trio.CancelScope(shield=True):
            if self._stopping:  # another task is escalating: just wait for it (bounded)
                with trio.move_on_after(2 * grace_s + KILL_REAP_TIMEOUT_S):
                    await self._exited.wait()
            self._stopping = True
            if not self._exited.is_set():
                await self.close_stdin()
                with trio.move_on_after(eof_wait_s):
                    await self._exited.wait()
            if not self._exited.is_set():
                log.info(
                    "agent %d ignored stdin EOF for %.1fs; sending SIGTERM", self.pid, eof_wait_s
                )
                self.signal_group(signal.SIGTERM)
                with trio.move_on_after(grace_s):
                    await self._exited.wait()
            if not self._exited.is_set():
                log.warning(
                    "agent %d survived SIGTERM for %.1fs; sending SIGKILL", self.pid, grace_s
                )
                self.signal_group(signal.SIGKILL)
                with trio.move_on_after(KILL_REAP_TIMEOUT_S):
                    await self._exited.wait()
        if self._exit is None:  # supervisor not running (should not happen): report what we know
            return ExitInfo.from_returncode(self._proc.returncode, self.stderr_tail())
        return self._exit

    # -- the owning task ----------------------------------------------------------------------

    async def _supervise(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain_stderr)
                await self._proc.wait()
                # The leader is gone: end the orphans it left in its group, which may also hold
                # the stdout/stderr pipes open. Then give stderr a moment to reach EOF.
                await self._kill_leftovers()
                with trio.move_on_after(1.0):
                    await self._stderr_eof.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self._proc.returncode is None:
                    # Cancelled while the child runs: escalate ourselves (stop() needs us, so
                    # do the signalling inline), then reap.
                    await self._escalate_inline(self._cancel_grace_s)
                with trio.move_on_after(0.5):
                    await self._stderr.aclose()
                self._exit = ExitInfo.from_returncode(self._proc.returncode, self.stderr_tail())
                self._exited.set()
                log.debug("agent %d: %s", self.pid, self._exit.describe())

    async def _escalate_inline(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        await self.close_stdin()
        for sig, wait_s in (
            (None, grace_s),
            (signal.SIGTERM, grace_s),
            (signal.SIGKILL, KILL_REAP_TIMEOUT_S),
        ):
            if sig is not None:
                self.signal_group(sig)
            with trio.move_on_after(wait_s):
                await self._proc.wait()
            if self._proc.returncode is not None:
                break
        await self._kill_leftovers()

    async def _kill_leftovers(self) -> None:
        if self.signal_group(signal.SIGTERM):
            deadline = trio.current_time() + LEFTOVER_GRACE_S
            while await trio.to_thread.run_sync(
                live_group_members, self.pgid, limiter=scan_limiter()
            ):
                if trio.current_time() >= deadline:
                    self.signal_group(signal.SIGKILL)
                    break
                await trio.sleep(0.02)
        # Descendants that left the group (setsid) carry the agent's marker: they die too.
        if self.marker is not None:
            escaped = await trio.to_thread.run_sync(
                marked_descendants, os.getpid(), self.marker, limiter=scan_limiter()
            )
            for pid in escaped:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if escaped:
                log.info(
                    "killed %d descendant(s) of agent %d outside its group", len(escaped), self.pid
                )
        _reap_adopted(self.pgid)
        await reap_adopted()

    async def _drain_stderr(self) -> None:
        try:
            while True:
                data = await self._stderr.receive_some(65536)
                if not data:
                    break
                self._tail.append(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._stderr_eof.set()


__all__ = [
    "DEFAULT_GRACE_S",
    "AgentProcess",
    "ExitInfo",
    "become_subreaper",
    "live_group_members",
    "redact",
    "scrub_env",
]
