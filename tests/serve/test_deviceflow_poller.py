"""The DeviceFlowPoller actor in-process against the fake IdP (real sockets, real files)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from serve.deviceflow import DeviceFlowPoller, FlowNotFound, TooManyFlows, UnsupportedProvider
from serve.deviceflow.poller import UpstreamError
from serve.deviceflow.providers import QWEN_OAUTH, ProviderConfig
from tests.serve.test_deviceflow_fake_idp import PENDING, FakeIdp, device_answer, grant

WAIT_S = 30.0
Events = list[tuple[str, dict[str, Any]]]


@pytest.fixture
def idp() -> Iterator[FakeIdp]:
    with FakeIdp() as server:
        yield server


@asynccontextmanager
async def running_poller(
    providers: list[ProviderConfig], state_dir: Path, events: Events
) -> AsyncIterator[DeviceFlowPoller]:
    poller = DeviceFlowPoller(
        providers={p.id: p for p in [QWEN_OAUTH, *providers]},
        state_dir=str(state_dir),
        fanout=lambda kind, data: events.append((kind, json.loads(json.dumps(data)))),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(poller.run)
        try:
            yield poller
        finally:
            poller.close()


async def until(predicate: Callable[[], bool]) -> None:
    """Wait (bounded) for the actor to get somewhere; it has no hook to wait on."""
    with trio.fail_after(WAIT_S):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


def kinds(events: Events, flow_id: str) -> list[str]:
    return [kind for kind, data in events if data.get("deviceFlowId") == flow_id]


async def test_grant_is_polled_persisted_and_announced(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("corp", token=[PENDING, PENDING, grant("corp")])
    events: Events = []
    async with running_poller([idp.config("corp", pkce=True)], tmp_path, events) as poller:
        flow_id, attached = await poller.start_flow("corp", "c1")
        assert attached is False
        view = poller.view(flow_id, "c1", attached=False)
        assert view["userCode"] == "USER-corp" and view["intervalMs"] == 50
        await until(lambda: poller.view(flow_id, None)["status"] != "pending")
        final = poller.view(flow_id, "c1")
        assert final["status"] == "authorized" and "userCode" not in final
    assert kinds(events, flow_id) == ["auth_device_flow_started", "auth_device_flow_authorized"]
    assert "USER-corp" not in json.dumps(events) and "AT-corp" not in json.dumps(events)
    assert len(idp.seen("corp", "token")) == 3
    path = tmp_path / "credentials" / "corp.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert (stored["accessToken"], stored["refreshToken"]) == ("AT-corp", "RT-corp")


async def test_callers_during_the_start_attach_to_one_flow(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("corp", token=[PENDING], delay_s=0.3)
    async with running_poller([idp.config("corp")], tmp_path, []) as poller:
        results: list[tuple[str, bool]] = []

        async def start(client: str) -> None:
            results.append(await poller.start_flow("corp", client))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(start, "c1")
            # c2 comes while c1's start waits on the IdP (its answer takes 0.3 s).
            await until(lambda: len(idp.seen("corp", "device/code")) == 1)
            nursery.start_soon(start, "c2")
        assert len({flow_id for flow_id, _ in results}) == 1
        assert sorted(attached for _, attached in results) == [False, True]
        assert len(idp.seen("corp", "device/code")) == 1
        (flow_id, _), *_ = results
        assert "userCode" in poller.view(flow_id, "c1")
        assert "userCode" not in poller.view(flow_id, "c2")
        await poller.cancel_flow(flow_id)


async def test_start_failure_then_retry(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("corp", token=[PENDING], device=[(503, b"down"), device_answer("corp")])
    async with running_poller([idp.config("corp")], tmp_path, []) as poller:
        with pytest.raises(UpstreamError, match="HTTP 503"):
            await poller.start_flow("corp", None)
        assert poller.pending_flows() == []
        flow_id, attached = await poller.start_flow("corp", None)
        assert not attached and poller.view(flow_id, None)["status"] == "pending"
        await poller.cancel_flow(flow_id)


async def test_limits_and_unknown_providers(idp: FakeIdp, tmp_path: Path) -> None:
    names = [f"p{i}" for i in range(5)]
    for name in names:
        idp.script(name, token=[PENDING])
    async with running_poller([idp.config(n) for n in names], tmp_path, []) as poller:
        with pytest.raises(UnsupportedProvider) as unknown:
            await poller.start_flow("nope", None)
        assert unknown.value.supported == ["qwen-oauth", *names]
        flows = [(await poller.start_flow(n, None))[0] for n in names[:4]]
        with pytest.raises(TooManyFlows):
            await poller.start_flow("p4", None)
        assert {f["deviceFlowId"] for f in poller.pending_flows()} == set(flows)
        for flow_id in flows:
            await poller.cancel_flow(flow_id)
        assert poller.pending_flows() == []
        with pytest.raises(FlowNotFound):
            await poller.cancel_flow("nope")


async def test_cancel_ends_a_pending_flow_once(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("corp", token=[PENDING])
    events: Events = []
    async with running_poller([idp.config("corp")], tmp_path, events) as poller:
        flow_id, _ = await poller.start_flow("corp", None)
        await until(lambda: len(idp.seen("corp", "token")) >= 1)
        await poller.cancel_flow(flow_id)
        await poller.cancel_flow(flow_id)  # terminal: accepted, no second event
        assert poller.view(flow_id, None)["status"] == "cancelled"
    assert kinds(events, flow_id) == ["auth_device_flow_started", "auth_device_flow_cancelled"]


async def test_repeated_transport_failures_end_the_flow(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("corp", token=[(503, b"busy")])
    events: Events = []
    async with running_poller([idp.config("corp")], tmp_path, events) as poller:
        flow_id, _ = await poller.start_flow("corp", None)
        await until(lambda: poller.view(flow_id, None)["status"] != "pending")
        view = poller.view(flow_id, None)
        assert (view["status"], view["errorKind"]) == ("error", "upstream_error")
    assert len(idp.seen("corp", "token")) == 3
    (failed,) = [d for k, d in events if k == "auth_device_flow_failed"]
    assert failed == {
        "deviceFlowId": flow_id,
        "errorKind": "upstream_error",
        "hint": "the token endpoint answered HTTP 503",
    }


async def test_persist_failure_is_reported(idp: FakeIdp, tmp_path: Path) -> None:
    idp.script("corp", token=[grant("corp")])
    (tmp_path / "credentials").write_text("in the way")
    events: Events = []
    async with running_poller([idp.config("corp")], tmp_path, events) as poller:
        flow_id, _ = await poller.start_flow("corp", None)
        await until(lambda: poller.view(flow_id, None)["status"] != "pending")
        view = poller.view(flow_id, None)
        assert (view["status"], view["errorKind"]) == ("error", "persist_failed")
    assert kinds(events, flow_id)[-1] == "auth_device_flow_failed"
    assert "AT-corp" not in json.dumps(events)
