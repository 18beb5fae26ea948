"""The scripted reference agent: a real ACP v1 agent over stdio, driven by the prompt text.

Theory of operation
-------------------
Threads, stdlib + msgspec only (it must start fast: it is the child of every test).

* The **main thread** reads stdin line by line. It answers the quick methods inline
  (``initialize``, ``session/new|load|resume|list|close``, ``set_mode``/``set_model``/
  ``set_config_option``), resolves responses to the requests the agent itself sent, and turns
  ``session/cancel`` / ``$/cancel_request`` into the session's cancel event. stdin EOF ends the
  process (status 0), as ACP's shutdown asks.
* Each ``session/prompt`` runs in its own daemon **prompt thread**, which executes the script
  (see :mod:`.script` and DESIGN.md), emitting ``session/update`` notifications and calling the
  client (``session/request_permission``, ``fs/*``, ``terminal/*``) and waiting for the answers.
  That is :mod:`.turn` (the directives); this module is the main thread's side (the methods,
  the sessions, the answers to the agent's own requests).
* All writes go through one lock; one line per message, flushed per message (``[flood]``
  writes in large batches).

Directives (besides DESIGN.md's table): ``[write PATH TEXT]`` offers ``allow`` (allow_once),
``allow_always`` and ``reject`` (reject_once); in modes ``auto-edit`` and ``yolo``, or after
``allow_always`` in the session, it writes without asking. ``[spawn-grandchild]`` starts a
``sleep 1000`` in the agent's own process group (for the group-kill tests) and reports its pid.
Model ``scripted-slow`` pauses 50 ms (cancellably) before each update. ``[flood N]`` is kept
in the history as the text ``[flood N]``, not N chunks. The extension request
``_scripted/ping`` answers ``{}`` at once (for round-trip benchmarks); other unknown requests
get -32601. ``[elicit form FIELDS]`` / ``[elicit url URL]`` ask ACP ``elicitation/create``
(:mod:`.elicit`). With ``ACP_SCRIPTED_METHODS_LOG=PATH`` each request received appends
``{"method", "meta"}`` (its ``params._meta``) as a JSON line to PATH.

Fork and usage (not with ``--legacy``, which mimics an older agent that has neither):
``session/fork`` (advertised as ``sessionCapabilities.fork``) copies the parent's stored
session (history, mode, model) under a new id, in any agent process sharing the state dir.
Each turn reports usage as ACP shapes: once a ``[usage]`` ran in the session, a
``usage_update {used, size, cost?}`` at the end of each turn (``used``: the session's
context, counted in words; ``size`` 200000; ``cost`` only once a ``[usage N COST]`` added
some, in USD), and always the prompt response's ``usage {totalTokens, inputTokens,
outputTokens}`` for the turn (input = the prompt's words plus what ``[usage]`` added,
output = the words the agent said). ``[usage N]`` / ``[usage N COST]`` adds N tokens (and
COST) to the turn at that point and sends a ``usage_update`` at once.

Steering (not with ``--legacy``): ``_meta.steering.supported`` in the initialize answer and
``_session/steering`` (:mod:`.steering`): a steer's text runs as more script in the running
turn, after the turn's own; after ``[steer-late]`` it runs in its own thread, so the prompt
answers ``end_turn`` while steered work still streams; after ``[steer-fail]`` the answer is
``failed``; with no turn running (or after ``[steer-closed]``) it is ``promptRequired``.

Sessions live in :class:`.store.Store` (one JSON file each), so ``session/load`` replays the
history (user / thought / agent chunks) and ``session/resume`` restores without replay, also
after the agent restarts. ``--legacy`` mimics older agents: no ``configOptions`` (models via
``session/set_model`` only) and ``session/resume`` unknown (only
``session/unstable_resumeSession``).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import IO, Any, Final

import msgspec

from acp import jsonrpc
from acp.agents.scripted import acp121, elicit, script, steering
from acp.agents.scripted.store import SessionRecord, Store, now_iso, valid_session_id
from acp.agents.scripted.turn import Cancelled, RpcFailure, Session, Turn, TurnRunner
from acp.errors import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, RESOURCE_NOT_FOUND
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    AvailableCommand,
    AvailableCommandInput,
    AvailableCommandsUpdate,
    SessionNotification,
    SessionUpdate,
    TextContent,
    UserMessageChunk,
)

AGENT_NAME: Final = "acp-scripted"
AGENT_VERSION: Final = "0.1.0"
MODES: Final = (
    ("default", "Default", "Ask before every edit"),
    ("auto-edit", "Auto edit", "Edit files without asking"),
    ("plan", "Plan", "Plan only"),
    ("yolo", "YOLO", "Never ask"),
)
MODELS: Final = (
    ("scripted-fast", "Scripted fast", "Answers at once"),
    ("scripted-slow", "Scripted slow", "Pauses 50 ms before each update"),
)
LIST_PAGE_SIZE: Final = 50


class _Pending:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: object = None
        self.error: jsonrpc.ErrorObject | None = None


class ScriptedAgent:
    def __init__(
        self,
        state_dir: str,
        *,
        legacy: bool = False,
        out: IO[bytes] | None = None,
        auth_methods: bool = False,
    ):
        self.store = Store(state_dir)
        self.legacy = legacy
        self.extras = acp121.Extras(auth_methods=auth_methods)
        self.out = out if out is not None else sys.stdout.buffer
        self.write_lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.sessions_lock = threading.Lock()
        self.pending: dict[int, _Pending] = {}
        self.ids = itertools.count(1)
        self.hung = threading.Event()
        self.turns = itertools.count(1)
        self.client_capabilities: object = None  # from initialize ([elicit] checks it)
        #: ``ACP_SCRIPTED_METHODS_LOG``: a file getting one JSON line per request received
        #: (``{"method", "meta"}``: its ``params._meta``), for tests of what the daemon sends.
        self.methods_log = os.environ.get("ACP_SCRIPTED_METHODS_LOG") or None

    def _log_method(self, method: str, params: dict[str, Any]) -> None:
        assert self.methods_log is not None
        line = msgspec.json.encode({"method": method, "meta": params.get("_meta")}) + b"\n"
        with self.write_lock, open(self.methods_log, "ab") as log:
            log.write(line)

    # -- output -------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.hung.is_set():
            threading.Event().wait()  # [hang]: never answer again
        with self.write_lock:
            self.out.write(data)
            self.out.flush()

    def reply(self, request_id: jsonrpc.RequestId, result: object) -> None:
        self._write(jsonrpc.encode_result(request_id, result))

    def reply_error(
        self, request_id: jsonrpc.RequestId, code: int, message: str, data: object = None
    ) -> None:
        self._write(jsonrpc.encode_error(request_id, code, message, data))

    def update(self, session_id: str, update: SessionUpdate) -> None:
        self._write(
            jsonrpc.encode_notification(
                "session/update", SessionNotification(session_id=session_id, update=update)
            )
        )

    def call(self, method: str, params: object, turn: Turn | None = None) -> dict[str, Any]:
        """Send a request to the client and wait for the answer (cancellable via ``turn``):
        the result object (``{}`` when the client answered ``null`` or a non-object)."""
        request_id = next(self.ids)
        pending = _Pending()
        self.pending[request_id] = pending
        self._write(jsonrpc.encode_request(request_id, method, params))
        try:
            while not pending.done.wait(0.05):
                if (
                    turn is not None
                    and turn.cancel.is_set()
                    and method not in ("session/request_permission", elicit.METHOD)
                ):
                    self._write(
                        jsonrpc.encode_notification("$/cancel_request", {"requestId": request_id})
                    )
                    raise Cancelled()
        finally:
            self.pending.pop(request_id, None)
        if pending.error is not None:
            raise RpcFailure(pending.error.code, pending.error.message, pending.error.data)
        return pending.result if isinstance(pending.result, dict) else {}

    # -- main loop ----------------------------------------------------------------------------

    def serve(self, stdin: IO[bytes]) -> None:
        for line in stdin:
            if self.hung.is_set():
                threading.Event().wait()
            line = line.strip()
            if not line:
                continue
            msg = jsonrpc.parse_line(line)
            if isinstance(msg, jsonrpc.Request):
                self._on_request(msg)
            elif isinstance(msg, jsonrpc.Notification):
                self._on_notification(msg)
            elif isinstance(msg, jsonrpc.Response):
                self._on_response(msg)
            else:
                print(f"scripted agent: invalid message: {msg.reason}", file=sys.stderr)
        if self.hung.is_set():  # [hang] outlives stdin EOF: only a signal ends it
            threading.Event().wait()

    def _on_response(self, msg: jsonrpc.Response) -> None:
        pending = self.pending.get(msg.id) if isinstance(msg.id, int) else None
        if pending is None:
            return
        if msg.error is not None:
            pending.error = msg.error
        else:
            pending.result = msgspec.json.decode(msg.result)
        pending.done.set()

    def _on_notification(self, msg: jsonrpc.Notification) -> None:
        params = _decode_params(msg.params)
        if msg.method == "session/cancel":
            session = self.sessions.get(str(params.get("sessionId")))
            if session is not None and session.turn is not None:
                session.turn.cancel.set()
        elif msg.method == "$/cancel_request":
            rid = params.get("requestId")
            for session in list(self.sessions.values()):
                if session.turn is not None and session.turn.request_id == rid:
                    session.turn.cancel.set()

    def _on_request(self, msg: jsonrpc.Request) -> None:
        handler = self.METHODS.get(msg.method)
        if handler is None or (self.legacy and msg.method in acp121.NOT_LEGACY):
            self.reply_error(msg.id, METHOD_NOT_FOUND, "Method not found", {"method": msg.method})
            return
        try:
            params = _decode_params(msg.params)
            if self.methods_log is not None:
                self._log_method(msg.method, params)
            result = handler(self, msg.id, params)
        except (RpcFailure, acp121.Refused) as exc:
            self.reply_error(msg.id, exc.code, exc.message, exc.data)
            return
        except (KeyError, TypeError, ValueError) as exc:
            self.reply_error(msg.id, INVALID_PARAMS, f"Invalid params: {exc!r}")
            return
        if result is not _DEFERRED:
            self.reply(msg.id, result)

    # -- lifecycle methods --------------------------------------------------------------------

    def initialize(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        self.client_capabilities = params.get("clientCapabilities")
        result = {
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}}
                | ({} if self.legacy else {"fork": {}}),
            },
            "authMethods": [],
            "agentInfo": {"name": AGENT_NAME, "title": "Scripted agent", "version": AGENT_VERSION},
        } | ({} if self.legacy else {"_meta": steering.INITIALIZE_META})
        acp121.on_initialize(self, params, result)
        return result

    def authenticate(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        return {}

    def _setup_result(self, record: SessionRecord, *, with_id: bool) -> dict[str, Any]:
        result: dict[str, Any] = {
            "modes": {
                "currentModeId": record.mode_id,
                "availableModes": [{"id": i, "name": n, "description": d} for i, n, d in MODES],
            },
            "models": {
                "currentModelId": record.model_id,
                "availableModels": [
                    {"modelId": i, "name": n, "description": d} for i, n, d in MODELS
                ],
            },
        }
        if not self.legacy:
            result["configOptions"] = self._config_options(record)
        if with_id:
            result["sessionId"] = record.session_id
        return result

    def _config_options(self, record: SessionRecord) -> list[dict[str, Any]]:
        return [
            {
                "id": "model",
                "name": "Model",
                "category": "model",
                "type": "select",
                "currentValue": record.model_id,
                "options": [{"value": i, "name": n, "description": d} for i, n, d in MODELS],
            },
            *acp121.extra_options(self, record.session_id),
        ]

    def _session(self, params: dict[str, Any]) -> Session:
        session_id = str(params["sessionId"])
        session = self.sessions.get(session_id)
        if session is None:
            raise RpcFailure(RESOURCE_NOT_FOUND, "Resource not found", {"sessionId": session_id})
        return session

    def forget(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None and session.turn is not None:
            session.turn.cancel.set()
        with self.sessions_lock:
            self.sessions.pop(session_id, None)

    def _save(self, session: Session) -> None:
        session.record.updated_at = now_iso()
        self.store.save(session.record)

    def new_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        cwd = str(params["cwd"])
        if not os.path.isabs(cwd):
            raise RpcFailure(INVALID_PARAMS, f"cwd must be absolute: {cwd!r}")
        now = now_iso()
        record = SessionRecord(
            session_id="sess_" + os.urandom(8).hex(), cwd=cwd, created_at=now, updated_at=now
        )
        session = Session(record)
        with self.sessions_lock:
            self.sessions[record.session_id] = session
        self.store.save(record)
        acp121.remember_directories(self, record.session_id, params)
        self.reply(rid, self._setup_result(record, with_id=True))
        self.update(
            record.session_id,
            AvailableCommandsUpdate(
                available_commands=[
                    AvailableCommand(
                        name="echo",
                        description="Echo the text back",
                        input=AvailableCommandInput(hint="text"),
                    ),
                    AvailableCommand(
                        name="flood",
                        description="Stream N message chunks",
                        input=AvailableCommandInput(hint="N"),
                    ),
                ]
            ),
        )
        return _DEFERRED

    def _restore(self, params: dict[str, Any]) -> Session:
        session_id = str(params["sessionId"])
        acp121.remember_directories(self, session_id, params)
        existing = self.sessions.get(session_id)
        if existing is not None:
            return existing
        record = None
        if valid_session_id(session_id):
            self.store.hold(session_id)  # before reading: no pruner may take it meanwhile
            record = self.store.load(session_id)
            if record is None:
                self.store.release(session_id)
        if record is None:
            raise RpcFailure(RESOURCE_NOT_FOUND, "Resource not found", {"sessionId": session_id})
        cwd = params.get("cwd")
        if isinstance(cwd, str) and cwd:
            record.cwd = cwd
        session = Session(record)
        with self.sessions_lock:
            self.sessions[session_id] = session
        return session

    def load_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        session = self._restore(params)
        record = session.record
        for entry in record.history:
            block = TextContent(text=entry.text)
            update: SessionUpdate
            if entry.role == "user":
                update = UserMessageChunk(content=block)
            elif entry.role == "thought":
                update = AgentThoughtChunk(content=block)
            else:
                update = AgentMessageChunk(content=block)
            self.update(record.session_id, update)
        return self._setup_result(record, with_id=False)

    def resume_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        return self._setup_result(self._restore(params).record, with_id=False)

    def fork_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        cwd = str(params.get("cwd") or "")
        if not os.path.isabs(cwd):
            raise RpcFailure(INVALID_PARAMS, f"cwd must be absolute: {cwd!r}")
        parent = self._restore({"sessionId": params.get("sessionId")}).record
        now = now_iso()
        record = SessionRecord(
            session_id="sess_" + os.urandom(8).hex(),
            cwd=cwd,
            title=parent.title,
            created_at=now,
            updated_at=now,
            mode_id=parent.mode_id,
            model_id=parent.model_id,
            history=list(parent.history),
        )
        with self.sessions_lock:
            self.sessions[record.session_id] = Session(record)
        self.store.save(record)
        return self._setup_result(record, with_id=True)

    def list_sessions(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        cwd = params.get("cwd")
        records = [r for r in self.store.list() if not cwd or r.cwd == cwd]
        start = int(params.get("cursor") or 0)
        page = records[start : start + LIST_PAGE_SIZE]
        result: dict[str, Any] = {
            "sessions": [
                {
                    "sessionId": r.session_id,
                    "cwd": r.cwd,
                    "title": r.title,
                    "updatedAt": r.updated_at,
                }
                | (
                    {"additionalDirectories": self.extras.directories[r.session_id]}
                    if self.extras.directories.get(r.session_id)
                    else {}
                )
                for r in page
            ]
        }
        if start + LIST_PAGE_SIZE < len(records):
            result["nextCursor"] = str(start + LIST_PAGE_SIZE)
        return result

    def close_session(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        session = self._session(params)
        if session.turn is not None:
            session.turn.cancel.set()
        with self.sessions_lock:
            self.sessions.pop(session.record.session_id, None)
        self.store.release(session.record.session_id)
        return {}

    def set_mode(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        session = self._session(params)
        mode_id = str(params["modeId"])
        if mode_id not in {m[0] for m in MODES}:
            raise RpcFailure(INVALID_PARAMS, f"unknown mode {mode_id!r}", {"modeId": mode_id})
        with session.lock:
            session.record.mode_id = mode_id
            self._save(session)
        return {}

    def _set_model(self, session: Session, model_id: str) -> None:
        if model_id not in {m[0] for m in MODELS}:
            raise RpcFailure(INVALID_PARAMS, f"unknown model {model_id!r}", {"modelId": model_id})
        with session.lock:
            session.record.model_id = model_id
            self._save(session)

    def set_model(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        self._set_model(self._session(params), str(params["modelId"]))
        return {}

    def set_config_option(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        session = self._session(params)
        if self.legacy:
            raise RpcFailure(INVALID_PARAMS, f"unknown config option {params.get('configId')!r}")
        if params.get("configId") == "model":
            self._set_model(session, str(params["value"]))
        else:
            acp121.set_option(self, session.record.session_id, params)
        return {"configOptions": self._config_options(session.record)}

    def ping(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        return {}

    # -- prompt -------------------------------------------------------------------------------

    def prompt(self, rid: jsonrpc.RequestId, params: dict[str, Any]) -> object:
        session = self._session(params)
        blocks = params.get("prompt") or []
        if not isinstance(blocks, list):
            raise RpcFailure(INVALID_PARAMS, "prompt must be a list of content blocks")
        texts = [
            str(b.get("text", ""))
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text"
        ]
        turn = Turn(rid)
        session.turn = turn
        threading.Thread(
            target=self._run_turn,
            args=(session, turn, "\n".join(texts)),
            name=f"prompt-{rid}",
            daemon=True,
        ).start()
        return _DEFERRED

    def _run_turn(self, session: Session, turn: Turn, text: str) -> None:
        run = TurnRunner(self, session, turn)
        session.record.add("user", text)
        if session.record.title is None and text.strip():
            session.record.title = text.strip().splitlines()[0][:80]
        try:
            stop_reason = run.execute(script.parse(text))
        except RpcFailure as exc:
            self._finish(session, turn)
            self.reply_error(turn.request_id, exc.code, exc.message, exc.data)
            return
        except Exception as exc:  # a bug in the agent: report it as the prompt's error
            self._finish(session, turn)
            self.reply_error(
                turn.request_id, INTERNAL_ERROR, f"scripted agent failed: {exc!r}", None
            )
            return
        self._finish(session, turn)
        result: dict[str, Any] = {
            "stopReason": stop_reason,
            "_meta": {"scripted": {"turn": next(self.turns), "updates": run.updates}},
        }
        if not self.legacy:
            input_tokens = len(text.split()) + run.extra_tokens
            session.context_used += len(text.split()) + run.output_words
            if session.reports_context:
                self.update(session.record.session_id, run.usage_update())
            result["usage"] = {
                "totalTokens": input_tokens + run.output_words,
                "inputTokens": input_tokens,
                "outputTokens": run.output_words,
            }
        self.reply(turn.request_id, result)

    def _finish(self, session: Session, turn: Turn) -> None:
        with session.lock:
            if session.turn is turn:
                session.turn = None
            self._save(session)

    METHODS: Final = {
        "initialize": initialize,
        "authenticate": authenticate,
        "session/new": new_session,
        "session/load": load_session,
        "session/resume": resume_session,
        "session/unstable_resumeSession": resume_session,
        "session/list": list_sessions,
        "session/fork": fork_session,
        "session/close": close_session,
        "session/set_mode": set_mode,
        "session/set_model": set_model,
        "session/set_config_option": set_config_option,
        "session/prompt": prompt,
        "_session/steering": steering.steer,
        "session/delete": acp121.delete_session,
        "logout": acp121.logout,
        "_scripted/ping": ping,
    }


_DEFERRED: Final = object()


def _decode_params(raw: msgspec.Raw) -> dict[str, Any]:
    value = msgspec.json.decode(raw) if raw else {}
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RpcFailure(INVALID_PARAMS, "params must be an object")
    return value


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from acp.agents.scripted.store import default_state_dir  # lazy: only the CLI needs it

    state_dir = default_state_dir()
    legacy = False
    auth_methods = False
    while args:
        arg = args.pop(0)
        if arg == "--state-dir" and args:
            state_dir = args.pop(0)
        elif arg.startswith("--state-dir="):
            state_dir = arg.split("=", 1)[1]
        elif arg == "--legacy":
            legacy = True
        elif arg == "--auth-methods":
            auth_methods = True
        elif arg in ("-h", "--help"):
            print(
                "usage: python -m acp.agents.scripted [--state-dir DIR] [--legacy] [--auth-methods]"
            )
            return 0
        else:
            print(f"scripted agent: unknown argument {arg!r}", file=sys.stderr)
            return 2
    agent = ScriptedAgent(os.path.abspath(state_dir), legacy=legacy, auth_methods=auth_methods)
    agent.serve(sys.stdin.buffer)
    return 0
