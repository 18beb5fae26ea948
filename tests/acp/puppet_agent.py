"""A puppet ACP "agent" for connection tests: it says exactly what its config tells it to.

    python puppet_agent.py CONFIG.json LOG.jsonl

CONFIG: ``{"startup": [raw lines], "respond": {method: result}, "errors": {method: error},
"after": {method: [raw lines sent after answering]}, "close_stdout_after": method}``.
Every line received is appended to LOG (flushed), so the test can see our replies. Raw lines
are written as given (strings, so tests can send garbage). Exits on stdin EOF.
"""

import json
import os
import sys


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    log = open(sys.argv[2], "a", buffering=1)
    out = sys.stdout

    def send(lines: list[str]) -> None:
        for line in lines:
            out.write(line if line.endswith("\n") else line + "\n")
        out.flush()

    send(config.get("startup", []))
    for raw in sys.stdin:
        log.write(raw if raw.endswith("\n") else raw + "\n")
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        method = msg.get("method")
        if method is None or "id" not in msg:
            continue
        if method in config.get("errors", {}):
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": config["errors"][method]}
        elif method in config.get("respond", {}):
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": config["respond"][method]}
        else:
            continue  # unanswered: lets tests exercise timeouts
        send([json.dumps(reply)])
        send(config.get("after", {}).get(method, []))
        if config.get("close_stdout_after") == method:
            out.close()
            os.close(1)


if __name__ == "__main__":
    main()
