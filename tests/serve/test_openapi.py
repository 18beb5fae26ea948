"""The OpenAPI 3.1 document: complete, tagged, valid, and true to what the daemon answers.

* every registered (method, rule) is an operation (walked from the app, as the route does);
* every capability tag's routes exist and carry the tag;
* the document validates as OpenAPI 3.1 (openapi-spec-validator);
* responses of a real daemon validate against the documented schema for their status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from serve.errors import SESSION_ERRORS
from serve.http import capabilities
from serve.http.app import collect_features, create_app
from serve.http.middleware import PUBLIC_PAGES
from serve.http.openapi import Route, build_document, path_template, registered_routes
from serve.http.openapi.catalog import CATALOG
from serve.http.openapi.types import APPROVAL_MODES
from serve.runtime.build import build_host
from serve.sessions.actor import APPROVAL_MODES as ACTOR_APPROVAL_MODES
from serve.settings import parse_settings
from tests.conftest import AUTH
from tests.support.daemon import DaemonProcess

FEATURES = collect_features()


def _document(tmp_path: Path, *args: str) -> tuple[dict[str, Any], set[tuple[str, str]]]:
    settings = parse_settings(["--workspace", str(tmp_path), *args], {"HOME": str(tmp_path)})
    d, _ = build_host(settings)
    app = create_app(d)
    routes = registered_routes(app.url_map.iter_rules(), app.view_functions)
    advertised = [f.tag for f in capabilities.advertised(d, FEATURES)]
    doc = build_document(routes, FEATURES, advertised)
    registered = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        for method in rule.methods or ():
            if method not in ("HEAD", "OPTIONS"):
                registered.add((method, rule.rule))
    return doc, registered


def _operations(doc: dict[str, Any]) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """(METHOD, rule) → (path template, operation)."""
    out = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            out[(method.upper(), op["x-quart-rule"])] = (path, op)
    return out


# ---- the document, in process ----------------------------------------------------------------


def test_every_registered_route_is_an_operation(tmp_path: Path) -> None:
    doc, registered = _document(tmp_path)
    ops = _operations(doc)
    assert set(ops) == registered
    for (_, rule), (path, op) in ops.items():
        assert path == path_template(rule)[0]
        assert op["summary"]
        assert op["responses"]


def test_every_capability_tag_maps_to_operations_that_carry_it(tmp_path: Path) -> None:
    doc, _ = _document(tmp_path)
    ops = _operations(doc)
    assert [t["name"] for t in doc["tags"]] == [f.tag for f in FEATURES]
    for feature in FEATURES:
        for route in feature.routes:
            assert route in ops, f"tag {feature.tag}: {route} is not in the document"
            assert feature.tag in ops[route][1]["tags"]
    used = {tag for _, op in ops.values() for tag in op.get("tags", ())}
    assert used <= {f.tag for f in FEATURES}


def test_advertised_flags_follow_the_daemon_settings(tmp_path: Path) -> None:
    plain, _ = _document(tmp_path)
    limited, _ = _document(tmp_path, "--rate-limit")
    flag = {t["name"]: t["x-advertised"] for t in plain["tags"]}
    assert flag["session_create"] is True
    assert flag["rate_limit"] is False
    assert {t["name"]: t["x-advertised"] for t in limited["tags"]}["rate_limit"] is True


def test_document_is_valid_openapi_3_1(tmp_path: Path) -> None:
    doc, _ = _document(tmp_path)
    assert doc["openapi"] == "3.1.0"
    errors = [e.message for e in _spec_validator()(doc).iter_errors()]
    assert errors == []


def test_operation_ids_are_unique(tmp_path: Path) -> None:
    doc, _ = _document(tmp_path)
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_strict_routes_are_marked(tmp_path: Path) -> None:
    doc, _ = _document(tmp_path)
    ops = _operations(doc)
    assert ops[("POST", "/file/write")][1].get("x-strict") is True
    assert "x-strict" not in ops[("POST", "/session/<session_id>/prompt")][1]
    assert ops[("GET", "/health")][1]["security"] == [{}, {"bearerAuth": []}]
    assert ops[("GET", "/capabilities")][1]["security"] == [{"bearerAuth": []}]


def test_catalog_entries_use_registered_rules(tmp_path: Path) -> None:
    """A catalog entry whose rule is misspelled would never be used: catch it."""
    _, registered = _document(tmp_path)
    core = {
        ("POST", "/session"),
        ("POST", "/session/<session_id>/prompt"),
        ("GET", "/session/<session_id>/events"),
        ("POST", "/session/<session_id>/permission/<request_id>"),
        ("POST", "/file/write"),
        ("GET", "/openapi.json"),
    }
    assert core <= set(CATALOG) & registered


@pytest.mark.parametrize(
    ("rule", "template", "params"),
    [
        ("/health", "/health", []),
        ("/session/<session_id>", "/session/{session_id}", [("session_id", "default")]),
        (
            "/workspace/<path:workspace>/sessions",
            "/workspace/{workspace}/sessions",
            [("workspace", "path")],
        ),
        (
            "/session/<string(length=36):sid>/p/<int:n>",
            "/session/{sid}/p/{n}",
            [("sid", "string"), ("n", "int")],
        ),
    ],
)
def test_path_template(rule: str, template: str, params: list[tuple[str, str]]) -> None:
    assert path_template(rule) == (template, params)


def test_workspace_qualified_twins_share_the_primary_entry() -> None:
    from serve.http.openapi.catalog import lookup

    for rule, twin in [
        ("/workspaces/<path:workspace>/file", ("GET", "/file")),
        ("/workspaces//<path:workspace>/env", ("GET", "/workspace/env")),
        ("/workspaces/<path:workspace>/sessions", ("GET", "/workspace/<path:workspace>/sessions")),
    ]:
        found = lookup("GET", rule)
        assert found is not None and found.replies == CATALOG[twin].replies
    assert lookup("GET", "/workspaces/<path:workspace>/nothing-like-it") is None


def test_every_operation_lists_its_statuses_and_has_no_default(tmp_path: Path) -> None:
    """The front's refusals on every operation, the session table on every session route,
    JSON-RPC error replies on /acp: statuses come from the tables, not a hand list."""
    doc, _ = _document(tmp_path)
    session_statuses = {str(status) for _, status, _ in SESSION_ERRORS}
    for (method, rule), (_, op) in _operations(doc).items():
        responses = op["responses"]
        assert "default" not in responses, (method, rule)
        assert {"400", "403", "408", "413"} <= set(responses), (method, rule)
        if rule not in PUBLIC_PAGES:
            assert "401" in responses, (method, rule)
        if rule.startswith("/session/<session_id>"):
            assert session_statuses <= set(responses), (method, rule)
    ops = _operations(doc)
    acp_415 = ops[("POST", "/acp")][1]["responses"]["415"]["content"]["application/json"]
    assert acp_415["schema"] == {"$ref": "#/components/schemas/ErrorReply"}
    prompt_429 = ops[("POST", "/session/<session_id>/prompt")][1]["responses"]["429"]
    assert prompt_429["headers"]["Retry-After"]["required"] is True


def test_a_new_session_route_is_documented_and_linked_without_an_entry(tmp_path: Path) -> None:
    settings = parse_settings(["--workspace", str(tmp_path)], {"HOME": str(tmp_path)})
    d, _ = build_host(settings)
    app = create_app(d)
    routes = registered_routes(app.url_map.iter_rules(), app.view_functions)
    routes.append(Route("GET", "/session/<session_id>/members", "members", "Who is in it."))
    doc = build_document(routes, FEATURES, [])
    op = doc["paths"]["/session/{session_id}/members"]["get"]
    assert {str(status) for _, status, _ in SESSION_ERRORS} <= set(op["responses"])
    links = doc["paths"]["/session"]["post"]["responses"]["200"]["links"]
    assert links["members"]["parameters"] == {"path.session_id": "$response.body#/sessionId"}


def test_approval_modes_match_the_session_actor() -> None:
    assert APPROVAL_MODES == ACTOR_APPROVAL_MODES


# ---- the live daemon -------------------------------------------------------------------------


def _spec_validator() -> Any:
    module = pytest.importorskip(
        "openapi_spec_validator", reason="pip install openapi-spec-validator"
    )
    return module.OpenAPIV31SpecValidator


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    jsonschema = pytest.importorskip("jsonschema", reason="pip install jsonschema")
    # Refs are "#/components/schemas/X": make the components part of the root schema.
    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def _conforms(doc: dict[str, Any], response: httpx.Response, method: str, rule: str) -> None:
    ops = _operations(doc)
    _, op = ops[(method, rule)]
    documented = op["responses"].get(str(response.status_code))
    assert documented is not None, (
        f"{method} {rule} answered {response.status_code}, which is not documented: "
        f"{response.text[:300]}"
    )
    content = documented.get("content")
    if content is None:
        assert response.content == b""
        return
    ((media, body),) = content.items()
    assert response.headers["content-type"].startswith(media)
    if media == "application/json":
        errors = [e.message for e in _validator(doc, body["schema"]).iter_errors(response.json())]
        assert errors == [], f"{method} {rule} {response.status_code}: {errors}"


async def test_served_document_matches_and_is_public(daemon_proc: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as client:
        res = await client.get("/openapi.json")
        caps = (await client.get("/capabilities")).json()
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("application/json")
    doc = res.json()
    assert _spec_validator()(doc).is_valid()
    advertised = {t["name"] for t in doc["tags"] if t["x-advertised"]}
    assert advertised == set(caps["features"])
    async with httpx.AsyncClient(base_url=daemon_proc.url, timeout=30) as anonymous:
        # The description and the pages carry no data: no token needed (the API is).
        assert (await anonymous.get("/openapi.json")).status_code == 200
        assert (await anonymous.get("/demo")).status_code == 200
        assert (await anonymous.get("/capabilities")).status_code == 401


async def test_real_responses_conform_to_the_document(daemon_proc: DaemonProcess) -> None:
    async with httpx.AsyncClient(base_url=daemon_proc.url, headers=AUTH, timeout=30) as c:
        doc = (await c.get("/openapi.json")).json()

        async def check(method: str, rule: str, path: str, **kw: Any) -> httpx.Response:
            res = await c.request(method, path, **kw)
            _conforms(doc, res, method, rule)
            return res

        await check("GET", "/health", "/health")
        await check("GET", "/capabilities", "/capabilities")
        await check("GET", "/readyz", "/readyz")
        created = await check("POST", "/session", "/session", json={"sessionScope": "thread"})
        assert created.status_code == 200
        sid, cid = created.json()["sessionId"], created.json()["clientId"]
        who = {"X-Qwen-Client-Id": cid}
        base = f"/session/{sid}"
        await check("POST", "/session", "/session", json={"sessionScope": "bogus"})
        await check("POST", "/session/<session_id>/heartbeat", f"{base}/heartbeat", headers=who)
        await check("GET", "/session/<session_id>/context", f"{base}/context")
        await check("GET", "/session/<session_id>/supported-commands", f"{base}/supported-commands")
        await check(
            "PATCH",
            "/session/<session_id>/metadata",
            f"{base}/metadata",
            json={"displayName": "renamed"},
            headers=who,
        )
        accepted = await check(
            "POST",
            "/session/<session_id>/prompt",
            f"{base}/prompt",
            json={"prompt": [{"type": "text", "text": "hello"}]},
            headers={**who, "Prefer": "respond-async"},
        )
        assert accepted.status_code == 202
        blocking = await check(
            "POST",
            "/session/<session_id>/prompt",
            f"{base}/prompt",
            json={"prompt": [{"type": "text", "text": "again"}]},
            headers=who,
        )
        assert blocking.status_code == 200
        await check("POST", "/session/<session_id>/prompt", f"{base}/prompt", json={"prompt": []})
        await check(
            "GET", "/session/<session_id>/pending-prompts", f"{base}/pending-prompts", headers=who
        )
        await check(
            "DELETE",
            "/session/<session_id>/pending-prompts/<prompt_id>",
            f"{base}/pending-prompts/nope",
            headers=who,
        )
        await check("GET", "/workspace/permissions", "/workspace/permissions")
        await check(
            "GET",
            "/workspace/<path:workspace>/sessions",
            "/workspace/" + str(daemon_proc.workspace.resolve()).lstrip("/") + "/sessions",
        )
        await check(
            "POST",
            "/session/<session_id>/permission/<request_id>",
            f"{base}/permission/nope",
            json={"outcome": {"outcome": "cancelled"}},
        )
        await check("POST", "/session/<session_id>/cancel", "/session/missing/cancel")
        written = await check(
            "POST",
            "/file/write",
            "/file/write",
            json={"path": "conform.txt", "content": "x\n", "mode": "create"},
            headers=who,
        )
        assert written.status_code == 201
        await check(
            "POST",
            "/file/write",
            "/file/write",
            content=b"\x00",
            headers={"Content-Type": "application/json"},
        )
        await check("GET", "/file", "/file", params={"path": "conform.txt"})
        await check("GET", "/file", "/file", params={"path": "missing.txt"})
        if ("GET", "/workspaces/<path:workspace>/file") in _operations(doc):
            await check(
                "GET",
                "/workspaces/<path:workspace>/file",
                "/workspaces/" + str(daemon_proc.workspace.resolve()).lstrip("/") + "/file",
                params={"path": "conform.txt"},
            )
        await check("GET", "/file/bytes", "/file/bytes", params={"path": "conform.txt"})
        await check("GET", "/stat", "/stat", params={"path": "conform.txt"})
        await check("GET", "/list", "/list")
        await check("GET", "/glob", "/glob", params={"pattern": "*.txt"})
        await check("GET", "/workspace/env", "/workspace/env")
        await check("GET", "/workspace/skills", "/workspace/skills")
        await check("DELETE", "/session/<session_id>", base, headers=who)


def test_wire_structs_roundtrip_what_the_daemon_sends() -> None:
    """The catalog's Structs decode the reference's documented examples (spec §4.2)."""
    from serve.http.openapi.types import PromptAccepted, SessionResponse

    body = b'{"sessionId":"s","workspaceCwd":"/w","attached":false,"clientId":"c","createdAt":"t"}'
    assert msgspec.json.decode(body, type=SessionResponse).client_id == "c"
    accepted = msgspec.json.decode(
        b'{"promptId":"p","lastEventId":3,"eventEpoch":"e","extra":1}', type=PromptAccepted
    )
    assert accepted.last_event_id == 3
