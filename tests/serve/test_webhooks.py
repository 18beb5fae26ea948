"""Signed webhooks end to end: a real daemon (the scripted agent) and a real HTTP receiver
on 127.0.0.1 run here, which checks every signature with the subscription's secret.

Each event type arrives once and signed; a receiver that is down gets what it is owed
when it is back; a daemon SIGKILLed with deliveries owed makes them after its restart; a
user cannot subscribe to another user's session nor to a forbidden address; bad bodies
get the error envelope.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.runtime.build import build_host
from serve.settings import SettingsError, parse_settings
from serve.webhooks import new_secret, sign, verify
from serve.webhooks.targets import AllowList
from tests.support.daemon import ROOT, DaemonProcess, spawn_daemon

TOKEN = "webhook-operator-token-0123456789"
OP = {"Authorization": f"Bearer {TOKEN}"}
ALLOW = {"outcome": {"outcome": "selected", "optionId": "allow"}}
WAIT_S = 30.0


class Receiver:
    """A webhook receiver on 127.0.0.1: records every POST (path, headers, body); ``down``
    closes its socket (connections refused), ``up`` listens again on the same port."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        self.cond = threading.Condition()
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.up()

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.cond:
                    receiver.got.append((self.path, headers, body))
                    receiver.cond.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self, secret: str, path: str = "/") -> list[dict[str, Any]]:
        """Every delivery to ``path``, its signature checked, as ``{id, type, data}``."""
        out = []
        with self.cond:
            got = list(self.got)
        for p, headers, body in got:
            if p != path:
                continue
            stamp = int(headers["webhook-timestamp"])
            assert abs(time.time() - stamp) < 600
            assert verify(secret, headers["webhook-id"], stamp, body, headers["webhook-signature"])
            payload = json.loads(body)
            out.append({"id": headers["webhook-id"], **payload})
        return out

    def wait(
        self, secret: str, done: Callable[[list[dict[str, Any]]], bool], path: str = "/"
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + WAIT_S
        with self.cond:
            while not done(self.events(secret, path)):
                left = deadline - time.monotonic()
                assert left > 0, f"webhooks seen: {self.events(secret, path)}"
                self.cond.wait(left)
        return self.events(secret, path)

    def close(self) -> None:
        if self.server is not None:
            self.down()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _has(*types: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda events: all(t in _types(events) for t in types)


def _config(tmp: Path, text: str) -> str:
    path = tmp / "acp.yaml"
    path.write_text(text)
    return str(path)


def _daemon(tmp: Path, args: list[str], **kw: Any) -> DaemonProcess:
    return spawn_daemon(
        args,
        workspace=tmp / "ws",
        state_dir=tmp / "state",
        env={"QWEN_SERVER_TOKEN": TOKEN},
        **kw,
    )


def _prompt(http: httpx.Client, sid: str, text: str) -> httpx.Response:
    return http.post(f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": text}]})


def _status(http: httpx.Client) -> dict[str, Any]:
    r = http.get("/daemon/status")
    assert r.status_code == 200, r.text
    section: dict[str, Any] = r.json()["webhooks"]
    return section


def _wait_status(http: httpx.Client, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        section = _status(http)
        if done(section):
            return section
        assert time.monotonic() < deadline, section
        time.sleep(0.05)  # polling the status page for the state asked, bounded


def test_signature_matches_the_standard_webhooks_test_vector() -> None:
    # The example of the Standard Webhooks specification (and its reference libraries).
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    msg_id, stamp, body = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    assert sign(secret, msg_id, stamp, body) == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert verify(
        secret, msg_id, stamp, body, "v1,bm9wZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )
    assert not verify(secret, msg_id, stamp + 1, body, sign(secret, msg_id, stamp, body))


def test_each_event_type_arrives_once_signed(tmp_path: Path, receiver: Receiver) -> None:
    secret = new_secret()
    config = _config(
        tmp_path,
        "restart:\n  session:\n    intensity: 0\n"
        f"webhooks:\n  subscriptions:\n    - url: {receiver.url}/\n      secret: {secret}\n",
    )
    d = _daemon(tmp_path, ["--config", config, "--webhook-allow", "127.0.0.1"])
    try:
        with httpx.Client(base_url=d.url, headers=OP, timeout=30) as http:
            sid = http.post("/session", json={}).json()["sessionId"]
            assert _prompt(http, sid, "hello").status_code == 200
            done = receiver.wait(secret, _has("turn.completed"))
            turn = done[0]["data"]
            assert turn["sessionId"] == sid and turn["stopReason"] == "end_turn"
            assert isinstance(turn["durationMs"], int) and "usage" in turn
            assert _prompt(http, sid, "[error]").status_code != 200
            receiver.wait(secret, _has("turn.failed"))

            # A permission request names its request id and the route that answers it.
            answer: list[httpx.Response] = []
            writer = threading.Thread(
                target=lambda: answer.append(_prompt(http, sid, "[write a.txt hi]"))
            )
            writer.start()
            asked = receiver.wait(secret, _has("permission.requested"))
            request = next(e for e in asked if e["type"] == "permission.requested")["data"]
            assert {o["optionId"] for o in request["options"]} >= {"allow"}
            voted = http.post(request["answer"]["path"], json=ALLOW)
            assert voted.status_code == 200, voted.text
            writer.join(WAIT_S)
            assert answer and answer[0].status_code == 200
            assert (d.workspace / "a.txt").read_text() == "hi"

            patched = http.patch(f"/session/{sid}/budget", json={"maxTokens": 5})
            assert patched.status_code == 200, patched.text
            _prompt(http, sid, "[usage 100] spend")
            exhausted = receiver.wait(secret, _has("budget.exhausted"))
            budget = next(e for e in exhausted if e["type"] == "budget.exhausted")["data"]
            assert budget["dimension"] == "tokens" and budget["limit"] == 5
            assert http.delete(f"/session/{sid}").status_code in (200, 204)
            receiver.wait(secret, _has("session.closed"))

            crashing = http.post("/session", json={"cwd": str(d.workspace / "sub")})
            if crashing.status_code != 200:  # one session per workspace: a fresh one
                crashing = http.post("/session", json={})
            sid2 = crashing.json()["sessionId"]
            _prompt(http, sid2, "[crash]")
            events = receiver.wait(secret, _has("session.failed"))
            section = _wait_status(http, lambda s: s["outbox"]["entries"] == 0)
            (listed,) = http.get("/webhooks").json()["webhooks"]
            assert listed["source"] == "config" and "secret" not in listed
            kept = http.delete(f"/webhooks/{listed['id']}")
            assert kept.status_code == 409 and kept.json()["code"] == "webhook_from_config"
        ids = [e["id"] for e in events]
        assert len(ids) == len(set(ids))  # each message once
        keys = [(e["data"]["sessionId"], e["data"]["eventId"]) for e in events]
        assert len(keys) == len(set(keys))  # each log event once
        assert [e["data"]["sessionId"] for e in events if e["type"] == "session.failed"] == [sid2]
        assert _types(events).count("session.closed") == 1
        assert section["delivered"] == len(events) and section["subscriptions"] == 1
    finally:
        d.stop()


def test_a_receiver_down_for_a_while_gets_its_deliveries_in_order(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = _config(tmp_path, "webhooks:\n  initialBackoffMs: 50\n  maxBackoffMs: 200\n")
    d = _daemon(tmp_path, ["--config", config, "--webhook-allow", "127.0.0.1"])
    try:
        with httpx.Client(base_url=d.url, headers=OP, timeout=30) as http:
            made = http.post(
                "/webhooks", json={"url": f"{receiver.url}/hook", "events": ["turn.completed"]}
            )
            assert made.status_code == 201, made.text
            secret = made.json()["secret"]
            assert made.json()["events"] == ["turn.completed"]
            listed = http.get("/webhooks").json()["webhooks"]
            assert [w["id"] for w in listed] == [made.json()["id"]]
            assert "secret" not in listed[0]
            receiver.down()
            sid = http.post("/session", json={}).json()["sessionId"]
            for word in ("one", "two", "three"):
                assert _prompt(http, sid, word).status_code == 200
            _wait_status(http, lambda s: s["retried"] >= 3 and s["outbox"]["entries"] == 3)
            receiver.up()
            events = receiver.wait(secret, lambda e: len(e) >= 3, "/hook")
            section = _wait_status(http, lambda s: s["outbox"]["entries"] == 0)
            metrics = http.get("/metrics").text
        assert _types(events) == ["turn.completed"] * 3
        prompts = [e["data"]["promptId"] for e in events]
        assert len(set(prompts)) == 3
        event_ids = [e["data"]["eventId"] for e in events]
        assert event_ids == sorted(event_ids)  # per subscription, in order
        assert section["delivered"] == 3 and section["dropped"]["expired"] == 0
        assert "acp_serve_webhook_delivered_total 3.0" in metrics
        assert "acp_serve_webhook_retried_total" in metrics
    finally:
        d.stop()


def test_deliveries_owed_by_a_killed_daemon_are_made_after_its_restart(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = _config(tmp_path, "webhooks:\n  initialBackoffMs: 50\n  maxBackoffMs: 200\n")
    args = ["--config", config, "--webhook-allow", "127.0.0.1"]
    d = _daemon(tmp_path, args)
    try:
        with httpx.Client(base_url=d.url, headers=OP, timeout=30) as http:
            made = http.post("/webhooks", json={"url": f"{receiver.url}/k"})
            secret, sub_id = made.json()["secret"], made.json()["id"]
            receiver.down()
            sid = http.post("/session", json={}).json()["sessionId"]
            assert _prompt(http, sid, "owed").status_code == 200
            _wait_status(http, lambda s: s["outbox"]["entries"] == 1 and s["retried"] >= 1)
        d.stop(signal.SIGKILL)
        receiver.up()
        d = _daemon(tmp_path, args)
        events = receiver.wait(secret, _has("turn.completed"), "/k")
        with httpx.Client(base_url=d.url, headers=OP, timeout=30) as http:
            assert [w["id"] for w in http.get("/webhooks").json()["webhooks"]] == [sub_id]
            _wait_status(http, lambda s: s["outbox"]["entries"] == 0)
        completed = [e for e in events if e["type"] == "turn.completed"]
        assert len(completed) == 1 and completed[0]["data"]["sessionId"] == sid
    finally:
        d.stop()


def test_users_subscribe_to_their_own_sessions_and_allowed_addresses_only(
    tmp_path: Path, receiver: Receiver
) -> None:
    tokens = tmp_path / "tokens.json"
    alice, bob = "alice-scoped-token-0123456789", "bob-scoped-token-0123456789"
    tokens.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "sha256": hashlib.sha256(alice.encode()).hexdigest(),
                    "principal": "alice",
                },
                {"id": "b", "sha256": hashlib.sha256(bob.encode()).hexdigest(), "principal": "bob"},
            ]
        )
    )
    args = [
        "--auth-tokens-file",
        str(tokens),
        "--quota-prompts-per-minute",
        "1",
        "--quota-sessions",
        "1",
        "--webhook-allow",
        "127.0.0.1",
    ]
    d = _daemon(tmp_path, args)
    try:
        as_alice = httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {alice}"})
        as_bob = httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {bob}"})
        with as_alice, as_bob:
            sid = as_alice.post("/session", json={"cwd": str(d.workspace)}).json()["sessionId"]
            theirs = as_bob.post("/webhooks", json={"url": f"{receiver.url}/", "sessionId": sid})
            assert theirs.status_code == 404 and theirs.json()["code"] == "session_not_found"
            for url in (
                "http://169.254.169.254/latest/meta-data",
                "http://10.1.2.3/",
                "http://[::1]:9/",
                f"{d.url}/session",  # the daemon's own address, although 127.0.0.1 is allowed
            ):
                refused = as_bob.post("/webhooks", json={"url": url})
                assert refused.status_code == 403, (url, refused.text)
                assert refused.json()["code"] == "webhook_target_forbidden"
            mine = as_alice.post(
                "/webhooks", json={"url": f"{receiver.url}/alice", "sessionId": sid}
            )
            assert mine.status_code == 201, mine.text
            wide = as_alice.post("/webhooks", json={"url": f"{receiver.url}/alice-all"})
            bobs = as_bob.post("/webhooks", json={"url": f"{receiver.url}/bob"})
            assert wide.status_code == bobs.status_code == 201
            assert [w["id"] for w in as_bob.get("/webhooks").json()["webhooks"]] == [
                bobs.json()["id"]
            ]
            gone = as_bob.delete(f"/webhooks/{mine.json()['id']}")
            assert gone.status_code == 404 and gone.json()["code"] == "webhook_not_found"

            assert _prompt(as_alice, sid, "hi").status_code == 200
            assert _prompt(as_alice, sid, "again").status_code == 429
            receiver.wait(mine.json()["secret"], _has("turn.completed"), "/alice")
            quota = receiver.wait(
                wide.json()["secret"], _has("turn.completed", "quota.exceeded"), "/alice-all"
            )
            hit = next(e for e in quota if e["type"] == "quota.exceeded")["data"]
            assert hit["principal"] == "alice" and hit["quota"] == "prompts_per_minute"
            second = as_alice.post(
                "/session", json={"cwd": str(d.workspace), "sessionScope": "thread"}
            )
            assert second.status_code == 429, second.text
            quota = receiver.wait(
                wide.json()["secret"],
                lambda e: (
                    [x["data"].get("quota") for x in e if x["type"] == "quota.exceeded"]
                    == ["prompts_per_minute", "sessions"]
                ),
                "/alice-all",
            )
            with httpx.Client(base_url=d.url, headers=OP) as op:
                _wait_status(op, lambda s: s["outbox"]["entries"] == 0)
            assert receiver.events(bobs.json()["secret"], "/bob") == []
            assert as_alice.delete(f"/webhooks/{wide.json()['id']}").status_code == 204
    finally:
        d.stop()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "url"),
        ({"url": "ftp://127.0.0.1/"}, "url"),
        ({"url": "http://user:pw@127.0.0.1/"}, "url"),
        ({"url": "http://\u0001\u00bdJ\u00c7"}, "url"),  # found by schemathesis: was a 500
        ({"url": "http://127.0.0.1/", "events": ["turn.nope"]}, "events"),
        ({"url": "http://127.0.0.1/", "events": "turn.completed"}, "events"),
        ({"url": "http://127.0.0.1/", "secret": "nope"}, "secret"),
        ({"url": "http://127.0.0.1/", "sessionId": 7}, "sessionId"),
        ({"url": "http://127.0.0.1/", "colour": "red"}, "colour"),
    ],
)
def test_bad_bodies_get_the_error_envelope(
    webhook_daemon: DaemonProcess, body: dict[str, Any], field: str
) -> None:
    r = httpx.post(f"{webhook_daemon.url}/webhooks", json=body, headers=OP)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_webhook" and r.json()["field"] == field
    assert r.json()["error"]


def test_unknown_webhooks_and_sessions_are_404(webhook_daemon: DaemonProcess) -> None:
    url = webhook_daemon.url
    r = httpx.post(f"{url}/webhooks", content=b"{not json", headers=OP)
    assert r.status_code == 400 and r.json()["error"]
    r = httpx.delete(f"{url}/webhooks/wh_nope", headers=OP)
    assert r.status_code == 404 and r.json()["code"] == "webhook_not_found"
    r = httpx.post(
        f"{url}/webhooks", json={"url": "http://127.0.0.1:9/", "sessionId": "nope"}, headers=OP
    )
    assert r.status_code == 404 and r.json()["code"] == "session_not_found"


@pytest.fixture(scope="module")
def webhook_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--webhook-allow", "127.0.0.1"], env={"QWEN_SERVER_TOKEN": TOKEN})
    yield d
    d.stop()


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.216.34", True),  # public
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("169.254.169.254", False),  # cloud metadata (link-local)
        ("fe80::1", False),
        ("10.0.0.1", False),
        ("172.16.5.4", False),
        ("192.168.1.1", False),
        ("100.64.0.1", False),
        ("fd00::1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("10.20.3.4", True),  # allowed by the CIDR below
    ],
)
def test_the_default_allow_list(address: str, allowed: bool) -> None:
    policy = AllowList(["10.20.0.0/16"], "127.0.0.1", lambda: 4170)
    assert policy.address_allowed(ipaddress.ip_address(address), 443) is allowed


def test_the_daemons_own_port_is_refused_even_when_allowed() -> None:
    policy = AllowList(["127.0.0.1", "0.0.0.0/0"], "0.0.0.0", lambda: 4170)
    assert policy.address_allowed(ipaddress.ip_address("127.0.0.1"), 8080)
    assert not policy.address_allowed(ipaddress.ip_address("127.0.0.1"), 4170)


@pytest.mark.parametrize(
    ("section", "needle"),
    [
        ("  allow: ['not a host!']\n", "webhooks.allow"),
        (
            "  subscriptions:\n    - url: http://h.example/\n      secret: nope\n",
            "subscriptions[0]",
        ),
        (
            "  subscriptions:\n    - url: ftp://h.example/\n      secret: " + new_secret() + "\n",
            "http",
        ),
        ("  maxAttempts: 0\n", "maxAttempts"),
        ("  colour: red\n", "colour"),
    ],
)
def test_a_bad_webhooks_section_stops_start_up_naming_it(
    tmp_path: Path, section: str, needle: str
) -> None:
    config = _config(tmp_path, "webhooks:\n" + section)
    settings = parse_settings(
        ["--workspace", str(tmp_path), "--state-dir", str(tmp_path / "s"), "--config", config],
        {"HOME": str(tmp_path)},
    )
    with pytest.raises(SettingsError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        build_host(settings)


def test_a_bad_webhook_allow_flag_is_refused() -> None:
    with pytest.raises(SettingsError, match="--webhook-allow"):
        parse_settings(["--webhook-allow", "no/such thing"], {"HOME": "/tmp"})


def test_the_documented_receiver_checks_a_real_delivery(
    tmp_path: Path, webhook_daemon: DaemonProcess
) -> None:
    code = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "webhooks.md").read_text(), re.S)
    script = tmp_path / "receiver.py"
    script.write_text(code[0])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = new_secret()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port)],
        env={"WEBHOOK_SECRET": secret},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        with httpx.Client(base_url=webhook_daemon.url, headers=OP, timeout=30) as http:
            made = http.post(
                "/webhooks",
                json={
                    "url": f"http://127.0.0.1:{port}/",
                    "secret": secret,
                    "events": ["turn.completed"],
                },
            )
            assert made.status_code == 201, made.text
            sid = http.post("/session", json={}).json()["sessionId"]
            assert _prompt(http, sid, "hello").status_code == 200
            assert proc.stdout is not None
            line = proc.stdout.readline()  # bounded by the suite's timeout (300 s)
            assert line.startswith("turn.completed ") and sid in line
            assert http.delete(f"/webhooks/{made.json()['id']}").status_code == 204
    finally:
        proc.kill()
        proc.wait()
