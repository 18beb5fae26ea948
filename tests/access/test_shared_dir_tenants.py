"""Each principal's places under ``--shared-dir``, end to end: two real daemons (their own
state directories, one workspace, one shared directory) under the default sandbox, two JWT
users whose scripted agents' shell steps probe and attack (as tests/access/test_tenant_agents.py
does for places under the state directory).

A user's HOME and agent store are the same directories whichever daemon starts the agent (what
the agent wrote on one daemon, it reads on the other), and each user's agent is refused the
other user's places and everything else under the shared directory.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from acp import landlock
from serve.isolation.tenants import TENANTS_SUBDIR, dir_name
from tests.access.test_multi_user import Jwks, bearer
from tests.access.test_tenant_agents import ATTACK_HEAD, Layout, User, _fields
from tests.support.daemon import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")

OWN_PROBE = """\
echo "{word}" > "$HOME/marker" && h=ok || h=denied
echo "{word}" > "$ACP_SCRIPTED_STATE_DIR/marker" && s=ok || s=denied
echo "home=$h store=$s"
echo "HOME=$HOME STORE=$ACP_SCRIPTED_STATE_DIR"
"""

READ_PROBE = """\
echo "HOME=$HOME STORE=$ACP_SCRIPTED_STATE_DIR"
echo "home_marker=$(cat "$HOME/marker")"
echo "store_marker=$(cat "$ACP_SCRIPTED_STATE_DIR/marker")"
"""


def _attack(victim: dict[str, str], shared: Path) -> str:
    lines = [ATTACK_HEAD.format()]
    for place in ("HOME", "STORE"):
        path = victim[place]
        lines.append(f'try list_{place} ls "{path}"')
        lines.append(f'try write_{place} touch "{path}/planted"')
        lines.append(f'try read_{place} cat "{path}/marker"')
    lines.append(f'try grep_STORE grep -rq "{victim["secret"]}" "{victim["STORE"]}"')
    # The shared directory itself: its listing, the tenants' folder, its other contents.
    lines.append(f'try list_shared ls "{shared}"')
    lines.append(f'try list_tenants ls "{shared / TENANTS_SUBDIR}"')
    lines.append(f'try grep_shared grep -rq "{victim["secret"]}" "{shared}"')
    lines.append(f'try write_shared touch "{shared}/planted"')
    lines.append(f'try read_other cat "{shared}/operator-notes"')
    lines.append(f'try make_scripted mkdir "{shared}/scripted"')
    return "\n".join(lines) + "\n"


#: The attempts of :func:`_attack`: 2 places x (list, write, read), a grep, 6 on the shared dir.
ATTEMPTS = 6 + 1 + 6


@pytest.fixture(scope="module")
def jwks() -> Iterator[Jwks]:
    server = Jwks()
    yield server
    server.server.shutdown()


class Cluster:
    """Two daemons of one cluster: the operator's HOME holds their state directories."""

    def __init__(self, root: Path, jwks: Jwks) -> None:
        self.layout = Layout(root, jwks)
        self.shared = root / "shared"
        self.shared.mkdir()
        (self.shared / "operator-notes").write_text("not for agents\n")
        self.daemons: list[DaemonProcess] = []

    def spawn(self, name: str) -> DaemonProcess:
        state = self.layout.home / ".local" / "state" / f"acp-serve-{name}"
        d = spawn_daemon(
            self.layout.args("--shared-dir", str(self.shared)),
            workspace=self.layout.ws,
            state_dir=state,
            env={"HOME": str(self.layout.home)},
        )
        self.daemons.append(d)
        return d


@pytest.fixture
def cluster(tmp_path: Path, jwks: Jwks) -> Iterator[Cluster]:
    c = Cluster(tmp_path, jwks)
    try:
        yield c
    finally:
        for d in c.daemons:
            d.stop()


@pytest.fixture
async def clients(cluster: Cluster, jwks: Jwks) -> AsyncIterator[dict[str, User]]:
    a, b = cluster.spawn("a"), cluster.spawn("b")
    async with (
        httpx.AsyncClient(base_url=a.url, headers=bearer(jwks.token("alice")), timeout=60) as aa,
        httpx.AsyncClient(base_url=b.url, headers=bearer(jwks.token("alice")), timeout=60) as ab,
        httpx.AsyncClient(base_url=b.url, headers=bearer(jwks.token("bob")), timeout=60) as bb,
        httpx.AsyncClient(base_url=a.url, headers=bearer(jwks.token("bob")), timeout=60) as ba,
    ):
        yield {
            "alice@a": User("alice", aa),
            "alice@b": User("alice", ab),
            "bob@b": User("bob", bb),
            "bob@a": User("bob", ba),
        }


async def test_a_principals_places_are_one_on_every_daemon_and_no_one_elses(
    cluster: Cluster, clients: dict[str, User]
) -> None:
    ws, shared = cluster.layout.ws, cluster.shared
    seen: dict[str, dict[str, str]] = {}
    for key in ("alice@a", "bob@b"):  # each user's agent on one daemon writes its places
        user = clients[key]
        await user.open()
        secret = f"{user.name}-secret-{secrets.token_hex(4)}"
        await user.say(f"remember {secret}")  # into the user's agent store
        word = f"{user.name}-wrote-{secrets.token_hex(4)}"
        own = _fields(await user.shell(ws, OWN_PROBE.format(word=word)))
        assert (own["home"], own["store"]) == ("ok", "ok"), own
        tenant = (shared / TENANTS_SUBDIR / dir_name(user.name)).resolve()
        assert Path(own["HOME"]) == tenant / "home", own
        assert Path(own["STORE"]) == tenant / "scripted", own
        seen[user.name] = {**own, "secret": secret, "word": word}

    # The same user's agent on the other daemon has the same places, with what was written.
    for key in ("alice@b", "bob@a"):
        user = clients[key]
        await user.open()
        there = _fields(await user.shell(ws, READ_PROBE))
        mine = seen[user.name]
        assert (there["HOME"], there["STORE"]) == (mine["HOME"], mine["STORE"]), there
        assert there["home_marker"] == there["store_marker"] == mine["word"], there

    # Neither the other user's places nor the rest of the shared directory, from either daemon.
    for attacker, victim in (("bob@b", "alice"), ("bob@a", "alice"), ("alice@a", "bob")):
        result = _fields(await clients[attacker].shell(ws, _attack(seen[victim], shared)))
        assert len(result) == ATTEMPTS and set(result.values()) == {"denied"}, (attacker, result)
    for victim in seen.values():
        for place in ("HOME", "STORE"):
            assert not (Path(victim[place]) / "planted").exists()
    assert not (shared / "planted").exists() and not (shared / "scripted").exists()
    # Each daemon's state directory holds no principal's places.
    for d in cluster.daemons:
        assert not (d.state_dir / TENANTS_SUBDIR).exists(), d.state_dir
