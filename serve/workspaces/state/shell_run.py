"""Run one user shell command: ``/bin/sh -c`` in its own process group, bounded, reaped.

Theory of operation
-------------------
:func:`run_shell` starts ``/bin/sh -c COMMAND`` with ``start_new_session=True`` (so the
shell and everything it starts share a process group whose id is the shell's pid), stdin
from ``/dev/null``, stdout and stderr merged into one pipe, in ``cwd``, with the given
environment (the caller passes the daemon's scrubbed environment), through the exec wrapper of
``acp/confine.py`` when given a ``confine`` (the session's agent sandbox). One task drains the
pipe:

* the response keeps the *last* ``output_limit`` bytes (oldest dropped at a UTF-8
  boundary, ``truncated`` set), like ACP terminals;
* ``on_output`` receives the *first* ``output_limit`` bytes as decoded text chunks while
  they arrive (for ``session_update`` streaming), then nothing more.

Ending. When the shell exits, the drain gets :data:`DRAIN_GRACE_S` to read what is left,
then the process group is SIGKILLed (a background job the command left behind does not
outlive the request) and the drain stops. At ``timeout_s`` the group is SIGKILLed and the
outcome says ``aborted`` and ``timed_out``. If the caller is cancelled (the HTTP client
went away) the group is SIGKILLed and the shell reaped under a shield before
``trio.Cancelled`` propagates. The shell is always reaped (bounded by
:data:`REAP_TIMEOUT_S` after SIGKILL, which cannot be ignored).

Errors: ``OSError`` when ``/bin/sh`` cannot be started (the caller reports it).
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Final

import msgspec
import trio

from acp.children import open_process
from acp.confine import Confinement
from acp.terminal import trim_output

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "DEFAULT_TIMEOUT_S",
    "DRAIN_GRACE_S",
    "SHELL",
    "ShellOutcome",
    "kill_group",
    "run_shell",
    "signal_name",
]

SHELL: Final = "/bin/sh"
#: The reference's bound on one user shell command.
DEFAULT_TIMEOUT_S: Final = 120.0
#: Output kept for the response and streamed as events (bytes each).
DEFAULT_OUTPUT_LIMIT: Final = 256 * 1024
#: After the shell exits, how long the drain may still read what its children wrote.
DRAIN_GRACE_S: Final = 1.0
#: After SIGKILL, how long to wait for the reap (SIGKILL cannot be ignored).
REAP_TIMEOUT_S: Final = 5.0
_READ_BYTES: Final = 65536


class ShellOutcome(msgspec.Struct, frozen=True):
    """How the command ended. ``signal`` is a name (``SIGKILL``) when a signal ended it."""

    exit_code: int | None
    signal: str | None
    aborted: bool
    timed_out: bool
    output: str
    truncated: bool
    duration_ms: int


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return str(-returncode)


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (gone already: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_shell(
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    on_output: Callable[[str], None] | None = None,
    drain_grace_s: float = DRAIN_GRACE_S,
    confine: Confinement | None = None,
) -> ShellOutcome:
    """Run ``command``; see the module docstring."""
    started = time.monotonic()
    argv = [SHELL, "-c", command]
    child_env = dict(env)
    if confine is not None:
        child_env.update(confine.env)
        argv = confine.wrap(argv)
    proc = await open_process(
        argv,
        cwd=cwd,
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    stdout = proc.stdout
    kept = bytearray()
    truncated = False
    streamed = 0
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    eof = trio.Event()

    async def drain() -> None:
        nonlocal truncated, streamed
        try:
            while True:
                data = await stdout.receive_some(_READ_BYTES)
                if not data:
                    break
                kept.extend(data)
                if trim_output(kept, output_limit):
                    truncated = True
                if on_output is not None and streamed < output_limit:
                    piece = data[: output_limit - streamed]
                    streamed += len(piece)
                    text = decoder.decode(piece, final=streamed >= output_limit)
                    if text:
                        on_output(text)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            eof.set()

    timed_out = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            with trio.move_on_after(timeout_s) as deadline:
                await proc.wait()
                with trio.move_on_after(drain_grace_s):
                    await eof.wait()
            timed_out = deadline.cancelled_caught
            kill_group(proc.pid)
            with trio.move_on_after(drain_grace_s):
                await eof.wait()
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                kill_group(proc.pid)
                with trio.move_on_after(REAP_TIMEOUT_S):
                    await proc.wait()
            await stdout.aclose()
    if on_output is not None and streamed < output_limit:
        tail = decoder.decode(b"", final=True)
        if tail:
            on_output(tail)
    returncode = proc.returncode
    return ShellOutcome(
        exit_code=returncode if returncode is not None and returncode >= 0 else None,
        signal=signal_name(returncode),
        aborted=timed_out,
        timed_out=timed_out,
        output=kept.decode("utf-8", "replace"),
        truncated=truncated,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
