"""``GET /workspace/preflight``: daemon-local readiness cells (and the cell type).

Theory of operation
-------------------
Daemon-local cells describe the host the daemon runs on: the Python runtime, the CLI
entry, the bound workspace directory, and the optional tools an agent typically shells
out to (``rg``, ``git``, ``npm``, ``node``). Agent-local cells (``locality: "acp"``) come
from :func:`serve.status.agent.acp_cells` and never start an agent.

A tool is located with ``shutil.which`` in a worker thread; its version comes from
running ``<tool> --version`` once, bounded by :data:`PROBE_TIMEOUT_S` (trio kills and
reaps a probe that overruns; its version is then reported as unknown), with the daemon's
secrets scrubbed from the probe's environment. Results are cached for
:data:`PROBE_CACHE_S` so polling the route does not fork processes; concurrent cold
requests may probe twice, which is harmless. A missing optional tool is a ``warning``
with ``errorKind: "missing_binary"``, never an error: the daemon works without it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from typing import Any, Final, Literal

import msgspec
import trio

from acp.children import run_process
from acp.process import scrub_env

__all__ = [
    "OPTIONAL_TOOLS",
    "PROBE_CACHE_S",
    "PROBE_TIMEOUT_S",
    "REQUIRED_PYTHON",
    "PreflightCell",
    "daemon_cells",
]

#: Tools probed, as (cell kind, executable name).
OPTIONAL_TOOLS: Final = (("ripgrep", "rg"), ("git", "git"), ("npm", "npm"), ("node", "node"))
#: Longest a ``--version`` probe may run (seconds).
PROBE_TIMEOUT_S: Final = 5.0
#: How long a probe result is reused (seconds).
PROBE_CACHE_S: Final = 300.0
#: Most bytes of probe output looked at.
MAX_PROBE_OUTPUT_BYTES: Final = 4096
REQUIRED_PYTHON: Final = (3, 13)

_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")

Locality = Literal["daemon", "acp"]


class PreflightCell(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """One ``DaemonPreflightCell``; absent optional fields are omitted."""

    kind: str
    status: str
    locality: Locality
    detail: dict[str, Any] | None = None
    error: str | None = None
    error_kind: str | None = None
    hint: str | None = None


class _Probe(msgspec.Struct, frozen=True):
    found: bool
    version: str | None
    at: float


_cache: dict[str, _Probe] = {}


async def _probe(executable: str) -> _Probe:
    cached = _cache.get(executable)
    now = time.monotonic()
    if cached is not None and now - cached.at < PROBE_CACHE_S:
        return cached
    path = await trio.to_thread.run_sync(shutil.which, executable)
    version: str | None = None
    if path is not None:
        with trio.move_on_after(PROBE_TIMEOUT_S):
            try:
                done = await run_process([path, "--version"], env=scrub_env(os.environ))
            except OSError:
                done = None
            if done is not None and done.returncode == 0:
                match = _VERSION.search(done.stdout[:MAX_PROBE_OUTPUT_BYTES].decode("latin-1"))
                version = match.group(1) if match else None
    probe = _Probe(path is not None, version, time.monotonic())
    _cache[executable] = probe
    return probe


def _tool_cell(kind: str, executable: str, probe: _Probe) -> PreflightCell:
    if not probe.found:
        return PreflightCell(
            kind,
            "warning",
            "daemon",
            error=f"{executable} was not found on PATH",
            error_kind="missing_binary",
            hint=f"install {executable} or add it to the daemon's PATH",
        )
    detail = {"version": probe.version} if probe.version else None
    return PreflightCell(kind, "ok", "daemon", detail=detail)


def _python_cell() -> PreflightCell:
    version = ".".join(str(part) for part in sys.version_info[:3])
    required = ">=" + ".".join(str(part) for part in REQUIRED_PYTHON)
    detail = {"version": version, "required": required}
    if sys.version_info[:2] < REQUIRED_PYTHON:
        return PreflightCell(
            "python_version",
            "error",
            "daemon",
            detail=detail,
            error=f"Python {version} is older than {required}",
            error_kind="missing_binary",
        )
    return PreflightCell("python_version", "ok", "daemon", detail=detail)


def _cli_cell() -> PreflightCell:
    entry = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    detail = {"path": entry, "source": "sys.argv[0]", "interpreter": sys.executable}
    if not entry or not os.path.exists(entry):
        return PreflightCell(
            "cli_entry",
            "warning",
            "daemon",
            detail=detail,
            error="the CLI entry point could not be located",
            error_kind="missing_binary",
        )
    return PreflightCell("cli_entry", "ok", "daemon", detail=detail)


def _workspace_cell(root: str) -> PreflightCell:
    if not os.path.isdir(root):
        return PreflightCell(
            "workspace_dir",
            "error",
            "daemon",
            detail={"path": root},
            error="the bound workspace does not exist or is not a directory",
            error_kind="missing_file",
            hint="restart the daemon with an existing --workspace",
        )
    return PreflightCell("workspace_dir", "ok", "daemon", detail={"path": root})


async def daemon_cells(workspace_root: str) -> list[PreflightCell]:
    """The daemon-local cells, in the seed's order (``python_version`` for ``node_version``)."""
    probes: dict[str, _Probe] = {}

    async def run(executable: str) -> None:
        probes[executable] = await _probe(executable)

    async with trio.open_nursery() as nursery:
        for _, executable in OPTIONAL_TOOLS:
            nursery.start_soon(run, executable)
    host = await trio.to_thread.run_sync(
        lambda: [_python_cell(), _cli_cell(), _workspace_cell(workspace_root)]
    )
    return host + [
        _tool_cell(kind, executable, probes[executable]) for kind, executable in OPTIONAL_TOOLS
    ]
