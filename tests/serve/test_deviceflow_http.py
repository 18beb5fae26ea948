"""Device-flow routes and events through the real daemon, against the fake IdP.

The daemon gets its providers from ``ACP_SERVE_DEVICE_FLOW_PROVIDERS`` (all on
127.0.0.1) and a bearer token (the routes are strict). A session is created so the
workspace-wide events can be read from its SSE stream.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.serve.test_deviceflow_fake_idp import (
    PENDING,
    SLOW_DOWN,
    FakeIdp,
    grant,
)
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until

TOKEN = "T-device-flow"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAILURES = {
    "deny": ((400, {"error": "access_denied"}), "error", "access_denied"),
    "expire": ((400, {"error": "expired_token"}), "expired", "expired_token"),
    "grant": ((400, {"error": "invalid_grant"}), "error", "invalid_grant"),
    "weird": ((400, {"error": "unsupported_grant_type"}), "error", "upstream_error"),
}
LIMIT_PROVIDERS = [f"slot{i}" for i in range(5)]


def provider_env(idp: FakeIdp, names: list[str]) -> dict[str, str]:
    return {"ACP_SERVE_DEVICE_FLOW_PROVIDERS": json.dumps({n: idp.provider(n) for n in names})}


@pytest.fixture(scope="module")
def idp() -> Iterator[FakeIdp]:
    with FakeIdp() as server:
        server.script("happy", token=[PENDING, SLOW_DOWN, grant("happy")])
        server.script("waiting", token=[PENDING])
        server.script("down", token=[PENDING], device=[(500, b"boom")])
        for name, (answer, _, _) in FAILURES.items():
            server.script(name, token=[answer])
        for name in LIMIT_PROVIDERS:
            server.script(name, token=[PENDING])
        yield server


@pytest.fixture(scope="module")
def flow_daemon(idp: FakeIdp) -> Iterator[DaemonProcess]:
    names = ["happy", "waiting", "down", *FAILURES, *LIMIT_PROVIDERS]
    d = spawn_daemon(["--token", TOKEN], env=provider_env(idp, names))
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
async def http(flow_daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=flow_daemon.url, headers=AUTH, timeout=30) as c:
        yield c


async def new_session(http: httpx.AsyncClient) -> tuple[str, str]:
    created = await http.post("/session", json={"sessionScope": "thread"})
    assert created.status_code in (200, 201), created.text
    return created.json()["sessionId"], created.json()["clientId"]


async def events_until(
    http: httpx.AsyncClient, session_id: str, flow_id: str, last: str
) -> list[dict[str, Any]]:
    """Replay the session's events and return those of ``flow_id`` up to type ``last``."""

    def done(event: dict[str, Any]) -> bool:
        return event.get("type") == last and event["data"].get("deviceFlowId") == flow_id

    async with http.stream(
        "GET", f"/session/{session_id}/events", headers={"Last-Event-ID": "0"}
    ) as stream:
        with trio.fail_after(30):
            events = await collect_until(stream, done)
    return [e for e in events if e.get("data", {}).get("deviceFlowId") == flow_id]


async def test_pending_slow_down_success(
    http: httpx.AsyncClient, flow_daemon: DaemonProcess
) -> None:
    session_id, client_id = await new_session(http)
    me = {"X-Qwen-Client-Id": client_id}
    started = await http.post(
        "/workspace/auth/device-flow", json={"providerId": "happy"}, headers=me
    )
    assert started.status_code == 201, started.text
    body = started.json()
    flow_id = body["deviceFlowId"]
    assert body["providerId"] == "happy" and body["status"] == "pending"
    assert body["attached"] is False and body["initiatorClientId"] == client_id
    assert body["userCode"] == "USER-happy"
    assert body["verificationUri"] == "http://127.0.0.1/verify"
    assert body["verificationUriComplete"].endswith("user_code=USER-happy")
    assert body["intervalMs"] == 50 and body["expiresAt"] > 0

    # While it is pending (the slow_down holds it for 5 s), an anonymous caller attaches
    # and does not see the code.
    again = await http.post("/workspace/auth/device-flow", json={"providerId": "happy"})
    assert again.status_code == 200, again.text
    assert again.json()["deviceFlowId"] == flow_id and again.json()["attached"] is True
    assert "userCode" not in again.json() and "verificationUri" not in again.json()

    events = await events_until(http, session_id, flow_id, "auth_device_flow_authorized")
    assert [e["type"] for e in events] == [
        "auth_device_flow_started",
        "auth_device_flow_throttled",
        "auth_device_flow_authorized",
    ]
    assert events[0]["data"] == {
        "deviceFlowId": flow_id,
        "providerId": "happy",
        "expiresAt": body["expiresAt"],
    }
    assert events[1]["data"] == {"deviceFlowId": flow_id, "intervalMs": 50 + 5000}
    assert events[2]["data"]["providerId"] == "happy" and events[2]["data"]["expiresAt"] > 0
    text = json.dumps(events)
    for secret in ("USER-happy", "DEV-happy", "AT-happy", "RT-happy", "verify"):
        assert secret not in text

    view = (await http.get(f"/workspace/auth/device-flow/{flow_id}", headers=me)).json()
    assert view["status"] == "authorized" and "userCode" not in view
    path = flow_daemon.state_dir / "credentials" / "happy.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text())["accessToken"] == "AT-happy"
    # Cancelling a terminal flow is an accepted no-op.
    assert (await http.delete(f"/workspace/auth/device-flow/{flow_id}")).status_code == 204
    view = (await http.get(f"/workspace/auth/device-flow/{flow_id}")).json()
    assert view["status"] == "authorized"


@pytest.mark.parametrize("provider", list(FAILURES))
async def test_terminal_idp_answers(http: httpx.AsyncClient, provider: str) -> None:
    _, status, kind = FAILURES[provider]
    session_id, _ = await new_session(http)
    started = await http.post("/workspace/auth/device-flow", json={"providerId": provider})
    assert started.status_code == 201
    flow_id = started.json()["deviceFlowId"]
    events = await events_until(http, session_id, flow_id, "auth_device_flow_failed")
    assert events[-1]["data"]["errorKind"] == kind
    view = (await http.get(f"/workspace/auth/device-flow/{flow_id}")).json()
    assert (view["status"], view["errorKind"]) == (status, kind)
    assert "userCode" not in view


async def test_cancel_and_not_found(http: httpx.AsyncClient) -> None:
    session_id, _ = await new_session(http)
    started = await http.post("/workspace/auth/device-flow", json={"providerId": "waiting"})
    flow_id = started.json()["deviceFlowId"]
    status = (await http.get("/workspace/auth/status")).json()
    assert {"deviceFlowId": flow_id, "providerId": "waiting"}.items() <= next(
        f for f in status["pendingDeviceFlows"] if f["deviceFlowId"] == flow_id
    ).items()
    assert status["v"] == 1 and status["providers"] == []
    assert status["supportedDeviceFlowProviders"][0] == "qwen-oauth"
    assert "waiting" in status["supportedDeviceFlowProviders"]

    assert (await http.delete(f"/workspace/auth/device-flow/{flow_id}")).status_code == 204
    assert (await http.delete(f"/workspace/auth/device-flow/{flow_id}")).status_code == 204
    events = await events_until(http, session_id, flow_id, "auth_device_flow_cancelled")
    assert [e["type"] for e in events].count("auth_device_flow_cancelled") == 1
    assert (await http.get(f"/workspace/auth/device-flow/{flow_id}")).json()["status"] == (
        "cancelled"
    )
    status = (await http.get("/workspace/auth/status")).json()
    assert all(f["deviceFlowId"] != flow_id for f in status["pendingDeviceFlows"])
    for method in ("GET", "DELETE"):
        missing = await http.request(method, "/workspace/auth/device-flow/no-such-flow")
        assert missing.status_code == 404
        assert missing.json()["code"] == "device_flow_not_found"


async def test_too_many_active_flows(http: httpx.AsyncClient) -> None:
    flows = []
    for name in LIMIT_PROVIDERS[:4]:
        started = await http.post("/workspace/auth/device-flow", json={"providerId": name})
        assert started.status_code == 201, started.text
        flows.append(started.json()["deviceFlowId"])
    try:
        refused = await http.post(
            "/workspace/auth/device-flow", json={"providerId": LIMIT_PROVIDERS[4]}
        )
        assert refused.status_code == 409
        assert refused.json()["code"] == "too_many_active_flows"
    finally:
        for flow_id in flows:
            await http.delete(f"/workspace/auth/device-flow/{flow_id}")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"providerId": "nope"}, 400, "unsupported_provider"),
        ({}, 400, "invalid_request"),
        ({"providerId": "  "}, 400, "invalid_request"),
        ({"providerId": 7}, 400, "invalid_request"),
        ({"providerId": "down"}, 502, "upstream_error"),
    ],
)
async def test_start_errors(
    http: httpx.AsyncClient, body: dict[str, Any], status: int, code: str
) -> None:
    response = await http.post("/workspace/auth/device-flow", json=body)
    assert response.status_code == status, response.text
    assert response.json()["code"] == code
    if code == "unsupported_provider":
        assert response.json()["supportedProviders"][0] == "qwen-oauth"
        assert "happy" in response.json()["supportedProviders"]


async def test_bad_json_and_unregistered_client(http: httpx.AsyncClient) -> None:
    bad = await http.post(
        "/workspace/auth/device-flow",
        content=b"{",
        headers={"Content-Type": "application/json"},
    )
    assert bad.status_code == 400 and bad.json() == {"error": "Invalid JSON in request body"}
    stranger = await http.post(
        "/workspace/auth/device-flow",
        json={"providerId": "waiting"},
        headers={"X-Qwen-Client-Id": "stranger"},
    )
    assert stranger.status_code == 400 and stranger.json()["code"] == "invalid_client_id"


async def test_persist_failure_through_the_daemon(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("keep", token=[grant("keep")])
    state = tmp_path / "state"
    state.mkdir()
    (state / "credentials").write_text("in the way")
    d = spawn_daemon(["--token", TOKEN], state_dir=state, env=provider_env(idp, ["keep"]))
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            started = await client.post("/workspace/auth/device-flow", json={"providerId": "keep"})
            flow_id = started.json()["deviceFlowId"]
            with trio.fail_after(30):
                while True:  # polled like a client would (GET is the contract here)
                    view = (await client.get(f"/workspace/auth/device-flow/{flow_id}")).json()
                    if view["status"] != "pending":
                        break
                    await trio.sleep(0.02)
        assert (view["status"], view["errorKind"]) == ("error", "persist_failed")
        assert str(state) not in json.dumps(view)
    finally:
        d.stop()


STRICT = [
    ("POST", "/workspace/auth/device-flow"),
    ("GET", "/workspace/auth/device-flow/some-id"),
    ("DELETE", "/workspace/auth/device-flow/some-id"),
    ("POST", "/workspace/mcp/a/restart"),
]


def test_strict_routes_need_a_configured_token() -> None:
    d = spawn_daemon([])
    try:
        for method, path in STRICT:
            response = httpx.request(method, f"{d.url}{path}", json={"providerId": "qwen-oauth"})
            assert response.status_code == 401, (method, path)
            assert response.json()["code"] == "token_required"
        # The read-only status route is not strict.
        assert httpx.get(f"{d.url}/workspace/auth/status").status_code == 200
    finally:
        d.stop()


async def test_providers_from_the_config_file(idp: FakeIdp, tmp_path: Path) -> None:
    """``deviceFlow.providers`` in ``--config`` (issue 16 item 14): the provider runs a
    whole flow against the fake IdP, its PKCE setting included."""
    idp.script("fromcfg", token=[PENDING, grant("fromcfg")])
    raw = idp.provider("fromcfg", pkce=True)
    config = tmp_path / "acp-serve.yaml"
    config.write_text(
        "deviceFlow:\n  providers:\n    fromcfg:\n"
        + "".join(f"      {key}: {json.dumps(value)}\n" for key, value in raw.items())
    )
    d = spawn_daemon(["--token", TOKEN, "--config", str(config)])
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            session = await client.post("/session", json={"sessionScope": "thread"})
            session_id = session.json()["sessionId"]
            started = await client.post(
                "/workspace/auth/device-flow", json={"providerId": "fromcfg"}
            )
            assert started.status_code == 201, started.text
            flow_id = started.json()["deviceFlowId"]
            assert started.json()["userCode"] == "USER-fromcfg"
            events = await events_until(client, session_id, flow_id, "auth_device_flow_authorized")
            assert events[-1]["data"]["providerId"] == "fromcfg"
        stored = json.loads((d.state_dir / "credentials" / "fromcfg.json").read_text())
        assert stored["accessToken"] == "AT-fromcfg"
        device_form = idp.seen("fromcfg", "device/code")[0]
        assert device_form["client_id"] == "client-fromcfg"
        assert "code_challenge" in device_form  # pkce: true reached the provider
    finally:
        d.stop()
