"""The Quart-Trio app: a thin front that parses, asks an actor, and encodes.

Error handling lives here and in :mod:`serve.http.errors` only: an :class:`ApiError` becomes
its JSON body and status; werkzeug's 404/405/413 become the reference's envelopes; any
other exception is logged and answered ``500 {"error":"Internal server error"}`` (a bug
of ours, never a client's fault).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from acp import telemetry
from serve.http import access, capabilities, forward, metrics, middleware, restore_hint, tracing
from serve.http.capabilities import Feature
from serve.http.context import FEATURES_KEY, HOST_KEY
from serve.http.errors import ApiError, to_api_error
from serve.http.keepalive import ShieldLastBody
from serve.http.routes import (
    acp,
    auth,
    bind,
    budget,
    docs,
    drain,
    elicitation,
    extensions,
    files,
    health,
    mcp,
    members,
    memory_settings,
    pending,
    permissions,
    sessions,
    shell,
    status,
    webhooks,
    workspace,
)
from serve.http.wire import json_response
from serve.journal import SharedJournal
from serve.sessions.errors import SessionNotFound

if TYPE_CHECKING:
    from serve.host import Host

log = logging.getLogger(__name__)

#: Every route module; each exposes ``blueprint`` and may export ``FEATURES`` (its capability
#: tags) and ``PLURAL_ROUTES`` (its workspace-qualified rules). Blueprints are registered in
#: this order.
ROUTE_MODULES: tuple[ModuleType, ...] = (
    acp,
    auth,
    bind,
    docs,
    drain,
    extensions,
    files,
    health,
    mcp,
    memory_settings,
    permissions,
    sessions,
    shell,
    status,
    workspace,
    budget,
    elicitation,
    pending,
    members,
    webhooks,
)
#: The order of the tags in ``GET /capabilities`` (as published: session tags first, the
#: ACP transport tags last, the others in registration order).
_FEATURE_ORDER: tuple[ModuleType, ...] = (
    sessions,
    *(m for m in ROUTE_MODULES if m not in (sessions, acp)),
    acp,
)


def collect_features() -> tuple[Feature, ...]:
    """Every tag the app serves, from the route modules, the tags that span modules, and the
    security front's, in ``/capabilities`` order."""
    served = capabilities.collect(
        capabilities.BASE_FEATURES, *(getattr(m, "FEATURES", ()) for m in _FEATURE_ORDER)
    )
    known = {f.tag: f for f in served}
    plural_rules = tuple(
        rule
        for module in _FEATURE_ORDER
        if (routes := getattr(module, "PLURAL_ROUTES", None)) is not None
        for rule in routes.rules
    )
    # Multi-workspace tags: on when more than one workspace runtime is active (and, for
    # rewind and shell, when the per-session feature itself is advertised).
    spanning = [
        Feature("workspace_qualified_rest_core", plural_rules),
        Feature(
            "multi_workspace_sessions",
            (("POST", "/session"), ("GET", "/workspaces/<path:workspace>/sessions")),
            when=lambda h: len(h.registry) > 1,
        ),
    ]
    for tag, base in (
        ("multi_workspace_session_rewind", "session_rewind"),
        ("multi_workspace_session_shell", "session_shell_command"),
    ):
        feature = known.get(base)
        if feature is not None:
            spanning.append(Feature(tag, feature.routes, when=_multi_and(feature)))
    return capabilities.collect(served, spanning, middleware.FEATURES)


def _multi_and(feature: Feature) -> Callable[[Host], bool]:
    def predicate(h: Host) -> bool:
        return len(h.registry) > 1 and bool(feature.enabled(h))

    return predicate


def create_app(host: Host) -> QuartTrio:
    # No implicit /static/<path> route (it would serve files from the working directory).
    app = QuartTrio("acp_serve", static_folder=None)
    app.config.update(
        RESPONSE_TIMEOUT=None,
        MAX_CONTENT_LENGTH=host.settings.max_body_bytes,
        BODY_TIMEOUT=60,
        JSON_SORT_KEYS=False,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    features = collect_features()
    app.extensions[HOST_KEY] = host
    app.extensions[FEATURES_KEY] = features
    # Workspace paths travel URL-encoded in route segments (%2Fwork%2Fproj): keep "//".
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False

    for module in ROUTE_MODULES:
        app.register_blueprint(module.blueprint)
    tracing.install(app)  # a request's W3C traceparent header, into its log records
    instruments = metrics.install_metrics(app, host)
    access.install(app, host)  # the route rules, only with multi-user auth
    if isinstance(host.journal, SharedJournal):  # many daemons on one shared journal
        forward.install(app, host.journal)
    # Around the framework: a keep-alive connection becomes idle again after any response
    # of the app, and the app's calls in flight are counted for the drain.
    # quart types asgi_app as its own method; any ASGI callable serves (ASGI middleware).
    inner = ShieldLastBody(app.asgi_app, host.front)  # type: ignore[arg-type]
    app.asgi_app = inner  # type: ignore[assignment,method-assign]
    # Outermost: the security front (it counts the requests it answers itself).
    middleware.install_middleware(app, host, features, instruments)
    if telemetry.enabled():  # OpenTelemetry: a span around every request (serve/telemetry)
        traced = tracing.TracedFront(app.asgi_app)  # type: ignore[arg-type]
        app.asgi_app = traced  # type: ignore[assignment,method-assign]

    @app.errorhandler(ApiError)
    async def _api_error(exc: ApiError) -> Response:
        return json_response(exc.body, exc.status, exc.headers)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 413:
            return json_response({"error": host.settings.body_too_large_message}, 413)
        if status == 404:
            return json_response({"error": "Not found"}, 404)
        if status == 405:
            return json_response({"error": "Method not allowed"}, 405)
        return json_response({"error": exc.description or exc.name}, status)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        mapped = to_api_error(exc)
        if mapped is not None:
            if isinstance(exc, SessionNotFound):
                await restore_hint.add_load_hint(exc.session_id, mapped.body)
            return json_response(mapped.body, mapped.status, mapped.headers)
        log.exception("unhandled error", exc_info=exc)
        return json_response({"error": "Internal server error"}, 500)

    return app
