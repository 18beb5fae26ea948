"""Native fork (issue 27 item 1): ``POST /session/:id/branch`` with ACP ``session/fork``.

Real daemon, real scripted agents: the default one advertises ``sessionCapabilities.fork``,
the ``--legacy`` one does not (501 ``not_supported_by_agent``).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import AUTH, TOKEN
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


@pytest.fixture
def daemon_url() -> Any:
    d = spawn_daemon([], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d.url
    finally:
        d.stop()


@pytest.fixture
def legacy_url() -> Any:
    agent = shlex.join([sys.executable, "-m", "acp.agents.scripted", "--legacy"])
    d = spawn_daemon(["--agent", agent], env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        yield d.url
    finally:
        d.stop()


async def test_a_fork_is_a_new_session_that_names_its_parent_and_keeps_its_context(
    daemon_url: str,
) -> None:
    async with httpx.AsyncClient(base_url=daemon_url, headers=AUTH, timeout=30) as client:
        parent = (await client.post("/session", json={"sessionScope": "thread"})).json()
        pid = parent["sessionId"]
        assert (
            await client.post(f"/session/{pid}/prompt", json=text("remember me"))
        ).status_code == 200
        caps = (await client.get("/capabilities")).json()
        assert "session_branch" in caps["features"]

        forked = await client.post(f"/session/{pid}/branch", json={"name": "worker"})
        assert forked.status_code == 201, forked.text
        body = forked.json()
        fid = body["sessionId"]
        assert fid != pid
        assert body["branchedFrom"] == pid
        assert body["via"] == "session/fork"

        async with client.stream(
            "GET", f"/session/{fid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            first = await collect_until(stream, lambda e: True)
        assert first[-1]["type"] == "session_forked"
        assert first[-1]["data"]["parentSessionId"] == pid

        # its own turn; the parent is untouched and stays usable
        done = await client.post(f"/session/{fid}/prompt", json=text("child"))
        assert done.status_code == 200
        assert (await client.post(f"/session/{pid}/prompt", json=text("parent"))).status_code == 200
        # its own budget and journal-backed stream
        assert (await client.get(f"/session/{fid}/budget")).json()["sessionId"] == fid
        # closing the fork leaves the parent
        assert (await client.delete(f"/session/{fid}")).status_code in (200, 204)
        assert (await client.get(f"/session/{pid}/budget")).status_code == 200


async def test_an_agent_that_cannot_fork_answers_501(legacy_url: str) -> None:
    async with httpx.AsyncClient(base_url=legacy_url, headers=AUTH, timeout=30) as client:
        sid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        refused = await client.post(f"/session/{sid}/branch", json={})
        assert refused.status_code == 501
        assert refused.json()["code"] == "not_supported_by_agent"


# -- inheritance: an agent whose fork starts in its default mode and model -----------------

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")


def _flavor(tmp_path: Path, *extra: str) -> Any:
    ws = tmp_path / "ws"
    (ws / ".qwen").mkdir(parents=True)
    servers = {
        name: {"command": sys.executable, "args": [MCP_SERVER, "--name", name]}
        for name in ("alpha", "beta")
    }
    (ws / ".qwen" / "settings.json").write_text(json.dumps({"mcpServers": servers}))
    store = ws / ".agent-sessions"  # under the file sandbox an agent writes its workspace
    store.mkdir()
    agent = shlex.join(
        [
            sys.executable,
            str(ROOT / "tests" / "support" / "flavor_agent.py"),
            "claude",
            f"--fork={store}",
            *extra,
        ]
    )
    return spawn_daemon(["--agent", agent], workspace=ws, env={"QWEN_SERVER_TOKEN": TOKEN})


@pytest.fixture
def flavor_daemon(tmp_path: Path) -> Any:
    """The claude flavor with ``--fork`` (claude-agent-acp's fork: default mode and model,
    its sessions in files, so a fork on another process finds its parent), and two stdio MCP
    servers configured for the workspace."""
    d = _flavor(tmp_path)
    try:
        yield d
    finally:
        d.stop()


async def said(client: httpx.AsyncClient, sid: str, words: str) -> str:
    """The agent's reply text to one prompt (read from the session's stream)."""
    r = await client.post(
        f"/session/{sid}/prompt", json=text(words), headers={"Prefer": "respond-async"}
    )
    assert r.status_code == 202, r.text
    prompt_id = r.json()["promptId"]
    with trio.fail_after(30):
        async with client.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            events = await collect_until(
                stream,
                lambda e: (
                    e["type"] in ("turn_complete", "turn_error") and e.get("promptId") == prompt_id
                ),
            )
    assert events[-1]["type"] == "turn_complete", events[-1]
    return "".join(
        (e["data"]["update"].get("content") or {}).get("text", "")
        for e in events
        if e["type"] == "session_update"
        and e.get("promptId") == prompt_id
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
    )


async def test_a_fork_inherits_model_mode_and_mcp_servers_the_agent_does_not_carry_over(
    flavor_daemon: Any,
) -> None:
    async with httpx.AsyncClient(base_url=flavor_daemon.url, headers=AUTH, timeout=30) as client:
        pid = (await client.post("/session", json={"sessionScope": "thread"})).json()["sessionId"]
        r = await client.post(f"/session/{pid}/approval-mode", json={"mode": "plan"})
        assert r.status_code == 200, r.text
        r = await client.post(f"/session/{pid}/model", json={"modelId": "claude-haiku"})
        assert r.status_code == 200, r.text
        parent = json.loads(await said(client, pid, "setup"))
        assert parent["via"] == "session/new"
        assert sorted(parent["mcpServers"]) == ["alpha", "beta"]

        forked = await client.post(f"/session/{pid}/branch", json={})
        assert forked.status_code == 201, forked.text
        body = forked.json()
        fid = body["sessionId"]
        assert body["inherited"] == {"model": "claude-haiku", "mode": "plan"}
        assert body["state"]["modes"]["currentModeId"] == "plan"
        model = next(o for o in body["state"]["configOptions"] if o["id"] == "model")
        assert model["currentValue"] == "claude-haiku"

        # The daemon's view of the fork ...
        context = (await client.get(f"/session/{fid}/context")).json()
        assert context["state"]["modes"]["currentModeId"] == "plan"
        assert context["state"]["models"]["currentModelId"] == "claude-haiku"
        # ... and the agent's own: it was forked from the parent, started in its default mode
        # and model, and was switched to the parent's; the same MCP servers reached it.
        child = json.loads(await said(client, fid, "setup"))
        assert child == {
            "via": "session/fork",
            "parent": pid,
            "mcpServers": parent["mcpServers"],
            "mode": "plan",
            "model": "claude-haiku",
        }
        # The parent kept its own settings.
        assert json.loads(await said(client, pid, "setup"))["mode"] == "plan"


async def test_capabilities_and_context_say_which_agent_can_fork(
    daemon_url: str, legacy_url: str
) -> None:
    """Known from the pool's warm child before any session exists; per session in /context."""
    for url, can in ((daemon_url, True), (legacy_url, False)):
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as client:
            with trio.fail_after(30):  # the warm spare's initialize (a guard, not a timing)
                while True:
                    agents = (await client.get("/capabilities")).json()["agents"]
                    if agents[0]["agentInfo"] is not None:
                        break
                    await trio.sleep(0.05)
            assert agents[0]["agentInfo"]["name"] == "acp-scripted"
            via = "session/fork" if can else None
            assert agents[0]["fork"] == {"supported": can, "via": via}
            sid = (await client.post("/session", json={"sessionScope": "thread"})).json()[
                "sessionId"
            ]
            context = (await client.get(f"/session/{sid}/context")).json()
            assert context["agent"]["fork"] == {"supported": can, "via": via}


def test_an_agent_without_agent_info_that_cannot_fork_answers_501(tmp_path: Path) -> None:
    """An agent that names itself nowhere (no ``agentInfo``, as the ACP SDK's echo example)
    and has no fork: the branch is tried on it and refused with 501, not 503."""
    no_method = {"code": -32601, "message": "Method not found"}
    config = {
        "respond": {
            "initialize": {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}},
            "session/new": {"sessionId": "puppet-1"},
        },
        "errors": {"qwen/control/session/branch": no_method},
    }
    (tmp_path / "puppet.json").write_text(json.dumps(config))
    puppet = ROOT / "tests" / "acp" / "puppet_agent.py"
    ws = tmp_path / "ws"  # the agent writes its log where the file sandbox lets it
    ws.mkdir()
    agent = shlex.join(
        [sys.executable, str(puppet), str(tmp_path / "puppet.json"), str(ws / "log.jsonl")]
    )
    d = spawn_daemon(["--agent", agent], workspace=ws, env={"QWEN_SERVER_TOKEN": TOKEN})
    try:
        with httpx.Client(base_url=d.url, headers=AUTH, timeout=30) as client:
            made = client.post("/session", json={"sessionScope": "thread"})
            assert made.status_code == 200, made.text
            sid = made.json()["sessionId"]
            context = client.get(f"/session/{sid}/context").json()
            assert context["agent"] == {
                "agentInfo": None,
                "fork": {"supported": False, "via": None},
            }
            refused = client.post(f"/session/{sid}/branch", json={})
            assert refused.status_code == 501, refused.text
            assert refused.json()["code"] == "not_supported_by_agent"
    finally:
        d.stop()


async def test_a_parent_that_let_its_agent_go_still_forks(tmp_path: Path) -> None:
    """A parent released while idle (``--agent-idle-release-ms``) has no agent bound: the
    fork is still native (the daemon knows the workspace's agent from its pool) and opens on
    an agent of its own."""
    d = spawn_daemon(
        ["--agent-idle-release-ms", "300", "--warm-agents", "0"],
        env={"QWEN_SERVER_TOKEN": TOKEN},
    )
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            pid = made.json()["sessionId"]
            assert (await client.post(f"/session/{pid}/prompt", json=text("hi"))).status_code == 200
            with trio.fail_after(30):
                async with client.stream(
                    "GET", f"/session/{pid}/events", headers={"Last-Event-ID": "0"}
                ) as stream:
                    await collect_until(stream, lambda e: e["type"] == "agent_released")
            forked = await client.post(f"/session/{pid}/branch", json={})
            assert forked.status_code == 201, forked.text
            assert forked.json()["via"] == "session/fork"
            fid = forked.json()["sessionId"]
            assert (await client.post(f"/session/{fid}/prompt", json=text("go"))).status_code == 200
    finally:
        d.stop()


async def test_a_fork_that_cannot_take_its_parents_mode_is_closed_and_the_call_fails(
    tmp_path: Path,
) -> None:
    d = _flavor(tmp_path, "--fork-frozen")
    try:
        async with httpx.AsyncClient(base_url=d.url, headers=AUTH, timeout=30) as client:
            made = await client.post("/session", json={"sessionScope": "thread"})
            pid = made.json()["sessionId"]
            r = await client.post(f"/session/{pid}/approval-mode", json={"mode": "plan"})
            assert r.status_code == 200, r.text
            refused = await client.post(f"/session/{pid}/branch", json={})
            assert refused.status_code == 400, refused.text
            body = refused.json()
            assert body["code"] == "fork_inheritance_failed"
            assert (body["setting"], body["value"]) == ("mode", "plan")
            assert "this fork keeps its mode" in body["error"]
            # No fork is left behind; the parent is untouched.
            deep = (await client.get("/health", params={"deep": "1"})).json()
            assert deep["sessions"] == 1
            context = (await client.get(f"/session/{pid}/context")).json()
            assert context["state"]["modes"]["currentModeId"] == "plan"
    finally:
        d.stop()
