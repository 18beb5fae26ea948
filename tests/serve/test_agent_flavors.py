"""Third-party agent behaviours behind a real daemon (issue 18 items 1-4).

The agent is ``tests/support/flavor_agent.py``, a real child process that advertises modes
and models the way claude-agent-acp, gemini-cli, codex-acp and opencode do, names a write's
path only in a ``diff`` block or only through an earlier ``tool_call`` (kimi), and sends whole
command lines in ``terminal/create`` (kimi).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import iter_events

AGENT = Path(__file__).resolve().parents[1] / "support" / "flavor_agent.py"


FLAVORS = ["claude", "gemini", "codex", "opencode"]


@pytest.fixture(scope="module")
def daemons() -> Iterator[Callable[[str], DaemonProcess]]:
    """One daemon per flavor, started on first use, stopped with the module."""
    started: dict[str, DaemonProcess] = {}

    def get(flavor: str) -> DaemonProcess:
        if flavor not in started:
            agent = f"{sys.executable} {AGENT} {flavor}"
            started[flavor] = spawn_daemon(["--agent", agent], env={"QWEN_SERVER_TOKEN": TOKEN})
        return started[flavor]

    try:
        yield get
    finally:
        for d in started.values():
            d.stop()


@asynccontextmanager
async def connect(daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30, headers=AUTH) as client:
        yield client


async def new_session(http: httpx.AsyncClient) -> tuple[str, str]:
    r = await http.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def set_mode(http: httpx.AsyncClient, sid: str, mode: str) -> httpx.Response:
    return await http.post(f"/session/{sid}/approval-mode", json={"mode": mode})


async def context(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await http.get(f"/session/{sid}/context")
    assert r.status_code == 200, r.text
    return r.json()["state"]  # type: ignore[no-any-return]


async def turn(http: httpx.AsyncClient, sid: str, cid: str, text: str) -> list[dict[str, Any]]:
    """Run one prompt, allowing every permission request; its events."""
    r = await http.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={"Prefer": "respond-async", "X-Qwen-Client-Id": cid},
    )
    assert r.status_code == 202, r.text
    accepted = r.json()
    events: list[dict[str, Any]] = []
    headers = {"Last-Event-ID": str(accepted["lastEventId"])}
    async with http.stream("GET", f"/session/{sid}/events", headers=headers) as stream:
        async for event in iter_events(stream):
            if "comment" in event or "id" not in event:
                continue
            events.append(event)
            if event["type"] == "permission_request":
                allow = next(
                    o["optionId"] for o in event["data"]["options"] if o["kind"] == "allow_once"
                )
                v = await http.post(
                    f"/session/{sid}/permission/{event['data']['requestId']}",
                    json={"outcome": {"outcome": "selected", "optionId": allow}},
                    headers={"X-Qwen-Client-Id": cid},
                )
                assert v.status_code == 200, v.text
            if event["type"] in ("turn_complete", "turn_error"):
                if event.get("promptId") == accepted["promptId"]:
                    break
    return events


def said(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"]["sessionUpdate"] == "agent_message_chunk"
    )


def mode_changes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] == "approval_mode_changed"]


async def all_events(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """The session's events so far (the ring from 0, up to a marker prompt's end)."""
    r = await http.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": "marker"}]},
        headers={"Prefer": "respond-async"},
    )
    assert r.status_code == 202, r.text
    out: list[dict[str, Any]] = []
    async with http.stream("GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}) as s:
        async for event in iter_events(s):
            if "comment" in event or "id" not in event:
                continue
            out.append(event)
            if event["type"] == "turn_complete" and event.get("promptId") == r.json()["promptId"]:
                break
    return out


# -- item 1: approval modes -------------------------------------------------------------------

# flavor → (own id to set, qwen name → the id it becomes, a qwen name with no equivalent)
CASES = {
    "claude": ("dontAsk", {"auto-edit": "acceptEdits", "yolo": "bypassPermissions"}, "auto"),
    "gemini": ("autoEdit", {"auto-edit": "autoEdit", "yolo": "yolo"}, "auto"),
    "codex": ("full-access", {"default": "read-only", "auto-edit": "auto"}, "plan"),
    "opencode": ("plan", {"default": "build"}, "yolo"),
}
IDS = {
    "claude": ["default", "acceptEdits", "plan", "dontAsk", "bypassPermissions"],
    "gemini": ["default", "autoEdit", "yolo", "plan"],
    "codex": ["read-only", "auto", "full-access"],
    "opencode": ["build", "plan"],
}


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_the_agents_own_mode_ids_are_accepted(
    daemons: Callable[[str], DaemonProcess], flavor: str
) -> None:
    own, _, _ = CASES[flavor]
    async with connect(daemons(flavor)) as http:
        sid, _ = await new_session(http)
        before = (await context(http, sid))["modes"]["currentModeId"]
        r = await set_mode(http, sid, own)
        assert r.status_code == 200, r.text
        assert r.json()["mode"] == own and r.json()["previous"] == before
        assert "requested" not in r.json()
        assert (await context(http, sid))["modes"]["currentModeId"] == own
        [changed] = mode_changes(await all_events(http, sid))
    assert (changed["previous"], changed["next"], changed["persisted"]) == (before, own, False)


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_qwen_names_map_onto_the_agents_modes(
    daemons: Callable[[str], DaemonProcess], flavor: str
) -> None:
    _, mapped, _ = CASES[flavor]
    async with connect(daemons(flavor)) as http:
        sid, _ = await new_session(http)
        for qwen_name, agent_id in mapped.items():
            r = await set_mode(http, sid, qwen_name)
            assert r.status_code == 200, r.text
            renamed = qwen_name if agent_id != qwen_name else None  # "requested" when mapped
            assert (r.json()["mode"], r.json().get("requested")) == (agent_id, renamed)
            state = await context(http, sid)
            assert state["modes"]["currentModeId"] == agent_id
        changes = mode_changes(await all_events(http, sid))
    assert [(c["next"], c.get("requested")) for c in changes] == [
        (a, q if q != a else None) for q, a in mapped.items()
    ]


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_name_the_agent_has_no_equivalent_for_is_400_with_its_ids(
    daemons: Callable[[str], DaemonProcess], flavor: str
) -> None:
    _, _, unmapped = CASES[flavor]
    async with connect(daemons(flavor)) as http:
        sid, _ = await new_session(http)
        before = await context(http, sid)
        for bad in (unmapped, "reckless"):
            r = await set_mode(http, sid, bad)
            assert r.status_code == 400, r.text
            body = r.json()
            assert body["code"] == "invalid_approval_mode"
            assert repr(bad) in body["error"]
            assert body["allowed"][: len(IDS[flavor])] == IDS[flavor]
            assert unmapped not in body["allowed"]
        for bad in ("", 5, None, "x" * 129):
            r = await set_mode(http, sid, bad)  # type: ignore[arg-type]
            assert r.status_code == 400 and r.json()["code"] == "invalid_approval_mode", r.text
        # Nothing reached the agent: its mode is unchanged, no event.
        assert (await context(http, sid))["modes"] == before["modes"]
        assert mode_changes(await all_events(http, sid)) == []


# -- item 2: models and modes offered as config options ---------------------------------------

MODELS = {
    "codex": ["gpt-5.1-codex", "gpt-5.1-codex-mini"],
    "opencode": ["fake/tool-model", "fake/other-model"],
}


@pytest.mark.parametrize("flavor", ["codex", "opencode"])
async def test_context_reports_models_and_modes_from_config_options(
    daemons: Callable[[str], DaemonProcess], flavor: str
) -> None:
    async with connect(daemons(flavor)) as http:
        sid, _ = await new_session(http)
        state = await context(http, sid)
        assert [m["modelId"] for m in state["models"]["availableModels"]] == MODELS[flavor]
        assert state["models"]["currentModelId"] == MODELS[flavor][0]
        assert [m["id"] for m in state["modes"]["availableModes"]] == IDS[flavor]
        assert state["modes"]["currentModeId"] == IDS[flavor][0]
        async with http.stream("GET", f"/session/{sid}/events?snapshot=1") as stream:
            async for event in iter_events(stream):
                if event.get("type") == "session_snapshot":
                    snapshot = event["data"]
                    break
        assert snapshot["currentModelId"] == MODELS[flavor][0]
        assert snapshot["currentApprovalMode"] == IDS[flavor][0]
        # Switching through the config option: context and the option itself follow.
        expected = "plan" if flavor == "opencode" else "auto"
        r = await set_mode(http, sid, expected)
        assert r.status_code == 200, r.text
        state = await context(http, sid)
        assert state["modes"]["currentModeId"] == expected
        [option] = [o for o in state["configOptions"] if o["category"] == "mode"]
        assert option["currentValue"] == expected
        r = await http.post(f"/session/{sid}/model", json={"modelId": MODELS[flavor][1]})
        assert r.status_code == 200, r.text
        assert (await context(http, sid))["models"]["currentModelId"] == MODELS[flavor][1]


# -- item 3: an approved write is asked once (kimi's shapes; the opencode flavor) --------------


@pytest.mark.parametrize("how", ["write-diff", "write-announced"])
async def test_an_approved_write_is_asked_once(
    daemons: Callable[[str], DaemonProcess], how: str
) -> None:
    daemon = daemons("opencode")
    name = f"{how}.txt"
    async with connect(daemon) as http:
        sid, cid = await new_session(http)
        events = await turn(http, sid, cid, f"{how} {name} hello {how}")
    requests = [e["data"] for e in events if e["type"] == "permission_request"]
    assert len(requests) == 1, requests  # the agent's own; the Host did not ask again
    assert not requests[0]["toolCall"]["toolCallId"].startswith("host_")
    assert said(events) == f"wrote {name}"
    assert (daemon.workspace / name).read_text() == f"hello {how}"


async def test_an_approval_does_not_cover_another_path(
    daemons: Callable[[str], DaemonProcess],
) -> None:
    """The link is by path: the diff names one file, a write to another is asked again."""
    daemon = daemons("opencode")
    async with connect(daemon) as http:
        sid, cid = await new_session(http)
        events = await turn(http, sid, cid, "write-elsewhere named.txt other.txt two")
    requests = [e["data"] for e in events if e["type"] == "permission_request"]
    assert len(requests) == 2, requests
    host = requests[1]["toolCall"]
    assert host["toolCallId"].startswith("host_")
    assert host["locations"] == [{"path": str(daemon.workspace / "other.txt")}]
    assert (daemon.workspace / "other.txt").read_text() == "two"
    assert not (daemon.workspace / "named.txt").exists()


async def test_a_diff_only_request_outside_the_workspace_is_refused_by_its_path(
    daemons: Callable[[str], DaemonProcess],
) -> None:
    """The approval policy screens the agent's request by the path in its diff block."""
    daemon = daemons("opencode")
    outside = daemon.workspace.parent / "outside.txt"
    async with connect(daemon) as http:
        sid, cid = await new_session(http)
        events = await turn(http, sid, cid, "write-diff ../outside.txt nope")
    assert [e for e in events if e["type"] == "permission_request"] == []
    [denied] = [e["data"] for e in events if e["type"] == "effect_denied"]
    assert (denied["capability"], denied["target"]) == ("fs.write", str(outside))
    assert said(events) == "rejected"
    assert not outside.exists()


async def test_a_request_that_names_no_path_is_asked_not_refused_unseen(
    daemons: Callable[[str], DaemonProcess],
) -> None:
    """Issue 22: an ``edit`` tool call with no location, diff or raw path was classified as
    a write to "" and denied by the approval policy with no client asked."""
    daemon = daemons("opencode")
    async with connect(daemon) as http:
        sid, cid = await new_session(http)
        events = await turn(http, sid, cid, "write-unmapped unmapped.txt asked first")
    assert [e for e in events if e["type"] == "effect_denied"] == []
    requests = [e["data"] for e in events if e["type"] == "permission_request"]
    assert requests and requests[0]["toolCall"]["toolCallId"].startswith("tc-")  # the agent's
    assert said(events) == "wrote unmapped.txt"
    assert (daemon.workspace / "unmapped.txt").read_text() == "asked first"


# -- item 4: whole command lines in terminal/create --------------------------------------------


async def test_a_whole_command_line_runs_through_the_shell(
    daemons: Callable[[str], DaemonProcess],
) -> None:
    daemon = daemons("opencode")
    (daemon.workspace / "listed.txt").write_text("x")
    async with connect(daemon) as http:
        sid, cid = await new_session(http)
        events = await turn(http, sid, cid, "shell echo one two | tr a-z A-Z && ls listed.txt")
    assert said(events) == "exit 0: ONE TWO\nlisted.txt\n"


# -- the agent's own mode changes --------------------------------------------------------------


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_mode_the_agent_switches_to_itself_is_the_current_one(
    daemons: Callable[[str], DaemonProcess], flavor: str
) -> None:
    target = IDS[flavor][1]
    async with connect(daemons(flavor)) as http:
        sid, cid = await new_session(http)
        events = await turn(http, sid, cid, f"switch-mode {target}")
        assert said(events) == f"now in {target}"
        assert (await context(http, sid))["modes"]["currentModeId"] == target


async def test_a_model_option_update_leaves_the_acp_mode_alone(
    daemons: Callable[[str], DaemonProcess],
) -> None:
    """claude: modes via ACP ``modes``, a model config option; switching the model sends a
    ``config_option_update`` without a mode option, which must not reset the mode."""
    async with connect(daemons("claude")) as http:
        sid, _ = await new_session(http)
        assert (await set_mode(http, sid, "acceptEdits")).status_code == 200
        r = await http.post(f"/session/{sid}/model", json={"modelId": "claude-haiku"})
        assert r.status_code == 200, r.text
        state = await context(http, sid)
    assert state["modes"]["currentModeId"] == "acceptEdits"
    assert state["models"]["currentModelId"] == "claude-haiku"
