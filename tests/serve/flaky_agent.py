"""The scripted agent with an outage switch (for the pool's and idle release's failure tests).

    python flaky_agent.py [--down FILE] [--die-after S] [--linger FILE] [--no-restore]
                          [--start-delay S] -- [scripted agent args...]

While FILE exists the agent fails at start (a line on stderr, exit 3: an outage of the
agent command). ``--die-after S``: the process exits (status 1) S seconds after it
started, whatever it is doing (an agent that crashes shortly after ``initialize``).
``--linger FILE``: at stdin EOF it appends a line to FILE, then ignores SIGTERM and sleeps
(only SIGKILL ends it: the slowest agent to stop). ``--no-restore``: ``initialize``
advertises neither ``loadSession`` nor ``resume`` (its sessions are never released).
``--start-delay S``: it reads nothing for S seconds first (a slow-starting agent).
Otherwise it is ``python -m acp.agents.scripted`` with the arguments after ``--``.
"""

import os
import signal
import sys
import threading
import time


def main() -> int:
    args = sys.argv[1:]
    rest = args[args.index("--") + 1 :] if "--" in args else []
    down = args[args.index("--down") + 1] if "--down" in args else None
    if down is not None and os.path.exists(down):
        sys.stderr.write("flaky agent: down\n")
        return 3
    if "--die-after" in args:
        delay = float(args[args.index("--die-after") + 1])
        timer = threading.Timer(delay, os._exit, args=(1,))
        timer.daemon = True
        timer.start()
    if "--start-delay" in args:
        time.sleep(float(args[args.index("--start-delay") + 1]))
    from acp.agents.scripted import agent

    if "--no-restore" in args:
        plain = agent.ScriptedAgent.METHODS["initialize"]

        def initialize(self: object, rid: object, params: object) -> object:
            result = plain(self, rid, params)
            caps = result["agentCapabilities"]
            caps["loadSession"] = False
            caps["sessionCapabilities"].pop("resume", None)
            return result

        agent.ScriptedAgent.METHODS["initialize"] = initialize
    scripted_main = agent.main
    status = scripted_main(rest)
    if "--linger" in args:
        with open(args[args.index("--linger") + 1], "a") as f:
            f.write(f"{os.getpid()} eof\n")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    return status


if __name__ == "__main__":
    sys.exit(main())
