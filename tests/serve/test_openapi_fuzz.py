"""Fuzz the daemon from its own OpenAPI document (schemathesis): no 5xx, no hangs.

One real daemon (scripted agent, bearer token). The document is fetched from
``/openapi.json`` and every operation gets ``EXAMPLES`` positive and ``EXAMPLES`` negative
cases (schemathesis' generators driven by Hypothesis, derandomized so a failure
reproduces). About half of the cases for routes that take a session id, a workspace or a client id
are pointed at a real live session, its client id and the real workspace (the session is
re-created when a case closed it), so the handlers behind the 404/400 are reached too.

A case fails when the daemon answers 5xx, does not answer within ``REQUEST_TIMEOUT_S``,
or drops the connection. Failures are collected (not raised at the first one) and
reported with the exact request as a curl command. The run is bounded: a fixed number of
cases per operation, a per-request timeout, and pytest-timeout on the whole test.

Not fuzzed: ``POST /workspace/auth/device-flow`` (starting a flow calls the provider's
identity server on the network); the event stream with a *live* session (it is an
endless stream by design; with a random id it is fuzzed like the rest).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from tests.support.daemon import DaemonProcess, spawn_daemon  # noqa: E402

TOKEN = "fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Cases per operation and generation mode (``ACP_FUZZ_EXAMPLES`` overrides, for deeper runs).
EXAMPLES = int(os.environ.get("ACP_FUZZ_EXAMPLES", "8"))
#: ``ACP_FUZZ_RANDOM=1``: new random cases each run instead of the reproducible set.
RANDOM = os.environ.get("ACP_FUZZ_RANDOM") == "1"
REQUEST_TIMEOUT_S = 15.0
#: Not fuzzed: the device flow (outbound calls), and the drain (a valid case drains the
#: daemon for good, by design, and every later case would then be a 503).
NOT_FUZZED = {("POST", "/workspace/auth/device-flow"), ("POST", "/daemon/drain")}
NOT_PINNED = {("GET", "/session/{session_id}/events")}


@pytest.fixture(scope="module")
def fuzz_daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(["--max-sessions", "0"], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


class LiveSession:
    """A live session and its client id for pinned cases; re-created after a case closed it."""

    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, headers=AUTH, timeout=30)
        self.session_id = ""
        self.client_id = ""

    def current(self) -> tuple[str, str]:
        if self.session_id:
            res = self.client.get(
                f"/session/{self.session_id}/context", headers={"X-Qwen-Client-Id": self.client_id}
            )
            if res.status_code == 200:
                return self.session_id, self.client_id
        res = self.client.post("/session", json={"sessionScope": "thread"})
        assert res.status_code == 200, res.text
        self.session_id, self.client_id = res.json()["sessionId"], res.json()["clientId"]
        return self.session_id, self.client_id


def _pinnable(operation: Any) -> bool:
    """Does the operation take a session id, a workspace or a client id we can make real?"""
    key = (operation.method.upper(), operation.path)
    if key in NOT_PINNED:
        return False
    names = {p.name for p in operation.path_parameters} | {p.name for p in operation.headers}
    return bool(names & {"session_id", "workspace", "X-Qwen-Client-Id"})


def _pin(case: Any, live: LiveSession, workspace: str) -> None:
    """Point a case at the live session, its client id and the real workspace."""
    session_id, client_id = live.current()
    params = case.path_parameters if case.path_parameters is not None else {}
    if "session_id" in params:
        params["session_id"] = session_id
    if "workspace" in params:
        params["workspace"] = workspace.lstrip("/")
    if case.headers is not None and "X-Qwen-Client-Id" in case.headers:
        case.headers["X-Qwen-Client-Id"] = client_id


def _describe(case: Any, base_url: str, what: str) -> str:
    try:
        curl = case.as_curl_command(headers=AUTH)
    except Exception:  # pragma: no cover - description only
        curl = f"{case.method} {case.formatted_path} body={case.body!r}"
    return f"{what}\n    {curl.replace('http://127.0.0.1', base_url.rsplit(':', 1)[0])}"


@pytest.mark.timeout(600 if EXAMPLES > 8 else 120)
def test_fuzz_no_server_errors_no_hangs(fuzz_daemon: DaemonProcess) -> None:
    doc = httpx.get(f"{fuzz_daemon.url}/openapi.json", headers=AUTH, timeout=30).json()
    schema = schemathesis.openapi.from_dict(doc)
    live = LiveSession(fuzz_daemon.url)
    failures: list[str] = []
    counted = {"cases": 0, "operations": 0}
    answered_ok: set[tuple[str, str]] = set()
    http = requests.Session()

    for result in schema.get_all_operations():
        operation = result.ok()
        key = (operation.method.upper(), operation.path)
        if key in NOT_FUZZED:
            continue
        counted["operations"] += 1
        pinnable = _pinnable(operation)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=not RANDOM,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy, pin=st.booleans() if pinnable else st.just(False))
            def run(case: Any, pin: bool) -> None:
                if pin:
                    _pin(case, live, str(fuzz_daemon.workspace.resolve()))
                try:
                    response = case.call(
                        base_url=fuzz_daemon.url,
                        session=http,
                        headers=AUTH,
                        timeout=REQUEST_TIMEOUT_S,
                    )
                except requests.Timeout:
                    failures.append(_describe(case, fuzz_daemon.url, "no answer (hang)"))
                    return
                except requests.ConnectionError as exc:
                    failures.append(_describe(case, fuzz_daemon.url, f"connection lost: {exc}"))
                    return
                except (ValueError, UnicodeError, requests.exceptions.InvalidHeader):
                    return  # the client library refused to send it (e.g. a bad header)
                counted["cases"] += 1
                if response.status_code < 300:
                    answered_ok.add((case.method.upper(), case.operation.path))
                # 501 not_supported_by_agent is the documented answer of an agent
                # extension route when the agent (here the scripted one) lacks the method.
                unsupported = response.status_code == 501 and '"not_supported_by_agent"' in (
                    response.text
                )
                if response.status_code >= 500 and not unsupported:
                    failures.append(
                        _describe(
                            case,
                            fuzz_daemon.url,
                            f"{response.status_code}: {response.text[:300]}",
                        )
                    )

            try:
                run()
            except Unsatisfiable:
                # Nothing to negate: no parameters, no body, no required auth (/readyz).
                assert mode is GenerationMode.NEGATIVE, operation.label

    live.client.close()
    http.close()
    assert fuzz_daemon.proc.poll() is None, fuzz_daemon.stderr()[-2000:]
    assert counted["operations"] >= 30 and counted["cases"] >= 100, counted
    # The pinned cases reach the handlers: most operations answered 2xx at least once.
    assert len(answered_ok) >= 25, sorted(answered_ok)
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])
