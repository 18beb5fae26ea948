"""The /demo and /doc pages in real headless Chromium against a real daemon.

Debian's ``chromium`` driven by Playwright's Python API (launched from
``/usr/bin/chromium``; Playwright's own browser download is never used). Each test opens
the page, pastes the token like a user would, and checks what a user sees: echoed text,
a permission card whose approve button lets the agent write a file into the workspace,
events of another client's prompt on an attached session, and the rendered API reference.
Every page must run without console errors (a CSP that blocked the inline script, a
failed fetch, a JS exception all show up there).

If the daemon does not let the browser load the page itself without a token (the page
is static; its API calls carry the pasted token), the test adds the token to that one
document request only, so the page is still exercised exactly as served.

Skips (with the install command) when Chromium or Playwright is missing.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed: pip install playwright"
)
from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

from tests.support.daemon import DaemonProcess, spawn_daemon  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
TOKEN = "demo-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UI_TIMEOUT_MS = 20_000

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"{CHROMIUM} is missing: apt-get install -y chromium",
)


@pytest.fixture(scope="module")
def demo_daemon() -> Iterator[DaemonProcess]:
    d = spawn_daemon(env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class PageErrors:
    """Console errors and uncaught exceptions of a page."""

    def __init__(self, page: Page) -> None:
        self.messages: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.messages.append(f"pageerror: {exc}"))

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.messages.append(f"console: {msg.text}")


def open_page(browser: Browser, daemon: DaemonProcess, path: str) -> tuple[Page, PageErrors]:
    page = browser.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    errors = PageErrors(page)
    if httpx.get(daemon.url + path, timeout=30).status_code == 401:
        # The daemon guards the static page itself: give the token to that one request.
        def with_token(route: Any) -> None:
            route.continue_(
                headers={**route.request.headers, "authorization": AUTH["Authorization"]}
            )

        page.route(daemon.url + path, with_token)
    response = page.goto(daemon.url + path)
    assert response is not None and response.status == 200
    return page, errors


def connect(page: Page, token: str = TOKEN) -> None:
    page.get_by_test_id("token").fill(token)
    page.get_by_test_id("connect").click()


def wait_for_file(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def test_prompt_echo_and_approved_write(browser: Browser, demo_daemon: DaemonProcess) -> None:
    page, errors = open_page(browser, demo_daemon, "/demo")
    try:
        connect(page)
        expect(page.get_by_test_id("status")).to_have_text("connected")
        page.get_by_test_id("new-session").click()
        expect(page.get_by_test_id("session-id")).to_have_text(re.compile(r"\S+"))
        expect(page.get_by_test_id("status")).to_have_text(re.compile("^streaming "))

        page.get_by_test_id("prompt").fill("hello from the browser")
        page.get_by_test_id("send").click()
        expect(page.get_by_test_id("agent-message").last).to_contain_text(
            "echo: hello from the browser"
        )
        expect(page.get_by_test_id("user-message").last).to_have_text("hello from the browser")

        target = demo_daemon.workspace / "demo.txt"
        assert not target.exists()
        page.get_by_test_id("prompt").fill("[write demo.txt from the demo]")
        page.get_by_test_id("send").click()
        card = page.get_by_test_id("permission").last
        expect(card).to_contain_text("demo.txt")
        assert not target.exists()  # nothing is written before the approval
        card.locator('button[data-option-id="allow"]').click()
        expect(card.get_by_test_id("permission-outcome")).to_contain_text("allow")
        assert wait_for_file(target) == "from the demo"
        expect(page.get_by_test_id("tool-call").last).to_contain_text("completed")
        assert errors.messages == []
    finally:
        page.close()


def test_rejected_write_leaves_no_file(browser: Browser, demo_daemon: DaemonProcess) -> None:
    page, errors = open_page(browser, demo_daemon, "/demo")
    try:
        connect(page)
        page.get_by_test_id("new-session").click()
        expect(page.get_by_test_id("status")).to_have_text(re.compile("^streaming "))
        page.get_by_test_id("prompt").fill("[write rejected.txt nope]")
        page.get_by_test_id("send").click()
        card = page.get_by_test_id("permission").last
        card.locator('button[data-option-id="reject"]').click()
        expect(page.get_by_test_id("tool-call").last).to_contain_text("failed")
        assert not (demo_daemon.workspace / "rejected.txt").exists()
        assert errors.messages == []
    finally:
        page.close()


def test_attach_streams_another_clients_prompt(
    browser: Browser, demo_daemon: DaemonProcess
) -> None:
    with httpx.Client(base_url=demo_daemon.url, headers=AUTH, timeout=30) as api:
        created = api.post("/session", json={"sessionScope": "thread"}).json()
        page, errors = open_page(browser, demo_daemon, "/demo")
        try:
            connect(page)
            expect(page.get_by_test_id("status")).to_have_text("connected")
            page.get_by_test_id("attach-id").fill(created["sessionId"])
            page.get_by_test_id("attach").click()
            expect(page.get_by_test_id("session-id")).to_have_text(created["sessionId"])
            expect(page.get_by_test_id("status")).to_have_text(re.compile("^streaming "))
            res = api.post(
                f"/session/{created['sessionId']}/prompt",
                json={"prompt": [{"type": "text", "text": "from another client"}]},
                headers={"X-Qwen-Client-Id": created["clientId"], "Prefer": "respond-async"},
            )
            assert res.status_code == 202
            expect(page.get_by_test_id("agent-message").last).to_contain_text(
                "echo: from another client"
            )
            expect(page.get_by_test_id("sessions")).to_contain_text(created["sessionId"])
            assert errors.messages == []
        finally:
            page.close()


def test_wrong_token_is_reported(browser: Browser, demo_daemon: DaemonProcess) -> None:
    page, errors = open_page(browser, demo_daemon, "/demo")
    try:
        connect(page, "not-the-token")
        expect(page.get_by_test_id("status")).to_have_text("the token was refused (401)")
        expect(page.get_by_test_id("new-session")).to_be_disabled()
        # The refused fetch is logged by the browser; nothing else may be.
        assert all("401" in m for m in errors.messages), errors.messages
    finally:
        page.close()


def test_doc_page_renders_every_operation(browser: Browser, demo_daemon: DaemonProcess) -> None:
    doc = httpx.get(demo_daemon.url + "/openapi.json", headers=AUTH, timeout=30).json()
    operations = sum(len(item) for item in doc["paths"].values())
    page, errors = open_page(browser, demo_daemon, "/doc")
    try:
        # Either the operations or the token field (when /openapi.json needs the token).
        page.locator("details.op, #auth[style*='flex']").first.wait_for()
        if page.locator("#auth").is_visible():  # /openapi.json needs the token: paste it
            page.locator("#token").fill(TOKEN)
            page.locator("#load").click()
        expect(page.locator("details.op")).to_have_count(operations)
        prompt = page.locator("details.op", has_text="/session/{session_id}/prompt")
        prompt.locator("summary").click()
        expect(prompt).to_contain_text('"minItems": 1')  # the resolved PromptRequest schema
        expect(prompt).to_contain_text("session_prompt")
        assert all("401" in m for m in errors.messages), errors.messages
    finally:
        page.close()


def test_demo_works_behind_a_path_prefix(browser: Browser, demo_daemon: DaemonProcess) -> None:
    """Served as /w/alpha/demo (an ingress prefix), the page calls /w/alpha/<route>."""
    prefix = demo_daemon.url + "/w/alpha"
    seen: list[str] = []
    page = browser.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    errors = PageErrors(page)

    def strip_prefix(route: Any) -> None:  # what the ingress rewrite does
        target = demo_daemon.url + route.request.url[len(prefix) :]
        seen.append(route.request.url[len(prefix) :])
        headers = {**route.request.headers}
        if target.endswith("/demo"):
            headers["authorization"] = AUTH["Authorization"]
        route.fulfill(response=route.fetch(url=target, headers=headers))

    page.route(prefix + "/**", strip_prefix)
    try:
        page.goto(prefix + "/demo")
        connect(page)
        expect(page.get_by_test_id("status")).to_have_text("connected")
        expect(page.get_by_test_id("sessions")).not_to_be_empty()
        assert "/capabilities" in seen
        assert any(p.startswith("/workspace/") and p.endswith("/sessions") for p in seen), seen
        assert errors.messages == []
    finally:
        page.close()
