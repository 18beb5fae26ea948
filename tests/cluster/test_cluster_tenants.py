"""Two users on a cluster, as an attacker would try it: ``ben`` goes through the daemon that
does not own ``ann``'s session, before and after its owner is killed. Forwarded, the owner
refuses him as it would directly; after the kill he cannot take the session over (its
lease stays the dead owner's until ``ann`` comes), nor use her client id, before or after
she took it over. Two real daemons, one PostgreSQL journal, one --shared-dir, a tokens file."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import trio

from tests.access.test_owner_records import ANN, BEN, ENV, tokens_file
from tests.cluster.test_forwarding import daemon_id, journaled, lease
from tests.support.daemon import DaemonProcess, spawn_daemon
from tests.support.sse import collect_until


def as_user(d: DaemonProcess, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=d.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def refused(r: httpx.Response) -> None:
    assert r.status_code in (400, 404), r.text
    assert r.json()["code"] in ("session_not_found", "invalid_client_id"), r.text


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """Daemons A and B of one cluster with the users ``ann`` and ``ben`` (a tokens file)."""
    ws, shared = tmp_path / "ws", tmp_path / "shared"
    ws.mkdir()
    shared.mkdir()
    tokens = tokens_file(tmp_path)
    daemons = []
    try:
        for name in ("a", "b"):
            daemons.append(
                spawn_daemon(
                    [
                        "--journal-url",
                        pg_url,
                        "--shared-dir",
                        str(shared),
                        "--auth-tokens-file",
                        str(tokens),
                    ],
                    workspace=ws,
                    state_dir=tmp_path / f"state-{name}",
                    env=ENV,
                )
            )
        yield daemons[0], daemons[1]
    finally:
        for d in daemons:
            d.stop()


async def test_another_user_can_neither_reach_nor_take_over_a_session_through_the_cluster(
    pair: tuple[DaemonProcess, DaemonProcess], pg_url: str
) -> None:
    a, b = pair
    ws = a.workspace
    async with as_user(a, ANN) as ann_a, as_user(b, ANN) as ann_b, as_user(b, BEN) as ben_b:
        made = await ann_a.post("/session", json={"sessionScope": "thread"})
        assert made.status_code == 200, made.text
        sid, cid = made.json()["sessionId"], made.json()["clientId"]
        said = await ann_a.post(
            f"/session/{sid}/prompt",
            json={"prompt": [{"type": "text", "text": "[echo secret plans]"}]},
            headers={"X-Qwen-Client-Id": cid},
        )
        assert said.status_code == 200, said.text
        before = await trio.to_thread.run_sync(lease, pg_url, sid)
        prompt = {"prompt": [{"type": "text", "text": "[echo ben was here]"}]}

        # Forwarded to A, which refuses ben as it would directly.
        refused(await ben_b.get(f"/session/{sid}/members"))
        refused(await ben_b.post(f"/session/{sid}/prompt", json=prompt))
        refused(
            await ben_b.post(
                f"/session/{sid}/prompt", json=prompt, headers={"X-Qwen-Client-Id": cid}
            )
        )
        events = await ben_b.get(f"/session/{sid}/events")
        refused(events)
        # The cluster's list, through B: hers to her (asked of A as her), not to him.
        listed = "/workspace/" + quote(str(ws), safe="") + "/sessions?include=persisted"
        hers = (await ann_b.get(listed)).json()["sessions"]
        assert sid in [e["sessionId"] for e in hers]
        his = await ben_b.get(listed)
        assert his.status_code == 200 and sid not in [
            e["sessionId"] for e in his.json()["sessions"]
        ]

        with trio.fail_after(10):  # A's turn committed, then A is killed
            while not await trio.to_thread.run_sync(journaled, pg_url, sid, "turn_complete"):  # noqa: ASYNC110 (the database)
                await trio.sleep(0.02)
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(10)

        # Ben, through B, cannot take it over: nothing is restored, the lease stays A's.
        refused(await ben_b.post(f"/session/{sid}/prompt", json=prompt))
        refused(
            await ben_b.post(
                f"/session/{sid}/prompt", json=prompt, headers={"X-Qwen-Client-Id": cid}
            )
        )
        refused(await ben_b.post(f"/session/{sid}/load", json={}))
        assert await trio.to_thread.run_sync(lease, pg_url, sid) == before

        # Ann, through B, goes on with her own client id.
        again = await ann_b.post(
            f"/session/{sid}/prompt",
            json={"prompt": [{"type": "text", "text": "[echo still mine]"}]},
            headers={"X-Qwen-Client-Id": cid},
        )
        assert again.status_code == 200, again.text
        owner, epoch = await trio.to_thread.run_sync(lease, pg_url, sid)
        assert owner == daemon_id(b) and epoch > before[1]
        # ... and her client id is still hers alone on the new owner.
        refused(
            await ben_b.post(
                f"/session/{sid}/prompt", json=prompt, headers={"X-Qwen-Client-Id": cid}
            )
        )
        refused(await ben_b.get(f"/session/{sid}/members"))


async def test_another_users_vote_through_the_cluster_is_refused_hers_is_taken(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    """Her agent asks on A; through B, ben's vote by request id (sent on to A) and on her
    session's route (forwarded) are refused as on A itself; hers, through B, lets the
    write happen."""
    a, b = pair
    allow = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    async with as_user(a, ANN) as ann_a, as_user(b, ANN) as ann_b, as_user(b, BEN) as ben_b:
        made = (await ann_a.post("/session", json={"sessionScope": "thread"})).json()
        sid, cid = made["sessionId"], made["clientId"]
        async with ann_a.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            sent = await ann_a.post(
                f"/session/{sid}/prompt",
                json={"prompt": [{"type": "text", "text": "[write hers.txt yes]"}]},
                headers={"X-Qwen-Client-Id": cid, "Prefer": "respond-async"},
            )
            assert sent.status_code == 202, sent.text
            asked = await collect_until(stream, lambda e: e.get("type") == "permission_request")
        rid = asked[-1]["data"]["requestId"]
        his = await ben_b.post(f"/permission/{rid}", json=allow)
        assert his.status_code == 404, his.text
        refused(await ben_b.post(f"/session/{sid}/permission/{rid}", json=allow))
        assert not (a.workspace / "hers.txt").exists()
        hers = await ann_b.post(f"/permission/{rid}", json=allow, headers={"X-Qwen-Client-Id": cid})
        assert hers.status_code == 200, hers.text
        target = a.workspace / "hers.txt"
        with trio.fail_after(20):  # the allowed write lands
            while not (target.exists() and target.read_text() == "yes"):  # noqa: ASYNC110 (the agent's write)
                await trio.sleep(0.05)
