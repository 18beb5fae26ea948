"""The HTTP front: the Quart-Trio app, the ASGI security front, routes, OpenAPI and the
one table from domain exceptions to HTTP status, code and body."""
