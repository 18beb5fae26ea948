"""Who a credential names: JWTs against a JWKS, scoped static tokens from a file.

:class:`PrincipalResolver` is asked by the security front only when the operator token did
not match and multi-user auth is configured (``docs/multi-user.md``); it answers a
:class:`~serve.access.Principal` or None, and the front answers every None with the same
``401 {"error":"Unauthorized"}`` (expired, wrong audience or issuer, unknown ``kid``, bad
signature, unknown token: one answer, so a caller learns nothing from it).

* :class:`~serve.access.tokens_file.TokensFile` — ``--auth-tokens-file`` (the Host's: its
  state is reported by ``/readyz`` and ``/daemon/status``): a presented token is looked up
  by its SHA-256; a missing, unreadable or malformed file accepts no token (fail closed).
* :class:`JwksCache` — the keys of ``--auth-jwks-url`` (fetched with httpx's async client)
  or ``--auth-jwks-file`` (read in a worker thread), at most :data:`MAX_KEYS` keys. A token
  naming an unknown ``kid`` refreshes the set (key rotation), the same ``kid`` again only
  after :data:`REFRESH_MIN_S`, any refresh at most once per :data:`REFRESH_GAP_S`; a
  ``kid`` still unknown is a refusal.
* JWT checks (PyJWT): the header's ``alg`` must be one of ``--auth-algorithms`` (never
  ``none`` or HMAC), signature, ``exp`` (required), ``nbf``, ``iss`` when configured,
  ``aud`` (``--auth-audience``; a daemon checks no audience only with
  ``--auth-allow-any-audience``), 30 s leeway; a lifetime of at most
  ``--auth-max-token-age`` (``exp - iat`` and ``exp - now``, the leeway added to the
  latter); ``sub`` names the principal (``operator`` and ``group:<name>`` are refused: the
  operator token's, and how grants name a group); the ``--auth-groups-claim`` claim its
  groups. A verified token is remembered (at most :data:`MAX_VERIFIED` tokens, each until
  its ``exp`` or :data:`VERIFIED_TTL_S`) so a client's next request costs one dict lookup.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import trio

from serve.access.principal import ADMIN, ANONYMOUS, USER, Principal
from serve.access.tokens_file import RELOAD_CHECK_S, TokensFile, parse_tokens, reserved_principal
from serve.settings import Settings

if TYPE_CHECKING:
    import jwt

    from serve.access.audit import AuditLog

__all__ = [
    "MAX_KEYS",
    "MAX_VERIFIED",
    "PRINCIPAL_KEY",
    "RELOAD_CHECK_S",
    "REVALIDATE_KEY",
    "JwksCache",
    "PrincipalResolver",
    "TokensFile",
    "bearer_credential",
    "parse_tokens",
]

log = logging.getLogger(__name__)

#: Where the security front leaves a request's principal in the ASGI scope (absent: the
#: operator token, or a daemon without multi-user auth).
PRINCIPAL_KEY = "acp_serve.principal"
#: Where it leaves, beside it, how to resolve the same credential again (an async callable
#: answering the principal it names now, None once revoked: serve/http/access.py Lease).
REVALIDATE_KEY = "acp_serve.revalidate"
#: Most keys kept from a JWKS.
MAX_KEYS = 64
#: One unknown kid refreshes the key set at most this often (seconds), and any refresh
#: waits REFRESH_GAP_S after the last one: a flood of made-up kids costs one fetch a second.
REFRESH_MIN_S = 10.0
REFRESH_GAP_S = 1.0
#: Most verified JWTs remembered, and for how long at most (seconds).
MAX_VERIFIED = 4096
VERIFIED_TTL_S = 60.0
#: Longest JWKS document accepted, in bytes.
MAX_JWKS_BYTES = 1024 * 1024
LEEWAY_S = 30
FETCH_TIMEOUT_S = 5.0
_MAX_CREDENTIAL_CHARS = 8192


def bearer_credential(auths: Sequence[str], tokens: Sequence[str]) -> str | None:
    """The one credential of a request: the ``--token-header`` value, else exactly one
    ``Authorization: Bearer <credential>``."""
    if len(tokens) == 1:
        value = tokens[0].strip(" \t")
        return value if 0 < len(value) <= _MAX_CREDENTIAL_CHARS else None
    if len(auths) != 1:
        return None
    scheme, _, value = auths[0].strip().partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value or len(value) > _MAX_CREDENTIAL_CHARS:
        return None
    return value


class _Watched:
    """A file re-read when its mtime changes, looked at no more than every RELOAD_CHECK_S."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime: float | None = None
        self._checked = -RELOAD_CHECK_S

    async def changed(self, *, force: bool = False) -> bytes | None:
        """The file's bytes when it changed since the last read (None: unchanged)."""
        now = time.monotonic()
        if not force and now - self._checked < RELOAD_CHECK_S:
            return None
        self._checked = now

        def read() -> tuple[float, bytes] | None:
            try:
                mtime = os.stat(self.path).st_mtime_ns / 1e9
                if mtime == self._mtime and not force:
                    return None
                with open(self.path, "rb") as f:
                    return mtime, f.read(MAX_JWKS_BYTES + 1)
            except OSError as exc:
                log.warning("cannot read %s: %s", self.path, exc.strerror)
                return None

        got = await trio.to_thread.run_sync(read)
        if got is None:
            return None
        self._mtime, data = got
        return data


class JwksCache:
    """The JWKS's keys by ``kid`` (see the module docstring)."""

    def __init__(self, *, url: str | None, path: str | None) -> None:
        self.url = url
        self._file = _Watched(path) if path is not None else None
        self.keys: dict[str, jwt.PyJWK] = {}
        self._last_fetch = -REFRESH_MIN_S
        #: Unknown kids and when a refresh last failed to find them (at most 1024).
        self._missed: dict[str, float] = {}
        self._lock = trio.Lock()
        self.fetches = 0

    async def key(self, kid: str) -> jwt.PyJWK | None:
        if self._file is not None:
            data = await self._file.changed()
            if data is not None:
                self._install(data)
        found = self.keys.get(kid)
        if found is not None:
            return found
        async with self._lock:  # one refresh at a time; the others then look again
            found = self.keys.get(kid)
            now = time.monotonic()
            missed = self._missed.get(kid)
            if (
                found is None
                and (missed is None or now - missed >= REFRESH_MIN_S)
                and now - self._last_fetch >= REFRESH_GAP_S
            ):
                self._last_fetch = now
                await self._refresh()
                found = self.keys.get(kid)
                if found is None:  # asked again for this kid only after REFRESH_MIN_S
                    self._missed[kid] = now
                    if len(self._missed) > MAX_KEYS * 16:
                        self._missed.pop(next(iter(self._missed)))
        return found

    async def _refresh(self) -> None:
        self.fetches += 1
        if self._file is not None:
            data = await self._file.changed(force=True)
        else:
            assert self.url is not None
            try:
                async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S) as client:
                    response = await client.get(self.url)
                response.raise_for_status()
                data = response.content
            except httpx.HTTPError as exc:
                log.warning("JWKS %s not fetched: %s", self.url, exc)
                return
        if data is not None:
            self._install(data)

    def _install(self, data: bytes) -> None:
        if len(data) > MAX_JWKS_BYTES:
            log.warning("JWKS larger than %d bytes: ignored", MAX_JWKS_BYTES)
            return
        try:
            document = json.loads(data)
            entries = document["keys"]
            assert isinstance(entries, list)
        except (ValueError, KeyError, TypeError, AssertionError):
            log.warning("JWKS is not a key set: ignored")
            return
        import jwt  # (PyJWT and cryptography: 8 MiB, loaded only by a daemon that checks JWTs)

        keys: dict[str, jwt.PyJWK] = {}
        for entry in entries[:MAX_KEYS]:
            kid = entry.get("kid") if isinstance(entry, dict) else None
            if not isinstance(kid, str) or entry.get("use", "sig") != "sig":
                continue
            try:
                keys[kid] = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue
        self.keys = keys


class PrincipalResolver:
    """The principal a non-operator credential names (None: refused)."""

    def __init__(
        self,
        settings: Settings,
        admin_groups: Callable[[], Sequence[str]],
        tokens: TokensFile | None = None,
    ) -> None:
        auth = settings.auth
        if tokens is None and auth.tokens_file:
            tokens = TokensFile(auth.tokens_file)
        self.tokens = tokens
        self.jwks = JwksCache(url=auth.jwks_url, path=auth.jwks_file) if auth.jwt else None
        self.issuer = auth.issuer
        self.audience = auth.audience
        self.algorithms = auth.algorithms
        self.groups_claim = auth.groups_claim
        self.max_age_s = auth.max_token_age_s
        self.admin_groups = admin_groups
        self._verified: OrderedDict[str, tuple[float, Principal]] = OrderedDict()

    async def admit(
        self,
        scope: MutableMapping[str, Any],
        auths: list[bytes],
        tokens: list[bytes],
        peer: str | None,
        audit: AuditLog | None,
    ) -> bool:
        """The principal a request's credential names, put in its ASGI scope
        (:data:`PRINCIPAL_KEY`); False (audited) when there is none."""
        credential = bearer_credential(
            [a.decode("latin-1") for a in auths], [t.decode("latin-1") for t in tokens]
        )
        principal = await self.resolve(credential)
        if principal is not None:
            scope[PRINCIPAL_KEY] = principal
            return True
        if audit is not None:  # counted and sampled, not one line each (audit.py)
            audit.refused(
                "no_credential" if credential is None else "bad_credential",
                peer,
                f"{scope.get('method', 'WS')} {scope['path']}",
            )
        return False

    async def identify(
        self, scope: MutableMapping[str, Any], auths: list[bytes], tokens: list[bytes]
    ) -> None:
        """On a route that needs no credential: the principal of a valid one, else
        :data:`ANONYMOUS`, into the scope (nothing is refused, counted nor audited)."""
        credential = bearer_credential(
            [a.decode("latin-1") for a in auths], [t.decode("latin-1") for t in tokens]
        )
        scope[PRINCIPAL_KEY] = await self.resolve(credential) or ANONYMOUS

    async def resolve(self, credential: str | None) -> Principal | None:
        if credential is None:
            return None
        if self.tokens is not None:
            found = await self.tokens.lookup(credential)
            if found is not None:
                return found
        if self.jwks is None or credential.count(".") != 2:
            return None
        now = time.time()
        hit = self._verified.get(credential)
        if hit is not None:
            if hit[0] > now:
                return hit[1]
            del self._verified[credential]
        return await self._verify(credential, now)

    async def _verify(self, credential: str, now: float) -> Principal | None:
        assert self.jwks is not None
        import jwt  # (loaded by the key set already: a dict lookup)

        try:
            header = jwt.get_unverified_header(credential)
        except jwt.PyJWTError:
            return None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in self.algorithms or not isinstance(kid, str):
            return None
        key = await self.jwks.key(kid)
        if key is None:
            return None
        try:
            claims: dict[str, Any] = jwt.decode(
                credential,
                key=key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.PyJWTError:
            return None
        if not self._lifetime_ok(claims, now):
            return None
        principal = self._principal(claims)
        if principal is None:
            return None
        until = min(float(claims["exp"]), now + VERIFIED_TTL_S)
        self._verified[credential] = (until, principal)
        if len(self._verified) > MAX_VERIFIED:
            self._verified.popitem(last=False)
        return principal

    def _lifetime_ok(self, claims: dict[str, Any], now: float) -> bool:
        """``exp`` (verified present) at most ``--auth-max-token-age`` after ``iat`` (when
        given) and after now (the leeway added): a token minted to live longer, or with a
        far ``exp``, is refused however it is signed."""
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            return False
        if iat is not None:
            if not isinstance(iat, int | float) or isinstance(iat, bool):
                return False
            if exp - iat > self.max_age_s:
                return False
        return exp - now <= self.max_age_s + LEEWAY_S

    def _principal(self, claims: dict[str, Any]) -> Principal | None:
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub or reserved_principal(sub) is not None:
            return None
        raw = claims.get(self.groups_claim, [])
        groups = tuple(g for g in (raw if isinstance(raw, list) else [raw]) if isinstance(g, str))
        admin = any(g in self.admin_groups() for g in groups)
        return Principal(sub, "jwt", (ADMIN,) if admin else (USER,), groups)
