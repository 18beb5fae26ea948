"""``--prompt-response async|blocking``: the daemon-wide answer of ``POST /session/:id/prompt``.

Blocking (the seed's default) answers when the turn ends and cancels the turn when the POST
goes away; async answers 202 at admission, as the reference does, and the turn does not
depend on the POST's connection. ``Prefer: respond-async`` gives 202 under either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve.settings import SettingsError, parse_settings
from tests.conftest import AUTH, TOKEN
from tests.support.daemon import DaemonProcess, running_daemon
from tests.support.sse import iter_events


def text(prompt: str) -> dict[str, Any]:
    return {"prompt": [{"type": "text", "text": prompt}]}


@pytest.fixture(scope="module")
def async_daemon() -> Iterator[DaemonProcess]:
    with running_daemon(["--prompt-response", "async"], env={"QWEN_SERVER_TOKEN": TOKEN}) as d:
        yield d


async def new_session(http: httpx.AsyncClient) -> tuple[str, str]:
    r = await http.post("/session", json={"sessionScope": "thread"})
    assert r.status_code == 200, r.text
    return r.json()["sessionId"], r.json()["clientId"]


async def finish_turn(
    http: httpx.AsyncClient, sid: str, cid: str, accepted: dict[str, Any]
) -> list[dict[str, Any]]:
    """Follow the events after the 202's watermark; allow the write; up to the turn's end."""
    events: list[dict[str, Any]] = []
    headers = {"Last-Event-ID": str(accepted["lastEventId"])}
    async with http.stream("GET", f"/session/{sid}/events", headers=headers) as stream:
        async for event in iter_events(stream):
            if "comment" in event or "id" not in event:
                continue
            events.append(event)
            if event["type"] == "permission_request":
                r = await http.post(
                    f"/session/{sid}/permission/{event['data']['requestId']}",
                    json={"outcome": {"outcome": "selected", "optionId": "allow"}},
                    headers={"X-Qwen-Client-Id": cid},
                )
                assert r.status_code == 200, r.text
            if event["type"] in ("turn_complete", "turn_error"):
                if event.get("promptId") == accepted["promptId"]:
                    break
    return events


@pytest.mark.parametrize("prefer", [None, "respond-async"])
async def test_async_answers_202_at_admission_and_the_turn_runs_on(
    async_daemon: DaemonProcess, prefer: str | None
) -> None:
    async with httpx.AsyncClient(base_url=async_daemon.url, timeout=30, headers=AUTH) as http:
        sid, cid = await new_session(http)
        name = f"async-{prefer or 'none'}.txt"
        headers = {"X-Qwen-Client-Id": cid}
        if prefer:
            headers["Prefer"] = prefer
        # The turn waits for a permission answer: a 202 now means it was not awaited.
        r = await http.post(
            f"/session/{sid}/prompt", json=text(f"[write {name} kept]"), headers=headers
        )
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert set(accepted) == {"promptId", "lastEventId", "eventEpoch"}
        assert not (async_daemon.workspace / name).exists()
    # That connection is gone; the turn is not cancelled: a new client finishes it.
    async with httpx.AsyncClient(base_url=async_daemon.url, timeout=30, headers=AUTH) as http:
        events = await finish_turn(http, sid, cid, accepted)
    assert events[-1]["type"] == "turn_complete"
    assert events[-1]["data"]["stopReason"] == "end_turn"
    assert (async_daemon.workspace / name).read_text() == "kept"


async def test_blocking_default_cancels_the_turn_when_the_post_goes_away(
    daemon_proc: DaemonProcess,
) -> None:
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30, headers=AUTH) as http:
        sid, cid = await new_session(http)
        events: list[dict[str, Any]] = []
        async with http.stream(
            "GET", f"/session/{sid}/events", headers={"Last-Event-ID": "0"}
        ) as stream:
            async with trio.open_nursery() as nursery:

                async def blocking_post() -> None:
                    async with httpx.AsyncClient(
                        base_url=daemon_proc.url, timeout=30, headers=AUTH
                    ) as poster:
                        await poster.post(
                            f"/session/{sid}/prompt",
                            json=text("[sleep 20000]"),
                            headers={"X-Qwen-Client-Id": cid},
                        )

                scope = trio.CancelScope()

                async def run_post() -> None:
                    with scope:
                        await blocking_post()

                nursery.start_soon(run_post)
                async for event in iter_events(stream):
                    if "comment" in event or "id" not in event:
                        continue
                    events.append(event)
                    if event.get("promptId") and not scope.cancel_called:
                        scope.cancel()  # the prompt runs: its blocking caller goes away
                    if event["type"] in ("turn_complete", "turn_error"):
                        break
    assert events[-1]["type"] == "turn_complete"
    assert events[-1]["data"]["stopReason"] == "cancelled"


def test_the_flag_and_its_environment_variable(tmp_path: Path) -> None:
    base = ["--workspace", str(tmp_path)]
    assert parse_settings(base, env={}).prompt_response == "blocking"
    assert parse_settings([*base, "--prompt-response", "async"], env={}).prompt_response == (
        "async"
    )
    env = {"ACP_SERVE_PROMPT_RESPONSE": "async"}
    assert parse_settings(base, env=env).prompt_response == "async"
    flag_wins = parse_settings([*base, "--prompt-response", "blocking"], env=env)
    assert flag_wins.prompt_response == "blocking"
    with pytest.raises(SettingsError, match=r'Invalid --prompt-response "later": must be one'):
        parse_settings([*base, "--prompt-response", "later"], env={})
    with pytest.raises(SettingsError, match=r'Invalid ACP_SERVE_PROMPT_RESPONSE "x"'):
        parse_settings(base, env={"ACP_SERVE_PROMPT_RESPONSE": "x"})
