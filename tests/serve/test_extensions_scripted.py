"""Agent extension routes behind an agent without vendor methods (the scripted agent).

Every route answers ``501 not_supported_by_agent`` and no extension tag is advertised,
even with live sessions; bad input and unknown sessions are refused before any call.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.daemon import running_daemon

EXTENSION_TAGS = {
    "session_recap",
    "session_btw",
    "session_rewind",
    "session_branch",
    "session_context_usage",
    "session_stats",
    "session_tasks",
    "session_lsp",
    "session_hooks",
    "session_language",
}

CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "context-usage", None),
    ("GET", "stats", None),
    ("GET", "tasks", None),
    ("GET", "lsp", None),
    ("GET", "hooks", None),
    ("GET", "rewind/snapshots", None),
    ("POST", "recap", {}),
    ("POST", "btw", {"question": "what now?"}),
    ("POST", "language", {"language": "en"}),
    ("POST", "rewind", {"targetTurnIndex": 0}),
    ("POST", "branch", {}),
]


async def new_session(client: httpx.AsyncClient) -> tuple[str, str]:
    """The workspace's shared session (one agent for the whole module), a fresh client id."""
    r = await client.post("/session", json={})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def call(
    client: httpx.AsyncClient,
    method: str,
    sid: str,
    route: str,
    body: dict[str, Any] | None,
    client_id: str | None = None,
) -> httpx.Response:
    headers = {"X-Qwen-Client-Id": client_id} if client_id else {}
    return await client.request(method, f"/session/{sid}/{route}", json=body, headers=headers)


#: The scripted agent forks natively (ACP session/fork): session_branch is advertised once a
#: session of it lives (tests/serve/test_session_fork.py); the vendor-only tags never are.
VENDOR_ONLY_TAGS = EXTENSION_TAGS - {"session_branch"}


async def test_no_tags_without_or_with_live_sessions(client: httpx.AsyncClient) -> None:
    assert not EXTENSION_TAGS & set((await client.get("/capabilities")).json()["features"])
    await new_session(client)
    features = set((await client.get("/capabilities")).json()["features"])
    assert not VENDOR_ONLY_TAGS & features
    assert "session_branch" in features


@pytest.mark.parametrize(
    ("method", "route", "body"),
    [c for c in CALLS if c[1] != "branch"],  # branch: native fork (test_session_fork.py)
)
async def test_every_route_is_not_supported(
    client: httpx.AsyncClient, method: str, route: str, body: dict[str, Any] | None
) -> None:
    sid, cid = await new_session(client)
    for _ in range(2):  # the first call learns -32601, the second is refused at once
        r = await call(client, method, sid, route, body, cid)
        assert r.status_code == 501, r.text
        assert r.json()["code"] == "not_supported_by_agent"
        assert r.json()["method"].startswith("qwen/")
    assert not VENDOR_ONLY_TAGS & set((await client.get("/capabilities")).json()["features"])


async def test_a_loaded_session_binds_its_agent_for_an_extension_route(
    client: httpx.AsyncClient,
) -> None:
    """A session loaded from its journal starts with no agent (released): an extension
    route binds one and gets the agent's own answer, not 503 ``acp_channel_unavailable``."""
    r = await client.post("/session", json={"sessionScope": "thread"})
    sid = r.json()["sessionId"]
    assert (await client.delete(f"/session/{sid}")).status_code == 204
    r = await client.post(f"/session/{sid}/load", json={})
    assert r.status_code == 200, r.text
    r = await call(client, "GET", sid, "stats", None, r.json()["clientId"])
    assert r.status_code == 501 and r.json()["code"] == "not_supported_by_agent", r.text


@pytest.mark.parametrize(("method", "route", "body"), CALLS)
async def test_unknown_session_and_client(
    client: httpx.AsyncClient, method: str, route: str, body: dict[str, Any] | None
) -> None:
    r = await call(client, method, "no-such-session", route, body)
    assert r.status_code == 404 and r.json()["code"] == "session_not_found"
    sid, _ = await new_session(client)
    r = await call(client, method, sid, route, body, "not-registered-here")
    assert r.status_code == 400 and r.json()["code"] == "invalid_client_id"


@pytest.mark.parametrize(
    ("route", "body", "code"),
    [
        ("btw", {}, "invalid_question"),
        ("btw", {"question": "   "}, "invalid_question"),
        ("btw", {"question": "x" * 4097}, "invalid_question"),
        ("language", {}, "invalid_language"),
        ("language", {"language": "en", "syncOutputLanguage": "yes"}, "invalid_sync_flag"),
        ("rewind", {}, "missing_prompt_id"),
        ("rewind", {"promptId": ""}, "missing_prompt_id"),
        ("rewind", {"targetTurnIndex": -1}, "invalid_rewind_target"),
        ("rewind", {"targetTurnIndex": True}, "invalid_rewind_target"),
        ("rewind", {"targetTurnIndex": 0, "rewindFiles": "no"}, "invalid_rewind_files_flag"),
        ("branch", {"name": 5}, "invalid_branch_name"),
        ("branch", {"atRecordId": 5}, "branch_point_invalid"),
    ],
)
async def test_bad_bodies_are_refused_before_forwarding(
    client: httpx.AsyncClient, route: str, body: dict[str, Any], code: str
) -> None:
    sid, _ = await new_session(client)
    r = await call(client, "POST", sid, route, body)
    assert r.status_code == 400 and r.json()["code"] == code, r.text


async def test_rewind_is_strict_without_a_token() -> None:
    with running_daemon() as d:
        async with httpx.AsyncClient(base_url=d.url, timeout=30) as http:
            sid, cid = await new_session(http)
            r = await call(http, "POST", sid, "rewind", {"targetTurnIndex": 0}, cid)
            assert r.status_code == 401 and r.json()["code"] == "token_required", r.text
