"""A fleet on one machine: two daemons behind nginx routing by ``X-Sandbox-ID``.

nginx (Debian's, installed by ``scripts/test`` when missing and root) stands in for
agent-sandbox's ``sandbox-router``: it picks the upstream from ``X-Sandbox-ID``, sets
``Host`` to the upstream, **strips ``Authorization``** and the routing header like the
router, and passes SSE (unbuffered) and WebSocket upgrades. So the token header
(``--token-header X-Acp-Serve-Token``) is what authenticates, as behind the router.

* sandbox ``a`` runs with its own token; sandbox ``b`` starts warm with the pool's
  bootstrap token and is bound through the proxy (``POST /daemon/bind``);
* the Python SDK drives sessions on each through the proxy: prompts, the SSE stream;
* ``/acp`` over WebSocket through the proxy: ``initialize`` and ``session/new``;
* a bearer token alone is refused through the proxy (the router would strip it);
* sandbox ``a`` is SIGKILLed and restarted on the same port and state directory: its
  session is restored from the journal through the proxy, with its history.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.client import AcpServeClient
from serve.client.errors import NotFoundError
from tests.support.daemon import DaemonProcess, spawn_daemon

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if Path(p).is_file()), None
)
pytestmark = pytest.mark.skipif(
    NGINX is None, reason="nginx is not installed (scripts/test installs it when root)"
)

HEADER = "X-Acp-Serve-Token"
TOKEN_A = "tenant-a-token-0123456789abcdef"
TOKEN_B = "tenant-b-token-0123456789abcdef"
BOOT = "pool-bootstrap-token-0123456789"

CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    map $http_x_sandbox_id $sandbox {{
        default "";
{routes}
    }}
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        "" "";
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            if ($sandbox = "") {{
                return 400 '{{"error":"X-Sandbox-ID header is required."}}';
            }}
            proxy_pass http://$sandbox;
            proxy_http_version 1.1;
            proxy_set_header Host $proxy_host;
            # Like agent-sandbox's sandbox-router: no Authorization, no routing headers.
            proxy_set_header Authorization "";
            proxy_set_header X-Sandbox-ID "";
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Proxy:
    def __init__(self, tmp: Path, upstreams: dict[str, int]) -> None:
        assert NGINX is not None
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        routes = "\n".join(f"        {sid} 127.0.0.1:{port};" for sid, port in upstreams.items())
        conf = tmp / "nginx.conf"
        conf.write_text(CONF.format(tmp=tmp, port=self.port, routes=routes))
        self.proc = subprocess.Popen(
            [NGINX, "-e", str(tmp / "error.log"), "-p", str(tmp), "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    self.stop()
                    pytest.fail(f"nginx did not start: {err}")
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Proxy, dict[str, DaemonProcess], Path]]:
    daemons = {
        "sandbox-a": spawn_daemon(
            ["--token-header", HEADER],
            workspace=tmp_path / "a" / "ws",
            state_dir=tmp_path / "a" / "state",
            env={"QWEN_SERVER_TOKEN": TOKEN_A},
        ),
        "sandbox-b": spawn_daemon(
            ["--token-header", HEADER, "--public-probes"],
            workspace=tmp_path / "b" / "ws",
            state_dir=tmp_path / "b" / "state",
            env={"ACP_SERVE_BOOTSTRAP_TOKEN": BOOT},
        ),
    }
    proxy = Proxy(tmp_path / "nginx", {sid: d.port for sid, d in daemons.items()})
    try:
        yield proxy, daemons, tmp_path
    finally:
        proxy.stop()
        for d in daemons.values():
            d.stop()


def _client(proxy: Proxy, sandbox: str, token: str) -> AcpServeClient:
    http = httpx.AsyncClient(
        base_url=proxy.url, headers={"X-Sandbox-ID": sandbox}, timeout=httpx.Timeout(30.0)
    )
    return AcpServeClient(proxy.url, token, token_header=HEADER, http=http)


async def _turn(client: AcpServeClient, session_id: str, text: str) -> list[str]:
    """A prompt, and the event types of its turn read over SSE through the proxy."""
    async with client.events(session_id) as stream:
        accepted = await client.prompt_async(session_id, text)
        assert accepted.prompt_id
        seen: list[str] = []
        chunks: list[str] = []
        with trio.fail_after(30):
            async for event in stream:
                seen.append(event.type)
                update = event.data.get("update", {})
                if isinstance(update, dict) and isinstance(update.get("content"), dict):
                    chunks.append(str(update["content"].get("text", "")))
                if event.type == "turn_complete":
                    break
    assert "".join(chunks).endswith(text), chunks
    return seen


def _ws_acp(port: int, sandbox: str, token: str, cwd: str) -> list[dict[str, Any]]:
    """``initialize`` and ``session/new`` over ``/acp`` WebSocket through the proxy (wsproto)."""
    import wsproto
    import wsproto.events as ev

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    sock.sendall(
        ws.send(
            ev.Request(
                host=f"127.0.0.1:{port}",
                target="/acp",
                extra_headers=[
                    (b"x-sandbox-id", sandbox.encode()),
                    (HEADER.encode(), token.encode()),
                ],
            )
        )
    )
    replies: list[dict[str, Any]] = []
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session/new",
            "params": {"cwd": cwd, "mcpServers": []},
        },
    ]
    text = ""
    try:
        while len(replies) < len(requests):
            data = sock.recv(65536)
            if not data:
                raise AssertionError(f"the proxy closed the WebSocket; got {replies}")
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, ev.AcceptConnection):
                    sock.sendall(ws.send(ev.Message(data=json.dumps(requests[0]))))
                elif isinstance(event, ev.RejectConnection):
                    raise AssertionError(f"upgrade refused: {event.status_code}")
                elif isinstance(event, ev.TextMessage):
                    text += event.data
                    if event.message_finished:
                        message = json.loads(text)
                        text = ""
                        if message.get("id") in (1, 2):
                            replies.append(message)
                            if message["id"] == 1:
                                sock.sendall(ws.send(ev.Message(data=json.dumps(requests[1]))))
                elif isinstance(event, ev.Ping):
                    sock.sendall(ws.send(event.response()))
    finally:
        sock.close()
    return replies


def test_two_daemons_behind_a_header_routing_proxy(
    fleet: tuple[Proxy, dict[str, DaemonProcess], Path],
) -> None:
    proxy, daemons, tmp = fleet
    a, b = daemons["sandbox-a"], daemons["sandbox-b"]
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        # The router strips Authorization: a bearer token alone does not get through.
        bearer = http.get(
            "/capabilities",
            headers={"X-Sandbox-ID": "sandbox-a", "Authorization": f"Bearer {TOKEN_A}"},
        )
        assert bearer.status_code == 401
        assert http.get("/capabilities", headers={HEADER: TOKEN_A}).status_code == 400
        # Each sandbox knows only its own token.
        cross = http.get("/capabilities", headers={"X-Sandbox-ID": "sandbox-b", HEADER: TOKEN_A})
        assert cross.status_code in (401, 403)
        # The claimer binds the warm sandbox b through the proxy.
        assert http.get("/readyz", headers={"X-Sandbox-ID": "sandbox-b"}).status_code == 200
        bound = http.post(
            "/daemon/bind",
            json={"token": TOKEN_B, "workspace": {"path": str(b.workspace)}},
            headers={"X-Sandbox-ID": "sandbox-b", HEADER: BOOT},
        )
        assert bound.status_code == 200, bound.text

    async def drive() -> tuple[str, list[str], list[str]]:
        async with (
            _client(proxy, "sandbox-a", TOKEN_A) as ca,
            _client(proxy, "sandbox-b", TOKEN_B) as cb,
        ):
            sa = (await ca.create_session(scope="thread")).session_id
            sb = (await cb.create_session(scope="thread")).session_id
            seen_a = await _turn(ca, sa, "hello a through nginx")
            seen_b = await _turn(cb, sb, "hello b through nginx")
            # Sessions live where they were made: b does not know a's session.
            with pytest.raises(NotFoundError):
                await cb.load_session(sa)
            return sa, seen_a, seen_b

    sa, seen_a, seen_b = trio.run(drive)
    for seen in (seen_a, seen_b):
        assert "session_update" in seen and seen[-1] == "turn_complete"

    for sandbox, token in (("sandbox-a", TOKEN_A), ("sandbox-b", TOKEN_B)):
        replies = _ws_acp(proxy.port, sandbox, token, str(daemons[sandbox].workspace))
        assert replies[0]["result"]["protocolVersion"] == 1, replies
        assert replies[1]["result"]["sessionId"], replies

    # Kill sandbox a hard and bring it back on the same port and volume.
    port = a.port
    a.stop(signal.SIGKILL)
    daemons["sandbox-a"] = spawn_daemon(
        ["--token-header", HEADER, "--port", str(port)],
        workspace=tmp / "a" / "ws",
        state_dir=tmp / "a" / "state",
        env={"QWEN_SERVER_TOKEN": TOKEN_A},
    )

    async def resume() -> list[str]:
        async with _client(proxy, "sandbox-a", TOKEN_A) as ca:
            restored = await ca.load_session(sa)
            assert restored.session_id == sa
            history: list[str] = []
            async with ca.events(sa, last_event_id=0) as stream:
                with trio.fail_after(30):
                    async for event in stream:
                        update = event.data.get("update", {})
                        if isinstance(update, dict) and isinstance(update.get("content"), dict):
                            history.append(str(update["content"].get("text", "")))
                        if event.type == "replay_complete":
                            break
            await _turn(ca, sa, "after the restart")
            return history

    history = trio.run(resume)
    assert "hello a through nginx" in "".join(history)
