"""The SDK against the real daemon and the scripted agent (async client and sync facade)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from serve.client import (
    AcpServeClient,
    Backoff,
    BadRequestError,
    ConflictError,
    DaemonUnreachableError,
    Event,
    EventStreamLostError,
    MissingCapabilityError,
    NotFoundError,
    ServerError,
    SyncAcpServeClient,
    UnauthorizedError,
)
from serve.client.types import PermissionRequest, SessionUpdate
from tests.client.proxy import Proxy
from tests.conftest import TOKEN
from tests.support.daemon import DaemonProcess


@pytest.fixture
async def sdk(daemon_proc: DaemonProcess) -> AsyncIterator[AcpServeClient]:
    async with AcpServeClient(daemon_proc.url, token=TOKEN) as client:
        yield client


def via_proxy(proxy: Proxy, daemon: DaemonProcess, **kw: object) -> AcpServeClient:
    """A client that connects through ``proxy`` (Host names the daemon: its allowlist)."""
    http = httpx.AsyncClient(
        base_url=proxy.url, headers={"Host": f"127.0.0.1:{daemon.port}"}, timeout=30
    )
    return AcpServeClient(proxy.url, token=TOKEN, http=http, **kw)  # type: ignore[arg-type]


def flood_texts(events: list[Event]) -> list[str]:
    out = []
    for event in events:
        if event.type == "session_update":
            update: SessionUpdate = event.payload
            if update.kind == "agent_message_chunk" and update.text is not None:
                out.append(update.text)
    return out


def assert_contiguous(events: list[Event]) -> list[int]:
    ids = [e.id for e in events if e.id is not None]
    assert ids == list(range(ids[0], ids[0] + len(ids))), "gap or duplicate in event ids"
    return ids


async def test_capabilities_preflight_health_and_status(sdk: AcpServeClient) -> None:
    caps = await sdk.capabilities()
    assert caps.v == 1 and caps.protocol_version == "v1"
    assert caps.supports("session_create", "session_events", "non_blocking_prompt")
    caps.require("session_permission_vote", "workspace_file_write")
    with pytest.raises(MissingCapabilityError) as info:
        caps.require("session_create", "no_such_feature")
    assert info.value.missing == ("no_such_feature",)
    assert "first-responder" in caps.modes("permission_mediation")
    assert caps.workspace_cwd and caps.workspaces[0].primary
    assert (await sdk.capabilities(refresh=False)) is caps
    health = await sdk.health(deep=True)
    assert health.status == "ok" and health.sessions is not None
    assert (await sdk.health()).sessions is None
    status = await sdk.daemon_status()
    assert status.v == 1 and status.status in ("ok", "warning", "error")
    assert status.security["tokenConfigured"] is True


async def test_errors_are_typed(daemon_proc: DaemonProcess) -> None:
    async with AcpServeClient(daemon_proc.url) as anonymous:
        with pytest.raises(UnauthorizedError) as unauthorized:
            await anonymous.capabilities()
        assert unauthorized.value.status == 401
    async with AcpServeClient(daemon_proc.url, token="wrong") as wrong:
        with pytest.raises(UnauthorizedError):
            await wrong.create_session()
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with AcpServeClient(f"http://127.0.0.1:{port}", token=TOKEN) as nowhere:
        with pytest.raises(DaemonUnreachableError):
            await nowhere.health()
        with pytest.raises(DaemonUnreachableError):
            await nowhere.events("sess_x").open()
    async with AcpServeClient(daemon_proc.url, token=TOKEN) as sdk:
        with pytest.raises(NotFoundError) as missing:
            await sdk.prompt("sess_nope", "x")
        assert missing.value.code == "session_not_found"
        with pytest.raises(NotFoundError):
            await sdk.events("sess_nope").open()
        with pytest.raises(BadRequestError) as bad:
            await sdk.create_session(cwd="/")
        assert bad.value.code == "workspace_mismatch"
        with pytest.raises(ValueError):
            await sdk.vote("s", "r")  # neither an option nor cancel


async def test_session_flow_prompt_events_vote_files_close(
    sdk: AcpServeClient, daemon_proc: DaemonProcess
) -> None:
    """create → prompt → replayed typed events → permission vote → hashed file writes → close."""
    session = await sdk.create_session(scope="thread")
    sid = session.session_id
    assert session.attached is False and sdk.client_id_for(sid) == session.client_id

    result = await sdk.prompt(sid, "hello [think hm] [plan a|b]")
    assert result.stop_reason == "end_turn" and result.prompt_id

    replayed: list[Event] = []
    async with sdk.events(sid, last_event_id=0) as stream:
        async for event in stream:
            replayed.append(event)
            if event.type == "replay_complete":
                break
        assert stream.epoch and stream.last_event_id == replayed[-2].id
    assert_contiguous(replayed)
    kinds = [e.payload.kind for e in replayed if e.type == "session_update"]
    assert {"user_message_chunk", "agent_thought_chunk", "plan"} <= set(kinds)
    assert "".join(flood_texts(replayed)).startswith("echo: hello")
    complete = next(e for e in replayed if e.type == "turn_complete")
    assert complete.payload.stop_reason == "end_turn" and complete.prompt_id == result.prompt_id

    # a non-blocking prompt that needs a permission; the stream opened from the 202 watermark
    accepted = await sdk.prompt_async(sid, "[write f.txt hi]")
    seen: list[Event] = []
    async with sdk.events(sid, last_event_id=accepted.last_event_id) as stream:
        async for event in stream:
            seen.append(event)
            if event.type == "permission_request":
                request: PermissionRequest = event.payload
                assert event.prompt_id == accepted.prompt_id
                assert {o.option_id for o in request.options} >= {"allow", "reject"}
                with pytest.raises(BadRequestError) as bad_option:
                    await sdk.vote(sid, request.request_id, "nope")
                assert bad_option.value.code == "invalid_option_id"
                await sdk.vote(sid, request.request_id, "allow")
                with pytest.raises(NotFoundError):  # already resolved
                    await sdk.vote(sid, request.request_id, "reject")
            if event.type == "turn_complete" and event.prompt_id == accepted.prompt_id:
                break
    resolved = next(e for e in seen if e.type == "permission_resolved")
    assert resolved.payload.option_id == "allow"
    assert resolved.payload.voter_client_id == session.client_id

    # files: read with hash, stale replace is 409 and changes nothing, fresh replace works
    read = await sdk.read_file("f.txt")
    assert read.content == "hi" and read.hash.startswith("sha256:") and read.size_bytes == 2
    stale = "sha256:" + "0" * 64
    with pytest.raises(ConflictError) as conflict:
        await sdk.write_file("f.txt", "clobbered", expected_hash=stale)
    assert conflict.value.status == 409 and conflict.value.code == "hash_mismatch"
    assert (daemon_proc.workspace / "f.txt").read_text() == "hi"
    with pytest.raises(ConflictError) as exists:
        await sdk.write_file("f.txt", "again")  # mode create
    assert exists.value.code == "file_already_exists"
    replaced = await sdk.write_file("f.txt", "hello world", expected_hash=read.hash)
    assert replaced.mode == "replace" and not replaced.created
    edited = await sdk.edit_file("f.txt", "world", "there", replaced.hash)
    assert edited.replacements == 1
    assert (await sdk.read_file("f.txt")).hash == edited.hash
    assert (daemon_proc.workspace / "f.txt").read_text() == "hello there"
    assert (await sdk.stat("f.txt")).size_bytes == len("hello there")
    assert "f.txt" in {entry.name for entry in (await sdk.list_dir()).entries}
    assert "f.txt" in (await sdk.glob("*.txt")).matches
    with pytest.raises(NotFoundError) as no_file:
        await sdk.read_file("missing.txt")
    assert no_file.value.code == "path_not_found"

    # close: a live stream sees session_closed and ends; the session is then gone
    async with sdk.events(sid) as stream:
        await sdk.close_session(sid)
        tail = [event async for event in stream]
    assert tail[-1].type == "session_closed" and tail[-1].is_terminal
    assert tail[-1].payload.closed_by == session.client_id
    assert stream.done
    with pytest.raises(NotFoundError):
        await sdk.prompt(sid, "x")


async def test_session_controls_and_listing(sdk: AcpServeClient) -> None:
    session = await sdk.create_session(scope="thread")
    sid = session.session_id
    listed = await sdk.list_sessions()
    assert sid in {s.session_id for s in listed.sessions}
    restored = await sdk.load_session(sid)
    assert restored.attached is True and restored.last_event_id is not None
    assert restored.event_epoch
    assert restored.client_id == session.client_id  # the client keeps its identity on attach
    beat = await sdk.heartbeat(sid)
    assert beat.client_id == session.client_id
    async with AcpServeClient(sdk.base_url, token=TOKEN) as other:
        joined = await other.load_session(sid)
        assert joined.attached and joined.client_id != session.client_id
        assert (await other.heartbeat(sid)).client_id == joined.client_id
    assert (await sdk.set_model(sid, "scripted-slow")).model_id == "scripted-slow"
    mode = await sdk.set_approval_mode(sid, "plan")
    assert (mode.previous, mode.mode) == ("default", "plan")
    with pytest.raises(ServerError) as failed:
        await sdk.prompt(sid, "[error]")
    assert failed.value.code == -32603
    async with trio.open_nursery() as nursery:
        outcome = {}

        async def blocking() -> None:
            outcome["result"] = await sdk.prompt(sid, "[sleep 20000]")

        async with sdk.events(sid, last_event_id=restored.last_event_id) as stream:
            nursery.start_soon(blocking)
            async for event in stream:
                if event.type == "session_update" and event.payload.kind == "user_message_chunk":
                    if "sleep" in (event.payload.text or ""):
                        await sdk.cancel(sid)
                if event.type == "turn_complete" and event.payload.stop_reason == "cancelled":
                    break
    assert outcome["result"].stop_reason == "cancelled"
    await sdk.close_session(sid)


async def test_events_resume_after_the_connection_is_cut_mid_frame(
    sdk: AcpServeClient, daemon_proc: DaemonProcess
) -> None:
    sid = (await sdk.create_session(scope="thread")).session_id
    assert (await sdk.prompt(sid, "[flood 1000]")).stop_reason == "end_turn"
    async with trio.open_nursery() as nursery:
        proxy = Proxy(daemon_proc.port, cut_first_after=40_000)  # ~150 frames, then mid-frame
        await proxy.start(nursery)
        async with via_proxy(proxy, daemon_proc) as client:
            events: list[Event] = []
            async with client.events(sid, last_event_id=0) as stream:
                async for event in stream:
                    events.append(event)
                    if event.type == "turn_complete":
                        break
                stats = stream.stats()
        nursery.cancel_scope.cancel()
    assert proxy.accepted == 2 and stats.connections == 2 and stats.reconnects == 1
    ids = assert_contiguous(events)
    assert ids[0] == 1
    assert flood_texts(events) == [f"{i} " for i in range(1000)]
    assert stats.duplicates_skipped == 0 and stats.malformed_dropped == 0
    await sdk.close_session(sid)


async def test_events_resume_after_the_daemon_evicts_a_slow_reader(
    sdk: AcpServeClient, daemon_proc: DaemonProcess
) -> None:
    sid = (await sdk.create_session(scope="thread")).session_id
    async with trio.open_nursery() as nursery:
        proxy = Proxy(daemon_proc.port)
        await proxy.start(nursery)
        async with via_proxy(proxy, daemon_proc) as client:
            async with client.events(sid, max_queued=16) as stream:
                proxy.pause()  # the daemon's writes back up: the subscriber lags
                assert (await sdk.prompt(sid, "[flood 4000]")).stop_reason == "end_turn"
                proxy.resume()
                events: list[Event] = []
                async for event in stream:
                    events.append(event)
                    if event.type == "turn_complete":
                        break
                stats = stream.stats()
        nursery.cancel_scope.cancel()
    types = [e.type for e in events]
    assert "client_evicted" in types and stats.reconnects >= 1
    evicted = events[types.index("client_evicted")]
    assert evicted.is_synthetic and evicted.payload.reason == "queue_overflow"
    assert_contiguous(events)
    assert flood_texts(events) == [f"{i} " for i in range(4000)], "each chunk exactly once"
    await sdk.close_session(sid)


async def test_a_reconnect_to_a_closed_session_raises_not_found(
    sdk: AcpServeClient, daemon_proc: DaemonProcess
) -> None:
    sid = (await sdk.create_session(scope="thread")).session_id
    async with trio.open_nursery() as nursery:
        proxy = Proxy(daemon_proc.port)
        await proxy.start(nursery)
        async with via_proxy(proxy, daemon_proc) as client:
            async with client.events(sid) as stream:
                proxy.pause()
                await sdk.close_session(sid)
                proxy.cut()  # session_closed never reaches the client
                proxy.resume()
                with pytest.raises(NotFoundError):
                    await stream.__anext__()
        nursery.cancel_scope.cancel()


async def test_reconnects_are_bounded(sdk: AcpServeClient, daemon_proc: DaemonProcess) -> None:
    sid = (await sdk.create_session(scope="thread")).session_id
    async with trio.open_nursery() as nursery:
        proxy = Proxy(daemon_proc.port)
        await proxy.start(nursery)
        backoff = Backoff(base_s=0.01, max_s=0.05, max_attempts=3)
        async with via_proxy(proxy, daemon_proc, backoff=backoff) as client:
            async with client.events(sid, last_event_id=0) as stream:
                first = await stream.__anext__()
                assert first.id == 1
                proxy.stop_listening()
                proxy.cut()
                with pytest.raises(EventStreamLostError) as lost:
                    async for _ in stream:
                        pass
                assert lost.value.attempts == 4 and lost.value.last_event_id is not None
        nursery.cancel_scope.cancel()
    await sdk.close_session(sid)


async def test_epoch_mismatch_is_surfaced_and_ids_restart(sdk: AcpServeClient) -> None:
    sid = (await sdk.create_session(scope="thread")).session_id
    await sdk.prompt(sid, "one")
    events: list[Event] = []
    async with sdk.events(sid, last_event_id=3, epoch="an-old-epoch") as stream:
        async for event in stream:
            events.append(event)
            if event.type == "replay_complete":
                break
    assert events[0].type == "state_resync_required"
    assert events[0].payload.reason == "epoch_reset"
    assert events[1].id == 1  # delivered although ≤ the presented id: the epoch changed
    assert_contiguous(events)
    await sdk.close_session(sid)


async def test_cancelling_a_read_leaves_the_stream_resumable(sdk: AcpServeClient) -> None:
    sid = (await sdk.create_session(scope="thread")).session_id
    async with sdk.events(sid, last_event_id=0) as stream:
        with trio.move_on_after(0.3):
            while True:
                await stream.__anext__()  # drains the replay, then waits: cancelled
        before = stream.last_event_id
        result = await sdk.prompt(sid, "after the cancel")
        async for event in stream:
            if event.type == "turn_complete":
                break
        assert stream.stats().connections == 2
        assert before is not None and event.id is not None and event.id > before
        assert event.prompt_id == result.prompt_id
    await sdk.close_session(sid)


def test_sync_facade_runs_the_same_flow(daemon_proc: DaemonProcess, tmp_path: Path) -> None:
    with SyncAcpServeClient(daemon_proc.url, token=TOKEN) as client:
        assert client.capabilities().supports("session_create")
        session = client.create_session(scope="thread")
        sid = session.session_id
        accepted = client.prompt_async(sid, "[write sync.txt synced]")
        with client.events(sid, last_event_id=accepted.last_event_id) as stream:
            for event in stream:
                if event.type == "permission_request":
                    client.vote(sid, event.payload.request_id, "allow")
                if event.type == "turn_complete":
                    break
        read = client.read_file("sync.txt")
        assert read.content == "synced"
        with pytest.raises(ConflictError):
            client.write_file("sync.txt", "x", expected_hash="sha256:" + "1" * 64)
        client.close_session(sid)
        with pytest.raises(NotFoundError):
            client.heartbeat(sid)


async def test_sync_facade_refuses_to_block_an_event_loop(daemon_proc: DaemonProcess) -> None:
    with pytest.raises(RuntimeError, match="AcpServeClient"):
        SyncAcpServeClient(daemon_proc.url, token=TOKEN)
