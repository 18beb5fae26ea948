"""The session's client table: registration, heartbeats, streams and idle expiry (pure)."""

from __future__ import annotations

import pytest

from serve.sessions.clients import ClientTable


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def test_idle_clients_expire_and_leave_the_electorate() -> None:
    clock = Clock()
    table = ClientTable(1000, clock_ms=clock)
    for i in range(300):
        table.register(f"anon{i}")
    table.register("alice")
    assert len(table) == 301
    clock.now += 600
    assert table.touch("alice")
    clock.now += 600  # the anonymous ones: 1200 ms idle; alice: 600 ms
    assert len(table) == 1 and table.active() == frozenset({"alice"})
    assert "anon0" not in table and table.expired == 300
    assert not table.touch("anon0")  # an expired id is no longer accepted
    clock.now += 1001
    assert not table  # alice too, once idle past the timeout


def test_a_streaming_client_never_expires_and_its_clock_restarts_when_the_stream_ends() -> None:
    clock = Clock()
    table = ClientTable(1000, clock_ms=clock)
    table.register("bob")
    assert table.stream_opened("bob")
    assert not table.stream_opened("nobody")
    clock.now += 10_000
    assert "bob" in table
    table.stream_closed("bob")
    clock.now += 999
    assert "bob" in table
    clock.now += 2
    assert "bob" not in table


def test_attach_counts_release_and_zero_means_never() -> None:
    clock = Clock()
    table = ClientTable(0, clock_ms=clock)
    table.register("c")
    table.register("c")
    assert table.get("c") == 2
    table.release("c")
    assert list(table) == ["c"]
    table.release("c")
    assert "c" not in table
    table.register("d")
    clock.now += 10**9
    assert "d" in table  # 0: never expires


def test_the_table_is_bounded_dropping_the_idlest() -> None:
    clock = Clock()
    table = ClientTable(0, clock_ms=clock, max_clients=3)
    for name in ("a", "b", "c"):
        table.register(name)
        clock.now += 1
    table.touch("a")
    table.register("d")
    assert table.active() == frozenset({"a", "c", "d"})
    with pytest.raises(ValueError):
        ClientTable(-1)


def test_a_flood_of_attaches_never_evicts_a_client_with_an_open_stream() -> None:
    """Issue 22 item 15: 4160 anonymous attaches once pushed the streaming client out."""
    clock = Clock()
    table = ClientTable(0, clock_ms=clock, max_clients=8)
    table.register("streamer")
    assert table.stream_opened("streamer")
    clock.now += 1
    table.register("idle")
    for i in range(100):  # the streamer is the idlest by its clock, but it streams
        clock.now += 1
        table.register(f"anon{i}")
    assert "streamer" in table and table.touch("streamer")
    assert len(table) == 8
    assert "idle" not in table  # the idlest without a stream went first


def test_attaches_from_one_peer_evict_only_that_peers_clients() -> None:
    clock = Clock()
    table = ClientTable(0, clock_ms=clock, max_clients=8, max_per_peer=3)
    table.register("bob", peer="10.0.0.2")
    for i in range(50):
        clock.now += 1
        table.register(f"flood{i}", peer="10.0.0.9")
    assert "bob" in table
    flood = {c for c in table.active() if c.startswith("flood")}
    assert flood == {"flood47", "flood48", "flood49"}  # the peer keeps its newest 3
    table.register("bob", peer="10.0.0.2")  # a known client's re-attach adds nobody
    assert len(table) == 4
