#!/usr/bin/env python3
"""The cost of tenants that cannot see each other: create p50, first-prompt p50 and
process-tree RSS with the real ``qwen --acp`` behind a fake model, packed
(``--sessions-per-agent 12``), with multi-user auth (JWTs from a JWKS file).

    .venv/bin/python scripts/bench_tenants.py [--modes 1p,3p,base-1p,base-3p] [--runs 3]
        [--per-principal 4] [--principals 3] [--gap-s 0.5] [--base-root DIR]

Modes (each a fresh daemon on the same workspace and fake model; ``base-<mode>`` runs the
daemon of the source tree ``--base-root``, e.g. ``git archive main`` unpacked: before/after):

* ``1p`` — one principal creates ``--per-principal`` sessions (the figure per principal);
* ``3p`` — ``--principals`` principals create ``--per-principal`` sessions each, one after
  the other in turn (a, b, c, a, b, c ...): 12 sessions of 3 principals by default;
* ``1p12`` — one principal creates ``principals x per-principal`` sessions (packing within
  a principal: all in one child).

Each session is created (``POST /session``, ``sessionScope: thread``) and prompted once;
then the tree RSS (VmRSS summed over the daemon and its descendants) with every session
live, and the number of agent processes. Helpers (RSS, the prompt's timing, start/stop)
are ``scripts/bench_density.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_density as bd  # noqa: E402  (beside this file)

TOKEN = bd.TOKEN
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank")


def _jwks(tmp: Path) -> tuple[Path, Any]:
    """A JWKS file and a signer (keys made here with cryptography)."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    path = tmp / "jwks.json"
    path.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}))

    def sign(sub: str) -> str:
        now = int(time.time())
        claims = {"sub": sub, "aud": "bench", "iss": "https://idp.bench", "iat": now}
        return jwt.encode({**claims, "exp": now + 3600}, key, "RS256", headers={"kid": "k1"})

    return path, sign


async def drive(url: str, result: bd.Result, order: list[str], tokens: dict[str, str]) -> None:
    clients = {
        name: httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {tok}"}, timeout=300
        )
        for name, tok in tokens.items()
    }
    try:
        for i, name in enumerate(order):
            client = clients[name]
            t0 = time.perf_counter()
            created = await client.post("/session", json={"sessionScope": "thread"})
            elapsed = (time.perf_counter() - t0) * 1000
            if created.status_code != 200:
                result.errors.append(f"create {i}: {created.status_code} {created.text[:160]}")
                continue
            result.create_ms.append(elapsed)
            sid = created.json()["sessionId"]
            try:
                result.prompt_ms.append(await bd.prompt_once(client, sid, f"hello {i}"))
            except Exception as exc:  # reported, the run goes on
                result.errors.append(f"prompt {i}: {exc}")
            await trio.sleep(GAP_S)
    finally:
        for c in clients.values():
            await c.aclose()


GAP_S = 0.5


def run_mode(mode: str, cli: Path, tmp: Path, env: dict[str, str], args: argparse.Namespace):
    from tests.support.node import qwen_acp_argv

    kind = mode.removeprefix("base-")
    n = args.per_principal
    names = list(NAMES[: args.principals])
    order = {
        "1p": [names[0]] * n,
        "3p": [name for _ in range(n) for name in names],
        "1p12": [names[0]] * (n * len(names)),
    }[kind]
    jwks, sign = _jwks(tmp)
    tokens = {name: sign(name) for name in set(order)}
    port = bd.free_port()
    extra = [
        "--sessions-per-agent",
        str(n * len(names)),
        "--warm-agents",
        "1",
        "--auth-jwks-file",
        str(jwks),
        "--auth-issuer",
        "https://idp.bench",
        "--auth-audience",
        "bench",
        "--auth-algorithms",
        "RS256",
    ]
    agent = shlex.join(qwen_acp_argv(cli))
    state = tmp / f"state-{mode}-{time.monotonic_ns()}"
    argv = bd.acp_serve_argv(tmp / "ws", state, port, agent, extra)
    cwd = Path(args.base_root) if mode.startswith("base-") else ROOT
    result = bd.Result(mode)
    proc = bd.start(argv, env, port, cwd, tmp / f"{mode}.log")
    try:
        time.sleep(args.settle_s)
        result.idle_rss = bd.tree_rss_mib(proc.pid)
        trio.run(drive, f"http://127.0.0.1:{port}", result, order, tokens)
        time.sleep(2.0)
        result.loaded_rss = bd.tree_rss_mib(proc.pid)
        result.agents = bd.agent_count(proc.pid)
    finally:
        bd.stop(proc)
    return result


def main() -> int:
    global GAP_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="1p,3p,1p12,base-3p,base-1p12")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--per-principal", type=int, default=4)
    parser.add_argument("--principals", type=int, default=3)
    parser.add_argument("--gap-s", type=float, default=0.5)
    parser.add_argument("--settle-s", type=float, default=8.0)
    parser.add_argument("--base-root", default=str(ROOT))
    args = parser.parse_args()
    GAP_S = args.gap_s

    from tests.support.fake_openai import FakeOpenAI
    from tests.support.node import ensure_qwen, qwen_env

    cli = ensure_qwen()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    (tmp / "ws").mkdir()
    runs: dict[str, list[bd.Result]] = {}
    with FakeOpenAI(workdir=str(tmp / "ws")) as model:
        env = qwen_env(tmp / "home", model.env())
        env["QWEN_SERVER_TOKEN"] = TOKEN
        for run in range(args.runs):
            for mode in args.modes.split(","):
                r = run_mode(mode, cli, tmp, env, args)
                runs.setdefault(mode, []).append(r)
                print(
                    f"run {run + 1} {mode}: {len(r.create_ms)} sessions, {len(r.errors)} errors, "
                    f"create p50 {r.create_p50:.0f} ms, tree {r.loaded_rss:.0f} MiB, "
                    f"{r.agents} agents",
                    file=sys.stderr,
                )
                for err in r.errors[:5]:
                    print(f"  {err}", file=sys.stderr)
    rows = [
        ("sessions", lambda r: float(len(r.create_ms)), "{:.0f}"),
        ("create first (ms)", lambda r: r.first_create, "{:.0f}"),
        ("create p50 (ms)", lambda r: r.create_p50, "{:.0f}"),
        ("first prompt p50 (ms)", lambda r: r.prompt_p50, "{:.0f}"),
        ("tree RSS idle (MiB)", lambda r: r.idle_rss, "{:.0f}"),
        ("tree RSS loaded (MiB)", lambda r: r.loaded_rss, "{:.0f}"),
        ("agent processes", lambda r: float(r.agents), "{:.0f}"),
    ]
    modes = list(runs)
    print(f"\nmedian of {args.runs} run(s); load average {os.getloadavg()[0]:.2f}")
    print("| metric | " + " | ".join(modes) + " |")
    print("|---" * (len(modes) + 1) + "|")
    for name, one, fmt in rows:
        cells = [fmt.format(statistics.median(one(x) for x in runs[m])) for m in modes]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
