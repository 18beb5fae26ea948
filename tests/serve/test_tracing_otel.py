"""OpenTelemetry traces: spans exported over OTLP/HTTP to a real receiver.

The receiver is a tiny HTTP server run by the test on 127.0.0.1 that accepts ``POST
/v1/traces`` and decodes the protobuf body with ``opentelemetry-proto`` (what the exporter
sends). The daemon is real (``python -m serve``) with the scripted agent, which logs the
``_meta`` of each request it gets (``ACP_SCRIPTED_METHODS_LOG``). A daemon stopped with
SIGTERM exports its last spans before it exits, so the spans are all there once it stopped.
"""

from __future__ import annotations

import gzip
import json
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.acpfront.helpers import AcpHttp
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Got:
    name: str
    trace_id: str
    span_id: str
    parent: str
    kind: int
    attributes: dict[str, Any]
    service: str
    error: bool


class Receiver:
    """OTLP/HTTP traces receiver on 127.0.0.1 (a thread; stopped by the fixture)."""

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self.posts = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            self.posts += 1
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        attributes: dict[str, Any] = {}
                        for a in s.attributes:
                            v = a.value
                            kind = v.WhichOneof("value")
                            attributes[a.key] = getattr(v, kind) if kind else None
                        self.spans.append(
                            Got(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent=s.parent_span_id.hex(),
                                kind=s.kind,
                                attributes=attributes,
                                service=resource.get("service.name", ""),
                                error=s.status.code == 2,
                            )
                        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.stop()


def start(args: list[str], methods_log: Path, **env: str) -> DaemonProcess:
    return spawn_daemon(
        [*args, "--agent-allow-write", str(methods_log.parent)],  # the agent's sandbox
        env={"QWEN_SERVER_TOKEN": TOKEN, "ACP_SCRIPTED_METHODS_LOG": str(methods_log), **env},
    )


def methods(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def traceparent() -> tuple[str, str, str]:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{parent_id}-01", trace_id, parent_id


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    buffer = ""
    for text in response.iter_text():
        buffer += text
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            data = [line[5:].strip() for line in block.split("\n") if line.startswith("data:")]
            if data:
                yield json.loads("\n".join(data))


def run_prompt_with_a_permission(client: httpx.Client, header: str) -> str:
    """A turn that asks a permission (allowed) in a new session; returns the session id."""
    sid: str = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
    accepted = client.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": "[write traced.txt yes]"}]},
        headers={"Prefer": "respond-async", "traceparent": header},
    )
    assert accepted.status_code == 202, accepted.text
    with client.stream("GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}) as s:
        for event in sse(s):
            if event.get("type") == "permission_request":
                r = client.post(
                    f"/session/{sid}/permission/{event['data']['requestId']}",
                    json={"outcome": {"outcome": "selected", "optionId": "allow"}},
                )
                assert r.status_code == 200, r.text
            if event.get("type") in ("turn_complete", "turn_error"):
                assert event["type"] == "turn_complete", event
                break
    return sid


def test_a_prompt_is_one_trace_under_the_callers_traceparent(
    receiver: Receiver, tmp_path: Path
) -> None:
    log = tmp_path / "methods.jsonl"
    daemon = start(["--otel-endpoint", receiver.url], log, OTEL_SERVICE_NAME="acp-serve-under-test")
    header, trace_id, caller_span = traceparent()
    try:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            status = client.get("/daemon/status").json()["runtime"]["tracing"]
            assert status == {"enabled": True, "sdkLoaded": True, "endpoint": receiver.url}
            sid = run_prompt_with_a_permission(client, header)
    finally:
        assert daemon.stop() == 0  # SIGTERM: the last spans are exported before the exit

    trace = [s for s in receiver.spans if s.trace_id == trace_id]
    by_name: dict[str, list[Got]] = {}
    for s in trace:
        by_name.setdefault(s.name, []).append(s)
    (http,) = by_name["POST /session/<session_id>/prompt"]
    assert http.parent == caller_span and http.kind == 2  # SERVER
    assert http.attributes["http.response.status_code"] == 202
    (admission,) = by_name["prompt.admission"]
    (turn,) = by_name["prompt.turn"]
    (queued,) = by_name["prompt.queue_wait"]
    (work,) = by_name["prompt.agent"]
    (rpc,) = by_name["session/prompt"]
    (permission,) = by_name["permission.wait"]
    assert admission.parent == http.span_id and turn.parent == http.span_id
    assert queued.parent == turn.span_id and work.parent == turn.span_id
    assert rpc.parent == work.span_id and rpc.kind == 3  # CLIENT
    assert permission.parent == work.span_id
    assert permission.attributes["acp_serve.outcome"] == "selected"
    (write,) = by_name["fs/write_text_file"]  # the agent's own request, then
    assert write.parent == work.span_id and write.kind == 2  # SERVER
    assert turn.attributes["acp_serve.session_id"] == sid
    assert turn.attributes["acp_serve.outcome"] == "turn_complete"
    assert turn.attributes["acp_serve.reason"] == "end_turn"
    assert {s.service for s in trace} == {"acp-serve-under-test"}

    # The agent got the trace: session/prompt's _meta.traceparent names the RPC span.
    (prompt,) = [m for m in methods(log) if m["method"] == "session/prompt"]
    assert prompt["meta"]["traceparent"] == f"00-{trace_id}-{rpc.span_id}-01"
    assert prompt["meta"]["qwen.daemon.invocation"]["sessionId"] == sid  # kept
    # Every request to the agent carries its span (initialize and session/new too; a new
    # trace sets the W3C level 2 "random" flag: 03).
    got = methods(log)
    assert {"initialize", "session/new"} <= {m["method"] for m in got}
    assert all(
        re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-0[13]", m["meta"]["traceparent"]) for m in got
    )

    # Spans outside the prompt's trace: the agent's start (its initialize under it) and
    # the journal's flushes.
    names = {s.name for s in receiver.spans}
    assert {"agent.start", "initialize", "journal.flush", "GET /daemon/status"} <= names
    starts = {s.span_id for s in receiver.spans if s.name == "agent.start"}
    assert any(s.parent in starts for s in receiver.spans if s.name == "initialize")


async def test_an_acp_message_traceparent_in_meta_is_the_parent(
    receiver: Receiver, tmp_path: Path
) -> None:
    log = tmp_path / "methods.jsonl"
    daemon = start(["--otel-endpoint", receiver.url], log)
    header, trace_id, caller_span = traceparent()
    try:
        async with (
            httpx.AsyncClient(base_url=daemon.url, timeout=30) as client,
            trio.open_nursery() as nursery,
        ):
            acp = AcpHttp(client, nursery)
            await acp.initialize({"protocolVersion": 1})
            async with acp.stream() as conn:
                sid = (await acp.new_session(str(daemon.workspace.resolve()), conn))["sessionId"]
                async with acp.stream(sid) as events:
                    rid = await acp.request(
                        "session/prompt",
                        {
                            "sessionId": sid,
                            "prompt": [{"type": "text", "text": "hello"}],
                            "_meta": {"traceparent": header},
                        },
                    )
                    frames = await events.until(lambda f: f.message.get("id") == rid)
            assert frames[-1].message["result"]["stopReason"] == "end_turn"
            await client.delete("/acp", headers=acp.headers())
    finally:
        assert daemon.stop() == 0

    trace = [s for s in receiver.spans if s.trace_id == trace_id]
    (front,) = [s for s in trace if s.name == "acp session/prompt"]
    assert front.parent == caller_span and front.kind == 2  # SERVER
    (turn,) = [s for s in trace if s.name == "prompt.turn"]
    (rpc,) = [s for s in trace if s.name == "session/prompt"]
    assert turn.parent == front.span_id
    (prompt,) = [m for m in methods(log) if m["method"] == "session/prompt"]
    assert prompt["meta"]["traceparent"] == f"00-{trace_id}-{rpc.span_id}-01"


def test_a_daemon_with_tracing_off_loads_no_opentelemetry(tmp_path: Path) -> None:
    log = tmp_path / "methods.jsonl"
    daemon = start([], log)
    header, _, _ = traceparent()
    try:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            r = client.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "hello"}]},
                headers={"traceparent": header},
            )
            assert r.status_code == 200, r.text
            tracing = client.get("/daemon/status").json()["runtime"]["tracing"]
            assert tracing == {"enabled": False, "sdkLoaded": False}
    finally:
        daemon.stop()
    (prompt,) = [m for m in methods(log) if m["method"] == "session/prompt"]
    assert "traceparent" not in prompt["meta"]  # nothing added with tracing off


def test_a_bad_endpoint_or_exporter_stops_the_start() -> None:
    bad_url = subprocess.run(
        [sys.executable, "-m", "serve", "--port", "0", "--otel-endpoint", "ftp://x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_url.returncode == 1
    assert "--otel-endpoint must be an http(s) URL" in bad_url.stderr
    grpc = subprocess.run(
        [sys.executable, "-m", "serve", "--port", "0", "--otel-endpoint", "http://127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
    )
    assert grpc.returncode == 1
    assert "OTLP protocol 'grpc' is not supported" in grpc.stderr


@pytest.mark.parametrize(
    ("endpoint", "env", "on"),
    [
        (None, {}, False),
        ("http://127.0.0.1:4318/v1/traces", {}, True),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        (None, {"OTEL_TRACES_EXPORTER": "console"}, True),
        (None, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        (None, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ("http://127.0.0.1:4318/v1/traces", {"OTEL_SDK_DISABLED": "true"}, True),
    ],
)
def test_when_tracing_is_on(endpoint: str | None, env: dict[str, str], on: bool) -> None:
    from serve.telemetry import wanted

    assert wanted(endpoint, env) is on


def test_a_collector_that_is_down_costs_no_prompt_and_a_bounded_exit(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = start(["--otel-endpoint", f"http://127.0.0.1:{port}/v1/traces"], tmp_path / "m")
    try:
        with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid = client.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
            r = client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hello"}]}
            )
            assert r.status_code == 200, r.text
            assert r.json()["stopReason"] == "end_turn"
    finally:
        began = time.monotonic()
        assert daemon.stop(timeout_s=30) == 0
        took = time.monotonic() - began
    # The exit waits for the exporter at most SHUTDOWN_FLUSH_S (5 s), then says so.
    assert took < 12, took
    assert "the last spans were not exported within 5.0 s" in daemon.stderr_path.read_text()
