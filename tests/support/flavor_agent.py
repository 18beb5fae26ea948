"""A small ACP agent that advertises modes and models the way third-party agents do.

    python -m tests.support.flavor_agent FLAVOR [--fork=DIR]

FLAVOR picks how modes and models are offered (issue 18; the ids are the real agents'):

* ``claude``: ACP ``modes`` ``default`` ``acceptEdits`` ``plan`` ``dontAsk``
  ``bypassPermissions`` (claude-agent-acp), ``session/set_mode``, and a ``model`` config
  option;
* ``gemini``: ACP ``modes`` ``default`` ``autoEdit`` ``yolo`` ``plan``;
* ``codex``: ACP ``modes`` *and* config options of category ``mode`` (``read-only``
  ``auto`` ``full-access``) and ``model`` (codex-acp);
* ``opencode``: config options only: ``mode`` (``build`` ``plan``) and ``model``;
  ``session/set_mode`` answers "mode not found: X" for an id it does not have, as opencode.

Every flavor answers ``session/set_mode`` for its own ids only (``-32602 mode not found``),
sends ``current_mode_update`` / ``config_option_update`` before answering a switch, and runs
these prompts (the first word picks the behaviour, the rest are arguments):

* ``write-diff REL TEXT``: a permission request whose tool call names the path only in a
  ``diff`` content block (kimi), then ``fs/write_text_file`` when allowed;
* ``write-announced REL TEXT``: a ``tool_call`` notification with ``locations``, then a
  permission request that carries only the ``toolCallId`` and a title, then the write;
* ``write-elsewhere REL OTHER TEXT``: like ``write-diff`` for REL, then writes OTHER;
* ``switch-mode ID``: the agent changes its own mode (``config_option_update`` or
  ``current_mode_update``);
* ``write-unmapped REL TEXT``: a permission request for an ``edit`` tool call that names no
  path at all (no ``locations``, no ``diff``, no ``rawInput``), then the write when allowed;
* ``params``: replies with the ``session/prompt`` params it got, ``prompt`` left out (JSON);
* ``shell CMDLINE``: ``terminal/create`` with the whole command line in ``command`` and no
  ``args`` (kimi), then ``wait_for_exit``/``output``/``release``; replies with the output;
* anything else: echoed back.

``--fork=DIR`` adds ACP ``session/fork`` (``sessionCapabilities.fork``) the way
claude-agent-acp 0.23.1 does it: the fork is a new session in the agent's *default* mode and
model (only the conversation is carried over), made in any agent process, since each
session's state is a JSON file in DIR. The prompt ``setup`` then replies with how the session
was made and what the agent holds: ``{via, parent, mcpServers (names), mode, model}``.
``--fork-frozen`` (with ``--fork``): a fork refuses every mode change (``-32602``), so it
cannot take its parent's mode.

Stdlib only; one thread: while waiting for an answer from the client it reads (and drops)
whatever else arrives. Exits on stdin EOF.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

FLAVORS = ("claude", "gemini", "codex", "opencode")
ACP_MODES = {
    "claude": ["default", "acceptEdits", "plan", "dontAsk", "bypassPermissions"],
    "gemini": ["default", "autoEdit", "yolo", "plan"],
    "codex": ["read-only", "auto", "full-access"],
}
OPTION_MODES = {
    "codex": ["read-only", "auto", "full-access"],
    "opencode": ["build", "plan"],
}
OPTION_MODELS = {
    "claude": ["claude-sonnet", "claude-haiku"],
    "codex": ["gpt-5.1-codex", "gpt-5.1-codex-mini"],
    "opencode": ["fake/tool-model", "fake/other-model"],
}
INVALID_PARAMS = -32602


class Agent:
    def __init__(self, flavor: str, fork_dir: str | None = None) -> None:
        self.flavor = flavor
        self.fork_dir = fork_dir
        self.fork_frozen = False
        self.ids = itertools.count(1)
        self.sessions: dict[str, dict[str, Any]] = {}
        self.mode_ids = ACP_MODES.get(flavor) or OPTION_MODES.get(flavor, [])
        self.out = sys.stdout

    # -- wire -----------------------------------------------------------------------------

    def send(self, msg: dict[str, Any]) -> None:
        self.out.write(json.dumps({"jsonrpc": "2.0", **msg}) + "\n")
        self.out.flush()

    def update(self, sid: str, update: dict[str, Any]) -> None:
        self.send({"method": "session/update", "params": {"sessionId": sid, "update": update}})

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = f"a{next(self.ids)}"
        self.send({"id": rid, "method": method, "params": params})
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(msg["error"].get("message", "error"))
                return msg.get("result") or {}
        sys.exit(0)

    # -- advertised state -----------------------------------------------------------------

    def config_options(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        if self.flavor in OPTION_MODES:
            out.append(
                {
                    "id": "mode",
                    "name": "Mode",
                    "category": "mode",
                    "type": "select",
                    "currentValue": state["mode"],
                    "options": [{"value": m, "name": m.title()} for m in OPTION_MODES[self.flavor]],
                }
            )
        if self.flavor in OPTION_MODELS:
            out.append(
                {
                    "id": "model",
                    "name": "Model",
                    "category": "model",
                    "type": "select",
                    "currentValue": state["model"],
                    "options": [{"value": m, "name": m} for m in OPTION_MODELS[self.flavor]],
                }
            )
        return out

    def setup(self, sid: str) -> dict[str, Any]:
        state = self.sessions[sid]
        result: dict[str, Any] = {"sessionId": sid}
        if self.flavor in ACP_MODES:
            result["modes"] = {
                "currentModeId": state["mode"],
                "availableModes": [{"id": m, "name": m} for m in ACP_MODES[self.flavor]],
            }
        options = self.config_options(state)
        if options:
            result["configOptions"] = options
        return result

    # -- methods --------------------------------------------------------------------------

    def handle(self, msg: dict[str, Any]) -> Any:
        method, params = msg["method"], msg.get("params") or {}
        if method == "initialize":
            caps: dict[str, Any] = {"loadSession": False}
            if self.fork_dir is not None:
                caps["sessionCapabilities"] = {"fork": {}}
            return {
                "protocolVersion": 1,
                "agentCapabilities": caps,
                "authMethods": [],
                "agentInfo": {"name": f"flavor-{self.flavor}", "version": "0.0.1"},
            }
        if method == "session/new":
            return self.made(method, params, None)
        if method == "session/fork" and self.fork_dir is not None:
            parent = str(params["sessionId"])
            if parent not in self.sessions and not self.stored(parent):
                raise ValueError(f"unknown session {parent}")
            return self.made(method, params, parent)
        if method == "session/set_mode":
            return self.set_mode(params["sessionId"], params["modeId"])
        if method == "session/set_config_option":
            return self.set_config_option(params)
        if method == "session/prompt":
            return self.prompt(params)
        raise LookupError(method)

    def made(self, method: str, params: dict[str, Any], parent: str | None) -> dict[str, Any]:
        """A new session (``session/new``, or a fork of ``parent``) in the default mode."""
        if self.fork_dir is not None:
            sid = f"{self.flavor}-{os.urandom(6).hex()}"  # unique across processes
        else:
            sid = f"{self.flavor}-{len(self.sessions) + 1}"
        models = OPTION_MODELS.get(self.flavor, [""])
        self.sessions[sid] = {
            "mode": self.mode_ids[0],
            "model": models[0],
            "cwd": params["cwd"],
            "via": method,
            "parent": parent,
            "mcpServers": [s.get("name") for s in params.get("mcpServers") or []],
            "frozen": parent is not None and self.fork_frozen,
        }
        self.save(sid)
        return self.setup(sid)

    def stored(self, sid: str) -> bool:
        assert self.fork_dir is not None
        path = os.path.join(self.fork_dir, f"{os.path.basename(sid)}.json")
        return os.path.isfile(path)

    def save(self, sid: str) -> None:
        if self.fork_dir is not None:
            path = os.path.join(self.fork_dir, f"{sid}.json")
            with open(path, "w") as f:
                json.dump(self.sessions[sid], f)

    def set_mode(self, sid: str, mode: str) -> dict[str, Any]:
        if mode not in self.mode_ids:
            raise ValueError(f"mode not found: {mode}")
        if self.sessions[sid].get("frozen"):
            raise ValueError("this fork keeps its mode")
        state = self.sessions[sid]
        state["mode"] = mode
        self.save(sid)
        self.update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": mode})
        if self.flavor in OPTION_MODES:
            self.update(
                sid,
                {
                    "sessionUpdate": "config_option_update",
                    "configOptions": self.config_options(state),
                },
            )
        return {}

    def set_config_option(self, params: dict[str, Any]) -> dict[str, Any]:
        sid, config, value = params["sessionId"], params["configId"], params["value"]
        state = self.sessions[sid]
        choices = {"mode": OPTION_MODES, "model": OPTION_MODELS}.get(config, {})
        if value not in choices.get(self.flavor, []):
            raise ValueError(f"invalid value for {config}: {value}")
        state[config] = value
        self.save(sid)
        if config == "mode" and self.flavor in ACP_MODES:
            self.update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": value})
        options = self.config_options(state)
        self.update(sid, {"sessionUpdate": "config_option_update", "configOptions": options})
        return {"configOptions": options}

    def switch_mode(self, sid: str, mode: str) -> str:
        """The agent changes its own mode (as plan-mode exits do)."""
        state = self.sessions[sid]
        state["mode"] = mode
        if self.flavor in OPTION_MODES:
            options = self.config_options(state)
            self.update(sid, {"sessionUpdate": "config_option_update", "configOptions": options})
        else:
            self.update(sid, {"sessionUpdate": "current_mode_update", "currentModeId": mode})
        return f"now in {mode}"

    def prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = params["sessionId"]
        text = " ".join(b.get("text", "") for b in params["prompt"] if b.get("type") == "text")
        word, _, rest = text.strip().partition(" ")
        try:
            if word in ("write-diff", "write-announced", "write-elsewhere", "write-unmapped"):
                reply = self.write(sid, word, rest)
            elif word == "switch-mode":
                reply = self.switch_mode(sid, rest)
            elif word == "shell":
                reply = self.shell(sid, rest)
            elif word == "setup":
                state = self.sessions[sid]
                keys = ("via", "parent", "mcpServers", "mode", "model")
                reply = json.dumps({k: state.get(k) for k in keys})
            elif word == "params":
                reply = json.dumps({k: v for k, v in params.items() if k != "prompt"})
            else:
                reply = text
        except RuntimeError as exc:
            reply = f"failed: {exc}"
        self.update(
            sid,
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": reply}},
        )
        return {"stopReason": "end_turn"}

    def write(self, sid: str, how: str, args: str) -> str:
        rel, _, content = args.partition(" ")
        target = rel
        if how == "write-elsewhere":
            target, _, content = content.partition(" ")
        path = os.path.join(self.sessions[sid]["cwd"], rel)
        tool = f"tc-{next(self.ids)}"
        if how == "write-announced":
            self.update(
                sid,
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": tool,
                    "title": f"Write {rel}",
                    "kind": "edit",
                    "status": "pending",
                    "locations": [{"path": path}],
                },
            )
            call: dict[str, Any] = {"toolCallId": tool, "title": f"Write {rel}"}
        elif how == "write-unmapped":
            call = {"toolCallId": tool, "title": "Edit", "kind": "edit"}
        else:
            call = {
                "toolCallId": tool,
                "title": "WriteFile",
                "kind": "edit",
                "content": [{"type": "diff", "path": path, "oldText": None, "newText": content}],
            }
        answer = self.call(
            "session/request_permission",
            {
                "sessionId": sid,
                "toolCall": call,
                "options": [
                    {"optionId": "approve", "name": "Approve", "kind": "allow_once"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                ],
            },
        )
        outcome = answer.get("outcome") or {}
        if outcome.get("optionId") != "approve":
            return "rejected"
        written = os.path.join(self.sessions[sid]["cwd"], target)
        self.call("fs/write_text_file", {"sessionId": sid, "path": written, "content": content})
        return f"wrote {target}"

    def shell(self, sid: str, cmdline: str) -> str:
        created = self.call(
            "terminal/create",
            {"sessionId": sid, "command": cmdline, "cwd": self.sessions[sid]["cwd"]},
        )
        tid = {"sessionId": sid, "terminalId": created["terminalId"]}
        status = self.call("terminal/wait_for_exit", tid)
        output = self.call("terminal/output", tid)
        self.call("terminal/release", tid)
        return f"exit {status.get('exitCode')}: {output.get('output', '')}"


def main() -> None:
    flavor = sys.argv[1] if len(sys.argv) > 1 else "claude"
    if flavor not in FLAVORS:
        raise SystemExit(f"flavor must be one of {FLAVORS}")
    fork_dir = next((a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--fork=")), None)
    agent = Agent(flavor, fork_dir)
    agent.fork_frozen = "--fork-frozen" in sys.argv[2:]
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "method" not in msg or "id" not in msg:
            continue  # notifications (session/cancel) and stray answers
        try:
            agent.send({"id": msg["id"], "result": agent.handle(msg)})
        except LookupError as exc:
            agent.send({"id": msg["id"], "error": {"code": -32601, "message": f"{exc} unknown"}})
        except (ValueError, KeyError) as exc:
            agent.send({"id": msg["id"], "error": {"code": INVALID_PARAMS, "message": str(exc)}})


if __name__ == "__main__":
    main()
