"""serve.tenant_claim.Binding: one bind at a time, never a second, the digest it accepts."""

from __future__ import annotations

import hashlib

from serve.tenant_claim import Binding, BindPlan


def _plan(token: str) -> BindPlan:
    return BindPlan(
        token_digest=hashlib.sha256(token.encode()).digest(),
        workspace="/w",
        repository=None,
        ref=None,
        agent_env={},
        credentials=(),
    )


def test_one_bind_at_a_time_and_never_twice() -> None:
    binding = Binding("bootstrap-token-0123456789", bootstrap=True)
    boot = hashlib.sha256(b"bootstrap-token-0123456789").digest()
    assert binding.pending and binding.digest() == boot
    assert binding.begin()
    assert not binding.begin()  # a bind is running: bind_in_progress
    binding.abort()  # it failed: still unbound, the bootstrap token still accepted
    assert binding.pending and binding.digest() == boot
    assert binding.begin()
    binding.complete(_plan("tenant-token-0123456789"), now=1.0)
    assert not binding.pending
    assert binding.digest() == hashlib.sha256(b"tenant-token-0123456789").digest()
    assert not binding.begin()  # already bound


def test_a_daemon_with_its_own_token_never_binds() -> None:
    binding = Binding("own-token-0123456789", bootstrap=False)
    assert not binding.pending and not binding.late
    assert not binding.begin()
    assert Binding(None, bootstrap=False).digest() is None
