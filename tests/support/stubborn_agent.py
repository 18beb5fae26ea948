"""A small ACP agent that ignores the control plane, for the daemon's control-plane tests.

    python tests/support/stubborn_agent.py MARKER_DIR

* ``initialize`` (``loadSession: true``, agentInfo ``stubborn``), ``session/new``,
  ``session/load`` answer at once.
* ``session/set_model``, ``session/set_mode``, ``session/set_config_option`` are never
  answered; ``session/cancel`` is ignored.
* ``session/prompt`` whose text contains ``hang`` is never answered; any other prompt
  answers ``end_turn``, or ``refusal`` when it arrived while a rewind was in progress (the
  overlap the daemon must prevent).
* ``qwen/control/session/rewind`` writes ``MARKER_DIR/rewind-started`` and answers only
  once ``MARKER_DIR/rewind-release`` exists.

Every request's method is appended to ``MARKER_DIR/methods.log``. stdin EOF ends the process.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time

write_lock = threading.Lock()
rewinding = threading.Event()


def send(msg: dict[str, object]) -> None:
    line = json.dumps(msg) + "\n"
    with write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def reply(rid: object, result: object) -> None:
    send({"jsonrpc": "2.0", "id": rid, "result": result})


def rewind(rid: object, marker_dir: str) -> None:
    rewinding.set()
    open(os.path.join(marker_dir, "rewind-started"), "w").close()
    release = os.path.join(marker_dir, "rewind-release")
    while not os.path.exists(release):
        time.sleep(0.02)
    rewinding.clear()
    reply(rid, {"targetTurnIndex": 0, "filesChanged": [], "filesFailed": []})


def main() -> None:
    marker_dir = sys.argv[1]
    ids = itertools.count(1)
    for raw in sys.stdin:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is not None and rid is not None:
            with open(os.path.join(marker_dir, "methods.log"), "a") as log:
                log.write(method + "\n")
        if method is None or rid is None:
            continue  # responses and notifications (session/cancel): ignored
        if method == "initialize":
            reply(
                rid,
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": True},
                    "agentInfo": {"name": "stubborn", "version": "1"},
                },
            )
        elif method == "session/new":
            reply(rid, {"sessionId": f"stub_{os.getpid()}_{next(ids)}"})
        elif method == "session/load":
            reply(rid, {})
        elif method == "session/prompt":
            text = json.dumps(params.get("prompt"))
            if "hang" in text:
                continue
            reply(rid, {"stopReason": "refusal" if rewinding.is_set() else "end_turn"})
        elif method == "qwen/control/session/rewind":
            threading.Thread(target=rewind, args=(rid, marker_dir), daemon=True).start()
        elif method.startswith("session/set_"):
            continue  # never answered
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})


if __name__ == "__main__":
    main()
