"""The control plane never waits behind the agent (issue 16 item 3), the session decides
"busy" and "last client" in its inbox (issue 15 item 2), one id has one actor (issue 16
item 7). Real daemon, real agent children: the scripted agent and
``tests/support/stubborn_agent.py`` (ignores set_model and cancel, holds a rewind)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.sessions.messages import ControlTimeout, ModelSwitchFailed, SetModel
from tests.conftest import AUTH, TOKEN
from tests.serve.test_session_lifetime import inprocess
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import collect_until

STUBBORN = Path(__file__).resolve().parents[1] / "support" / "stubborn_agent.py"
#: Bound of a wait for something the daemon or the agent does (seconds).
WAIT_S = 20


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    # In the workspace of inprocess() (tmp_path/ws): the agent's file sandbox allows it.
    path = tmp_path / "ws" / "markers"
    path.mkdir(parents=True)
    return path


def stubborn(markers: Path, *args: str) -> Iterator[DaemonProcess]:
    agent = f"{sys.executable} {STUBBORN} {markers}"
    # The markers are the workspace: the agent's file sandbox lets it write there.
    return running_daemon(
        ["--agent", agent, *args], workspace=markers, env={"QWEN_SERVER_TOKEN": TOKEN}
    )


async def new_session(client: httpx.AsyncClient, scope: str = "thread") -> tuple[str, str]:
    r = await client.post("/session", json={"sessionScope": scope})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def submit(client: httpx.AsyncClient, sid: str, text: str) -> str:
    r = await client.post(
        f"/session/{sid}/prompt",
        json={"prompt": [{"type": "text", "text": text}]},
        headers={"Prefer": "respond-async"},
    )
    assert r.status_code == 202, r.text
    return str(r.json()["promptId"])


async def pending_states(client: httpx.AsyncClient, sid: str) -> list[str]:
    r = await client.get(f"/session/{sid}/pending-prompts")
    assert r.status_code == 200, r.text
    return [p["state"] for p in r.json()["pending"]]


async def until_running(client: httpx.AsyncClient, sid: str) -> None:
    with trio.fail_after(WAIT_S):
        while await pending_states(client, sid) != ["running"]:  # noqa: ASYNC110
            await trio.sleep(0.02)


async def until_agent_got(markers: Path, prefix: str) -> None:
    """Until the stubborn agent received a request whose method starts with ``prefix``."""
    log = markers / "methods.log"

    def got() -> bool:
        return log.exists() and any(m.startswith(prefix) for m in log.read_text().split())

    with trio.fail_after(WAIT_S):
        while not got():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def session_detail(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    status = (await client.get("/daemon/status", params={"detail": "full"})).json()
    return [s for s in status["full"]["sessions"] if s["sessionId"] == sid]


async def test_prompt_and_delete_are_not_stuck_behind_unanswered_set_model(
    markers: Path,
) -> None:
    with stubborn(markers, "--initialize-timeout-ms", "60000") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=90) as client:
            sid, _ = await new_session(client)
            events: list[dict[str, Any]] = []

            async def watch() -> None:
                async with client.stream("GET", f"/session/{sid}/events") as stream:
                    events.extend(
                        await collect_until(stream, lambda e: e["type"] == "session_closed")
                    )

            answered: list[int] = []

            async def switch(i: int) -> None:
                if i % 2:
                    r = await client.post(f"/session/{sid}/model", json={"modelId": "m2"})
                else:
                    r = await client.post(f"/session/{sid}/approval-mode", json={"mode": "plan"})
                answered.append(r.status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                first = await submit(client, sid, "hang")
                await until_running(client, sid)
                async with trio.open_nursery() as switches:
                    for i in range(4):
                        switches.start_soon(switch, i)
                    # The switches reach the session first: one is at the agent (which
                    # never answers it), the others wait behind it.
                    await until_agent_got(markers, "session/set_")
                    # Admission and close are answered while the switches (model and mode)
                    # still wait on an agent that never answers them (up to 60 s).
                    second = await submit(client, sid, "next")
                    assert answered == []
                    closed = await client.delete(f"/session/{sid}")
                    assert closed.status_code == 204
            # The switches end with the session: 404, never a 500 for something that
            # happened anyway.
            assert answered == [404, 404, 404, 404]
            ends = [e for e in events if e["type"] in ("turn_complete", "turn_error")]
            assert [e["promptId"] for e in ends] == [first, second]
            assert {e["data"]["stopReason"] for e in ends} == {"cancelled"}


async def test_an_unanswered_model_switch_fails_cleanly(markers: Path) -> None:
    with stubborn(markers, "--initialize-timeout-ms", "1000") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=30) as client:
            sid, _ = await new_session(client)
            r = await client.post(f"/session/{sid}/model", json={"modelId": "m2"})
            assert r.status_code == 400, r.text
            assert r.json()["code"] == "model_switch_failed"
            assert r.json()["requestedModelId"] == "m2"
            # The session still answers at once.
            assert (await pending_states(client, sid)) == []


async def test_a_switch_that_never_got_its_turn_is_not_sent(tmp_path: Path, markers: Path) -> None:
    agent = f"{sys.executable} {STUBBORN} {markers}"
    async with inprocess(tmp_path, "--agent", agent) as (d, client):
        sid, _ = await new_session(client)
        session = d.host.registry.get(sid)
        assert session is not None
        errors: list[Exception] = []

        async def switch(model: str, bound_s: float) -> None:
            try:
                await session.call(SetModel(model, None, timeout_s=bound_s))
            except Exception as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(switch, "first", 3.0)
            await trio.lowlevel.checkpoint()
            nursery.start_soon(switch, "second", 0.3)  # its bound ends while the first waits
        # The first was sent and timed out at the agent; the second waited its whole bound
        # behind it and was never sent.
        assert sorted(type(e).__name__ for e in errors) == ["ControlTimeout", "ModelSwitchFailed"]
        assert any(isinstance(e, ModelSwitchFailed) and e.model_id == "first" for e in errors)
        assert any(isinstance(e, ControlTimeout) for e in errors)
        methods = (markers / "methods.log").read_text().split()
        assert methods.count("session/set_model") + methods.count("session/set_config_option") == 1


async def test_an_ignored_cancel_ends_the_turn_and_restarts_the_agent(markers: Path) -> None:
    with stubborn(markers, "--cancel-grace-ms", "300") as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            sid, _ = await new_session(client)
            [before] = await session_detail(client, sid)
            blocking: list[httpx.Response] = []

            async def hang() -> None:
                blocking.append(
                    await client.post(
                        f"/session/{sid}/prompt",
                        json={"prompt": [{"type": "text", "text": "hang"}]},
                    )
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hang)
                await until_running(client, sid)
                assert (await client.post(f"/session/{sid}/cancel")).status_code == 204
            [answer] = blocking
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] == "cancel_timeout"
            async with client.stream(
                "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
            ) as stream:
                events = await collect_until(stream, lambda e: e["type"] == "session_restarted")
            kinds = [e["type"] for e in events]
            assert kinds.index("turn_error") < kinds.index("session_restarted")
            error = next(e for e in events if e["type"] == "turn_error")
            assert error["data"]["code"] == "cancel_timeout"
            # The restarted agent serves the next prompt; it is another child.
            r = await client.post(
                f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hello"}]}
            )
            assert r.status_code == 200 and r.json()["stopReason"] == "end_turn", r.text
            [after] = await session_detail(client, sid)
            assert after["agentRestarts"] == 1
            assert after["agentPid"] != before["agentPid"]


async def test_rewind_holds_back_a_prompt_admitted_meanwhile(markers: Path) -> None:
    with stubborn(markers) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            sid, _ = await new_session(client)
            results: dict[str, httpx.Response] = {}

            async def rewind() -> None:
                results["rewind"] = await client.post(
                    f"/session/{sid}/rewind", json={"targetTurnIndex": 0}
                )

            async def prompt() -> None:
                results["prompt"] = await client.post(
                    f"/session/{sid}/prompt", json={"prompt": [{"type": "text", "text": "hi"}]}
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(rewind)
                with trio.fail_after(WAIT_S):  # the marker is empty: made when the rewind starts
                    while not (markers / "rewind-started").exists():  # noqa: ASYNC110
                        await trio.sleep(0.02)
                nursery.start_soon(prompt)
                # Admitted, but it waits: no turn starts while the rewind runs.
                with trio.fail_after(WAIT_S):
                    while await pending_states(client, sid) != ["queued"]:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                (markers / "rewind-release").touch()
            assert results["rewind"].status_code == 200, results["rewind"].text
            assert results["rewind"].json()["rewound"] is True
            # "refusal" would mean the agent got the prompt during the rewind.
            assert results["prompt"].json()["stopReason"] == "end_turn"
            # And a rewind while a prompt runs is refused by the session.
            await submit(client, sid, "hang")
            await until_running(client, sid)
            busy = await client.post(f"/session/{sid}/rewind", json={"targetTurnIndex": 0})
            assert busy.status_code == 409
            assert busy.json() == {
                "error": "Cannot rewind while a prompt is running or queued",
                "code": "session_busy",
                "sessionId": sid,
            }


async def test_detach_never_closes_a_session_under_a_client_that_just_attached() -> None:
    with running_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            for _ in range(6):
                sid, first = await new_session(client, "single")
                joined: list[dict[str, Any]] = []

                async def detach(sid: str = sid, first: str = first) -> None:
                    r = await client.post(
                        f"/session/{sid}/detach", headers={"X-Qwen-Client-Id": first}
                    )
                    assert r.status_code == 204

                async def attach(joined: list[dict[str, Any]] = joined) -> None:
                    r = await client.post("/session", json={"sessionScope": "single"})
                    assert r.status_code == 200, r.text
                    joined.append(r.json())

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(attach)
                    nursery.start_soon(detach)
                [second] = joined
                # Whatever the order, the session the second client holds is alive and
                # knows it.
                r = await client.get(
                    f"/session/{second['sessionId']}/pending-prompts",
                    headers={"X-Qwen-Client-Id": second["clientId"]},
                )
                assert r.status_code == 200, (second, r.text)
                await client.delete(f"/session/{second['sessionId']}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_loading_a_session_while_it_closes_waits_for_the_close() -> None:
    with running_daemon(env={"QWEN_SERVER_TOKEN": TOKEN}) as daemon:
        async with httpx.AsyncClient(base_url=daemon.url, headers=AUTH, timeout=60) as client:
            sid, _ = await new_session(client)
            await submit(client, sid, "[hang]")  # the agent stops reading: a slow close
            await until_running(client, sid)
            [old] = await session_detail(client, sid)
            assert (await client.delete(f"/session/{sid}")).status_code == 204
            loaded = await client.post(f"/session/{sid}/load", json={})
            assert loaded.status_code == 200, loaded.text
            # One actor, one child: the old agent is gone, the new one journals.
            assert not _alive(old["agentPid"])
            [new] = await session_detail(client, sid)
            assert new["agentPid"] != old["agentPid"]
            assert "journal" in new
