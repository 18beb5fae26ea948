#!/usr/bin/env python
"""Benchmark the cost of multi-user auth per request (medians; not a test).

    .venv/bin/python scripts/bench_auth.py [--requests N]

Starts three daemons with the scripted agent on 127.0.0.1 and times, over one keep-alive
connection each, N sequential requests of:

* ``GET /capabilities`` (authenticated: ``/health`` skips the token on loopback binds, so
  this is the cheapest route that runs the credential check) and ``GET /health``;
* a prompt round trip, ``POST /session/:id/prompt`` ("hi", blocking, one agent message),

for: ``plain`` (the operator token, no ``--auth-*`` flag: today's daemon), ``operator``
(``--auth-jwks-url`` set, the operator token still used: the operator pays nothing extra),
``jwt`` (the same daemon, an RS256 JWT checked against a JWKS served here; the first
request verifies the signature, the next ones hit the verified-token cache) and ``jwt
cold`` (a fresh JWT per request: one RSA-2048 signature check each). Prints the p50 of each
and its ratio to ``plain``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import jwt
import trio
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.daemon import spawn_daemon  # noqa: E402

TOKEN = "bench-operator-token-0123456789"
AUD = "bench"


def serve_jwks(key: rsa.RSAPrivateKey) -> str:
    jwk = {**RSAAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": "k1", "use": "sig"}
    body = json.dumps({"keys": [jwk]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/jwks.json"


def timed(call: Callable[[], httpx.Response], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        r = call()
        out.append((time.perf_counter() - start) * 1000)
        assert r.status_code == 200, r.text
    return out


class Config:
    """One way of calling: a daemon, a credential, a session, and its timings."""

    def __init__(self, url: str, headers: Callable[[], dict[str, str]]) -> None:
        self.http = httpx.Client(base_url=url, timeout=60)
        self.headers = headers
        self.sid = self.http.post("/session", json={}, headers=headers()).json()["sessionId"]
        self.times: dict[str, list[float]] = {"health": [], "capabilities": [], "prompt": []}

    def round(self, n: int) -> None:
        http, h = self.http, self.headers
        prompt = {"prompt": [{"type": "text", "text": "hi"}]}
        self.times["health"] += timed(lambda: http.get("/health", headers=h()), n)
        self.times["capabilities"] += timed(lambda: http.get("/capabilities", headers=h()), n)
        self.times["prompt"] += timed(
            lambda: http.post(f"/session/{self.sid}/prompt", json=prompt, headers=h()), n
        )


async def micro(jwks_url: str, token: Callable[[str], str], n: int) -> dict[str, float]:
    """The resolver alone, in process: microseconds per call (median)."""
    from serve.http.security.principals import PrincipalResolver
    from serve.settings import parse_settings

    settings = parse_settings(
        ["--auth-jwks-url", jwks_url, "--auth-audience", AUD, "--token", TOKEN], {"HOME": "/tmp"}
    )
    resolver = PrincipalResolver(settings, lambda: ())
    out = {}
    warm = token("micro")
    assert await resolver.resolve(warm) is not None
    cold = [token(f"u{i}") for i in range(n)]
    for name, creds in (("jwt cached", [warm] * n), ("jwt cold (RS256 verify)", cold)):
        times = []
        for credential in creds:
            start = time.perf_counter()
            await resolver.resolve(credential)
            times.append((time.perf_counter() - start) * 1e6)
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks_url = serve_jwks(key)

    def token(sub: str) -> str:
        now = int(time.time())
        claims = {
            "sub": sub,
            "aud": AUD,
            "iat": now,
            "exp": now + 3600,
            "jti": str(time.perf_counter_ns()),
        }
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})

    env = {"QWEN_SERVER_TOKEN": TOKEN}
    op = {"Authorization": f"Bearer {TOKEN}"}
    plain = spawn_daemon([], env=env)
    auth = spawn_daemon(["--auth-jwks-url", jwks_url, "--auth-audience", AUD], env=env)
    try:
        warm = {"Authorization": f"Bearer {token('bench-user')}"}
        fresh = iter([token("bench-user") for _ in range(3 * args.requests + 10)])
        configs = {
            "plain (no --auth-*)": Config(plain.url, lambda: op),
            "operator token, --auth-*": Config(auth.url, lambda: op),
            "jwt (verified once)": Config(auth.url, lambda: warm),
            # Signed before the clock starts: each request carries a JWT never seen before.
            "jwt cold (new each request)": Config(
                auth.url, lambda: {"Authorization": f"Bearer {next(fresh)}"}
            ),
        }
        # Interleaved rounds: a load change on the machine hits every configuration alike.
        for _ in range(args.rounds):
            for config in configs.values():
                config.round(args.requests // args.rounds)
    finally:
        plain.stop()
        auth.stop()
    base = configs["plain (no --auth-*)"].times
    print(
        f"p50 of {args.requests} requests per cell, {args.rounds} interleaved rounds "
        "(ms; ratio to plain)"
    )
    print(f"{'':30} {'/health':>16} {'/capabilities':>16} {'prompt':>16}")
    for name, config in configs.items():
        cells = []
        for k in ("health", "capabilities", "prompt"):
            value, ref = statistics.median(config.times[k]), statistics.median(base[k])
            cells.append(f"{value:7.3f} ({value / ref:4.2f}x)")
        print(f"{name:30} " + " ".join(f"{c:>16}" for c in cells))
    print("the resolver alone, in process (median, microseconds per call):")
    for name, us in trio.run(micro, jwks_url, token, 200).items():
        print(f"  {name:28} {us:8.1f}")


if __name__ == "__main__":
    main()
