"""A small misbehaving ACP agent for hardening tests and benchmarks (stdlib only).

    python tests/support/rogue_agent.py

It answers ``initialize``, ``session/new`` and ``session/prompt``; a prompt's text is a list
of commands separated by ``;``, run in order before the turn ends with ``end_turn``:

``say TEXT``           one ``agent_message_chunk`` with TEXT
``big BYTES COUNT``    COUNT ``agent_message_chunk`` updates whose text is BYTES long
``line BYTES``         one ``agent_message_chunk`` whose whole JSON-RPC line is BYTES long
``garbage COUNT``      COUNT lines that are not JSON
``nested DEPTH``       one notification whose params nest arrays DEPTH deep
``exit CODE``          exit at once with CODE

Every write is flushed, so the daemon sees the lines in order.
"""

from __future__ import annotations

import json
import os
import sys

OUT = sys.stdout.buffer


def send(obj: object) -> None:
    OUT.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    OUT.flush()


def chunk(session_id: str, text: str) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": session_id,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": text},
                },
            },
        },
        separators=(",", ":"),
    ).encode()


def run_command(session_id: str, command: str) -> None:
    name, _, arg = command.strip().partition(" ")
    args = arg.split()
    if name == "say":
        OUT.write(chunk(session_id, arg) + b"\n")
    elif name == "big":
        size, count = int(args[0]), int(args[1])
        line = chunk(session_id, "x" * size) + b"\n"
        for _ in range(count):
            OUT.write(line)
            OUT.flush()
    elif name == "line":
        overhead = len(chunk(session_id, ""))
        OUT.write(chunk(session_id, "y" * max(0, int(args[0]) - overhead)) + b"\n")
    elif name == "garbage":
        OUT.write(b"".join(b"not json, line %d\n" % i for i in range(int(args[0]))))
    elif name == "nested":
        depth = int(args[0])
        head = b'{"jsonrpc":"2.0","method":"session/update","params":'
        OUT.write(head + b"[" * depth + b"]" * depth + b"}\n")
    elif name == "exit":
        OUT.flush()
        os._exit(int(args[0]))
    OUT.flush()


def main() -> None:
    session_id = ""
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method, rid = msg.get("method"), msg.get("id")
        if rid is None or method is None:
            continue
        if method == "initialize":
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "protocolVersion": 1,
                        "agentCapabilities": {"loadSession": False},
                        "authMethods": [],
                        "agentInfo": {"name": "rogue", "version": "0"},
                    },
                }
            )
        elif method == "session/new":
            session_id = f"rogue-{os.getpid()}"
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": session_id}})
        elif method == "session/prompt":
            text = "".join(block.get("text", "") for block in msg["params"].get("prompt", []))
            for command in text.split(";"):
                if command.strip():
                    run_command(session_id, command)
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})


if __name__ == "__main__":
    main()
