"""acp-serve with one fault injected, for supervision tests (a real daemon process).

    python tests/support/faulty_daemon.py FAULT TRIGGER_FILE [acp-serve flags...]

Nothing is wrong until TRIGGER_FILE exists; from then on:

``flaky-service``  an extra optional service ("flaky") crashes 20 ms after every start;
``mediator``       the permission mediator (a child of the root supervisor) crashes 20 ms
                   after every start, so the root exhausts its restart budget and gives up.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import trio

from actors import ChildSpec, Restart
from serve.__main__ import main
from serve.permissions.mediator import PermissionMediator
from serve.runtime import build, daemon


async def _wait_for(trigger: str) -> None:
    while not os.path.exists(trigger):  # noqa: ASYNC110, ASYNC240 (another process makes it)
        await trio.sleep(0.02)
    await trio.sleep(0.02)


def _flaky_service(trigger: str) -> None:
    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await _wait_for(trigger)
        raise RuntimeError("injected fault in an optional service")

    flaky = ChildSpec("flaky", run, Restart.PERMANENT)
    daemon.build_host = functools.partial(build.build_host, extra_services=[flaky])


def _crashing_mediator(trigger: str) -> None:
    original = PermissionMediator.run

    async def run(self: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            value = await nursery.start(functools.partial(original, self))
            task_status.started(value)
            await _wait_for(trigger)
            raise RuntimeError("injected fault in the permission mediator")

    PermissionMediator.run = run  # type: ignore[method-assign]


if __name__ == "__main__":
    fault, trigger, *flags = sys.argv[1:]
    {"flaky-service": _flaky_service, "mediator": _crashing_mediator}[fault](trigger)
    sys.exit(main(flags))
