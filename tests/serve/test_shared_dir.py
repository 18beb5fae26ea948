"""``--shared-dir DIR``: the agents' places live in a directory all daemons of a cluster share
(serve/isolation/tenants.py), so a session whose agent kept its conversation on one daemon is
continued by the agent another daemon starts for it.

End to end: two real daemons with their own state directories, one PostgreSQL journal (the
files journal is one daemon's), one workspace and one shared directory; the built-in scripted
agent keeps its sessions in its store (``session/resume`` restores from it). Units: the
flag's validation and where the places go (the default unchanged).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from serve.isolation import sandbox, tenants
from serve.sessions.agent_link import agent_env
from serve.settings import Settings, SettingsError, parse_settings
from tests.conftest import AUTH, TOKEN
from tests.serve.test_effects import of_type, said, turn
from tests.support.daemon import spawn_daemon


def holding(root: Path, word: str) -> list[Path]:
    """The files under ``root`` whose bytes hold ``word``."""
    if not root.exists():
        return []
    return [p for p in root.rglob("*") if p.is_file() and word.encode() in p.read_bytes()]


async def test_a_conversation_kept_on_one_daemon_is_continued_by_the_agent_of_another(
    tmp_path: Path, pg_url: str
) -> None:
    shared, ws = tmp_path / "shared", tmp_path / "ws"
    shared.mkdir()
    ws.mkdir()
    args = ["--journal-url", pg_url, "--shared-dir", str(shared)]
    env = {"QWEN_SERVER_TOKEN": TOKEN}
    state_a, state_b = tmp_path / "state-a", tmp_path / "state-b"
    word = f"kept-on-a-{secrets.token_hex(4)}"

    a = spawn_daemon(args, workspace=ws, state_dir=state_a, env=env)
    try:
        async with httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=60) as client:
            r = await client.post("/session", json={})
            assert r.status_code == 200, r.text
            sid = r.json()["sessionId"]
            events = await turn(client, sid, word)
            assert events[-1]["type"] == "turn_complete", events[-1]
    finally:
        assert a.stop() == 0  # a clean stop: the lease is released, B may take it at once
    # The agent kept the conversation in the shared directory, not in A's state directory.
    [kept] = holding(shared / "scripted", word)
    assert holding(state_a, word) == []

    b = spawn_daemon(args, workspace=ws, state_dir=state_b, env=env)
    try:
        async with httpx.AsyncClient(base_url=b.url, headers=AUTH, timeout=60) as client:
            r = await client.post(f"/session/{sid}/load", json={})
            assert r.status_code == 200, r.text
            # The next prompt binds an agent on B, which restores the session from its
            # store (session/resume): without the shared store it would not know it
            # (404 and session_died {reason: agent_session_not_found}).
            events = await turn(client, sid, "again on b")
            assert of_type(events, "session_died") == [], events
            assert events[-1]["type"] == "turn_complete", events[-1]
            assert "again on b" in said(events)
    finally:
        assert b.stop() == 0
    # B's agent went on with A's record: one file holds both daemons' turns.
    text = kept.read_text()
    assert word in text and "again on b" in text, text
    assert holding(state_b, "again on b") == []


# -- units: the flag, where the places go ---------------------------------------------------


def _settings(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> Settings:
    (tmp_path / "ws").mkdir(exist_ok=True)
    argv = ["--workspace", str(tmp_path / "ws"), "--state-dir", str(tmp_path / "state")]
    return parse_settings([*argv, *extra], {"HOME": str(tmp_path), **(env or {})})


def test_without_the_flag_the_places_stay_under_the_state_dir(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    state = str(tmp_path / "state")
    assert settings.shared_dir is None
    assert agent_env(settings)["ACP_SCRIPTED_STATE_DIR"] == f"{state}/scripted"
    assert tenants.tenant_root(settings, "alice").startswith(f"{state}/tenants/")
    roots = sandbox.status(settings).get("roots")
    if roots is not None:  # (the sandbox is in force on this kernel)
        assert f"{state}/scripted" in roots["write"]
        assert roots["protected"][0] == state


def test_with_the_flag_the_places_go_under_it_and_it_is_protected(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    settings = _settings(tmp_path, "--shared-dir", str(shared))
    assert settings.shared_dir == str(shared.resolve())
    assert agent_env(settings)["ACP_SCRIPTED_STATE_DIR"] == f"{shared}/scripted"
    assert tenants.tenant_root(settings, "alice") == str(
        shared / "tenants" / tenants.dir_name("alice")
    )
    roots = sandbox.status(settings).get("roots")
    if roots is not None:
        assert f"{shared}/scripted" in roots["write"]
        assert str(shared) in roots["protected"]
        assert str(tmp_path / "state") in roots["protected"]
    # The environment variable names it as the flag does; the flag wins.
    other = tmp_path / "other"
    other.mkdir()
    from_env = _settings(tmp_path, env={"ACP_SERVE_SHARED_DIR": str(shared)})
    assert from_env.shared_dir == str(shared)
    both = _settings(tmp_path, "--shared-dir", str(other), env={"ACP_SERVE_SHARED_DIR": "/x"})
    assert both.shared_dir == str(other)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("state", "is the state directory"),
        ("state/sub", "is inside the state directory"),
        ("ws", "is the workspace"),
        ("ws/sub", "is inside the workspace"),
    ],
)
def test_a_shared_dir_that_is_one_daemons_own_or_a_workspace_is_refused(
    tmp_path: Path, where: str, message: str
) -> None:
    (tmp_path / where).mkdir(parents=True, exist_ok=True)
    with pytest.raises(SettingsError, match=message) as refused:
        _settings(tmp_path, "--shared-dir", str(tmp_path / where))
    assert "--shared-dir" in str(refused.value) and str(tmp_path / where) in str(refused.value)


def test_a_state_dir_inside_the_shared_places_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "tenants").mkdir(parents=True)
    (tmp_path / "ws").mkdir()
    argv = ["--workspace", str(tmp_path / "ws"), "--shared-dir", str(shared)]
    with pytest.raises(SettingsError, match="keeps the agents' places"):
        parse_settings([*argv, "--state-dir", str(shared / "tenants" / "s")], {"HOME": "/x"})
    # Beside them is fine (each daemon's own state directory on the shared volume).
    ok = parse_settings([*argv, "--state-dir", str(shared / "state-a")], {"HOME": "/x"})
    assert ok.shared_dir == str(shared)


def test_an_agent_grant_into_the_shared_dir_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "tenants").mkdir(parents=True)
    with pytest.raises(SettingsError, match="is inside the shared directory"):
        _settings(
            tmp_path, "--shared-dir", str(shared), "--agent-allow-write", str(shared / "tenants")
        )
    # A grant holding it is fine: the sandbox carves the shared directory out of it.
    held = _settings(tmp_path, "--shared-dir", str(shared), "--agent-allow-write", str(tmp_path))
    assert held.agent_allow_write == (str(tmp_path.resolve()),)
