"""Client-side terminals for ``terminal/*`` requests: real processes, bounded output.

Theory of operation
-------------------
A :class:`TerminalManager` owns the terminals of one connection (or one workspace). It is
given a nursery; each terminal is one task in it that drains the process's combined
stdout+stderr into a bounded buffer and waits for its exit.

* ``create`` starts ``command`` + ``args`` in its own process group, with stdin from
  ``/dev/null``, ``cwd`` (default: the manager's), and the scrubbed daemon environment plus
  the request's ``env``. It returns at once with a terminal id. A manager given a
  ``confine`` (the agent's own :class:`~acp.confine.Confinement`: its file sandbox, cgroups,
  private ``TMPDIR``) starts every command through that wrapper, so a terminal can do no more
  than the agent that asked for it.
* **Whole command lines** (:func:`argv_for`): some agents (kimi) send a shell command line in
  ``command`` and no ``args`` (``"ls -la | head"``). The rule: when ``args`` is empty,
  ``command`` is not an executable on the terminal's ``PATH`` nor a path to one (relative
  paths against the terminal's cwd), and it contains whitespace or a shell metacharacter,
  it runs as ``/bin/sh -c COMMAND``. Otherwise ``command`` is executed directly (never
  through a shell), so an executable whose name has a space still runs as itself and a
  single unknown word still fails with "cannot start".
* Output is kept up to ``outputByteLimit`` bytes (default :data:`DEFAULT_OUTPUT_BYTE_LIMIT`,
  never more than :data:`MAX_OUTPUT_BYTE_LIMIT`); beyond it the *oldest* bytes are dropped at a
  UTF-8 character boundary and ``truncated`` becomes true, as ACP specifies.
* ``wait_for_exit`` returns once the command exited and its output reached EOF (at most
  :data:`EXIT_DRAIN_GRACE_S` after the exit: a background grandchild may keep the pipe
  open), so the next ``output`` holds everything the command printed.
* ``kill`` SIGKILLs the terminal's process group; the terminal stays valid (output and exit
  status can still be read). ``release`` kills it if still running and forgets the id.
* :meth:`TerminalManager.aclose` kills every terminal and waits for the reaps; the owner calls
  it when the connection ends. :meth:`TerminalManager.release_session` kills and forgets every
  terminal of one session (it left a shared connection). At most ``max_terminals`` terminals
  exist at once per session (a connection shared by M sessions holds at most M times that).

A terminal belongs to the session that created it: any other session's request for it gets
``-32002`` (resource not found), as does an unknown or released id.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from typing import Final

import trio

from acp.children import open_process
from acp.confine import Confinement
from acp.errors import INTERNAL_ERROR, INVALID_PARAMS, RESOURCE_NOT_FOUND, HandlerError
from acp.process import scrub_env
from acp.schema import (
    CreateTerminalParams,
    TerminalExitStatus,
    TerminalIdParams,
    TerminalOutputResult,
)

log = logging.getLogger(__name__)

#: The shell that runs a whole command line sent in ``command`` (see :func:`argv_for`).
SHELL: Final = "/bin/sh"
_SHELL_CHARS: Final = frozenset(" \t\n|&;<>()$`\\\"'*?[]#~=%{}!")
DEFAULT_OUTPUT_BYTE_LIMIT: Final = 1 * 2**20
MAX_OUTPUT_BYTE_LIMIT: Final = 16 * 2**20
DEFAULT_MAX_TERMINALS: Final = 32
REAP_TIMEOUT_S: Final = 5.0
#: How long ``wait_for_exit`` waits for the output pipe's EOF after the exit.
EXIT_DRAIN_GRACE_S: Final = 1.0


def trim_output(buf: bytearray, limit: int) -> bool:
    """Drop the oldest bytes of ``buf`` so it fits ``limit``, cutting at a UTF-8 character
    boundary. Returns whether anything was dropped."""
    excess = len(buf) - limit
    if excess <= 0:
        return False
    del buf[:excess]
    # Skip continuation bytes (0b10xxxxxx) left at the front by the cut.
    skip = 0
    while skip < len(buf) and skip < 4 and (buf[skip] & 0xC0) == 0x80:
        skip += 1
    if skip:
        del buf[:skip]
    return True


def _is_executable(command: str, *, path: str | None, cwd: str | None) -> bool:
    if "/" in command:
        target = command if os.path.isabs(command) else os.path.join(cwd or os.getcwd(), command)
        return os.path.isfile(target) and os.access(target, os.X_OK)
    return shutil.which(command, path=path) is not None


def argv_for(command: str, args: list[str], *, path: str | None, cwd: str | None) -> list[str]:
    """The argv a ``terminal/create`` runs (module docstring: whole command lines).

    Blocking (it looks at the file system): call it from a worker thread."""
    if (
        not args
        and any(c in _SHELL_CHARS for c in command)
        and not _is_executable(command, path=path, cwd=cwd)
    ):
        return [SHELL, "-c", command]
    return [command, *args]


class Terminal:
    """One running (or finished) terminal command."""

    def __init__(self, terminal_id: str, session_id: str, proc: trio.Process, limit: int) -> None:
        self.id = terminal_id
        self.session_id = session_id
        self.proc = proc
        self.limit = limit
        self.output = bytearray()
        self.truncated = False
        self.exit_status: TerminalExitStatus | None = None
        self.exited = trio.Event()
        self.drained = trio.Event()  # output reached EOF
        self.done = trio.Event()  # reaped and drained: the task is over

    def result(self) -> TerminalOutputResult:
        return TerminalOutputResult(
            output=self.output.decode("utf-8", "replace"),
            truncated=self.truncated,
            exit_status=self.exit_status,
        )

    def kill(self) -> None:
        if self.done.is_set():
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def run(self) -> None:
        """Drain output and wait for the exit; on cancellation kill the group and reap."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._drain)
                await self.proc.wait()
                self._set_exit()
                # Background grandchildren may keep the pipe (and the drain) going until
                # kill/release ends the group.
        finally:
            with trio.CancelScope(shield=True):
                if self.proc.returncode is None:
                    self.kill()
                    with trio.move_on_after(REAP_TIMEOUT_S):
                        await self.proc.wait()
                self._set_exit()
                self.done.set()
                if self.proc.stdout is not None:
                    await self.proc.stdout.aclose()

    def _set_exit(self) -> None:
        rc = self.proc.returncode
        if rc is None or self.exit_status is not None:
            return
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = str(-rc)
            self.exit_status = TerminalExitStatus(exit_code=None, signal=name)
        else:
            self.exit_status = TerminalExitStatus(exit_code=rc, signal=None)
        self.exited.set()

    async def _drain(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                data = await self.proc.stdout.receive_some(65536)
                if not data:
                    break
                self.output += data
                if trim_output(self.output, self.limit):
                    self.truncated = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.drained.set()


class TerminalManager:
    """The terminals of one owner; see the module docstring."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        max_terminals: int = DEFAULT_MAX_TERMINALS,
        confine: Confinement | None = None,
    ) -> None:
        self._nursery = nursery
        #: Every terminal command is started through this (the agent's cgroups, sandbox, ...).
        self._confine = confine if confine is not None else Confinement()
        self._cwd = cwd
        self._env = scrub_env(os.environ if env is None else env)
        self._max = max_terminals
        self._terminals: dict[str, Terminal] = {}
        self._ids = itertools.count(1)
        self._closed = False

    def __len__(self) -> int:
        return len(self._terminals)

    def _get(self, params: TerminalIdParams) -> Terminal:
        term = self._terminals.get(params.terminal_id)
        if term is None or term.session_id != params.session_id:
            raise HandlerError(
                RESOURCE_NOT_FOUND,
                "Resource not found",
                {"terminalId": params.terminal_id, "reason": "unknown or released terminal"},
            )
        return term

    async def create(self, params: CreateTerminalParams) -> str:
        if self._closed:
            raise HandlerError(INTERNAL_ERROR, "terminals are shut down")
        owned = sum(1 for t in self._terminals.values() if t.session_id == params.session_id)
        if owned >= self._max:
            raise HandlerError(
                INTERNAL_ERROR,
                f"too many terminals (limit {self._max} per session); release some first",
            )
        limit = params.output_byte_limit
        if limit is None:
            limit = DEFAULT_OUTPUT_BYTE_LIMIT
        if limit < 0:
            raise HandlerError(INVALID_PARAMS, "outputByteLimit must not be negative")
        limit = min(limit, MAX_OUTPUT_BYTE_LIMIT)
        env = dict(self._env)
        env.update(self._confine.env)
        env.update({v.name: v.value for v in params.env})
        cwd = params.cwd or self._cwd
        argv = await trio.to_thread.run_sync(
            functools.partial(
                argv_for, params.command, list(params.args), path=env.get("PATH"), cwd=cwd
            )
        )
        if not self._confine.empty:
            # Through the wrapper a missing command would only show as exit 127: refuse it
            # here as an unconfined start would.
            if not await trio.to_thread.run_sync(
                functools.partial(_is_executable, argv[0], path=env.get("PATH"), cwd=cwd)
            ):
                raise HandlerError(
                    INTERNAL_ERROR,
                    f"cannot start terminal command {params.command!r}: not found",
                    {"command": params.command},
                )
            argv = self._confine.wrap(argv)
        try:
            proc = await open_process(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise HandlerError(
                INTERNAL_ERROR,
                f"cannot start terminal command {params.command!r}: {exc}",
                {"command": params.command},
            )
        term = Terminal(f"term_{next(self._ids)}", params.session_id, proc, limit)
        self._terminals[term.id] = term
        self._nursery.start_soon(term.run, name=f"acp-terminal-{term.id}")
        return term.id

    def output(self, params: TerminalIdParams) -> TerminalOutputResult:
        return self._get(params).result()

    async def wait_for_exit(self, params: TerminalIdParams) -> TerminalExitStatus:
        term = self._get(params)
        await term.exited.wait()
        # The output an agent reads next should be complete: give the drain (a pipe read
        # away) a bounded moment; a background grandchild may hold the pipe open for good.
        with trio.move_on_after(EXIT_DRAIN_GRACE_S):
            await term.drained.wait()
        assert term.exit_status is not None
        return term.exit_status

    async def kill(self, params: TerminalIdParams) -> None:
        self._get(params).kill()

    async def release(self, params: TerminalIdParams) -> None:
        term = self._get(params)
        del self._terminals[term.id]
        term.kill()

    def release_session(self, session_id: str) -> int:
        """Kill and forget every terminal of ``session_id`` (it left the connection); the
        terminal tasks reap them. Returns how many there were."""
        terms = [t for t in self._terminals.values() if t.session_id == session_id]
        for term in terms:
            del self._terminals[term.id]
            term.kill()
        return len(terms)

    async def aclose(self) -> None:
        """Kill every terminal and wait (bounded) for them to be reaped. Idempotent."""
        self._closed = True
        terms = list(self._terminals.values())
        self._terminals.clear()
        for term in terms:
            term.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(REAP_TIMEOUT_S):
            for term in terms:
                await term.done.wait()
