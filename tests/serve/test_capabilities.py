"""The capability registry: every tag has its routes, every API route has its tag.

"Tag present means behaviour present": a tag whose route is not registered fails here, and
so does an API route no tag announces (unless it is listed below as deliberately untagged).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import msgspec
import pytest

from serve.host import Host
from serve.http import capabilities
from serve.http.app import collect_features, create_app
from serve.runtime.build import build_host
from serve.settings import parse_settings
from tests.conftest import AUTH
from tests.support.daemon import DaemonProcess

FEATURES = collect_features()

#: Routes that exist without a feature tag of their own (the reference has none for them).
UNTAGGED = {
    ("POST", "/session/<session_id>/detach"),
    ("GET", "/workspace//<path:workspace>/sessions"),
    ("GET", "/openapi.json"),
    ("GET", "/doc"),
    ("GET", "/demo"),
    ("GET", "/favicon.ico"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
}


def _app_routes(tmp_path: Path, *args: str) -> set[tuple[str, str]]:
    settings = parse_settings(["--workspace", str(tmp_path), *args], {"HOME": str(tmp_path)})
    app = create_app(build_host(settings)[0])
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule.startswith("/static"):
            continue
        for method in rule.methods or ():
            if method not in ("HEAD", "OPTIONS"):
                routes.add((method, rule.rule))
    return routes


def test_every_tag_has_registered_routes(tmp_path: Path) -> None:
    routes = _app_routes(tmp_path)
    for feature in FEATURES:
        assert feature.routes, f"tag {feature.tag} names no route"
        for route in feature.routes:
            assert route in routes, f"tag {feature.tag}: route {route} is not registered"


def test_every_api_route_has_a_tag(tmp_path: Path) -> None:
    tagged = {route for f in FEATURES for route in f.routes}
    untagged = {
        r for r in _app_routes(tmp_path) - tagged - UNTAGGED if not r[1].startswith("/static")
    }
    assert not untagged, f"routes without a capability tag: {sorted(untagged)}"


def test_tags_are_unique_and_versioned() -> None:
    tags = [f.tag for f in FEATURES]
    assert len(tags) == len(set(tags))
    assert all(f.since == "v1" for f in FEATURES)


async def test_envelope_shape(daemon_proc: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH) as client:
        body = (await client.get("/capabilities")).json()
    assert body["v"] == 1
    assert body["protocolVersions"] == {"current": "v1", "supported": ["v1"]}
    assert body["mode"] == "http-bridge"
    assert body["modelServices"] == []
    assert body["workspaceCwd"] == str(daemon_proc.workspace.resolve())
    assert body["policy"]["permission"] == "first-responder"
    assert set(body["features"]) == set(body["featureDetails"])
    assert body["featureDetails"]["permission_mediation"]["modes"] == [
        "first-responder",
        "designated",
        "consensus",
        "local-only",
    ]
    # None of these toggles is on for the shared test daemon.
    assert not ({"require_auth", "allow_origin", "rate_limit"} & set(body["features"]))


@pytest.mark.parametrize(
    ("args", "tag"),
    [
        (["--require-auth", "--token", "t0123456"], "require_auth"),
        (["--allow-origin", "https://app.example.com", "--token", "t0123456"], "allow_origin"),
        (["--rate-limit"], "rate_limit"),
    ],
)
def test_conditional_tags_follow_their_toggles(tmp_path: Path, args: list[str], tag: str) -> None:
    on = _host(tmp_path, *args)
    off = _host(tmp_path)
    assert tag in {f.tag for f in capabilities.advertised(on, FEATURES)}
    assert tag not in {f.tag for f in capabilities.advertised(off, FEATURES)}


def _host(tmp_path: Path, *args: str) -> Host:
    settings = parse_settings(["--workspace", str(tmp_path), *args], {"HOME": str(tmp_path)})
    return build_host(settings)[0]


def test_route_modules_export_what_they_serve() -> None:
    """No import-time registry: collecting twice gives the same list, and every route
    module's own FEATURES are in it."""
    from serve.http.app import ROUTE_MODULES

    assert [(f.tag, f.routes) for f in collect_features()] == [(f.tag, f.routes) for f in FEATURES]
    tags = {f.tag for f in FEATURES}
    for module in ROUTE_MODULES:
        assert {f.tag for f in getattr(module, "FEATURES", ())} <= tags


def test_the_prepared_body_follows_conditional_tags(tmp_path: Path) -> None:
    """The fast path's body (built once per combination of the conditional tags) is the
    envelope's, and changes when a predicate, plain or shared, flips."""
    settings = parse_settings(["--workspace", str(tmp_path)], {"HOME": str(tmp_path)})
    host = build_host(settings)[0]
    state = {"plain": False, "shared": frozenset[str]()}
    features = (
        *FEATURES,
        capabilities.Feature("test_plain", (("GET", "/health"),), when=lambda _: state["plain"]),
        capabilities.Feature(
            "test_shared",
            (("GET", "/health"),),
            modes=("a", "b"),
            when=capabilities.SharedPredicate(lambda _: state["shared"], "x"),
        ),
    )
    advertiser = capabilities.Advertiser(features)

    def shown() -> dict[str, object]:
        body = advertiser.body(host)
        assert body == msgspec.json.encode(capabilities.envelope(host, features))
        return json.loads(body)  # type: ignore[no-any-return]

    body = shown()
    assert "test_plain" not in body["features"] and "test_shared" not in body["features"]
    state["plain"] = True
    body = shown()
    assert "test_plain" in body["features"] and "test_shared" not in body["featureDetails"]
    state["shared"] = frozenset({"x"})
    body = shown()
    assert body["featureDetails"]["test_shared"] == {"since": "v1", "modes": ["a", "b"]}
    state["plain"] = False
    assert "test_plain" not in shown()["features"]


async def test_the_fast_path_and_the_route_name_the_same_caller(tmp_path: Path) -> None:
    """With multi-user auth ``GET /capabilities`` names the caller: the front's fast path
    (no query) and the route (a query string goes to the framework) build the same body."""
    tokens = tmp_path / "tokens.json"
    digest = hashlib.sha256(b"carol-secret").hexdigest()
    tokens.write_text(json.dumps([{"id": "c1", "sha256": digest, "principal": "carol"}]))
    host = _host(tmp_path, "--token", "t0123456", "--auth-tokens-file", str(tokens))
    app = create_app(host)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))  # type: ignore[arg-type]
    base = f"http://127.0.0.1:{host.port}"
    async with httpx.AsyncClient(transport=transport, base_url=base) as client:
        for token, caller in (
            ("carol-secret", {"id": "carol", "kind": "token", "roles": ["user"]}),
            ("t0123456", {"id": "operator", "kind": "operator", "roles": ["admin"]}),
        ):
            auth = {"Authorization": f"Bearer {token}"}
            fast = await client.get("/capabilities", headers=auth)
            routed = await client.get("/capabilities?via=route", headers=auth)
            assert fast.status_code == routed.status_code == 200
            assert fast.json() == routed.json()
            assert fast.json()["principal"] == caller
            assert fast.json()["auth"] == {"modes": ["tokens"]}
