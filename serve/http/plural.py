"""Workspace-qualified routes: ``/workspaces/<workspace>/...`` beside the singular forms.

The singular routes (``/file``, ``/workspace/env``, ...) address the primary workspace; the
plural forms address any served workspace by id or by URL-encoded absolute path. Hypercorn
decodes ``%2F``, so a path reference arrives as several segments (and starts with a slash),
hence two rules per plural form. Handlers find the addressed workspace with
:func:`serve.http.addressing.addressed_path`. Every plural rule is announced by the
``workspace_qualified_rest_core`` capability tag: a route module that serves plural rules
exports them as ``PLURAL_ROUTES`` (a :class:`PluralRoutes`), and the app collects them.
"""

from __future__ import annotations

from collections.abc import Callable

from quart import Blueprint
from quart.typing import RouteCallable


def plural_rules(rule: str) -> tuple[str, str]:
    suffix = rule.removeprefix("/workspace")
    return (f"/workspaces/<path:workspace>{suffix}", f"/workspaces//<path:workspace>{suffix}")


class PluralRoutes:
    """The plural rules one route module serves, registered on its blueprint."""

    def __init__(self, blueprint: Blueprint) -> None:
        self.blueprint = blueprint
        #: (METHOD, rule) of every plural rule registered, for the capability tag.
        self.rules: list[tuple[str, str]] = []

    def route[H: RouteCallable](self, method: str, rule: str) -> Callable[[H], H]:
        """Register ``rule`` and its two plural forms for ``method``."""

        def decorate(handler: H) -> H:
            for candidate in (rule, *plural_rules(rule)):
                self.blueprint.add_url_rule(candidate, view_func=handler, methods=[method])
            self.rules.extend((method, r) for r in plural_rules(rule))
            return handler

        return decorate

    def declare(self, *rules: tuple[str, str]) -> None:
        """Plural rules the module registers itself (announced with the others)."""
        self.rules.extend(rules)
