"""A real PostgreSQL server for the tests: initdb into a temporary directory, started with
``pg_ctl`` on a free 127.0.0.1 port, stopped at the end (``--mode fast``, then its pid).

Debian's ``postgresql`` package provides the binaries (``scripts/test`` installs it when
missing and root). PostgreSQL refuses to run as root: as root the server runs as the
``postgres`` user (``runuser``). Without the binaries, or as root without that user, the
tests that need it skip, saying why. Each test gets its own database
(:meth:`PostgresServer.new_database`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

#: Bound on initdb, start and stop, in seconds.
PG_TIMEOUT_S = 60


def pg_bin_dir() -> Path | None:
    """The directory of ``initdb`` / ``pg_ctl`` / ``postgres`` (PATH, else Debian's)."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One running server (module docstring)."""

    def __init__(self, bin_dir: Path, run_as: str | None) -> None:
        self.bin_dir = bin_dir
        self.run_as = run_as
        self.tmp = Path(tempfile.mkdtemp(prefix="acp-serve-pg-"))
        self.data = self.tmp / "data"
        self.port = _free_port()
        self.user = run_as or pwd.getpwuid(os.getuid()).pw_name
        self.pid: int | None = None

    def _cmd(self, *args: str) -> list[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        return ["runuser", "-u", self.run_as, "--", *cmd] if self.run_as else cmd

    def start(self) -> None:
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(self.tmp, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            self._cmd("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "-E", "UTF8"),
            check=True,
            capture_output=True,
            timeout=PG_TIMEOUT_S,
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port}"
            f" -c unix_socket_directories={self.tmp} -c fsync=on -c max_connections=200"
        )
        subprocess.run(
            self._cmd(
                "pg_ctl",
                "-D",
                str(self.data),
                "-l",
                str(self.tmp / "log"),
                "-o",
                options,
                "-w",
                "-t",
                str(PG_TIMEOUT_S),
                "start",
            ),
            check=True,
            capture_output=True,
            timeout=PG_TIMEOUT_S + 5,
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                self._cmd("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"),
                capture_output=True,
                timeout=PG_TIMEOUT_S,
            )
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)
        shutil.rmtree(self.tmp, ignore_errors=True)


def skip_reason() -> str | None:
    """Why PostgreSQL tests cannot run here (None: they can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg not installed (the test extra pins it)"
    if pg_bin_dir() is None:
        return "PostgreSQL not installed (scripts/test installs Debian's postgresql as root)"
    if os.getuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no postgres user to run the server as"
        if shutil.which("runuser") is None:
            return "running as root and no runuser to start the server as postgres"
    return None


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    bin_dir = pg_bin_dir()
    assert bin_dir is not None
    server = PostgresServer(bin_dir, "postgres" if os.getuid() == 0 else None)
    try:
        server.start()
        yield server
    finally:
        server.stop()
