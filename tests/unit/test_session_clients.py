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
