"""Agent extension routes with the real ``qwen --acp`` child (qwen-code 0.24.4) behind the daemon.

qwen runs offline against the fake OpenAI server; skipped only when node/npm are missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import AUTH, TOKEN
from tests.serve.test_extensions_scripted import EXTENSION_TAGS
from tests.support.daemon import DaemonProcess
from tests.support.node import missing_node_reason
from tests.support.qwen_daemon import qwen_behind_daemon
from tests.support.sse import iter_events

pytestmark = pytest.mark.skipif(
    missing_node_reason() is not None, reason=str(missing_node_reason())
)


@pytest.fixture(scope="module")
def qwen_daemon() -> Iterator[DaemonProcess]:
    with qwen_behind_daemon(TOKEN, prefix="acp-serve-qwen-ext-") as daemon:
        yield daemon


async def features(http: httpx.AsyncClient) -> set[str]:
    return set((await http.get("/capabilities")).json()["features"])


async def prompt(http: httpx.AsyncClient, sid: str, cid: str, text: str) -> None:
    r = await http.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={"X-Qwen-Client-Id": cid},
    )
    assert r.status_code == 200 and r.json()["stopReason"] == "end_turn", r.text


async def test_qwen_extension_routes(qwen_daemon: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=qwen_daemon.url, timeout=180, headers=AUTH) as http:
        assert not EXTENSION_TAGS & await features(http)  # no live session, no agent to ask

        r = await http.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 200, r.text
        sid, cid = r.json()["sessionId"], r.json()["clientId"]
        headers = {"X-Qwen-Client-Id": cid}
        assert EXTENSION_TAGS <= await features(http)

        # status reads relay the agent's JSON
        stats = await http.get(f"/session/{sid}/stats", headers=headers)
        assert stats.status_code == 200, stats.text
        assert stats.headers["cache-control"] == "no-store"
        body = stats.json()
        assert body["v"] == 1 and body["sessionId"] == sid and body["promptCount"] == 0
        usage = await http.get(f"/session/{sid}/context-usage", headers=headers)
        assert usage.status_code == 200, usage.text
        assert usage.json()["sessionId"] == sid
        assert usage.json()["usage"]["contextWindowSize"] > 0
        detailed = await http.get(f"/session/{sid}/context-usage", params={"detail": "true"})
        assert detailed.status_code == 200 and detailed.json()["sessionId"] == sid
        tasks = (await http.get(f"/session/{sid}/tasks")).json()
        assert tasks["sessionId"] == sid and tasks["tasks"] == []
        lsp = (await http.get(f"/session/{sid}/lsp")).json()
        assert lsp["sessionId"] == sid and "enabled" in lsp and isinstance(lsp["servers"], list)
        hooks = (await http.get(f"/session/{sid}/hooks")).json()
        assert hooks["sessionId"] == sid and isinstance(hooks["hooks"], list)

        await prompt(http, sid, cid, "hello there")
        await prompt(http, sid, cid, "second turn")
        assert (await http.get(f"/session/{sid}/stats")).json()["promptCount"] == 2

        # side queries and language
        recap = await http.post(f"/session/{sid}/recap", json={}, headers=headers)
        assert recap.status_code == 200, recap.text
        assert recap.json()["sessionId"] == sid and "recap" in recap.json()
        btw = await http.post(f"/session/{sid}/btw", json={"question": "what is this?"})
        assert btw.status_code == 200, btw.text
        assert btw.json()["sessionId"] == sid and "answer" in btw.json()
        lang = await http.post(f"/session/{sid}/language", json={"language": "en"})
        assert lang.status_code == 200 and lang.json()["language"] == "en", lang.text
        bad = await http.post(f"/session/{sid}/language", json={"language": "xx-nowhere"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_language", bad.text

        # branch: forked in the agent, loaded into the daemon
        branch = await http.post(f"/session/{sid}/branch", json={"name": "experiment"})
        assert branch.status_code == 201, branch.text
        out = branch.json()
        assert out["branchedFrom"] == sid and out["restored"] is True, out
        new_id = out["sessionId"]
        assert new_id != sid and out["clientId"] and out["title"].startswith("experiment")
        live = (await http.get(f"/session/{new_id}/stats")).json()
        assert live["sessionId"] == new_id
        assert (await http.delete(f"/session/{new_id}")).status_code == 204

        # rewind: snapshots name the turns; rewinding publishes session_rewound
        snapshots = (await http.get(f"/session/{sid}/rewind/snapshots")).json()["snapshots"]
        assert [s["turnIndex"] for s in snapshots] == [0, 1]
        target = snapshots[1]["promptId"]
        r = await http.post(
            f"/session/{sid}/rewind", json={"promptId": target, "rewindFiles": False}
        )
        assert r.status_code == 200, r.text
        assert r.json() == {
            "sessionId": sid,
            "rewound": True,
            "targetTurnIndex": 1,
            "filesChanged": [],
            "filesFailed": [],
        }
        event = await first_event(http, sid, "session_rewound")
        assert event["data"]["promptId"] == target and event["data"]["targetTurnIndex"] == 1
        bad = await http.post(f"/session/{sid}/rewind", json={"promptId": "not-a-prompt"})
        assert bad.status_code == 400 and bad.json()["code"] == "invalid_rewind_target"

        assert (await http.delete(f"/session/{sid}")).status_code == 204
        assert not EXTENSION_TAGS & await features(http)


async def first_event(http: httpx.AsyncClient, sid: str, kind: str) -> dict[str, Any]:
    async with http.stream("GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}) as s:
        async for event in iter_events(s):
            if event.get("type") == kind:
                return event
    raise AssertionError(f"no {kind} event")
