"""Tenants that cannot see each other, even through their agents (serve/isolation/tenants.py,
the pool's tenant keying in serve/agents/slots.py), end to end: a real daemon on the real
kernel under the default sandbox (``--agent-sandbox auto``), two JWT users (a JWKS *file*),
the scripted agent's shell steps run by each user's own agent.

Each user's agent tries to read and write the other user's HOME, agent store and temp
directory, and the files the daemon trusts (the tokens file, the JWKS file, the config file,
the audit log, the token file: all under the operator's HOME, where operators put them):
every attempt is refused, and each user's own agent still writes its workspace, keeps its
sessions across a daemon restart and loads them. Packed sessions of two users in one
workspace are in different children; one user's sessions share one.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from acp import landlock
from serve.isolation.tenants import TENANTS_SUBDIR, dir_name
from tests.access.test_multi_user import AUD, ISS, Jwks, bearer
from tests.serve.test_effects import of_type, said, turn
from tests.support.daemon import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")

TOKEN = "operator-token-0123456789"
OP = bearer(TOKEN)
CAROL_TOKEN = "carol-scoped-token-abcdef"


class Layout:
    """The operator's HOME holds the state directory and every file the daemon trusts."""

    def __init__(self, root: Path, jwks: Jwks) -> None:
        self.root = root
        self.home = root / "home"
        conf = self.home / ".config" / "acp-serve"
        self.state = self.home / ".local" / "state" / "acp-serve"
        self.ws = root / "ws"
        for d in (conf, self.state, self.ws, self.home / ".local" / "share"):
            d.mkdir(parents=True, exist_ok=True)
        self.tokens = conf / "tokens.jsonl"
        digest = hashlib.sha256(CAROL_TOKEN.encode()).hexdigest()
        self.tokens.write_text(json.dumps({"id": "c1", "sha256": digest, "principal": "carol"}))
        self.jwks = conf / "jwks.json"
        self.jwks.write_text(json.dumps(jwks.document()))
        self.config = conf / "config.yaml"
        self.config.write_text("{}\n")
        self.token_file = conf / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.audit = self.home / ".local" / "share" / "acp-serve-audit.jsonl"
        self.audit.write_text("")
        # The operator's agent set-up, copied into each tenant's HOME.
        (self.home / ".qwen").mkdir()
        (self.home / ".qwen" / "settings.json").write_text('{"seeded": true}\n')

    def trusted(self) -> dict[str, Path]:
        return {
            "tokens": self.tokens,
            "jwks": self.jwks,
            "config": self.config,
            "token_file": self.token_file,
            "audit": self.audit,
        }

    def args(self, *extra: str) -> list[str]:
        return [
            "--auth-jwks-file",
            str(self.jwks),
            "--auth-issuer",
            ISS,
            "--auth-audience",
            AUD,
            "--auth-algorithms",
            "RS256",
            "--auth-tokens-file",
            str(self.tokens),
            "--audit-log",
            str(self.audit),
            "--config",
            str(self.config),
            "--token-file",
            str(self.token_file),
            "--agent-sandbox",
            "auto",
            *extra,
        ]

    def spawn(self, *extra: str) -> DaemonProcess:
        return spawn_daemon(
            self.args(*extra),
            workspace=self.ws,
            state_dir=self.state,
            env={"HOME": str(self.home)},
        )


@pytest.fixture(scope="module")
def jwks() -> Iterator[Jwks]:
    server = Jwks()
    yield server
    server.server.shutdown()


@pytest.fixture
def layout(tmp_path: Path, jwks: Jwks) -> Layout:
    return Layout(tmp_path, jwks)


@pytest.fixture
def daemon(layout: Layout) -> Iterator[DaemonProcess]:
    d = layout.spawn()
    yield d
    d.stop()


class User:
    def __init__(self, name: str, client: httpx.AsyncClient) -> None:
        self.name = name
        self.client = client
        self.sid = ""
        self.cid = ""

    async def open(self) -> None:
        r = await self.client.post("/session", json={"sessionScope": "thread"})
        assert r.status_code == 200, r.text
        self.sid, self.cid = r.json()["sessionId"], r.json()["clientId"]
        r = await self.client.post(f"/session/{self.sid}/approval-mode", json={"mode": "yolo"})
        assert r.status_code == 200, r.text

    async def say(self, text: str) -> list[dict[str, Any]]:
        events = await turn(
            self.client, self.sid, text, client_id=self.cid, on_permission=_vote(self)
        )
        assert events[-1]["type"] == "turn_complete", events[-1]
        return events

    async def shell(self, ws: Path, script: str) -> str:
        """Run ``script`` through the agent's shell step (a terminal of the agent, in its
        sandbox); the command the effect gate sees names only a file of the workspace."""
        name = f"probe-{self.name}-{secrets.token_hex(4)}.sh"
        (ws / name).write_text(script)
        events = await self.say(f"[shell sh {name}]")
        assert of_type(events, "effect_denied") == [], events
        return said(events)


@pytest.fixture
async def users(daemon: DaemonProcess, jwks: Jwks) -> AsyncIterator[tuple[User, User]]:
    async with (
        httpx.AsyncClient(
            base_url=daemon.url, headers=bearer(jwks.token("alice")), timeout=60
        ) as a,
        httpx.AsyncClient(base_url=daemon.url, headers=bearer(jwks.token("bob")), timeout=60) as b,
    ):
        yield User("alice", a), User("bob", b)


def _vote(user: User) -> Any:
    """Allow what the user's own agent asks (the gate asks for a workspace script)."""

    async def vote(request: dict[str, Any]) -> None:
        r = await user.client.post(
            f"/session/{user.sid}/permission/{request['requestId']}",
            json={"outcome": {"outcome": "selected", "optionId": "allow_once"}},
        )
        assert r.status_code == 200, r.text

    return vote


SELF_PROBE = """\
echo "{name}-own-home" > "$HOME/marker" && h=ok || h=denied
echo "{name}-own-tmp" > "$TMPDIR/marker" && t=ok || t=denied
touch ./{name}-was-here && w=ok || w=denied
ls "$ACP_SCRIPTED_STATE_DIR" >/dev/null && s=ok || s=denied
grep -q seeded "$HOME/.qwen/settings.json" && seed=ok || seed=missing
echo "home=$h tmp=$t ws=$w store=$s seed=$seed"
echo "HOME=$HOME TMPDIR=$TMPDIR STORE=$ACP_SCRIPTED_STATE_DIR"
"""

ATTACK_HEAD = """\
try() {{ n=$1; shift; if "$@" >/dev/null 2>&1; then echo "$n=ok"; else echo "$n=denied"; fi; }}
"""


def _attack(victim: dict[str, str], trusted: dict[str, Path], state: Path) -> str:
    lines = [ATTACK_HEAD.format()]
    for place in ("HOME", "TMPDIR", "STORE"):
        path = victim[place]
        lines.append(f'try list_{place} ls "{path}"')
        lines.append(f'try write_{place} touch "{path}/planted"')
    lines.append(f'try read_HOME cat "{victim["HOME"]}/marker"')
    lines.append(f'try read_TMPDIR cat "{victim["TMPDIR"]}/marker"')
    lines.append(f'try grep_STORE grep -rq "{victim["secret"]}" "{victim["STORE"]}"')
    lines.append(f'try grep_state grep -rq "{victim["secret"]}" "{state}"')
    for name, path in trusted.items():
        lines.append(f'try read_{name} cat "{path}"')
        lines.append(f"try write_{name} sh -c 'echo forged >> \"{path}\"'")
    lines.append(f"try env_token sh -c 'env | grep -q {TOKEN}'")  # none in its environment
    return "\n".join(lines) + "\n"


#: The attempts of :func:`_attack`: 3 places x (list, write), 2 reads, 2 greps, 5 files x
#: (read, write), the environment.
ATTEMPTS = 6 + 2 + 2 + 10 + 1


def _fields(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


async def test_each_users_agent_is_refused_the_others_places_and_the_daemons_files(
    daemon: DaemonProcess, layout: Layout, users: tuple[User, User]
) -> None:
    alice, bob = users
    seen: dict[str, dict[str, str]] = {}
    for user in users:
        await user.open()
        secret = f"{user.name}-secret-{secrets.token_hex(4)}"
        await user.say(f"remember {secret}")  # into the user's agent store
        own = _fields(await user.shell(layout.ws, SELF_PROBE.format(name=user.name)))
        # Its own places work: HOME, temp, store, the workspace; the operator's set-up seeded.
        assert (own["home"], own["tmp"], own["ws"], own["store"]) == ("ok",) * 4, own
        assert own["seed"] == "ok", own
        assert (layout.ws / f"{user.name}-was-here").exists()
        tenant = layout.state / TENANTS_SUBDIR / dir_name(user.name)
        assert Path(own["HOME"]) == (tenant / "home").resolve(), own
        assert Path(own["STORE"]) == (tenant / "scripted").resolve(), own
        seen[user.name] = {**own, "secret": secret}
    assert seen["alice"]["TMPDIR"] != seen["bob"]["TMPDIR"]
    before = {name: path.read_bytes() for name, path in layout.trusted().items()}

    for attacker, victim in ((bob, "alice"), (alice, "bob")):
        script = _attack(seen[victim], layout.trusted(), layout.state)
        result = _fields(await attacker.shell(layout.ws, script))
        assert len(result) == ATTEMPTS and set(result.values()) == {"denied"}, result

    # Nothing was planted or forged; the daemon's files are as they were.
    for victim in seen.values():
        for place in ("HOME", "TMPDIR", "STORE"):
            assert not (Path(victim[place]) / "planted").exists()
    after = {name: path.read_bytes() for name, path in layout.trusted().items() if name != "audit"}
    assert after == {k: v for k, v in before.items() if k != "audit"}
    assert b"forged" not in layout.audit.read_bytes()
    # The operator's token was read from the file: it still works (and is no agent's).
    async with httpx.AsyncClient(base_url=daemon.url, headers=OP, timeout=30) as op:
        r = await op.get("/daemon/audit?limit=1")
        assert r.status_code == 200, r.text


async def test_each_user_keeps_their_sessions_across_a_restart(layout: Layout, jwks: Jwks) -> None:
    d = layout.spawn()
    words = {}
    try:
        async with (
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("alice")), timeout=60) as a,
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("bob")), timeout=60) as b,
        ):
            users = User("alice", a), User("bob", b)
            for user in users:
                await user.open()
                words[user.name] = f"{user.name}-words-{secrets.token_hex(4)}"
                await user.say(words[user.name])
            sids = {u.name: u.sid for u in users}
    finally:
        d.stop()

    d = layout.spawn()
    try:
        async with (
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("alice")), timeout=60) as a,
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("bob")), timeout=60) as b,
        ):
            # The other's session is not there for them.
            r = await b.post(f"/session/{sids['alice']}/load", json={})
            assert r.status_code == 404, r.text
            for name, client in (("alice", a), ("bob", b)):
                r = await client.post(f"/session/{sids[name]}/load", json={})
                assert r.status_code == 200, r.text
                user = User(name, client)
                user.sid, user.cid = sids[name], r.json()["clientId"]
                # The next prompt binds an agent: the user's own, whose store holds the
                # session (session/resume), and it answers.
                events = await user.say("again")
                assert "again" in said(events), events
                assert of_type(events, "session_died") == []
    finally:
        d.stop()
    for name, word in words.items():
        store = layout.state / TENANTS_SUBDIR / dir_name(name) / "scripted"
        found = [p for p in store.rglob("*") if p.is_file() and word.encode() in p.read_bytes()]
        assert found, (name, sorted(store.rglob("*")))
        other = next(n for n in words if n != name)
        other_store = layout.state / TENANTS_SUBDIR / dir_name(other) / "scripted"
        assert not [
            p for p in other_store.rglob("*") if p.is_file() and word.encode() in p.read_bytes()
        ]


async def test_packed_sessions_of_two_users_are_in_different_children(
    layout: Layout, jwks: Jwks
) -> None:
    d = layout.spawn("--sessions-per-agent", "4")
    try:
        async with (
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("alice")), timeout=60) as a,
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("bob")), timeout=60) as b,
            httpx.AsyncClient(base_url=d.url, headers=OP, timeout=60) as op,
        ):
            owners: dict[str, str] = {}
            for name, client in (("alice", a), ("bob", b), ("alice", a), ("bob", b)):
                r = await client.post("/session", json={"sessionScope": "thread"})
                assert r.status_code == 200, r.text
                owners[r.json()["sessionId"]] = name
            r = await op.get("/daemon/status", params={"detail": "full"})
            assert r.status_code == 200, r.text
            pids: dict[str, set[int]] = {"alice": set(), "bob": set()}
            for s in r.json()["full"]["sessions"]:
                if s["sessionId"] in owners:
                    assert s["agentPid"] is not None, s
                    pids[owners[s["sessionId"]]].add(s["agentPid"])
            # One user's sessions share a child; the two users never do.
            assert len(pids["alice"]) == 1 and len(pids["bob"]) == 1, pids
            assert pids["alice"] != pids["bob"]
    finally:
        d.stop()


# -- units: safe names, the token file ------------------------------------------------------


@pytest.mark.parametrize(
    "principal", ["../x", "..", ".", "group:eng", "a/b/../../c", "x" * 4096, "ü", "", "-"]
)
def test_a_principal_id_maps_to_one_safe_directory_name(principal: str, tmp_path: Path) -> None:
    name = dir_name(principal)
    assert "/" not in name and name not in (".", "..") and not name.startswith(".")
    assert len(name) <= 64
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()
    assert name != dir_name(principal + "x")  # distinct ids, distinct places


def test_names_that_escape_to_the_same_text_still_differ() -> None:
    assert dir_name("group:eng") != dir_name("group_eng")
    assert dir_name("a/b") != dir_name("a_b")


def test_the_token_file_gives_the_token_and_never_counts_as_argv(tmp_path: Path) -> None:
    from serve.settings import SettingsError, parse_settings  # (as tests/serve/test_settings)

    path = tmp_path / "token"
    path.write_text("  from-the-file-0123456789  \nignored\n")
    base = ["--workspace", str(tmp_path), "--state-dir", str(tmp_path / "s")]
    s = parse_settings([*base, "--token-file", str(path)], {"HOME": str(tmp_path)})
    assert s.token == "from-the-file-0123456789"
    assert s.token_from_argv is False and s.token_file == str(path)
    with pytest.raises(SettingsError, match="not both"):
        parse_settings(
            [*base, "--token-file", str(path), "--token", "x" * 20], {"HOME": str(tmp_path)}
        )
    with pytest.raises(SettingsError, match="--token-file"):
        parse_settings([*base, "--token-file", str(tmp_path / "missing")], {"HOME": str(tmp_path)})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="holds no token"):
        parse_settings([*base, "--token-file", str(tmp_path / "empty")], {"HOME": str(tmp_path)})
    assert (
        parse_settings([*base, "--token", "y" * 20], {"HOME": str(tmp_path)}).token_from_argv
        is True
    )


async def test_a_fork_of_another_principals_session_is_refused_not_a_500(
    layout: Layout, jwks: Jwks
) -> None:
    d = layout.spawn()
    try:
        async with (
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("alice")), timeout=60) as a,
            httpx.AsyncClient(base_url=d.url, headers=bearer(jwks.token("bob")), timeout=60) as b,
        ):
            r = await a.post("/session", json={"sessionScope": "thread"})
            sid = r.json()["sessionId"]
            r = await a.put(f"/session/{sid}/members", json={"members": {"bob": "collaborator"}})
            assert r.status_code == 200, r.text
            # Bob may prompt it (a collaborator), but his fork would run in his own agent,
            # whose store does not hold Alice's conversation.
            r = await b.post(f"/session/{sid}/branch", json={})
            assert r.status_code == 400, r.text
            assert r.json()["code"] == "fork_across_principals" and r.json()["sessionId"] == sid
            r = await a.post(f"/session/{sid}/branch", json={})
            assert r.status_code == 201, r.text
    finally:
        d.stop()


def _auth_settings(tmp_path: Path) -> Any:
    from serve.settings import parse_settings  # (as tests/serve/test_settings)

    for name in ("tokens.jsonl", "c.pem", "k.pem"):
        (tmp_path / name).write_text("")
    tokens = tmp_path / "tokens.jsonl"
    argv = ["--workspace", str(tmp_path), "--state-dir", str(tmp_path / "state")]
    argv += ["--auth-tokens-file", str(tokens), "--tls-cert", str(tmp_path / "c.pem")]
    argv += ["--tls-key", str(tmp_path / "k.pem")]
    return parse_settings(argv, {"HOME": str(tmp_path), "QWEN_SERVER_TOKEN": TOKEN})


def test_a_principals_home_gets_a_copy_of_the_operators_setup_kept_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from serve.isolation.tenants import places

    operator = tmp_path / "op-home"
    (operator / ".qwen").mkdir(parents=True)
    creds = operator / ".qwen" / "oauth_creds.json"
    creds.write_text("v1")
    monkeypatch.setenv("HOME", str(operator))
    settings = _auth_settings(tmp_path)
    box = places(settings, "../x")
    assert box is not None
    copy = Path(box.home) / ".qwen" / "oauth_creds.json"
    assert copy.read_text() == "v1" and not copy.is_symlink()
    assert (copy.stat().st_mode & 0o777) == 0o600
    assert Path(box.root).parent == (tmp_path / "state" / TENANTS_SUBDIR).resolve()
    # A rotated credential reaches the principal at its next spawn...
    creds.write_text("v2")
    os.utime(creds, (copy.stat().st_mtime + 10, copy.stat().st_mtime + 10))
    places(settings, "../x")
    assert copy.read_text() == "v2"
    # ...and the agent's own refresh of its copy (newer) is not overwritten.
    copy.write_text("refreshed by the agent")
    os.utime(copy, (creds.stat().st_mtime + 10, creds.stat().st_mtime + 10))
    places(settings, "../x")
    assert copy.read_text() == "refreshed by the agent"
    assert creds.read_text() == "v2"  # the operator's file is never written


def test_variables_into_the_operators_home_are_rerooted(tmp_path: Path) -> None:
    from serve.isolation.tenants import Places, tenant_env

    box = Places("alice", "/s/t", "/s/t/home", "/s/t/scripted")
    env = {
        "HOME": "/home/op",
        "XDG_CONFIG_HOME": "/home/op/.config",
        "XDG_CACHE_HOME": "/var/cache/x",
        "CODEX_HOME": "/home/op/.codex",
        "CLAUDE_CONFIG_DIR": "/etc/claude",
        "PATH": "/usr/bin",
    }
    out = tenant_env(env, box)
    assert out["HOME"] == "/s/t/home"
    assert out["XDG_CONFIG_HOME"] == "/s/t/home/.config"
    assert out["CODEX_HOME"] == "/s/t/home/.codex"
    assert "XDG_CACHE_HOME" not in out  # elsewhere: the agent's default under its HOME
    assert out["CLAUDE_CONFIG_DIR"] == "/etc/claude" and out["PATH"] == "/usr/bin"


def test_the_trusted_files_are_every_file_the_daemon_trusts(tmp_path: Path) -> None:
    from serve.isolation.tenants import trusted_files

    found = set(trusted_files(_auth_settings(tmp_path)))
    audit = tmp_path / "state" / "audit.jsonl"
    expected = {tmp_path / "tokens.jsonl", tmp_path / "c.pem", tmp_path / "k.pem", audit}
    expected |= {Path(f"{audit}.{n}") for n in (1, 2, 3)}
    assert {Path(p) for p in found} == expected
