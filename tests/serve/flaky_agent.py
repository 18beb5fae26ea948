"""The scripted agent with an outage switch (for the pool's and idle release's failure tests).

    python flaky_agent.py --down FILE [--die-after S] -- [scripted agent args...]

While FILE exists the agent fails at start (a line on stderr, exit 3: an outage of the
agent command). ``--die-after S``: the process exits (status 1) S seconds after it
started, whatever it is doing (an agent that crashes shortly after ``initialize``).
Otherwise it is ``python -m acp.agents.scripted`` with the arguments after ``--``.
"""

import os
import sys
import threading


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
    from acp.agents.scripted.agent import main as scripted_main

    return scripted_main(rest)


if __name__ == "__main__":
    sys.exit(main())
