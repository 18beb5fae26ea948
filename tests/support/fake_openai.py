"""A tiny fake OpenAI-compatible chat-completions server, for running real agents offline.

Usage (sync or async tests alike; the server runs in its own thread)::

    with FakeOpenAI(workdir=str(workspace)) as server:
        env = {**os.environ, **server.env()}      # OPENAI_API_KEY / OPENAI_BASE_URL / OPENAI_MODEL
        ... run `qwen --acp` with env ...
        server.requests                           # every chat request body received, in order

It binds 127.0.0.1 on a free port (``server.base_url`` is ``http://127.0.0.1:PORT/v1``) and is
stopped when the ``with`` block ends.

Endpoints: ``GET /v1/models``; ``POST /v1/chat/completions`` with ``stream`` true (SSE
``chat.completion.chunk`` lines, a last chunk with ``usage``, then ``data: [DONE]``) or false.

Replies, decided from the conversation:

* If the last message has role ``tool``: the text ``done``.
* Else the *last user text* is the last text part of the last user message that does not start
  with ``<system-reminder>`` (qwen sends several parts per message).
* **Tool-call trigger**: if that text contains ``please write FILE CONTENT`` (case-insensitive;
  FILE is one word, CONTENT runs to the end of the line and may be empty), the reply is a
  ``write_file`` tool call with ``{"file_path": <FILE made absolute against workdir>,
  "content": CONTENT}``.
* Otherwise the reply is the user text itself (streamed in a few pieces).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final

WRITE_TRIGGER: Final = re.compile(r"please write (\S+)[ \t]*([^\n]*)", re.IGNORECASE)
REMINDER_PREFIX: Final = "<system-reminder>"


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts = [content]
        elif isinstance(content, list):
            parts = [
                str(p.get("text", ""))
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            ]
        else:
            parts = []
        texts = [p for p in parts if p.strip() and not p.lstrip().startswith(REMINDER_PREFIX)]
        if texts:
            return texts[-1]
    return ""


class Reply:
    def __init__(self, text: str = "", tool_call: dict[str, Any] | None = None) -> None:
        self.text = text
        self.tool_call = tool_call


def decide(messages: list[dict[str, Any]], workdir: str) -> Reply:
    if messages and messages[-1].get("role") == "tool":
        return Reply("done")
    text = last_user_text(messages)
    match = WRITE_TRIGGER.search(text)
    if match:
        path = os.path.normpath(os.path.join(workdir, match.group(1)))
        return Reply(
            tool_call={
                "id": f"call_{int(time.time() * 1000) % 10**8}",
                "name": "write_file",
                "arguments": json.dumps({"file_path": path, "content": match.group(2)}),
            }
        )
    return Reply(text or "(empty)")


def _pieces(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class FakeOpenAI:
    """See the module docstring. Thread-safe; one instance per test."""

    def __init__(self, *, model: str = "fake", workdir: str | None = None) -> None:
        self.model = model
        self.workdir = workdir or os.getcwd()
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> FakeOpenAI:
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
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
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
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": "dummy-key",
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_MODEL": self.model,
        }

    def record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)

    def chat_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            model = {"id": self.fake.model, "object": "model", "created": 0, "owned_by": "fake"}
            self._json(200, {"object": "list", "data": [model]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "invalid JSON", "type": "invalid_request"}})
            return
        self.fake.record(body)
        reply = decide(body.get("messages") or [], self.fake.workdir)
        if body.get("stream"):
            self._stream(reply, body)
        else:
            self._complete(reply)

    def _usage(self) -> dict[str, int]:
        return {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}

    def _complete(self, reply: Reply) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        finish = "stop"
        if reply.tool_call is not None:
            tc = reply.tool_call
            message["tool_calls"] = [
                {
                    "id": tc["id"],
                    "type": "function",
                    "function": {"name": tc["name"], "arguments": tc["arguments"]},
                }
            ]
            finish = "tool_calls"
        self._json(
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.fake.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self._usage(),
            },
        )

    def _stream(self, reply: Reply, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            obj = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.fake.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        if reply.tool_call is not None:
            tc = reply.tool_call
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": tc["id"],
                            "type": "function",
                            "function": {"name": tc["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for piece in _pieces(tc["arguments"]):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            chunk({}, "tool_calls")
        else:
            for piece in _pieces(reply.text):
                chunk({"content": piece})
            chunk({}, "stop")
        usage_chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.fake.model,
            "choices": [],
            "usage": self._usage(),
        }
        self.wfile.write(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
