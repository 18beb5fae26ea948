"""A scripted OAuth device-authorization server on 127.0.0.1 (:class:`FakeIdp`), and tests
of the daemon's IdP client against it (form fields, PKCE, bad answers, unreachable IdP).

Other device-flow test modules import :class:`FakeIdp` from here. Each provider name gets
``/<name>/device/code`` and ``/<name>/token``; each endpoint answers from its script in
order, repeating the last answer. Every request's form is recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from serve.deviceflow.idp import IdpError, new_pkce, poll_token, request_device_code
from serve.deviceflow.machine import PollFailed, TokenGranted, TokenPending
from serve.deviceflow.providers import ProviderConfig

Answer = tuple[int, Any]  # (HTTP status, JSON-able body or raw bytes)

PENDING: Answer = (400, {"error": "authorization_pending"})
SLOW_DOWN: Answer = (400, {"error": "slow_down"})


def device_answer(name: str, interval: float = 0.05, expires_in: int = 600) -> Answer:
    return (
        200,
        {
            "device_code": f"DEV-{name}",
            "user_code": f"USER-{name}",
            "verification_uri": "http://127.0.0.1/verify",
            "verification_uri_complete": f"http://127.0.0.1/verify?user_code=USER-{name}",
            "expires_in": expires_in,
            "interval": interval,
        },
    )


def grant(name: str) -> Answer:
    return (
        200,
        {
            "access_token": f"AT-{name}",
            "refresh_token": f"RT-{name}",
            "token_type": "Bearer",
            "expires_in": 3600,
        },
    )


class _Script:
    def __init__(self, device: list[Answer], token: list[Answer], delay_s: float) -> None:
        self.answers = {"device/code": device, "token": token}
        self.counts = {"device/code": 0, "token": 0}
        self.delay_s = delay_s


class FakeIdp:
    """See the module docstring. Use as a context manager; ``url`` is its base URL."""

    def __init__(self) -> None:
        self._scripts: dict[str, _Script] = {}
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def script(
        self,
        name: str,
        *,
        token: list[Answer],
        device: list[Answer] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        with self._lock:
            self._scripts[name] = _Script(device or [device_answer(name)], token, delay_s)

    def provider(self, name: str, *, pkce: bool = False) -> dict[str, Any]:
        """The provider's configuration (``ACP_SERVE_DEVICE_FLOW_PROVIDERS`` entry)."""
        return {
            "deviceAuthorizationEndpoint": f"{self.url}/{name}/device/code",
            "tokenEndpoint": f"{self.url}/{name}/token",
            "clientId": f"client-{name}",
            "scope": "openid profile",
            "pkce": pkce,
        }

    def config(self, name: str, *, pkce: bool = False) -> ProviderConfig:
        raw = self.provider(name, pkce=pkce)
        return ProviderConfig(
            id=name,
            device_authorization_endpoint=raw["deviceAuthorizationEndpoint"],
            token_endpoint=raw["tokenEndpoint"],
            client_id=raw["clientId"],
            scope=raw["scope"],
            pkce=pkce,
        )

    def seen(self, name: str, endpoint: str) -> list[dict[str, str]]:
        with self._lock:
            return [form for n, e, form in self.requests if n == name and e == endpoint]

    def _answer(self, path: str, form: dict[str, str]) -> tuple[Answer, float]:
        name, _, endpoint = path.strip("/").partition("/")
        with self._lock:
            self.requests.append((name, endpoint, form))
            script = self._scripts.get(name)
            if script is None or endpoint not in script.answers:
                return (404, {"error": "not_found"}), 0.0
            answers = script.answers[endpoint]
            index = min(script.counts[endpoint], len(answers) - 1)
            script.counts[endpoint] += 1
            return answers[index], script.delay_s if endpoint == "device/code" else 0.0

    def __enter__(self) -> FakeIdp:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                form = {k: v[0] for k, v in parse_qs(raw).items()}
                (status, payload), delay = idp._answer(self.path, form)
                if delay:
                    threading.Event().wait(delay)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def idp() -> Iterator[FakeIdp]:
    with FakeIdp() as server:
        yield server


# ---- the IdP client against it -------------------------------------------------------------


async def test_device_and_token_requests_carry_the_rfc_8628_form(idp: FakeIdp) -> None:
    idp.script("corp", token=[PENDING, grant("corp")])
    provider = idp.config("corp", pkce=True)
    pkce = new_pkce()
    async with httpx.AsyncClient() as client:
        code = await request_device_code(client, provider, pkce)
        assert code.public.user_code == "USER-corp"
        first = await poll_token(client, provider, code.device_code, pkce)
        second = await poll_token(client, provider, code.device_code, pkce)
    assert first == (TokenPending(), None)
    assert isinstance(second[0], TokenGranted) and second[1] is not None
    assert second[1]["access_token"] == "AT-corp"
    (device_form,) = idp.seen("corp", "device/code")
    assert device_form == {
        "client_id": "client-corp",
        "scope": "openid profile",
        "code_challenge": pkce.challenge,
        "code_challenge_method": "S256",
    }
    token_forms = idp.seen("corp", "token")
    assert len(token_forms) == 2
    verifier = token_forms[0]["code_verifier"]
    digest = hashlib.sha256(verifier.encode()).digest()
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == pkce.challenge
    assert token_forms[0]["grant_type"] == "urn:ietf:params:oauth:grant-type:device_code"
    assert token_forms[0]["device_code"] == "DEV-corp"


async def test_without_pkce_no_challenge_is_sent(idp: FakeIdp) -> None:
    idp.script("plain", token=[PENDING])
    provider = idp.config("plain")
    async with httpx.AsyncClient() as client:
        code = await request_device_code(client, provider, None)
        await poll_token(client, provider, code.device_code, None)
    assert "code_challenge" not in idp.seen("plain", "device/code")[0]
    assert "code_verifier" not in idp.seen("plain", "token")[0]


async def test_device_request_failures_are_idp_errors(idp: FakeIdp) -> None:
    idp.script("bad", token=[PENDING], device=[(500, b"boom"), (200, {"user_code": "x"})])
    provider = idp.config("bad")
    async with httpx.AsyncClient() as client:
        with pytest.raises(IdpError, match="HTTP 500"):
            await request_device_code(client, provider, None)
        with pytest.raises(IdpError, match="device_code"):
            await request_device_code(client, provider, None)
        big = idp.config("big")
        idp.script("big", token=[PENDING], device=[(200, b"x" * (300 * 1024))])
        with pytest.raises(IdpError, match="larger than"):
            await request_device_code(client, big, None)


async def test_an_unreachable_idp_is_a_transient_poll_failure(idp: FakeIdp) -> None:
    provider = ProviderConfig(
        id="gone",
        device_authorization_endpoint="http://127.0.0.1:9/device",
        token_endpoint="http://127.0.0.1:9/token",
        client_id="x",
    )
    from serve.deviceflow.idp import Secret

    async with httpx.AsyncClient() as client:
        with pytest.raises(IdpError, match="ConnectError"):
            await request_device_code(client, provider, None)
        outcome, tokens = await poll_token(client, provider, Secret("d"), None)
    assert isinstance(outcome, PollFailed) and tokens is None
