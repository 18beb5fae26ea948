"""Issue 45 item 10 and the credential rules: the tokens file fails closed, JWTs need an
audience and a bounded lifetime, no principal is named like a group, and an ``/acp``
connection is bound to the credential that opened it whichever header carried it.

Two users of a tokens file (``ann`` and ``ben``, role ``user``) and the operator token, a
real JWKS on 127.0.0.1 (tests/access/test_multi_user.py's), real daemons.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import jwt
import pytest

from tests.access.test_multi_user import AUD, ISS, Jwks
from tests.support.daemon import DaemonProcess, spawn_daemon

TOKEN = "operator-token-token-sources"
OP = {"Authorization": f"Bearer {TOKEN}"}
ANN = "ann-token-0123456789"
BEN = "ben-token-0123456789"
ENV = {"QWEN_SERVER_TOKEN": TOKEN}
#: Bound on waiting for the daemon to see a change of the tokens file (it looks once a second).
SEEN_S = 15.0


def entries(*users: tuple[str, str]) -> str:
    return json.dumps(
        [
            {"id": n, "sha256": hashlib.sha256(t.encode()).hexdigest(), "principal": n}
            for n, t in users
        ]
    )


def tokens_file(directory: Path) -> Path:
    path = directory / "tokens.json"
    path.write_text(entries(("ann", ANN), ("ben", BEN)))
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SEEN_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.fixture(scope="module")
def jwks() -> Iterator[Jwks]:
    server = Jwks()
    yield server
    server.server.shutdown()


def test_a_deleted_malformed_or_unreadable_tokens_file_accepts_no_token(tmp_path: Path) -> None:
    """Item 10: deleting the tokens file revoked nothing (the last good table was kept);
    now a missing, malformed or unreadable file accepts no token from it, says so in the
    log, ``/readyz`` and ``/daemon/status``, and the file made good again is used again."""
    path = tokens_file(tmp_path)
    good = path.read_text()
    d = spawn_daemon(["--auth-tokens-file", str(path)], env=ENV)
    try:

        def ann_status() -> int:
            return httpx.get(f"{d.url}/capabilities", headers=bearer(ANN)).status_code

        assert ann_status() == 200
        assert httpx.get(f"{d.url}/readyz").status_code == 200
        for state, spoil in (
            ("missing", path.unlink),
            ("malformed", lambda: path.write_text(good[: len(good) // 2])),
            ("unreadable", lambda: (path.unlink(), path.mkdir())),  # (root reads any mode)
        ):
            spoil()
            until(f"{state}: a token still accepted", lambda: ann_status() == 401)
            r = httpx.get(f"{d.url}/readyz")
            assert (r.status_code, r.json()["reason"]) == (503, "auth_tokens_file_unusable")
            status = httpx.get(f"{d.url}/daemon/status", headers=OP).json()
            assert status["auth"]["tokensFile"]["state"] == state, status["auth"]
            assert status["auth"]["tokensFile"]["tokens"] == 0
            assert "auth_tokens_file_unusable" in [i["code"] for i in status["issues"]]
            assert status["status"] == "error"
            # The operator token, the break-glass credential, still works.
            assert httpx.get(f"{d.url}/capabilities", headers=OP).status_code == 200
            if path.is_dir():
                path.rmdir()
            path.write_text(good)
            until(f"{state}: the good file not used again", lambda: ann_status() == 200)
            assert httpx.get(f"{d.url}/readyz").status_code == 200
        status = httpx.get(f"{d.url}/daemon/status", headers=OP).json()
        assert status["auth"]["tokensFile"]["state"] == "ok"
        assert status["auth"]["tokensFile"]["tokens"] == 2
        assert "auth_tokens_file_unusable" not in [i["code"] for i in status["issues"]]
    finally:
        d.stop()
    log = d.stderr()
    for state in ("missing", "malformed", "unreadable"):
        assert f"unusable ({state}" in log, log
    assert "usable again: 2 tokens" in log


def test_jwt_auth_needs_an_audience_or_the_explicit_opt_out(jwks: Jwks, tmp_path: Path) -> None:
    """A daemon checking JWTs with no ``--auth-audience`` accepted a token minted for any
    other service of the identity provider; it now refuses to start unless told to
    (``--auth-allow-any-audience``)."""
    with pytest.raises(RuntimeError) as refused:
        spawn_daemon(["--auth-jwks-url", jwks.url], env=ENV)
    assert "--auth-allow-any-audience" in str(refused.value)
    d = spawn_daemon(["--auth-jwks-url", jwks.url, "--auth-allow-any-audience"], env=ENV)
    try:
        other = jwks.token("ann", aud="some-other-service")
        r = httpx.get(f"{d.url}/capabilities", headers=bearer(other))
        assert r.status_code == 200  # what the operator asked for
    finally:
        d.stop()
    with pytest.raises(RuntimeError) as both:
        spawn_daemon(
            ["--auth-jwks-url", jwks.url, "--auth-audience", AUD, "--auth-allow-any-audience"],
            env=ENV,
        )
    assert "exclude each other" in str(both.value)


def test_a_jwt_lives_no_longer_than_the_max_token_age(jwks: Jwks) -> None:
    """A JWT valid for a year (or with a far ``exp`` and no ``iat``) was accepted for its
    whole life; ``--auth-max-token-age`` (a day by default) bounds it."""
    args = ["--auth-jwks-url", jwks.url, "--auth-audience", AUD, "--auth-issuer", ISS]
    now = int(time.time())
    year = 365 * 24 * 3600
    d = spawn_daemon(args, env=ENV)
    try:

        def status(token: str) -> int:
            return httpx.get(f"{d.url}/capabilities", headers=bearer(token)).status_code

        assert status(jwks.token("ann")) == 200  # ten minutes
        assert status(jwks.token("ann", iat=now, exp=now + 23 * 3600)) == 200
        assert status(jwks.token("ann", iat=now, exp=now + year)) == 401
        assert status(jwks.token("ann", iat=now - year + 600, exp=now + 600)) == 401  # lived long
        no_iat = {"sub": "ann", "aud": AUD, "iss": ISS, "exp": now + year}
        far = jwt.encode(no_iat, jwks.keys["k1"], algorithm="RS256", headers={"kid": "k1"})
        assert status(far) == 401
    finally:
        d.stop()
    d = spawn_daemon([*args, "--auth-max-token-age", "120"], env=ENV)
    try:
        r = httpx.get(f"{d.url}/capabilities", headers=bearer(jwks.token("ann")))
        assert r.status_code == 401  # ten minutes > two
        short = jwks.token("ann", iat=now, exp=now + 100)
        assert httpx.get(f"{d.url}/capabilities", headers=bearer(short)).status_code == 200
    finally:
        d.stop()


def test_no_principal_is_named_like_a_group(jwks: Jwks, tmp_path: Path) -> None:
    """A JWT whose ``sub`` is ``group:eng`` got the grants of the group ``eng`` without
    being in it (A shared a session with ``group:eng``: that ``sub`` read it); a tokens file
    naming such a principal is refused as malformed."""
    path = tokens_file(tmp_path)
    d = spawn_daemon(
        ["--auth-jwks-url", jwks.url, "--auth-audience", AUD, "--auth-tokens-file", str(path)],
        env=ENV,
    )
    try:
        ann = httpx.Client(base_url=d.url, headers=bearer(ANN), timeout=30)
        sid = ann.post("/session", json={"sessionScope": "thread"}).json()["sessionId"]
        r = ann.put(f"/session/{sid}/members", json={"members": {"group:eng": "observer"}})
        assert r.is_success, r.text
        impostor = bearer(jwks.token("group:eng"))
        r = httpx.get(f"{d.url}/session/{sid}/members", headers=impostor)
        assert r.status_code == 401, r.text
        member = bearer(jwks.token("eve", groups=["eng"]))  # the group's real member
        assert httpx.get(f"{d.url}/session/{sid}/members", headers=member).status_code == 200
        # A tokens file naming one: no token from it is accepted until it is fixed.
        path.write_text(entries(("ann", ANN), ("group:eng", BEN)))
        until(
            "a tokens file naming group:eng was used",
            lambda: httpx.get(f"{d.url}/capabilities", headers=bearer(BEN)).status_code == 401,
        )
        status = httpx.get(f"{d.url}/daemon/status", headers=OP).json()
        assert status["auth"]["tokensFile"]["state"] == "malformed"
        assert "group:<name> names a group" in status["auth"]["tokensFile"]["error"]
    finally:
        d.stop()


def _acp_as(d: DaemonProcess, headers: dict[str, str], conn: str | None, rid: int) -> int:
    message = {"jsonrpc": "2.0", "id": rid, "method": "initialize", "params": {}}
    if conn is not None:
        message = {"jsonrpc": "2.0", "id": rid, "method": "session/list", "params": {}}
        headers = {**headers, "Acp-Connection-Id": conn}
    r = httpx.post(f"{d.url}/acp", json=message, headers=headers, timeout=30)
    return r.status_code


def test_an_acp_connection_is_bound_to_the_token_header_credential(tmp_path: Path) -> None:
    """With ``--token-header``, the ``/acp`` connection was bound to ``Authorization``
    only (absent: the same for every caller), so B, from the same address, could post on
    A's connection and act as A; it is bound to the credential that opened it."""
    args = ["--token-header", "X-Api-Key", "--auth-tokens-file", str(tokens_file(tmp_path))]
    d = spawn_daemon(args, env=ENV)
    try:
        ann, ben = {"X-Api-Key": ANN}, {"X-Api-Key": BEN}
        r = httpx.post(
            f"{d.url}/acp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers=ann,
            timeout=30,
        )
        assert r.status_code == 200, r.text
        conn = r.headers["acp-connection-id"]
        assert _acp_as(d, ben, conn, 2) == 404
        assert _acp_as(d, ann, conn, 3) == 202
    finally:
        d.stop()
