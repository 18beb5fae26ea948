"""The OpenAPI 3.1 description of the HTTP API, generated from msgspec Structs.

* :mod:`serve.http.openapi.types`: the wire Structs of request and response bodies;
* :mod:`serve.http.openapi.catalog`: ``(METHOD, rule)`` → what the route takes and answers;
* :mod:`serve.http.openapi.document`: walks the app's registered routes and builds the document
  (tags from :data:`serve.http.capabilities.FEATURES`).

``GET /openapi.json`` and the ``/doc`` page are served by :mod:`serve.http.routes.docs`.
"""

from serve.http.openapi.document import (
    OPENAPI_VERSION,
    DocumentCache,
    Route,
    build_document,
    path_template,
    registered_routes,
)

__all__ = [
    "OPENAPI_VERSION",
    "DocumentCache",
    "Route",
    "build_document",
    "path_template",
    "registered_routes",
]
