"""Build the OpenAPI 3.1 document from the registered routes, the catalog and the features.

Theory of operation
-------------------
:func:`registered_routes` walks a Quart ``url_map`` and yields one :class:`Route` per
(method, rule) pair, skipping ``HEAD``/``OPTIONS`` (implicit), Quart's ``static``
endpoint and WebSocket rules (an upgrade is not an HTTP operation; ``GET /acp`` is
documented by its HTTP rule). :func:`build_document` turns each route into one operation:

* the path template comes from the rule (``<path:workspace>`` → ``{workspace}``, the
  converter decides the parameter schema), and ``x-quart-rule`` keeps the rule, so a
  client or test can map an operation back to the ``(METHOD, rule)`` pairs that
  :class:`serve.http.capabilities.Feature` and :data:`serve.http.security.STRICT_ROUTES` use;
* body, parameters and replies come from :func:`serve.http.openapi.catalog.lookup` (the
  workspace-qualified twins share their primary route's entry), or a generic open-JSON
  operation when the route has no entry; to those :mod:`serve.http.openapi.replies` adds
  the rule's error families and the security front's refusals, and :func:`_responses`
  merges them status by status. There is no ``default`` response: every status an
  operation can answer is listed;
* ``POST /session``'s 200 links to every operation that takes ``{session_id}``;
* ``tags`` are the capability tags whose feature lists this route; the top-level ``tags``
  list every registered feature with ``x-advertised`` (does this daemon advertise it now);
* ``security``: the bearer scheme on every route, optional on ``public`` ones; routes the
  strict gate covers carry ``x-strict: true``.

Schemas: every body type is collected and passed once to
``msgspec.json.schema_components`` with ``#/components/schemas/{name}`` refs (JSON Schema
2020-12, which OpenAPI 3.1 uses as is).

The document depends only on the registered routes, the feature list and which features
are advertised; :class:`DocumentCache` encodes it once per distinct advertised set (a
feature may turn on at run time). Pure: no I/O; raises only on a programming error (a
catalog type msgspec cannot describe), which the route turns into a 500.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from serve.http.capabilities import Feature
from serve.http.openapi import catalog as cat
from serve.http.openapi import replies as rp
from serve.http.openapi.types import ErrorEnvelope
from serve.http.security.strict import is_strict

if TYPE_CHECKING:
    from werkzeug.routing import Rule

__all__ = [
    "OPENAPI_VERSION",
    "DocumentCache",
    "Route",
    "build_document",
    "path_template",
    "registered_routes",
]

OPENAPI_VERSION: Final = "3.1.0"
_SKIP_METHODS: Final = frozenset({"HEAD", "OPTIONS"})
_RULE_PARAM: Final = re.compile(
    r"<(?:(?P<conv>[a-zA-Z_][a-zA-Z0-9_]*)(?:\([^)]*\))?:)?(?P<name>\w+)>"
)
_CONVERTER_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "int": {"type": "integer", "minimum": 0},
    "float": {"type": "number", "minimum": 0},
    "uuid": {"type": "string", "format": "uuid"},
    "path": {"type": "string", "minLength": 1},
    "default": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
    "string": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
    "any": {"type": "string"},
}
_REF = "#/components/schemas/{name}"


class Route(msgspec.Struct, frozen=True):
    """A registered route: method, Quart rule, endpoint and its handler's docstring."""

    method: str
    rule: str
    endpoint: str
    doc: str = ""


def registered_routes(
    rules: Iterable[Rule], view_functions: Mapping[str, Callable[..., object]]
) -> list[Route]:
    """One :class:`Route` per (method, rule) of a ``url_map``, sorted by rule then method."""
    out: list[Route] = []
    for rule in rules:
        if rule.endpoint == "static" or rule.websocket:
            continue  # a WebSocket upgrade is not an HTTP operation
        view = view_functions.get(rule.endpoint)
        doc = (getattr(view, "__doc__", None) or "").strip()
        for method in sorted(set(rule.methods or ()) - _SKIP_METHODS):
            out.append(Route(method, rule.rule, rule.endpoint, doc))
    out.sort(key=lambda r: (r.rule, r.method))
    return out


def path_template(rule: str) -> tuple[str, list[tuple[str, str]]]:
    """``/a/<path:ws>/b`` → (``/a/{ws}/b``, ``[("ws", "path")]``)."""
    params: list[tuple[str, str]] = []

    def repl(match: re.Match[str]) -> str:
        params.append((match["name"], match["conv"] or "default"))
        return "{" + match["name"] + "}"

    return _RULE_PARAM.sub(repl, rule), params


def _operation_ids(routes: Sequence[Route]) -> dict[tuple[str, str], str]:
    """``endpoint`` when it serves one (method, rule), else suffixed with method and index."""
    counts: dict[str, int] = {}
    for r in routes:
        counts[r.endpoint] = counts.get(r.endpoint, 0) + 1
    ids: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for r in routes:
        base = r.endpoint if counts[r.endpoint] == 1 else f"{r.endpoint}_{r.method.lower()}"
        op_id, n = base, 1
        while op_id in used:
            n += 1
            op_id = f"{base}_{n}"
        used.add(op_id)
        ids[(r.method, r.rule)] = op_id
    return ids


class _Schemas:
    """Collects body types; resolves each to a schema (a ``$ref`` for Structs) at the end."""

    def __init__(self) -> None:
        self._types: list[object] = []  # type expressions (a Struct class, dict[str, Any], ...)
        self._index: dict[object, int] = {}

    def slot(self, tp: object) -> int:
        if tp not in self._index:
            self._index[tp] = len(self._types)
            self._types.append(tp)
        return self._index[tp]

    def slots(self, body: object) -> tuple[int, ...]:
        """Slots of a body type, or of each type of a tuple of alternatives (``anyOf``)."""
        return tuple(self.slot(tp) for tp in (body if isinstance(body, tuple) else (body,)))

    def resolve(self) -> tuple[tuple[dict[str, Any], ...], dict[str, Any]]:
        return msgspec.json.schema_components(self._types, ref_template=_REF)


def _first_line(doc: str) -> str:
    return doc.splitlines()[0].strip().rstrip(".") if doc else ""


def _generic(route: Route) -> cat.Operation:
    return cat.Operation(
        _first_line(route.doc) or route.endpoint, (cat.Reply(200, "OK", dict[str, Any]),)
    )


def build_document(
    routes: Sequence[Route],
    features: Sequence[Feature],
    advertised: Iterable[str],
    *,
    version: str = "0.1.0",
) -> dict[str, Any]:
    """The OpenAPI 3.1 document (a JSON-ready dict) for ``routes``."""
    advertised_set = set(advertised)
    tags_of: dict[tuple[str, str], list[str]] = {}
    for feature in features:
        for pair in feature.routes:
            tags_of.setdefault(pair, []).append(feature.tag)
    op_ids = _operation_ids(routes)
    schemas = _Schemas()
    schemas.slot(ErrorEnvelope)
    for extra in cat.EXTRA_SCHEMAS:
        schemas.slot(extra)

    # First pass: operations with integer placeholders where schemas go.
    paths: dict[str, dict[str, Any]] = {}
    pending: list[tuple[dict[str, Any], tuple[int, ...]]] = []  # (media object, slots)
    for route in routes:
        documented = cat.lookup(route.method, route.rule)
        op = documented if documented is not None else _generic(route)
        template, path_params = path_template(route.rule)
        operation: dict[str, Any] = {
            "operationId": op_ids[(route.method, route.rule)],
            "summary": op.summary,
        }
        description = op.description if documented is not None else route.doc
        if description:
            operation["description"] = description
        tags = tags_of.get((route.method, route.rule))
        if tags:
            operation["tags"] = tags
        parameters: list[dict[str, Any]] = [
            {
                "name": name,
                "in": "path",
                "required": True,
                "description": cat.PATH_PARAMS.get(name, ""),
                "schema": dict(_CONVERTER_SCHEMAS.get(conv, _CONVERTER_SCHEMAS["default"])),
            }
            for name, conv in path_params
        ]
        for p in op.params:
            param: dict[str, Any] = {"name": p.name, "in": p.location, "schema": dict(p.schema)}
            if p.description:
                param["description"] = p.description
            if p.required:
                param["required"] = True
            parameters.append(param)
        if parameters:
            operation["parameters"] = parameters
        if op.body is not None:
            media: dict[str, Any] = {}
            pending.append((media, schemas.slots(op.body)))
            operation["requestBody"] = {
                "required": op.body_required,
                "content": {rp.JSON: media},
            }
        replies = [
            *op.replies,
            *rp.family_replies(
                op.families if op.families is not None else rp.families_of(route.method, route.rule)
            ),
            *rp.front_replies(route.method, route.rule, has_params=bool(path_params)),
        ]
        operation["responses"] = _responses(replies, schemas, pending)
        operation["security"] = [{}, {"bearerAuth": []}] if op.public else [{"bearerAuth": []}]
        operation["x-quart-rule"] = route.rule
        if is_strict(route.method, route.rule):
            operation["x-strict"] = True
        paths.setdefault(template, {})[route.method.lower()] = operation

    _link_sessions(paths)
    resolved, components = schemas.resolve()
    for media_object, slots in pending:
        alternatives = [resolved[slot] for slot in slots]
        media_object["schema"] = (
            alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
        )

    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "acp-serve",
            "version": version,
            "description": (
                "The qwen serve v1 HTTP + SSE protocol served by acp-serve. Send "
                "`Authorization: Bearer <token>` when the daemon has a token. Operation "
                "tags are capability tags: check `GET /capabilities` before using one."
            ),
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "tags": [
            {
                "name": f.tag,
                "description": _tag_description(f),
                "x-advertised": f.tag in advertised_set,
            }
            for f in features
        ],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The daemon token (--token or QWEN_SERVER_TOKEN).",
                }
            },
        },
    }


#: The operation whose answer names a session (``sessionId``) and its caller (``clientId``).
_SESSION_SOURCE: Final = ("/session", "post", "200")


def _link_sessions(paths: dict[str, dict[str, Any]]) -> None:
    """OpenAPI links from ``POST /session`` to every operation that takes ``{session_id}``
    (with the issued ``clientId`` as ``X-Qwen-Client-Id`` where the operation takes it), so
    a client generator or a stateful fuzzer can follow a created session through them."""
    path, method, status = _SESSION_SOURCE
    source = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
    if source is None:
        return
    links: dict[str, Any] = {}
    for item in paths.values():
        for op in item.values():
            params = {(p["in"], p["name"]) for p in op.get("parameters", ())}
            if ("path", "session_id") not in params:
                continue
            values = {"path.session_id": "$response.body#/sessionId"}
            if ("header", "X-Qwen-Client-Id") in params:
                values["header.X-Qwen-Client-Id"] = "$response.body#/clientId"
            links[op["operationId"]] = {"operationId": op["operationId"], "parameters": values}
    if links:
        source["links"] = links


def _responses(
    replies: Sequence[rp.Reply],
    schemas: _Schemas,
    pending: list[tuple[dict[str, Any], tuple[int, ...]]],
) -> dict[str, Any]:
    """``responses`` of one operation: the replies merged status by status. Descriptions
    are joined, bodies of one media type become ``anyOf`` (each type once), and a header
    is required only when every reply of that status sends it."""
    by_status: dict[int, list[rp.Reply]] = {}
    for reply in replies:
        by_status.setdefault(reply.status, []).append(reply)
    out: dict[str, Any] = {}
    for status in sorted(by_status):
        group = by_status[status]
        descriptions = list(dict.fromkeys(r.description for r in group))
        entry: dict[str, Any] = {"description": " ".join(descriptions)}
        bodies: dict[str, list[object]] = {}
        for r in group:
            if r.body is None:
                continue
            kinds = bodies.setdefault(r.media, [])
            for tp in r.body if isinstance(r.body, tuple) else (r.body,):
                if tp not in kinds:
                    kinds.append(tp)
        if bodies:
            content: dict[str, Any] = {}
            for media, kinds in bodies.items():
                media_object: dict[str, Any] = {}
                pending.append((media_object, schemas.slots(tuple(kinds))))
                content[media] = media_object
            entry["content"] = content
        names = list(dict.fromkeys(n for r in group for n in r.headers))
        if names:
            entry["headers"] = {
                name: {
                    "description": rp.HEADERS[name][1],
                    "required": all(name in r.headers for r in group),
                    "schema": dict(rp.HEADERS[name][0]),
                }
                for name in names
            }
        out[str(status)] = entry
    return out


def _tag_description(feature: Feature) -> str:
    routes = ", ".join(f"{m} {r}" for m, r in feature.routes)
    text = f"Since {feature.since}. Routes: {routes}."
    if feature.modes:
        text += " Modes: " + ", ".join(feature.modes) + "."
    if feature.when is not None:
        text += " Conditional: advertised only when enabled on this daemon."
    return text


class DocumentCache:
    """The encoded document per distinct advertised-tag set (bounded: ``MAX_ENTRIES``)."""

    MAX_ENTRIES: Final = 16

    def __init__(self) -> None:
        self._docs: dict[frozenset[str], bytes] = {}

    def get(
        self,
        key: frozenset[str],
        build: Callable[[], dict[str, Any]],
    ) -> bytes:
        doc = self._docs.get(key)
        if doc is None:
            if len(self._docs) >= self.MAX_ENTRIES:
                self._docs.clear()
            doc = msgspec.json.encode(build())
            self._docs[key] = doc
        return doc
