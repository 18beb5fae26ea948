"""The Quart-Trio app: a thin front that parses, asks an actor, and encodes.

Error handling lives here and in :mod:`serve.http.errors` only: an :class:`ApiError` becomes
its JSON body and status; werkzeug's 404/405/413 become the reference's envelopes; any
other exception is logged and answered ``500 {"error":"Internal server error"}`` (a bug
of ours, never a client's fault).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from quart import Response
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from serve.http.errors import ApiError, to_api_error
from serve.http.wire import json_response

if TYPE_CHECKING:
    from serve.runtime.daemon import Daemon

log = logging.getLogger(__name__)


def route_modules() -> list[ModuleType]:
    """Every module of :mod:`serve.http.routes` (each exposes ``blueprint``), imported once."""
    import serve.http.routes as package

    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.ispkg)
    return [importlib.import_module(f"serve.http.routes.{name}") for name in names]


def _register_plural_tag() -> None:
    """Tags that span route modules, registered once every module is imported."""
    from serve.http import capabilities, plural

    known = {f.tag: f for f in capabilities.FEATURES}
    if "workspace_qualified_rest_core" not in known:
        capabilities.register(
            capabilities.Feature("workspace_qualified_rest_core", tuple(plural.PLURAL_ROUTES))
        )
    # Multi-workspace tags: on when more than one workspace runtime is active (and, for
    # rewind and shell, when the per-session feature itself is advertised).
    if "multi_workspace_sessions" not in known:
        capabilities.register(
            capabilities.Feature(
                "multi_workspace_sessions",
                (("POST", "/session"), ("GET", "/workspaces/<path:workspace>/sessions")),
                when=lambda d: len(d.registry) > 1,
            )
        )
        for tag, base in (
            ("multi_workspace_session_rewind", "session_rewind"),
            ("multi_workspace_session_shell", "session_shell_command"),
        ):
            feature = known.get(base)
            if feature is not None:
                capabilities.register(
                    capabilities.Feature(tag, feature.routes, when=_multi_and(feature))
                )


def _multi_and(feature: Any) -> Callable[[Daemon], bool]:
    def predicate(d: Daemon) -> bool:
        return len(d.registry) > 1 and bool(feature.enabled(d))

    return predicate


def create_app(daemon: Daemon) -> QuartTrio:
    # No implicit /static/<path> route (it would serve files from the working directory).
    app = QuartTrio("acp_serve", static_folder=None)
    app.config.update(
        RESPONSE_TIMEOUT=None,
        MAX_CONTENT_LENGTH=daemon.settings.max_body_bytes,
        BODY_TIMEOUT=60,
        JSON_SORT_KEYS=False,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    app.extensions["acp_serve"] = daemon
    # Workspace paths travel URL-encoded in route segments (%2Fwork%2Fproj): keep "//".
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False

    for module in route_modules():
        app.register_blueprint(module.blueprint)
    _register_plural_tag()

    from serve.http.metrics import install_metrics

    install_metrics(app, daemon)

    from serve.http.middleware import install_middleware

    install_middleware(app, daemon)

    @app.errorhandler(ApiError)
    async def _api_error(exc: ApiError) -> Response:
        return json_response(exc.body, exc.status, exc.headers)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 413:
            return json_response({"error": daemon.settings.body_too_large_message}, 413)
        if status == 404:
            return json_response({"error": "Not found"}, 404)
        if status == 405:
            return json_response({"error": "Method not allowed"}, 405)
        return json_response({"error": exc.description or exc.name}, status)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        mapped = to_api_error(exc)
        if mapped is not None:
            return json_response(mapped.body, mapped.status, mapped.headers)
        log.exception("unhandled error", exc_info=exc)
        return json_response({"error": "Internal server error"}, 500)

    return app
