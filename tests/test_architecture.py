"""The dependency rules of docs/architecture.md ("Dependency rules"), checked on the source.

Every ``import`` of ``actors``, ``acp`` and ``serve`` is read with :mod:`ast`, wherever it is:
at module level, inside a function, or under ``if TYPE_CHECKING:`` (a type-only import is
still a dependency). ``scripts/check`` runs this file.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "acp", "serve")
#: Domain packages: no web framework, no HTTP layer, no runtime, no Host.
DOMAIN = (
    "serve.sessions",
    "serve.events",
    "serve.journal",
    "serve.permissions",
    "serve.workspace",
    "serve.workspace_state",
    "serve.mcp",
    "serve.deviceflow",
    "serve.status",
    "serve.agents",
    "serve.isolation",
)
WEB = ("quart", "quart_trio", "werkzeug", "hypercorn")
UPPER = ("serve.http", "serve.runtime", "serve.host")
ENTRY_POINT = "serve.__main__"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (ours: the longest known module name)
    line: int
    local: bool  # inside a function
    comment: str  # the source line and the one above (for the lazy-import marker)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str | None:
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _imports() -> Iterator[Import]:
    for name, path in MODULES.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        is_package = path.name == "__init__.py"
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        local_ids = {id(n) for f in functions for n in ast.walk(f)}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    # ``from pkg import submodule`` depends on the submodule.
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in MODULES else base)
            else:
                continue
            line = node.lineno
            comment = "\n".join(lines[max(0, line - 2) : line])
            for target in targets:
                ours = _known(target)
                yield Import(
                    source=name,
                    target=ours if ours is not None else target,
                    line=line,
                    local=id(node) in local_ids,
                    comment=comment,
                )


IMPORTS = list(_imports())


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _where(imp: Import) -> str:
    return f"{MODULES[imp.source].relative_to(ROOT)}:{imp.line} imports {imp.target}"


def test_actors_and_acp_import_nothing_of_serve() -> None:
    bad = [
        _where(i)
        for i in IMPORTS
        if _within(i.source, ("actors", "acp")) and _within(i.target, ("serve",))
    ]
    assert not bad, "\n".join(bad)


def test_domain_packages_know_no_http_and_no_runtime() -> None:
    bad = [
        _where(i) for i in IMPORTS if _within(i.source, DOMAIN) and _within(i.target, WEB + UPPER)
    ]
    assert not bad, "\n".join(bad)


def test_only_the_entry_point_imports_the_runtime() -> None:
    bad = [
        _where(i)
        for i in IMPORTS
        if _within(i.target, ("serve.runtime",))
        and not _within(i.source, ("serve.runtime",))
        and i.source != ENTRY_POINT
    ]
    assert not bad, "\n".join(bad)


def test_function_local_imports_of_our_modules_say_why() -> None:
    """An import of our own inside a function is allowed only as a documented lazy import
    (start-up memory): the line or the one above says ``lazy``."""
    bad = [
        _where(i)
        for i in IMPORTS
        if i.local and _within(i.target, PACKAGES) and "lazy" not in i.comment.lower()
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for imp in IMPORTS:
        if imp.target in MODULES and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; the components of more than one module, sorted."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_checker_sees_a_cycle_and_a_violation() -> None:
    """The rules above can fail: a made-up graph with a cycle is caught."""
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _within("serve.http.app", UPPER) and not _within("serve.httpx", UPPER)
