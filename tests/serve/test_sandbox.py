"""The agents' file sandbox end to end (serve/isolation/sandbox.py, acp/landlock.py): a real
daemon on the real kernel, a hostile agent (tests/serve/sandbox_hostile_agent.py) that tries the
forbidden reads and writes itself and through a terminal it starts, and the session shell."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from acp import landlock
from tests.conftest import AUTH, TOKEN
from tests.serve.test_effects import new_session, said, turn
from tests.support.daemon import DaemonProcess, running_daemon

pytestmark = pytest.mark.skipif(landlock.abi_version() < 1, reason="needs Landlock")

HOSTILE = Path(__file__).with_name("sandbox_hostile_agent.py")


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.state = self.home / ".local" / "state" / "acp-serve"  # the default, under HOME
        self.ws = root / "ws"
        self.other_ws = root / "other-ws"
        self.outside = root / "outside"
        self.targets = root / "targets.json"
        for d in (self.home / ".hostile", self.ws, self.other_ws, self.outside):
            d.mkdir(parents=True)
        (self.other_ws / "secret.py").write_text("other tenant's code\n")
        # Made before the daemon: a file created later at a carved level (the tmp dir holds
        # the other workspace) is invisible to the children (acp/landlock.py).
        self.targets.write_text("{}")


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


@pytest.fixture
def hostile_daemon(layout: Layout) -> Iterator[DaemonProcess]:
    agent = f"{sys.executable} {HOSTILE} {layout.targets}"
    with running_daemon(
        ["--agent", agent, "--workspace", str(layout.other_ws), "--agent-sandbox", "landlock"],
        workspace=layout.ws,
        state_dir=layout.state,
        env={"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(layout.home)},
    ) as d:
        yield d


@pytest.fixture
async def hclient(hostile_daemon: DaemonProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=hostile_daemon.url, timeout=60, headers=AUTH) as c:
        yield c


def _journal_file(state: Path) -> Path:
    segs = sorted((state / "journal").rglob("*.seg"))
    assert segs, "the first session has no journal segment"
    return segs[0]


async def test_a_hostile_agent_is_denied_the_daemons_files(
    hclient: httpx.AsyncClient, layout: Layout
) -> None:
    # Another session with a journal on disk.
    first, first_cid = await new_session(hclient)
    layout.targets.write_text(json.dumps({"journal": "/nonexistent"} | _targets(layout)))
    await turn(hclient, first, "warm up", client_id=first_cid, on_permission=_vote(hclient, first))
    journal = _journal_file(layout.state)
    assert journal.read_bytes()  # the daemon itself reads it fine
    layout.targets.write_text(json.dumps(_targets(layout) | {"journal": str(journal)}))

    sid, cid = await new_session(hclient)
    events = await turn(hclient, sid, "attack", client_id=cid, on_permission=_vote(hclient, sid))
    assert said(events), [(e["type"], e["data"]) for e in events]
    report = json.loads(said(events))
    direct = report["direct"]
    denied = ["list_state", "read_journal", "write_state", "write_outside"]
    denied += ["read_other_ws", "write_other_ws"]
    assert {k: direct[k] for k in denied} == dict.fromkeys(denied, "EACCES"), direct
    allowed = ["write_workspace", "write_tmpdir", "write_home", "read_etc"]
    assert {k: direct[k] for k in allowed} == dict.fromkeys(allowed, "ok"), direct

    terminal = dict(line.split("=", 1) for line in report["terminal"].split())
    assert terminal == {
        "cat_journal": "denied",
        "ls_state": "denied",
        "touch_other_ws": "denied",
        "touch_outside": "denied",
        "touch_tmpdir": "ok",
        "touch_workspace": "ok",
        "env_token": "denied",  # grep found no daemon token in the terminal's environment
    }, report["terminal"]
    # No daemon secret in the agent's environment.
    assert report["env_has_token"] is False
    assert sorted(p.name for p in layout.other_ws.iterdir()) == ["secret.py"]
    assert list(layout.outside.iterdir()) == []
    assert not list(layout.state.glob("planted-*"))
    assert (layout.ws / "from-terminal").exists()


def _targets(layout: Layout) -> dict[str, str]:
    return {
        "token": TOKEN,
        "state_dir": str(layout.state),
        "other_ws": str(layout.other_ws),
        "outside": str(layout.outside),
        "home": str(layout.home),
    }


def _vote(client: httpx.AsyncClient, sid: str) -> Any:
    async def vote(request: dict[str, Any]) -> None:
        option = next(
            o["optionId"] for o in request["options"] if o["kind"] in ("allow_once", "allow_always")
        )
        r = await client.post(
            f"/session/{sid}/permission/{request['requestId']}",
            json={"outcome": {"outcome": "selected", "optionId": option}},
        )
        assert r.status_code == 200, r.text

    return vote


async def test_each_child_has_a_private_tmpdir_removed_with_it(
    hclient: httpx.AsyncClient, layout: Layout
) -> None:
    layout.targets.write_text(json.dumps(_targets(layout) | {"journal": "/nonexistent"}))
    sid, _ = await new_session(hclient)
    r = await hclient.get("/daemon/status")
    box = r.json()["isolation"]["sandbox"]
    assert (box["mode"], box["active"], box["backend"]) == ("landlock", True, "landlock")
    assert box["landlockAbi"] == landlock.abi_version()
    assert str(layout.state) in box["roots"]["protected"]
    parent = Path(box["roots"]["tmpdirParent"])
    before = await trio.to_thread.run_sync(_private_children, parent)
    assert before
    r = await hclient.delete(f"/session/{sid}")
    assert r.status_code in (200, 204), r.text
    # The session's child is stopped and reaped: its TMPDIR goes with it.
    with trio.fail_after(20):
        while True:  # polling a directory: there is no event to wait on
            if not before <= await trio.to_thread.run_sync(_private_children, parent):
                break
            await trio.sleep(0.1)


def _private_children(parent: Path) -> set[Path]:
    assert (parent.stat().st_mode & 0o777) == 0o700
    children = set(parent.iterdir())
    assert all((c.stat().st_mode & 0o777) == 0o700 for c in children)
    return children


def test_the_session_shell_runs_in_the_sandbox(layout: Layout) -> None:
    journal = layout.state / "journal"
    with running_daemon(
        [
            "--workspace",
            str(layout.other_ws),
            "--agent-sandbox",
            "landlock",
            "--enable-session-shell",
        ],
        workspace=layout.ws,
        state_dir=layout.state,
        env={"QWEN_SERVER_TOKEN": TOKEN, "HOME": str(layout.home)},
    ) as d:
        with httpx.Client(base_url=d.url, timeout=60, headers=AUTH) as c:
            r = c.post("/session", json={"sessionScope": "thread"})
            assert r.status_code == 200, r.text
            sid = r.json()["sessionId"]
            script = (
                f"ls {journal} && echo LISTED; touch {layout.other_ws}/x && echo WROTE; "
                'touch "$TMPDIR/t" && touch ./shell-ok && echo FINE'
            )
            headers = {"X-Qwen-Client-Id": r.json()["clientId"]}
            r = c.post(f"/session/{sid}/approval-mode", json={"mode": "yolo"}, headers=headers)
            assert r.status_code == 200, r.text
            r = c.post(f"/session/{sid}/shell", json={"command": script}, headers=headers)
            assert r.status_code == 200, r.text
            out = r.json()["output"]
    assert "LISTED" not in out and "WROTE" not in out
    assert "Permission denied" in out
    assert "FINE" in out
    assert (layout.ws / "shell-ok").exists()
    assert not (layout.other_ws / "x").exists()
    assert os.path.isdir(layout.state)
