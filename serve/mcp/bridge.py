"""The agent side of the shared MCP pool: a stdio MCP server that is a byte pipe.

Usage: ``python bridge.py SOCKET_PATH``. The pool hands agents this script as the stdio
command of a pooled server; the agent spawns it and speaks MCP on its stdin/stdout, and
the script copies bytes both ways to the pool's Unix socket for that server, where the
multiplexer (:mod:`serve.mcp.mux`) routes them to the one shared server process.

It imports nothing but the standard library and nothing of this package, so it runs under
any Python 3 the agent finds, from any working directory. It exits when either side
closes (stdin EOF is MCP's stdio shutdown signal; a closed socket means the pool went
away). If the socket is not there yet it retries for :data:`CONNECT_TIMEOUT_S` seconds.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import time

CONNECT_TIMEOUT_S = 10.0
CHUNK = 65536


def _connect(path: str) -> socket.socket:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def pipe(path: str) -> int:
    try:
        sock = _connect(path)
    except OSError as exc:
        print(f"acp-serve MCP bridge: cannot reach the pool at {path}: {exc}", file=sys.stderr)
        return 1
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(stdin, selectors.EVENT_READ, "stdin")
    selector.register(sock, selectors.EVENT_READ, "socket")
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "stdin":
                    data = os.read(stdin, CHUNK)
                    if not data:
                        return 0
                    sock.sendall(data)
                else:
                    data = sock.recv(CHUNK)
                    if not data:
                        return 0
                    _write_all(stdout, data)
    except (OSError, KeyboardInterrupt):
        return 0
    finally:
        sock.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: bridge.py SOCKET_PATH", file=sys.stderr)
        return 2
    return pipe(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
