"""A small real MCP server over stdio, for tests (stdlib only).

``python tests/support/mcp_server.py [--name NAME] [--tools N] [--hang-initialize]
[--init-delay-ms MS] [--exit-after-handshake CODE] [--log FILE]``

Answers ``initialize`` (serverInfo.name = NAME, tools capability), ``ping``,
``tools/list`` (N tools ``tool0``..), and ``tools/call`` of:

* ``whoami`` → text ``"<NAME> pid <pid>"`` (which process served the call);
* ``echo {text}`` → the text back;
* ``sleep {ms}`` → waits, then ``"slept"`` (for in-flight tests);
* ``roots`` → asks the *client* ``roots/list`` and returns the JSON it got.

``--hang-initialize`` never answers ``initialize``; ``--init-delay-ms MS`` answers it
late; ``--exit-after-handshake CODE`` exits with CODE right after answering ``tools/list``
(a crash loop for the pool); ``--log FILE`` appends every received line (tests check what
the pool forwarded). Exits on stdin EOF.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

_pending: list[dict[str, Any]] = []


def send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def read(log: str | None) -> dict[str, Any] | None:
    if _pending:
        return _pending.pop(0)
    line = sys.stdin.readline()
    if not line:
        return None
    if log:
        with open(log, "a") as f:
            f.write(line)
    try:
        msg = json.loads(line)
    except ValueError:
        send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse"}})
        return read(log)
    return msg if isinstance(msg, dict) else read(log)


def ask_client(method: str, log: str | None) -> Any:
    rid = f"srv-{time.monotonic_ns()}"
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": {}})
    while True:
        line = sys.stdin.readline()
        if not line:
            return None
        if log:
            with open(log, "a") as f:
                f.write(line)
        msg = json.loads(line)
        if msg.get("id") == rid and "method" not in msg:
            return msg.get("result", msg.get("error"))
        _pending.append(msg)


def call_tool(name: str, args: dict[str, Any], opts: argparse.Namespace) -> dict[str, Any]:
    if name == "whoami":
        text = f"{opts.name} pid {os.getpid()}"
    elif name == "echo":
        text = str(args.get("text", ""))
    elif name == "sleep":
        time.sleep(float(args.get("ms", 0)) / 1000)
        text = "slept"
    elif name == "roots":
        text = json.dumps(ask_client("roots/list", opts.log))
    else:
        return {"content": [{"type": "text", "text": f"no tool {name}"}], "isError": True}
    return {"content": [{"type": "text", "text": text}]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="test-mcp")
    parser.add_argument("--tools", type=int, default=3)
    parser.add_argument("--hang-initialize", action="store_true")
    parser.add_argument("--init-delay-ms", type=int, default=0)
    parser.add_argument("--exit-after-handshake", type=int, default=None)
    parser.add_argument("--log", default=None)
    opts = parser.parse_args()
    while True:
        msg = read(opts.log)
        if msg is None:
            return 0
        method, rid = msg.get("method"), msg.get("id")
        if method is None:
            continue  # a response we did not wait for
        if rid is None:
            continue  # notifications
        if method == "initialize":
            if opts.hang_initialize:
                continue
            time.sleep(opts.init_delay_ms / 1000)
            result: Any = {
                "protocolVersion": msg.get("params", {}).get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": opts.name, "version": "1.0.0"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            tools = [
                {"name": f"tool{i}", "inputSchema": {"type": "object"}} for i in range(opts.tools)
            ]
            tools += [
                {"name": n, "inputSchema": {"type": "object"}}
                for n in ("whoami", "echo", "sleep", "roots")
            ]
            result = {"tools": tools}
        elif method == "tools/call":
            params = msg.get("params") or {}
            result = call_tool(params.get("name", ""), params.get("arguments") or {}, opts)
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})
        if method == "tools/list" and opts.exit_after_handshake is not None:
            return int(opts.exit_after_handshake)


if __name__ == "__main__":
    sys.exit(main())
