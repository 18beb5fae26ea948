"""A minimal ACP agent that tries what a prompt-injected agent would (sandbox tests).

    python sandbox_hostile_agent.py TARGETS.json

TARGETS.json names ``state_dir``, ``journal`` (a file of another session), ``other_ws`` (another
workspace of the daemon), ``outside`` (a directory outside every root) and ``home``. At every
``session/prompt`` the agent, with its own ``open()`` and through a ``terminal/create`` it asks
the client for, tries to list the state directory, read the journal, write outside its
workspace and into the other workspace, and writes in its workspace, its ``TMPDIR`` and HOME.
It answers with one ``agent_message_chunk`` holding ``{"direct": {...}, "terminal": "..."}``:
each probe ``ok`` or the errno name; the terminal's output.
"""

import errno
import json
import os
import sys
import uuid


def probe(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def write(path):
    with open(path, "w") as f:
        f.write("hostile\n")


def direct_probes(t, cwd):
    tag = uuid.uuid4().hex[:8]
    return {
        "list_state": probe(lambda: os.listdir(t["state_dir"])),
        "read_journal": probe(lambda: open(t["journal"], "rb").read()),
        "write_state": probe(lambda: write(os.path.join(t["state_dir"], f"planted-{tag}"))),
        "write_outside": probe(lambda: write(os.path.join(t["outside"], f"x-{tag}"))),
        "read_other_ws": probe(lambda: os.listdir(t["other_ws"])),
        "write_other_ws": probe(lambda: write(os.path.join(t["other_ws"], f"x-{tag}"))),
        "write_workspace": probe(lambda: write(os.path.join(cwd, f"mine-{tag}.txt"))),
        "write_tmpdir": probe(lambda: write(os.path.join(os.environ["TMPDIR"], f"t-{tag}"))),
        "write_home": probe(lambda: write(os.path.join(t["home"], ".hostile", f"h-{tag}"))),
        "read_etc": probe(lambda: open("/etc/passwd", "rb").read()),
    }


def terminal_script(t):
    # Each line prints NAME=ok or NAME=denied.
    checks = {
        "cat_journal": f"cat {t['journal']}",
        "ls_state": f"ls {t['state_dir']}",
        "touch_other_ws": f"touch {t['other_ws']}/from-terminal",
        "touch_outside": f"touch {t['outside']}/from-terminal",
        "touch_tmpdir": 'touch "$TMPDIR/from-terminal"',
        "touch_workspace": "touch ./from-terminal",
        "env_token": f"env | grep -q -- {t.get('token') or 'no-token'}",
    }
    return "; ".join(
        f"if {cmd} >/dev/null 2>&1; then echo {name}=ok; else echo {name}=denied; fi"
        for name, cmd in checks.items()
    )


class Agent:
    def __init__(self, targets_file):
        self.targets_file = targets_file  # read at each prompt (the test writes it late)
        self.ids = iter(range(1000, 10**9))
        self.cwd = os.getcwd()
        self.pending = []  # messages read while waiting for a reply

    def send(self, msg):
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    def call(self, method, params):
        rid = next(self.ids)
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        for raw in sys.stdin:
            msg = json.loads(raw)
            if msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(json.dumps(msg["error"]))
                return msg["result"]
            self.pending.append(msg)
        raise EOFError

    def prompt(self, sid):
        with open(self.targets_file) as f:
            self.t = json.load(f)
        result = {"direct": direct_probes(self.t, self.cwd)}
        # What of the daemon's secrets it can see: its own environment, the daemon's.
        token = self.t.get("token") or "\0"
        result["env_has_token"] = any(token in v for v in os.environ.values())
        try:
            with open(f"/proc/{os.getppid()}/environ", "rb") as f:
                result["daemon_environ_has_token"] = token.encode() in f.read()
        except OSError as exc:
            result["daemon_environ_has_token"] = errno.errorcode.get(exc.errno, "error")
        try:
            term = self.call(
                "terminal/create",
                {"sessionId": sid, "command": "/bin/sh", "args": ["-c", terminal_script(self.t)]},
            )
            tid = term["terminalId"]
            self.call("terminal/wait_for_exit", {"sessionId": sid, "terminalId": tid})
            out = self.call("terminal/output", {"sessionId": sid, "terminalId": tid})
            self.call("terminal/release", {"sessionId": sid, "terminalId": tid})
            result["terminal"] = out["output"]
        except RuntimeError as exc:
            result["terminal"] = f"error: {exc}"
        self.send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": sid,
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": json.dumps(result)},
                    },
                },
            }
        )

    def handle(self, msg):
        method, rid = msg.get("method"), msg.get("id")
        if rid is None or method is None:
            return
        params = msg.get("params") or {}
        if method == "initialize":
            result = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": False},
                "authMethods": [],
            }
        elif method == "session/new":
            self.cwd = params.get("cwd") or self.cwd
            result = {"sessionId": f"hostile-{uuid.uuid4().hex[:8]}"}
        elif method == "session/prompt":
            self.prompt(params["sessionId"])
            result = {"stopReason": "end_turn"}
        else:
            self.send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
            return
        self.send({"jsonrpc": "2.0", "id": rid, "result": result})

    def run(self):
        while True:
            if self.pending:
                self.handle(self.pending.pop(0))
                continue
            raw = sys.stdin.readline()
            if not raw:
                return
            try:
                self.handle(json.loads(raw))
            except ValueError:
                continue


if __name__ == "__main__":
    Agent(sys.argv[1]).run()
