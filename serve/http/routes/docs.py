"""``GET /openapi.json``, ``GET /doc`` and ``GET /demo``: the API described and tried.

* ``/openapi.json``: the OpenAPI 3.1 document of *this* app, built from its registered
  routes (:mod:`serve.http.openapi`), tagged with the capability tags, ``x-advertised`` telling
  which tags this daemon advertises now. Encoded once per distinct advertised set and
  cached on the app.
* ``/doc``: a static page that fetches ``/openapi.json`` and renders it (no CDN, no build
  step: ``serve/http/static/doc.html``).
* ``/demo``: a static single-file client (``serve/http/static/demo.html``) that uses only the
  public API with a token the user pastes: create or attach a session, stream its events
  (``fetch`` + a streamed SSE parser, so the ``Authorization`` header can be sent), send
  prompts, answer permission requests.

The pages are read from the package once (in a worker thread) and kept in memory. They
are served with a Content-Security-Policy that allows only their own inline script (by
hash), inline styles and same-origin ``fetch``; nothing they render is parsed as HTML.
Access control is the security front's (bearer, Host allowlist, CORS); these routes add
none and carry no capability tag.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Final

import trio
from quart import Blueprint, Response, current_app

from serve.http import capabilities
from serve.http.context import daemon, features

blueprint = Blueprint("docs", __name__)

STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "static"
PAGES: Final = {"doc": "doc.html", "demo": "demo.html"}
_CACHE_KEY: Final = "acp_serve.openapi"
_SCRIPT: Final = re.compile(rb"<script>(.*?)</script>", re.DOTALL)
_HTML_HEADERS: Final = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _version() -> str:
    try:
        import importlib.metadata

        return importlib.metadata.version("acp-serve")
    except Exception:  # PackageNotFoundError: not installed as a distribution
        return "0.1.0"


def content_security_policy(html: bytes) -> str:
    """A CSP admitting exactly the page's inline ``<script>`` blocks (by SHA-256)."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
        for body in _SCRIPT.findall(html)
    )
    return (
        "default-src 'none'; "
        f"script-src {hashes or "'none'"}; "
        "style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class _Page:
    """One static page: its bytes and CSP, loaded on first use."""

    def __init__(self, filename: str) -> None:
        self.path = STATIC_DIR / filename
        self.body: bytes | None = None
        self.csp = ""

    async def response(self) -> Response:
        if self.body is None:
            body = await trio.to_thread.run_sync(self.path.read_bytes)
            self.csp = content_security_policy(body)
            self.body = body
        headers = {**_HTML_HEADERS, "Content-Security-Policy": self.csp}
        return Response(self.body, 200, headers, content_type="text/html; charset=utf-8")


_pages = {name: _Page(filename) for name, filename in PAGES.items()}


@blueprint.get("/openapi.json")
async def openapi_json() -> Response:
    """The OpenAPI 3.1 document of this daemon."""
    d = daemon()
    advertised = frozenset(f.tag for f in capabilities.advertised(d, features()))
    cache = current_app.extensions.get(_CACHE_KEY)
    # lazy: the OpenAPI machinery is imported on the first request for the document.
    from serve.http.openapi import DocumentCache, build_document, registered_routes

    if not isinstance(cache, DocumentCache):
        cache = current_app.extensions[_CACHE_KEY] = DocumentCache()
    app = current_app
    all_features = features()

    def build() -> dict[str, object]:
        routes = registered_routes(app.url_map.iter_rules(), app.view_functions)
        return build_document(routes, all_features, advertised, version=_version())

    body = cache.get(advertised, build)
    return Response(
        body, 200, {"Cache-Control": "no-cache"}, content_type="application/json; charset=utf-8"
    )


@blueprint.get("/doc")
async def doc_page() -> Response:
    """The API reference page (renders /openapi.json)."""
    return await _pages["doc"].response()


@blueprint.get("/demo")
async def demo_page() -> Response:
    """The demo client page."""
    return await _pages["demo"].response()


@blueprint.get("/favicon.ico")
async def favicon() -> Response:
    """No icon: 204, so a browser opening the pages logs no failed request."""
    return Response(b"", status=204, headers={"Cache-Control": "max-age=86400"})
