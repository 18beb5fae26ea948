"""The daemon keeps the contract it publishes: schemathesis over its own ``/openapi.json``.

A real daemon (the scripted agent, a bearer token, device flows against a local fake IdP)
is fuzzed by the pinned schemathesis CLI, run as a user would run it from the repository
root (so ``schemathesis.toml`` applies), with the checks ``not_a_server_error``,
``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``
and ``negative_data_rejection``, every phase (examples, coverage, fuzzing, and the stateful
phase that follows the document's links from ``POST /session`` into the session routes),
a fixed seed and a time budget. Any finding fails the test with schemathesis' report
(each finding with its ``curl`` reproduction).

The routes that end or change the daemon for every later request run last, each against a
daemon of its own: ``POST /daemon/drain`` (the daemon stays draining until it stops) and
``POST /daemon/bind`` (on a late-bound daemon; a bind replaces the token).

``ACP_CONTRACT_SEED`` and ``ACP_CONTRACT_SECONDS`` change the seed and the main budget
(a deeper run: ``ACP_CONTRACT_SECONDS=600``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.serve.test_deviceflow_fake_idp import PENDING, FakeIdp
from tests.support.daemon import ROOT, DaemonProcess, spawn_daemon

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
pytestmark = pytest.mark.skipif(
    not SCHEMATHESIS.exists(), reason="schemathesis is not installed (the test extra)"
)

TOKEN = "contract-token-0123456789"
BOOT = "contract-bootstrap-0123456789"
SEED = int(os.environ.get("ACP_CONTRACT_SEED", "20261205"))
MAIN_SECONDS = int(os.environ.get("ACP_CONTRACT_SECONDS", "100"))
END_SECONDS = 15
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,negative_data_rejection"
)
#: Run last, on their own daemons (see the module docstring).
ENDING = "^/daemon/(drain|bind)$"
#: One operation alone has no links to follow: every phase but the stateful one.
NO_LINKS = ("--phases", "examples,coverage,fuzzing")


@pytest.fixture(scope="module")
def idp() -> Iterator[FakeIdp]:
    with FakeIdp() as server:
        server.script("qwen-oauth", token=[PENDING])
        yield server


def _daemon(idp: FakeIdp, args: Sequence[str] = (), token: str | None = TOKEN) -> DaemonProcess:
    env = {
        "ACP_SERVE_DEVICE_FLOW_PROVIDERS": json.dumps({"qwen-oauth": idp.provider("qwen-oauth")})
    }
    if token is not None:
        env["QWEN_SERVER_TOKEN"] = token
    # No session or prompt-queue cap: a generated case may create sessions and prompts at any
    # rate, and a cap is a documented 503 (Retry-After) that not_a_server_error counts.
    return spawn_daemon(
        ["--max-sessions", "0", "--max-pending-prompts-per-session", "0", *args], env=env
    )


def schemathesis(daemon: DaemonProcess, token: str, seconds: int, *args: str) -> None:
    """Run schemathesis against ``daemon``; fail with its report on any finding."""
    argv = [
        str(SCHEMATHESIS),
        "run",
        f"{daemon.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        CHECKS,
        "--seed",
        str(SEED),
        "--max-time",
        str(seconds),
        "--no-color",
        *args,
    ]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds + 240,
    )
    report = done.stdout[-20000:] + done.stderr[-4000:]
    assert daemon.proc.poll() is None, daemon.stderr()[-3000:]
    assert done.returncode == 0, f"schemathesis (seed {SEED}) found:\n{report}"


@pytest.mark.timeout(MAIN_SECONDS + 300)
def test_schemathesis_finds_nothing_on_the_daemons_own_document(idp: FakeIdp) -> None:
    daemon = _daemon(idp)
    try:
        schemathesis(daemon, TOKEN, MAIN_SECONDS, "--exclude-path-regex", ENDING)
    finally:
        daemon.stop()


@pytest.mark.timeout(2 * END_SECONDS + 300)
def test_schemathesis_finds_nothing_on_drain_and_bind(idp: FakeIdp) -> None:
    daemon = _daemon(idp)
    try:
        schemathesis(daemon, TOKEN, END_SECONDS, "--include-path", "/daemon/drain", *NO_LINKS)
    finally:
        daemon.stop()
    late = _daemon(idp, ["--bootstrap-token", BOOT], token=None)
    try:
        schemathesis(late, BOOT, END_SECONDS, "--include-path", "/daemon/bind", *NO_LINKS)
    finally:
        late.stop()
