"""A minimal ACP agent that is hard to get rid of (for shutdown and reaping tests).

    python stubborn_agent.py [--ignore-eof] [--ignore-term] [--orphans N] [--pids FILE]
                             [--hang-init-if FILE]

It answers ``initialize`` and ``session/new`` and nothing else. ``--ignore-eof``: stdin EOF
does not end it (it sleeps until signalled). ``--ignore-term``: SIGTERM is ignored (only
SIGKILL ends it). ``--orphans N``: at ``session/new`` it forks N grandchildren that each call
``setsid()`` (leaving the agent's process group), fork once more so they are orphans, and
sleep; their pids are appended to FILE (one a line) before the reply is sent.
``--hang-init-if FILE``: ``initialize`` is never answered while FILE exists.
"""

import json
import os
import signal
import sys
import time


def spawn_orphans(count: int, pid_file: str) -> None:
    for _ in range(count):
        child = os.fork()
        if child == 0:  # first fork: leave the group, fork the real orphan, exit
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                for fd in (0, 1, 2):
                    os.close(fd)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(3600)
                os._exit(0)
            with open(pid_file, "a") as f:
                f.write(f"{grandchild}\n")
            os._exit(0)
        os.waitpid(child, 0)  # the intermediate exits at once: the grandchild is orphaned


def main() -> None:
    args = sys.argv[1:]
    orphans = int(args[args.index("--orphans") + 1]) if "--orphans" in args else 0
    pid_file = args[args.index("--pids") + 1] if "--pids" in args else os.devnull
    hang_if = args[args.index("--hang-init-if") + 1] if "--hang-init-if" in args else None
    if "--ignore-term" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = sys.stdout
    for raw in sys.stdin:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:
            continue
        if method == "initialize" and hang_if is not None and os.path.exists(hang_if):
            continue
        if method == "initialize":
            result: object = {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}}
        elif method == "session/new":
            spawn_orphans(orphans, pid_file)
            result = {"sessionId": f"stubborn-{os.getpid()}"}
        else:
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
        out.flush()
    if "--ignore-eof" in args:
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
