"""Per-principal uids (serve/isolation/identity.py): the pure map, the flag, and real agent
children run as a principal's uid through the daemon's spawn point (``spawn_limited``)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from acp.handler import BaseClientHandler
from serve.isolation import identity, pidns
from serve.sessions.agent_link import spawn_limited
from serve.settings import Settings, SettingsError, parse_settings

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (setresuid)")


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory outside pytest's base temp: pytest chmods that base to 0700 when it finds
    group bits, and an ACL's mask shows as group bits, so a concurrent pytest run would take
    the uid's search right on it away from under a running test."""
    path = Path(tempfile.mkdtemp(prefix="acp-uids-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_principal_maps_to_one_stable_uid_in_the_range() -> None:
    uids = {p: identity.uid_for(p, 3_000_000, 1000) for p in ("alice", "bob", "carol")}
    assert all(3_000_000 <= u < 3_001_000 for u in uids.values())
    assert identity.uid_for("alice", 3_000_000, 1000) == uids["alice"]  # pure
    assert len(set(uids.values())) == 3
    assert identity.uid_for("alice", 5_000_000, 1) == 5_000_000


def test_two_principals_on_one_uid_are_refused() -> None:
    uids = identity.UidMap(4_000_000, 1)
    assert uids.run_as("alice") == identity.RunAs("alice", 4_000_000, 4_000_000)
    assert uids.run_as("alice").uid == 4_000_000  # the same principal again: fine
    with pytest.raises(identity.UidCollision, match="'alice' and 'bob' both map to uid 4000000"):
        uids.run_as("bob")


def test_the_flag(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert parse_settings(["--agent-uid-range", "off"], env).agent_uid_range is None
    assert parse_settings([], env).agent_uid_range is None  # auto, single-user: off
    tokens = tmp_path / "tokens.jsonl"
    tokens.write_text("")
    multi_env = {**env, "QWEN_SERVER_TOKEN": "operator-token-0123456789"}
    # auto in multi-user mode: on for a root daemon whose agent another uid may run (sh);
    # off for one under a 0700 directory (as the venv's interpreter under /root can be).
    sh = ["--auth-tokens-file", str(tokens), "--agent", "sh -c true"]
    multi = parse_settings(sh, multi_env).agent_uid_range
    assert multi == (identity.AUTO_RANGE if os.geteuid() == 0 else None)
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    agent = hidden / "agent"
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    closed = ["--auth-tokens-file", str(tokens), "--agent", str(agent)]
    assert parse_settings(closed, multi_env).agent_uid_range is None
    for bad, why in (
        ("100:5", "START must be at least 65536"),
        ("70000:0", "COUNT must be at least 1"),
        ("x:1", "must be off, auto or START:COUNT"),
    ):
        with pytest.raises(SettingsError, match=f'Invalid --agent-uid-range "{bad}": {why}'):
            parse_settings(["--agent-uid-range", bad], env)
    with pytest.raises(SettingsError, match='Invalid --agent-pid-namespace "maybe"'):
        parse_settings(["--agent-pid-namespace", "maybe"], env)


def _settings(tmp_path: Path, script: str, *extra: str) -> Settings:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    argv = [
        "--agent",
        shlex.join(["/bin/sh", "-c", script]),
        "--workspace",
        str(ws),
        "--state-dir",
        str(tmp_path / "state"),
        "--agent-uid-range",
        "3000000:1000",
        *extra,
    ]
    return parse_settings(argv, {"HOME": str(tmp_path)})


async def _run(settings: Settings, principal: str | None, home: Path) -> str:
    """Spawn the agent (a shell script) as ``principal``; its stderr once it exited."""
    async with trio.open_nursery() as nursery:
        conn, _limits = await spawn_limited(
            nursery,
            settings,
            None,
            cwd=settings.workspaces[0],
            handler=BaseClientHandler(),
            request_timeout_s=5,
            env={"PATH": os.defpath, "HOME": str(home)},
            tenant=principal,
        )
        with trio.fail_after(20):
            info = await conn.wait_closed()
    assert info.exit_code == 0, info
    return conn.process.stderr_tail()


@root_only
@pytest.mark.parametrize("sandbox", ["auto", "off"])
async def test_an_agent_runs_as_its_principals_uid_and_works_in_its_places(
    place: Path, sandbox: str
) -> None:
    tmp_path = place
    other = tmp_path / "other-secret"  # another uid's 0600 file
    other.write_text("bob's\n")
    os.chown(other, identity.uid_for("bob", 3_000_000, 1000), 0)
    other.chmod(0o600)
    home = tmp_path / "home-alice"
    home.mkdir()
    script = (
        "id -u >&2; echo work > mine.txt && echo WROTE >&2; "
        'echo tmp > "${TMPDIR:-/tmp}/t-$$" && echo TEMP >&2; '
        'echo cfg > "$HOME/.cfg" && echo HOME >&2; '
        f"cat {other} >&2 || echo DENIED >&2"
    )
    settings = _settings(tmp_path, script, "--agent-sandbox", sandbox)
    err = await _run(settings, "alice", home)
    alice = identity.uid_for("alice", 3_000_000, 1000)
    assert err.split()[0] == str(alice), err
    assert "WROTE" in err and "TEMP" in err and "HOME" in err, err
    assert "DENIED" in err and "bob's" not in err, err
    made = Path(settings.workspaces[0]) / "mine.txt"
    assert (made.stat().st_uid, made.stat().st_gid) == (alice, alice)
    assert (home / ".cfg").stat().st_uid == alice


@root_only
async def test_without_a_principal_nothing_changes_uid_wise(place: Path) -> None:
    tmp_path = place
    settings = _settings(tmp_path, "id -u >&2; echo x > mine.txt")
    err = await _run(settings, None, tmp_path)
    assert err.split()[0] == "0", err
    assert (Path(settings.workspaces[0]) / "mine.txt").stat().st_uid == 0


@root_only
def test_status_says_what_is_in_force(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "true")
    status = identity.status(settings)
    assert status["active"] is True
    assert status["range"] == {"start": 3_000_000, "count": 1000}
    assert pidns.status(settings)["mode"] == "auto"
