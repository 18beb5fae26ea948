"""acp-serve in front of the real ``qwen --acp`` agent (offline, against FakeOpenAI)."""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.fake_openai import FakeOpenAI
from tests.support.node import ensure_qwen, qwen_acp_argv, qwen_env


@contextmanager
def qwen_behind_daemon(token: str, *, prefix: str = "acp-serve-qwen-") -> Iterator[DaemonProcess]:
    """Start the fake model server and a daemon whose agent is ``qwen --acp``."""
    cli = ensure_qwen()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    workspace = tmp / "ws"
    workspace.mkdir()
    with FakeOpenAI(workdir=str(workspace)) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = token
        daemon = spawn_daemon(
            ["--agent", shlex.join(qwen_acp_argv(cli)), "--initialize-timeout-ms", "60000"],
            workspace=workspace,
            env=env,
        )
        try:
            yield daemon
        finally:
            daemon.stop()
