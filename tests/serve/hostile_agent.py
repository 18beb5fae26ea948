"""A minimal ACP agent that misbehaves on request (for the resource-limit tests).

    python hostile_agent.py

It answers ``initialize`` (``loadSession``: a restarted child is restored in place),
``session/new``, ``session/load`` and ``session/prompt``. A prompt's text says what to do:

* ``alloc N [S]``: allocate N MiB in 1 MiB pieces, touching every page (in this process),
  and hold it S seconds (default 0.2);
* ``alloc-child N [S]``: the same in a forked grandchild (a tool of the agent), then wait for it;
* ``fork N``: fork up to N sleeping children; the reply says how many forks succeeded
  (``forked K failed F``), then they are killed again;
* ``spin S``: burn CPU for S seconds, then reply;
* ``pid``: reply with its pid;
* ``procs``: reply with the pids its ``/proc`` lists (space-separated, ascending);
* ``cat PATH``: reply with the file's bytes (``repr``), or ``error <errno name>``;
* anything else: reply ``ok <text>``.

Every reply is one ``agent_message_chunk`` followed by ``end_turn``.

``HOSTILE_MARK=MIB:FILE`` (environment): ``alloc`` appends ``time.monotonic()`` to FILE when
it has allocated MIB MiB (the benchmark's "crossed the cap" moment; the clock is the
machine's ``CLOCK_MONOTONIC``, the same in every process).
"""

import errno
import json
import os
import signal
import sys
import time

MIB = 1024 * 1024


def send(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def alloc(mib: int, hold_s: float = 0.2) -> None:
    mark = os.environ.get("HOSTILE_MARK", "")
    mark_mib, _, mark_file = mark.partition(":")
    at = int(mark_mib) if mark_file else -1
    hold = []
    for n in range(mib):
        if n == at:
            with open(mark_file, "a") as f:
                f.write(f"{time.monotonic()}\n")
        block = bytearray(MIB)
        for i in range(0, MIB, 4096):
            block[i] = 1
        hold.append(block)
    time.sleep(hold_s)


def fork_many(n: int) -> str:
    kids, failed = [], 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            failed += 1
            continue
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
    for pid in kids:
        os.kill(pid, signal.SIGKILL)
    for pid in kids:
        os.waitpid(pid, 0)
    return f"forked {len(kids)} failed {failed}"


def act(text: str) -> str:
    word, _, arg = text.strip().partition(" ")
    if word == "alloc":
        mib, _, hold = arg.partition(" ")
        alloc(int(mib), float(hold or 0.2))
        return f"allocated {mib}"
    if word == "alloc-child":
        mib, _, hold = arg.partition(" ")
        pid = os.fork()
        if pid == 0:
            alloc(int(mib), float(hold or 0.2))
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        return f"child status {status}"
    if word == "fork":
        return fork_many(int(arg))
    if word == "spin":
        end = time.monotonic() + float(arg)
        n = 0
        while time.monotonic() < end:
            n += 1
        return f"spun {n}"
    if word == "pid":
        return str(os.getpid())
    if word == "procs":
        return " ".join(str(p) for p in sorted(int(e) for e in os.listdir("/proc") if e.isdigit()))
    if word == "cat":
        try:
            with open(arg, "rb") as f:
                return repr(f.read())
        except OSError as exc:
            return f"error {errno.errorcode.get(exc.errno or 0, exc.errno)}"
    return f"ok {text}"


def main() -> None:
    for raw in sys.stdin:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if rid is None:
            continue
        if method == "initialize":
            result: object = {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}
        elif method == "session/new":
            result = {"sessionId": f"hostile-{os.getpid()}-{time.monotonic_ns()}"}
        elif method == "session/load":
            result = {}
        elif method == "session/prompt":
            text = " ".join(b.get("text", "") for b in params.get("prompt", []))
            reply = act(text)
            send(
                {
                    "jsonrpc": "2.0",
                    "method": "session/update",
                    "params": {
                        "sessionId": params.get("sessionId"),
                        "update": {
                            "sessionUpdate": "agent_message_chunk",
                            "content": {"type": "text", "text": reply},
                        },
                    },
                }
            )
            result = {"stopReason": "end_turn"}
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})


if __name__ == "__main__":
    main()
