"""One small fake model server speaking four vendors' streaming APIs, for real agents offline.

Design: a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (free port, own thread, one instance per
agent under test). Each API's request is parsed into one neutral :class:`Turn` (the last user
text, whether the last input is a tool result, the tool names offered); :func:`plan` decides a
:class:`Reply` from it; the API's own encoder streams that reply. So every agent gets the same
behaviour whatever wire format it speaks:

======================================  =========================================================
API                                      routes
======================================  =========================================================
OpenAI chat completions (qwen, opencode) ``POST …/chat/completions`` (SSE chunks, ``[DONE]``)
OpenAI Responses (codex)                 ``POST …/responses`` (SSE ``response.*`` events)
Anthropic Messages (claude)              ``POST …/v1/messages`` (SSE), ``…/messages/count_tokens``
Gemini (gemini-cli)                      ``POST …/models/M:streamGenerateContent`` (SSE),
                                         ``:generateContent``, ``:countTokens``
all                                      ``GET …/models`` (a one-model list)
======================================  =========================================================

Replies (:func:`plan`), from the last user text (wrapper blocks such as ``<system-reminder>`` or
``<environment_context>`` are skipped):

* last input is a tool result → the text ``done``;
* ``please write FILE CONTENT`` (FILE one word, made absolute against ``workdir``; CONTENT to
  the end of the line) and a write tool is offered → a streamed call of that tool. The tool is
  picked from the offered names (:data:`WRITE_TOOLS`: qwen/gemini ``write_file``, claude
  ``Write``, opencode / pi ``write``, kimi ``WriteFile``, codex ``shell_command`` / ``shell`` /
  ``exec_command``);
* ``please run FILE CONTENT`` and a shell tool is offered → a streamed call of the agent's
  shell tool (:data:`SHELL_TOOLS`: qwen/gemini ``run_shell_command``, claude ``Bash``,
  opencode / pi ``bash``, kimi ``Shell``, codex ``shell_command`` / ``shell`` /
  ``exec_command``) running ``printf CONTENT > FILE`` (the effect a test checks on disk);
* ``please stall`` and tools are offered (a main turn, not a background title call) → one text
  chunk, then the stream is held open until the client goes away, :meth:`FakeModels.stop`, or
  ``stall_s`` seconds (then it finishes normally);
* anything else (including background calls: titles, summaries) → the user text itself,
  streamed in three pieces.

Every request is recorded (``server.requests``: ``(api, path, body)``) for assertions and for
diagnosing an agent that misbehaves.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final

WRITE_TRIGGER: Final = re.compile(r"please write (\S+)[ \t]*([^\n]*)", re.IGNORECASE)
SHELL_TRIGGER: Final = re.compile(r"please run (\S+)[ \t]*([^\n]*)", re.IGNORECASE)
STALL_TRIGGER: Final = re.compile(r"please stall", re.IGNORECASE)
#: Text parts that are wrappers added by agents around (or beside) the user's words.
_WRAPPER: Final = re.compile(r"^\s*(<[\w-]+[\s>]|# AGENTS\.md|Caveat:)", re.IGNORECASE)


@dataclass
class Turn:
    """What a request asks for, whatever API it came through."""

    user_text: str
    after_tool_result: bool
    tools: list[str] = field(default_factory=list)
    #: Parameter names of each offered tool (where the API tells them).
    params: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class Reply:
    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    stall: bool = False


def _write_args(
    tool: str, params: set[str], path: str, content: str, workdir: str
) -> dict[str, Any]:
    if tool in ("write_file", "Write"):
        return {"file_path": path, "content": content}
    if tool == "write":  # opencode names it filePath, pi path
        return {"path" if "path" in params else "filePath": path, "content": content}
    if tool == "WriteFile":
        return {"path": path, "content": content}
    script = f"printf '%s' {shlex.quote(content)} > {shlex.quote(path)}"
    if tool == "shell":
        return {"command": ["bash", "-lc", script], "workdir": workdir}
    if tool == "exec_command":
        return {"cmd": script, "workdir": workdir}
    return {"command": script, "workdir": workdir}  # shell_command


#: Write tools by agent, in preference order (the first one offered is used).
WRITE_TOOLS: Final = (
    "write_file",
    "Write",
    "write",
    "WriteFile",
    "shell_command",
    "shell",
    "exec_command",
)


#: Shell tools by agent, in preference order (the first one offered is used).
SHELL_TOOLS: Final = (
    "run_shell_command",
    "Bash",
    "bash",
    "Shell",
    "shell_command",
    "shell",
    "exec_command",
)


def _shell_args(
    tool: str, params: set[str], path: str, content: str, workdir: str
) -> dict[str, Any]:
    script = f"printf '%s' {shlex.quote(content)} > {shlex.quote(path)}"
    if tool in ("shell", "shell_command", "exec_command"):
        return _write_args(tool, params, path, content, workdir)
    args: dict[str, Any] = {"command": script}
    if tool in ("run_shell_command", "Bash", "bash"):
        args["description"] = "write a file"
    if "is_background" in params:  # qwen requires it
        args["is_background"] = False
    return args


def plan(turn: Turn, workdir: str) -> Reply:
    if turn.after_tool_result:
        return Reply("done")
    text = turn.user_text
    shell = SHELL_TRIGGER.search(text)
    shell_tool = next((t for t in SHELL_TOOLS if t in turn.tools), None)
    if shell and shell_tool is not None:
        path = os.path.normpath(os.path.join(workdir, shell.group(1)))
        params = turn.params.get(shell_tool, set())
        args = _shell_args(shell_tool, params, path, shell.group(2), workdir)
        return Reply(tool=shell_tool, arguments=args)
    match = WRITE_TRIGGER.search(text)
    tool = next((t for t in WRITE_TOOLS if t in turn.tools), None)
    if match and tool is not None:
        path = os.path.normpath(os.path.join(workdir, match.group(1)))
        params = turn.params.get(tool, set())
        return Reply(tool=tool, arguments=_write_args(tool, params, path, match.group(2), workdir))
    if STALL_TRIGGER.search(text) and turn.tools:
        return Reply("stalling", stall=True)
    return Reply(text or "(empty)")


def pieces(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _last_text(texts: list[str]) -> str:
    kept = [t for t in texts if t.strip() and not _WRAPPER.match(t)]
    return kept[-1] if kept else ""


# -- request parsers: one per API ---------------------------------------------------------------


def chat_turn(body: dict[str, Any]) -> Turn:
    messages = body.get("messages") or []
    functions = [t.get("function") or {} for t in body.get("tools") or [] if isinstance(t, dict)]
    tools = [str(f.get("name", "")) for f in functions]
    params = {
        str(f.get("name", "")): set((f.get("parameters") or {}).get("properties") or {})
        for f in functions
    }
    after_tool = bool(messages) and messages[-1].get("role") == "tool"
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts = [content]
        else:
            texts = [
                str(p.get("text", ""))
                for p in content or []
                if isinstance(p, dict) and p.get("type") == "text"
            ]
        if text := _last_text(texts):
            return Turn(text, after_tool, tools, params)
    return Turn("", after_tool, tools, params)


def responses_turn(body: dict[str, Any]) -> Turn:
    items = body.get("input") or []
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    tools = [str(t.get("name", "")) for t in body.get("tools") or [] if isinstance(t, dict)]
    after_tool = bool(items) and str(items[-1].get("type", "")).endswith("_call_output")
    for item in reversed(items):
        if item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            texts = [content]
        else:
            texts = [
                str(p.get("text", ""))
                for p in content or []
                if isinstance(p, dict) and p.get("type") in ("input_text", "text")
            ]
        if text := _last_text(texts):
            return Turn(text, after_tool, tools)
    return Turn("", after_tool, tools)


def anthropic_turn(body: dict[str, Any]) -> Turn:
    messages = body.get("messages") or []
    offered = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    tools = [str(t.get("name", "")) for t in offered]
    params = {
        str(t.get("name", "")): set((t.get("input_schema") or {}).get("properties") or {})
        for t in offered
    }
    after_tool = False
    if messages and messages[-1].get("role") == "user":
        content = messages[-1].get("content")
        after_tool = isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts = [content]
        else:
            texts = [
                str(b.get("text", ""))
                for b in content or []
                if isinstance(b, dict) and b.get("type") == "text"
            ]
        if text := _last_text(texts):
            return Turn(text, after_tool, tools, params)
    return Turn("", after_tool, tools, params)


def gemini_turn(body: dict[str, Any]) -> Turn:
    contents = body.get("contents") or []
    declared = [
        d
        for t in body.get("tools") or []
        if isinstance(t, dict)
        for d in t.get("functionDeclarations") or []
        if isinstance(d, dict)
    ]
    tools = [str(d.get("name", "")) for d in declared]
    params = {
        str(d.get("name", "")): set(
            (d.get("parametersJsonSchema") or d.get("parameters") or {}).get("properties") or {}
        )
        for d in declared
    }
    after_tool = bool(contents) and any(
        isinstance(p, dict) and "functionResponse" in p for p in contents[-1].get("parts") or []
    )
    for content in reversed(contents):
        if content.get("role", "user") != "user":
            continue
        texts = [str(p["text"]) for p in content.get("parts") or [] if "text" in p]
        if text := _last_text(texts):
            return Turn(text, after_tool, tools, params)
    return Turn("", after_tool, tools, params)


# -- the server ---------------------------------------------------------------------------------


class FakeModels:
    """See the module docstring. Thread-safe; one instance per agent under test."""

    def __init__(self, *, workdir: str, model: str = "fake", stall_s: float = 30.0) -> None:
        self.workdir = workdir
        self.model = model
        self.stall_s = stall_s
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeModels:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        owner = self

        class Handler(_Handler):
            fake = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-models",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no path: each agent appends its own ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def record(self, api: str, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append((api, path, body))

    def requests_of(self, api: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for a, _, body in self.requests if a == api]

    def hold(self) -> None:
        """Block a stalled stream until stop() or ``stall_s`` seconds."""
        self._stopping.wait(self.stall_s)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeModels
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # -- plumbing -----------------------------------------------------------------------------

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, data: object, event: str | None = None) -> None:
        frame = b""
        if event is not None:
            frame += b"event: " + event.encode() + b"\n"
        payload = data if isinstance(data, str) else json.dumps(data)
        frame += b"data: " + payload.encode() + b"\n\n"
        self.wfile.write(frame)
        self.wfile.flush()

    def _not_found(self) -> None:
        self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/models"):
            model = self.fake.model
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": model, "object": "model", "created": 0, "owned_by": "fake"}],
                    "models": [{"name": f"models/{model}", "displayName": model}],
                },
            )
        else:
            self._not_found()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "invalid JSON", "type": "invalid_request"}})
            return
        path = self.path.split("?", 1)[0].rstrip("/")
        routes: list[tuple[Callable[[str], bool], str, Callable[[dict[str, Any]], None]]] = [
            (lambda p: p.endswith("/chat/completions"), "chat", self._chat),
            (lambda p: p.endswith("/responses"), "responses", self._responses),
            (lambda p: p.endswith("/messages/count_tokens"), "anthropic", self._count_tokens),
            (lambda p: p.endswith("/messages"), "anthropic", self._anthropic),
            (lambda p: p.endswith(":streamGenerateContent"), "gemini", self._gemini_stream),
            (lambda p: p.endswith(":generateContent"), "gemini", self._gemini_once),
            (lambda p: p.endswith(":countTokens"), "gemini", self._gemini_count),
        ]
        for matches, api, handle in routes:
            if matches(path):
                self.fake.record(api, path, body)
                try:
                    handle(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent went away (a cancelled turn)
                return
        self._not_found()

    def _stall(self, reply: Reply) -> None:
        """Hold a stalling reply's stream open once, after its first chunk."""
        if reply.stall:
            reply.stall = False
            self.fake.hold()

    # -- OpenAI chat completions ----------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        reply = plan(chat_turn(body), self.fake.workdir)
        model = self.fake.model
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        call_id = f"call_{time.monotonic_ns() % 10**9}"
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            finish = "stop"
            if reply.tool is not None:
                message["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": reply.tool, "arguments": json.dumps(reply.arguments)},
                    }
                ]
                finish = "tool_calls"
            self._json(
                200,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            return
        self._sse_start()
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
            self._sse(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        chunk({"role": "assistant", "content": ""})
        if reply.tool is not None:
            args = json.dumps(reply.arguments)
            first = {"index": 0, "id": call_id, "type": "function"}
            chunk({"tool_calls": [{**first, "function": {"name": reply.tool, "arguments": ""}}]})
            for piece in pieces(args):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            chunk({}, "tool_calls")
        else:
            for piece in pieces(reply.text):
                chunk({"content": piece})
                self._stall(reply)
            chunk({}, "stop")
        self._sse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
        self._sse("[DONE]")

    # -- OpenAI Responses -----------------------------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> None:
        reply = plan(responses_turn(body), self.fake.workdir)
        rid = f"resp_{time.monotonic_ns() % 10**9}"
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }
        if reply.tool is not None:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{rid}",
                "call_id": f"call_{rid}",
                "name": reply.tool,
                "arguments": json.dumps(reply.arguments),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": f"msg_{rid}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        response: dict[str, Any] = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": self.fake.model,
            "status": "in_progress",
            "output": [],
        }
        if not body.get("stream"):
            self._json(200, {**response, "status": "completed", "output": [item], "usage": usage})
            return
        self._sse_start()
        seq = iter(range(1_000_000))

        def event(kind: str, **data: Any) -> None:
            self._sse({"type": kind, "sequence_number": next(seq), **data}, event=kind)

        event("response.created", response=response)
        event("response.in_progress", response=response)
        if reply.tool is not None:
            event("response.output_item.added", output_index=0, item={**item, "arguments": ""})
            for piece in pieces(item["arguments"]):
                event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=0,
                    delta=piece,
                )
            event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=0,
                arguments=item["arguments"],
            )
        else:
            event(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "content": []},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part=part,
            )
            for piece in pieces(reply.text):
                event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=0,
                    content_index=0,
                    delta=piece,
                )
                self._stall(reply)
            event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                text=reply.text,
            )
            event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part={**part, "text": reply.text},
            )
        event("response.output_item.done", output_index=0, item=item)
        event(
            "response.completed",
            response={**response, "status": "completed", "output": [item], "usage": usage},
        )

    # -- Anthropic Messages ---------------------------------------------------------------------

    def _count_tokens(self, body: dict[str, Any]) -> None:
        self._json(200, {"input_tokens": 10})

    def _anthropic(self, body: dict[str, Any]) -> None:
        reply = plan(anthropic_turn(body), self.fake.workdir)
        mid = f"msg_{time.monotonic_ns() % 10**9}"
        model = str(body.get("model") or self.fake.model)
        usage = {"input_tokens": 10, "output_tokens": 5}
        if reply.tool is not None:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_{mid}",
                "name": reply.tool,
                "input": reply.arguments,
            }
            stop = "tool_use"
        else:
            block = {"type": "text", "text": reply.text}
            stop = "end_turn"
        message = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        }
        if not body.get("stream"):
            self._json(200, {**message, "content": [block], "stop_reason": stop, "usage": usage})
            return
        self._sse_start()
        self._sse({"type": "message_start", "message": message}, event="message_start")
        if reply.tool is not None:
            start = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in pieces(json.dumps(reply.arguments))
            ]
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(reply.text)]
        self._sse(
            {"type": "content_block_start", "index": 0, "content_block": start},
            event="content_block_start",
        )
        for delta in deltas:
            self._sse(
                {"type": "content_block_delta", "index": 0, "delta": delta},
                event="content_block_delta",
            )
            self._stall(reply)
        self._sse({"type": "content_block_stop", "index": 0}, event="content_block_stop")
        self._sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
            event="message_delta",
        )
        self._sse({"type": "message_stop"}, event="message_stop")

    # -- Gemini ---------------------------------------------------------------------------------

    def _gemini_chunks(self, reply: Reply) -> list[dict[str, Any]]:
        usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
        if reply.tool is not None:
            parts_list = [[{"functionCall": {"name": reply.tool, "args": reply.arguments}}]]
        else:
            parts_list = [[{"text": p}] for p in pieces(reply.text)]
        chunks = []
        for i, parts in enumerate(parts_list):
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
            if i == len(parts_list) - 1:
                candidate["finishReason"] = "STOP"
            chunks.append(
                {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "fake"}
            )
        return chunks

    def _gemini_stream(self, body: dict[str, Any]) -> None:
        reply = plan(gemini_turn(body), self.fake.workdir)
        self._sse_start()
        for chunk in self._gemini_chunks(reply):
            self._sse(chunk)
            self._stall(reply)

    def _gemini_once(self, body: dict[str, Any]) -> None:
        reply = plan(gemini_turn(body), self.fake.workdir)
        chunks = self._gemini_chunks(reply)
        parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
        if reply.tool is None:
            parts = [{"text": reply.text}]
        merged = {
            **chunks[-1],
            "candidates": [
                {**chunks[-1]["candidates"][0], "content": {"role": "model", "parts": parts}}
            ],
        }
        self._json(200, merged)

    def _gemini_count(self, body: dict[str, Any]) -> None:
        self._json(200, {"totalTokens": 10})
