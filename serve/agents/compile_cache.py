"""A persistent module compile cache for node-based agents (``NODE_COMPILE_CACHE``).

Theory of operation
-------------------
Node >= 22.1 keeps V8's compiled code of every module it loads in ``NODE_COMPILE_CACHE`` when
that variable names a directory, and reuses it on the next start: an agent made of tens of
MiB of bundled JavaScript (qwen-code, gemini-cli, claude-agent-acp) then skips most of its
parse and compile work on every spawn. Older node ignores the variable.

Node writes the cache when the process *exits cleanly*; an agent the daemon SIGTERMs or
SIGKILLs (a crash, a busy child at teardown, an idle child past its 0.2 s EOF grace) writes
nothing. So the cache is populated by the daemon itself, once: :func:`warm_up` runs at the
primary workspace's pool start and, when the cache directory holds no entries for the
current agent command, spawns one **probe** child (the agent, ``initialize``, then stdin EOF
and up to :data:`PROBE_EXIT_GRACE_S` for its clean exit). It costs one agent start on the
first start of a state directory (and after the agent's entry point changes), in the
background: readiness and the first sessions do not wait for it.

Who may write it: the probe (the daemon's own, before any session exists). Every agent
child gets ``NODE_COMPILE_CACHE`` (from :func:`serve.sessions.agent_link.agent_env`), which
node reads, and would also write on a clean exit; a file sandbox in force gives the agents
the directory read-only, because the cache holds code that every later agent child runs: an
agent that could write it could plant code in its neighbours (node does not fail when it
cannot write the cache; it only skips writing).

Bounds: the directory is removed and rebuilt by the next probe when it exceeds
``--agent-compile-cache-mb`` MiB (checked at start, in a worker thread), and when the stamp
(``.acp-serve-stamp``: the agent argv and its entry point's size and mtime) no longer
matches the agent command. ``--agent-compile-cache-mb 0`` turns it off. An operator's own
``NODE_COMPILE_CACHE`` in the daemon's environment wins (and is then not probed or bounded).

Which agents are node-based: the command is ``node`` (or ``nodejs``), or its entry point is
a script whose ``#!`` line names node.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Final

import trio

from acp.client import AgentConnection
from serve.settings import Settings

log = logging.getLogger(__name__)

#: The stamp file naming the agent command the cache was populated for.
STAMP_NAME: Final = ".acp-serve-stamp"
#: How long the probe child may take to exit cleanly after stdin EOF (seconds).
PROBE_EXIT_GRACE_S: Final = 10.0
#: The first bytes of an entry point read to find its ``#!`` line.
SHEBANG_READ_BYTES: Final = 256
_NODE_NAMES: Final = frozenset({"node", "nodejs"})


def is_node_command(argv: Sequence[str], path: str | None = None) -> bool:
    """Whether ``argv`` starts node: ``node ...`` or a script whose ``#!`` line names node.
    Reads at most :data:`SHEBANG_READ_BYTES` of the entry point (call it from a thread)."""
    if not argv:
        return False
    exe = shutil.which(argv[0], path=path) or argv[0]
    if os.path.basename(exe) in _NODE_NAMES:
        return True
    try:
        with open(exe, "rb") as f:
            head = f.read(SHEBANG_READ_BYTES)
    except OSError:
        return False
    if not head.startswith(b"#!"):
        return False
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return any(os.path.basename(word) in _NODE_NAMES for word in first)


def stamp_for(argv: Sequence[str], path: str | None = None) -> dict[str, object]:
    """What the cache was populated for: the argv and its entry point's size and mtime (the
    script after ``node``, else the command itself)."""
    entry = argv[1] if len(argv) > 1 and os.path.basename(argv[0]) in _NODE_NAMES else argv[0]
    resolved = shutil.which(entry, path=path) or entry
    node = shutil.which("node", path=path) or ""
    return {
        "argv": list(argv),
        "entry": [resolved, *_ident(resolved)],
        "node": [node, *_ident(node)],
    }


def _ident(path: str) -> list[int]:
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [st.st_size, st.st_mtime_ns]


def _tree_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def prepare(cache: str, *, max_bytes: int, stamp: Mapping[str, object]) -> bool:
    """Make ``cache`` (0700) fit for use and say whether it needs a probe: it is emptied when
    it is over ``max_bytes`` or was populated for another command (blocking: a thread).
    Emptied in place, never replaced: sandboxed children already running hold their read
    grant on this directory (serve/isolation/sandbox.py)."""
    stamp_path = os.path.join(cache, STAMP_NAME)
    if os.path.isdir(cache):
        try:
            with open(stamp_path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = None
        if old == stamp and _tree_bytes(cache) <= max_bytes:
            return False
        for entry in os.scandir(cache):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    os.chmod(cache, 0o700)
    return True


def _write_stamp(cache: str, stamp: Mapping[str, object]) -> bool:
    """Record the stamp (also when node wrote nothing: an older node, not probed again until
    node or the agent changes); returns whether the probe left entries."""
    tmp = os.path.join(cache, STAMP_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(stamp, f)
    os.replace(tmp, os.path.join(cache, STAMP_NAME))
    return any(name != STAMP_NAME for name in os.listdir(cache))


async def warm_up(settings: Settings, *, cwd: str, env: Mapping[str, str]) -> bool:
    """Populate the compile cache with one probe child when it needs one (module doc);
    returns whether a probe ran and left a cache. Never raises for the agent's failures."""
    cache = settings.node_compile_cache_dir
    if cache is None or env.get("NODE_COMPILE_CACHE") != cache:
        return False  # off, or the operator's own cache
    argv = settings.agent_argv
    path = env.get("PATH")
    if not await trio.to_thread.run_sync(is_node_command, argv, path):
        return False
    stamp = await trio.to_thread.run_sync(stamp_for, argv, path)
    max_bytes = settings.agent_compile_cache_mb * 1024 * 1024
    try:
        needed = await trio.to_thread.run_sync(
            lambda: prepare(cache, max_bytes=max_bytes, stamp=stamp)
        )
    except OSError as exc:
        log.warning("node compile cache %s unusable: %s", cache, exc)
        return False
    if not needed:
        return False
    timeout_s = settings.initialize_timeout_ms / 1000
    started = trio.current_time()
    try:
        async with trio.open_nursery() as nursery:
            conn = await AgentConnection.spawn(
                nursery,
                argv,
                cwd=cwd,
                env=env,
                request_timeout_s=timeout_s,
                max_line_bytes=settings.max_agent_line_bytes,
            )
            try:
                await conn.initialize(timeout_s=timeout_s)
                # Its clean exit after stdin EOF writes the cache. Waited for here, where
                # a daemon shutdown may cancel the wait (a shielded close would hold the
                # exit for up to PROBE_EXIT_GRACE_S): then it is stopped at once.
                await conn.process.close_stdin()
                with trio.move_on_after(PROBE_EXIT_GRACE_S):
                    await conn.process.wait()
            finally:
                info = await conn.aclose(grace_s=1.0, eof_grace_s=0.0)
    except Exception as exc:  # the agent's failure is the pool's to report, not ours
        log.info("node compile cache probe did not complete: %s", exc)
        return False
    wrote = await trio.to_thread.run_sync(_write_stamp, cache, stamp)
    log.info(
        "node compile cache %s %s by a probe run of the agent (%s after %.2fs)",
        cache,
        "populated" if wrote else "not written (node older than 22.1?)",
        info.describe(),
        trio.current_time() - started,
    )
    return wrote
