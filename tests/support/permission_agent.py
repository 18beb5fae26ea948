"""A small fake ACP agent that misbehaves around ``session/request_permission``.

    python tests/support/permission_agent.py

It speaks just enough ACP (``initialize``, ``session/new``, ``session/prompt``,
``session/cancel``) for the daemon, and each prompt's text is a script of words:

``withdraw N MS`` send N permission requests (kind ``other``), each withdrawn with
                 ``$/cancel_request`` MS milliseconds later (a looping agent that keeps
                 changing its mind; the pause lets the daemon open each one first);
``leave N MS``   send N permission requests (kind ``other``) and end the turn MS
                 milliseconds later without waiting for their answers;
``ask KIND PATH`` one permission request for a tool call of ``kind`` KIND on PATH (relative
                 to the agent's cwd, the workspace); wait for the answer and report it as an
                 ``agent_message_chunk`` ``outcome: ...``, then a ``tool_call_update`` (what
                 the agent does after being answered).

Words run in order; the turn then ends with ``stopReason: end_turn``. The answers the
daemon sends to withdrawn or abandoned requests are read and ignored. stdin EOF ends it.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import Any

_inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
_next_id = 1000
_session = "perm-session-1"


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **msg}) + "\n")
    sys.stdout.flush()


def _reader() -> None:
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            _inbox.put(msg)
    _inbox.put(None)


def _update(update: dict[str, Any]) -> None:
    _send({"method": "session/update", "params": {"sessionId": _session, "update": update}})


def _request_permission(kind: str, path: str) -> int:
    global _next_id
    _next_id += 1
    call_id = f"call_{_next_id}"
    _send(
        {
            "id": _next_id,
            "method": "session/request_permission",
            "params": {
                "sessionId": _session,
                "toolCall": {
                    "toolCallId": call_id,
                    "title": f"{kind} {path}",
                    "kind": kind,
                    "status": "pending",
                    "locations": [{"path": path}],
                    "rawInput": {"path": path},
                },
                "options": [
                    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                ],
            },
        }
    )
    return _next_id


def _wait_response(request_id: int) -> dict[str, Any] | None:
    while True:
        msg = _inbox.get()
        if msg is None:
            raise SystemExit(0)
        if msg.get("id") == request_id and "method" not in msg:
            return msg
        _handle(msg)  # a cancel or a request that arrives meanwhile


def _run_prompt(request_id: Any, params: dict[str, Any]) -> None:
    blocks = params.get("prompt") or []
    text = " ".join(b.get("text", "") for b in blocks if isinstance(b, dict))
    words = text.split()
    i = 0
    while i < len(words):
        word = words[i]
        if word == "withdraw":
            pause = int(words[i + 2]) / 1000
            for _ in range(int(words[i + 1])):
                rid = _request_permission("other", os.path.join(os.getcwd(), "withdrawn.txt"))
                time.sleep(pause)
                _send({"method": "$/cancel_request", "params": {"requestId": rid}})
            i += 3
        elif word == "leave":
            for _ in range(int(words[i + 1])):
                _request_permission("other", os.path.join(os.getcwd(), "left.txt"))
            time.sleep(int(words[i + 2]) / 1000)
            i += 3
        elif word == "ask":
            kind, path = words[i + 1], os.path.join(os.getcwd(), words[i + 2])
            rid = _request_permission(kind, path)
            answer = _wait_response(rid) or {}
            outcome = (answer.get("result") or {}).get("outcome") or {}
            said = outcome.get("optionId") or outcome.get("outcome") or "error"
            _update(
                {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"outcome: {said}"},
                }
            )
            _update(
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": f"call_{rid}",
                    "status": "completed" if said == "allow" else "failed",
                }
            )
            i += 3
        else:
            i += 1
    _send({"id": request_id, "result": {"stopReason": "end_turn"}})


def _handle(msg: dict[str, Any]) -> None:
    method = msg.get("method")
    rid = msg.get("id")
    params = msg.get("params") or {}
    if method == "initialize":
        _send(
            {
                "id": rid,
                "result": {
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": False},
                    "agentInfo": {"name": "permission-agent", "version": "0.1"},
                },
            }
        )
    elif method == "session/new":
        _send({"id": rid, "result": {"sessionId": _session}})
    elif method == "session/prompt":
        _run_prompt(rid, params)
    elif method is not None and rid is not None:
        _send({"id": rid, "error": {"code": -32601, "message": f"no {method}"}})
    # notifications (session/cancel) and stray responses need no answer


def main() -> None:
    threading.Thread(target=_reader, daemon=True).start()
    while True:
        msg = _inbox.get()
        if msg is None:
            return
        _handle(msg)


if __name__ == "__main__":
    main()
