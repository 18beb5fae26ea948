"""Start the real ``acp-serve`` process on 127.0.0.1:0 for tests, and stop it."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_READY = re.compile(r"^acp-serve listening on (https?://\S+) ")


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[str]
    url: str
    workspace: Path
    state_dir: Path
    stderr_path: Path
    lines: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def spawn_daemon(
    args: Sequence[str] = (),
    *,
    workspace: Path | None = None,
    state_dir: Path | None = None,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 20.0,
    launcher: Sequence[str] = ("-m", "serve"),
    wrapper: Sequence[str] = (),
) -> DaemonProcess:
    """``launcher``: what follows the interpreter instead of ``-m serve`` (e.g. a script
    that injects a fault, then runs ``serve.__main__.main``); ``wrapper``: what runs the
    interpreter (e.g. ``unshare --pid --fork``: then ``proc`` is the wrapper's)."""
    tmp = Path(tempfile.mkdtemp(prefix="acp-serve-test-"))
    # Removed when the test run ends (a test may read a stopped daemon's files): a suite
    # otherwise leaves a thousand of these in /tmp.
    atexit.register(shutil.rmtree, tmp, True)
    workspace = workspace or (tmp / "ws")
    workspace.mkdir(parents=True, exist_ok=True)
    state_dir = state_dir or (tmp / "state")
    stderr_path = tmp / "stderr.log"
    full_env = {k: v for k, v in os.environ.items() if k != "QWEN_SERVER_TOKEN"}
    full_env.update(env or {})
    argv = [
        *wrapper,
        sys.executable,
        *launcher,
        "--port",
        "0",
        "--workspace",
        str(workspace),
        "--state-dir",
        str(state_dir),
        *args,
    ]
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    deadline = time.monotonic() + ready_timeout_s
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or time.monotonic() > deadline:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"daemon did not start: {stderr_path.read_text()}")
    match = _READY.match(line)
    if not match:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"unexpected first line {line!r}: {stderr_path.read_text()}")
    return DaemonProcess(proc, match.group(1), workspace, state_dir, stderr_path, [line])


@contextmanager
def running_daemon(args: Sequence[str] = (), **kwargs: object) -> Iterator[DaemonProcess]:
    daemon = spawn_daemon(args, **kwargs)  # type: ignore[arg-type]
    try:
        yield daemon
    finally:
        daemon.stop()
