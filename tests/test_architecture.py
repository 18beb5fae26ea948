"""The dependency rules of docs/architecture.md ("Dependency rules"), checked on the source.

Every ``import`` of ``actors``, ``acp`` and ``serve`` is read with :mod:`ast`, wherever it is:
at module level, inside a function, or under ``if TYPE_CHECKING:`` (a type-only import is
still a dependency). ``scripts/check`` runs this file.
"""

from __future__ import annotations

import ast
import re
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
    "serve.workspaces.files",
    "serve.workspaces.state",
    "serve.mcp",
    "serve.deviceflow",
    "serve.status",
    "serve.agents",
    "serve.isolation",
    "serve.workspaces.runtimes",
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


def test_the_error_table_knows_no_transport_and_no_domain_imports_it() -> None:
    """``serve.errors`` maps domain errors to neutral wire errors: no web framework, no
    front, no runtime; the domain raises its own errors and never picks a status."""
    bad = [
        _where(i)
        for i in IMPORTS
        if _within(i.source, ("serve.errors",))
        and _within(i.target, WEB + UPPER + ("serve.acpfront",))
    ]
    bad += [
        _where(i)
        for i in IMPORTS
        if _within(i.source, DOMAIN) and _within(i.target, ("serve.errors",))
    ]
    assert not bad, "\n".join(bad)


#: The application layer (serve/api): the session use cases under both fronts.
API = ("serve.api",)


def test_the_application_layer_knows_no_front() -> None:
    """``serve.api`` sits between the fronts and the domain: it may import the domain
    packages and the error table, never a web framework, a front (``serve.http``,
    ``serve.acpfront``), the runtime or the Host; no domain package imports it (the
    fronts do)."""
    bad = [
        _where(i)
        for i in IMPORTS
        if _within(i.source, API) and _within(i.target, WEB + UPPER + ("serve.acpfront",))
    ]
    bad += [_where(i) for i in IMPORTS if _within(i.source, DOMAIN) and _within(i.target, API)]
    bad += [
        _where(i)
        for i in IMPORTS
        if _within(i.source, ("serve.errors",)) and _within(i.target, API)
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


# ---- package level ------------------------------------------------------------------------


#: Packages that only group packages: each of their children counts as a package of its own
#: (``serve.workspaces.files`` sits below the sessions, ``serve.workspaces.runtimes`` above).
GROUPS = ("serve.workspaces",)


def package_of(module: str) -> str:
    """``serve.sessions.actor`` → ``serve.sessions``; a top-level module (``serve.settings``)
    is its own package; ``acp.*`` → ``acp``, ``actors.*`` → ``actors``; under a group
    (:data:`GROUPS`) one level deeper: ``serve.workspaces.files.paths`` →
    ``serve.workspaces.files``."""
    parts = module.split(".")
    if parts[0] != "serve" or len(parts) == 1:
        return parts[0]
    depth = 3 if ".".join(parts[:2]) in GROUPS else 2
    return ".".join(parts[:depth])


def package_graph() -> dict[str, dict[str, list[str]]]:
    """Package → imported package → the imports behind that edge (``module:line``)."""
    graph: dict[str, dict[str, list[str]]] = {package_of(m): {} for m in MODULES}
    for imp in IMPORTS:
        if imp.target not in MODULES:
            continue
        a, b = package_of(imp.source), package_of(imp.target)
        if a != b:
            graph[a].setdefault(b, []).append(f"{imp.source}:{imp.line}")
    return graph


#: Package edges that still close a cycle, each with why it is there and what removes it.
#: Without them the package graph has no cycle; a new edge that closes one fails, and an
#: entry whose edge is gone must be removed (the list only shrinks).
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}


def test_no_package_cycle_beyond_the_known_back_edges() -> None:
    graph = {
        a: {b for b in targets if (a, b) not in KNOWN_BACK_EDGES}
        for a, targets in package_graph().items()
    }
    cycles = strongly_connected(graph)
    assert not cycles, "package cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_known_back_edges_still_exist() -> None:
    graph = package_graph()
    stale = [f"{a} -> {b}" for a, b in KNOWN_BACK_EDGES if b not in graph.get(a, {})]
    assert not stale, "gone, remove from KNOWN_BACK_EDGES: " + ", ".join(stale)


# ---- names --------------------------------------------------------------------------------

#: Module base names under ``serve/`` shared by more than one module, each because the
#: modules are the same kind of thing in parallel packages. Any other shared name fails (a
#: reader who knows the job must find the file without grep); an entry no longer shared
#: must be removed.
PARALLEL_NAMES: dict[str, str] = {
    "__main__": "the entry point of each program (the daemon, the client)",
    "access": "the access rules enforced by each front (the REST gate, the /acp policy)",
    "budget": "each package's budget: MCP clients, session tokens, its route",
    "config": "each package's own settings (daemon, MCP, permissions)",
    "elicitation": "the domain mediator and its HTTP route",
    "errors": "each package's own error types",
    "fork": "the fork use case and its /acp method",
    "jsonrpc": "the /acp front's JSON-RPC codec and the error table's JSON-RPC rendering",
    "mcp": "the MCP status read model and its HTTP route",
    "messages": "each actor package's messages",
    "pool": "each package's pool (agent children, MCP clients)",
    "service": "each package's service facade",
    "sessions": "the session use cases and their HTTP routes",
    "steering": "the steering use case and its /acp method",
    "store": "each package's persistent store",
    "types": "each package's wire types",
}


def shared_module_names() -> dict[str, list[str]]:
    """Base name → the modules under ``serve/`` that have it (``__init__`` left out)."""
    names: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if module.startswith("serve.") and path.name != "__init__.py":
            names.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    return {name: sorted(paths) for name, paths in names.items() if len(paths) > 1}


def test_no_two_modules_share_a_name_unless_parallel() -> None:
    shared = shared_module_names()
    bad = [f"{name}: {', '.join(paths)}" for name, paths in sorted(shared.items())]
    bad = [line for line in bad if line.split(":")[0] not in PARALLEL_NAMES]
    assert not bad, "modules that share a name (rename one):\n" + "\n".join(bad)
    stale = [name for name in PARALLEL_NAMES if name not in shared]
    assert not stale, "no longer shared, remove from PARALLEL_NAMES: " + ", ".join(stale)


#: How a work item is named ("issue 16", "issue-11", "issue 27.2", "item 3").
WORK_ITEM = re.compile(r"\bissue[- ]?\d+|\bitem \d+", re.IGNORECASE)


def test_no_module_names_a_work_item() -> None:
    """A docstring or comment (of ``actors``, ``acp``, ``serve`` and ``scripts/``) says what
    the code does and why, never which work item made it: the tracker is not where a reader
    of the code is."""
    paths = [*MODULES.values(), *sorted((ROOT / "scripts").glob("*.py"))]
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in paths
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if WORK_ITEM.search(line)
    ]
    assert not bad, "\n".join(bad)
    assert WORK_ITEM.search("the routes of issue-11") and not WORK_ITEM.search("issues 0")


# ---- the map ------------------------------------------------------------------------------

ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"
MAP_HEADING = "## The map of serve/"
#: A row of the map: ``| `serve/<package>/` | ... |`` or ``| `serve/<module>.py` | ... |``.
MAP_ROW = re.compile(r"^\| `(serve/[^`]+)` \|\s*[^|\s]")


def serve_rooms() -> set[str]:
    """Every package (``serve/x/``) and top-level module (``serve/x.py``) under ``serve/``."""
    root = ROOT / "serve"
    packages = {f"serve/{p.parent.name}/" for p in root.glob("*/__init__.py")}
    modules = {f"serve/{p.name}" for p in root.glob("*.py") if p.name != "__init__.py"}
    return packages | modules


def mapped_rooms(text: str) -> list[str]:
    """The paths the map section of ``text`` names, one per row with a job, in order."""
    _, found, rest = text.partition(f"\n{MAP_HEADING}\n")
    assert found, f"docs/architecture.md has no {MAP_HEADING!r} section"
    section = rest.split("\n## ", 1)[0]
    return [m.group(1) for line in section.splitlines() if (m := MAP_ROW.match(line))]


def test_the_map_names_every_package_and_top_level_module_of_serve() -> None:
    """docs/architecture.md's map names each package and top-level module under ``serve/``
    once, with its job; a new one must be added, a gone one removed."""
    named = mapped_rooms(ARCHITECTURE_DOC.read_text())
    rooms = serve_rooms()
    missing = sorted(rooms - set(named))
    assert not missing, f"not in {MAP_HEADING!r} of docs/architecture.md: " + ", ".join(missing)
    gone = sorted(set(named) - rooms)
    assert not gone, f"in {MAP_HEADING!r} but not under serve/: " + ", ".join(gone)
    twice = sorted({n for n in named if named.count(n) > 1})
    assert not twice, "named twice: " + ", ".join(twice)


def test_the_map_reader_sees_rows_only_in_its_section() -> None:
    text = (
        "intro\n| `serve/early.py` | before |\n"
        f"{MAP_HEADING}\n\n| Where | Its one job |\n|---|---|\n"
        "| `serve/a/` | the a |\n| `serve/b.py` | the b |\n| `serve/c.py` | |\n"
        "## Next\n| `serve/late.py` | after |\n"
    )
    assert mapped_rooms(text) == ["serve/a/", "serve/b.py"]
    assert "serve/settings/" in serve_rooms() and "serve/host.py" in serve_rooms()


# ---- module size --------------------------------------------------------------------------

MAX_MODULE_LINES = 700
#: Modules over the limit today (each to be split on a seam), and the exempt ones. A new module
#: over the limit fails; an entry that is back under it must be removed.
OVERSIZED: dict[str, str] = {}


def module_lines() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in MODULES.values()
    }


def test_no_new_module_over_the_size_limit() -> None:
    sizes = module_lines()
    new = [f"{p}: {n} lines" for p, n in sorted(sizes.items()) if n > MAX_MODULE_LINES]
    new = [line for line in new if line.split(":")[0] not in OVERSIZED]
    assert not new, f"over {MAX_MODULE_LINES} lines:\n" + "\n".join(new)
    back = [p for p in OVERSIZED if sizes.get(p, 0) <= MAX_MODULE_LINES]
    assert not back, "now within the limit, remove from OVERSIZED: " + ", ".join(back)


# ---- Any ----------------------------------------------------------------------------------

_JSON_CONTAINERS = ("dict", "Mapping", "MutableMapping")


def any_counts() -> tuple[int, int]:
    """``(on our own objects, in JSON bodies)`` over ``serve``, ``acp`` and ``actors``."""
    own = json = 0
    for path in MODULES.values():
        a, b = count_any(path.read_text())
        own, json = own + a, json + b
    return own, json


def count_any(source: str) -> tuple[int, int]:
    """Every ``Any`` in an annotation (parameter, return, variable) of ``source``: one that is
    the value of ``dict[str, Any]`` (or ``Mapping``/``MutableMapping``) is in a JSON body,
    any other is on our own objects."""
    own = json = 0
    tree = ast.parse(source)
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            annotations += [a.annotation for a in every if a.annotation is not None]
            if node.returns is not None:
                annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    for annotation in annotations:
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                continue
        in_json: set[int] = set()
        for sub in ast.walk(annotation):
            if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Tuple):
                base = sub.value
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                elts = sub.slice.elts
                if name in _JSON_CONTAINERS and len(elts) == 2:
                    in_json.add(id(elts[1]))
        for sub in ast.walk(annotation):
            is_any = (isinstance(sub, ast.Name) and sub.id == "Any") or (
                isinstance(sub, ast.Attribute) and sub.attr == "Any"
            )
            if is_any:
                if id(sub) in in_json:
                    json += 1
                else:
                    own += 1
    return own, json


#: ``Any`` on our own objects stays below this (``scripts/check`` prints the figure). A new
#: one is a type a reader must guess: declare it (a ``Request[R]``, a ``Protocol``, a
#: ``TypedDict``, ``object``) instead of raising the ceiling.
MAX_ANY_ON_OWN_OBJECTS = 30


def test_any_on_our_own_objects_stays_under_the_ceiling() -> None:
    own, json = any_counts()
    assert own > 0 and json > 0  # the walk sees annotations at all
    print(f"\nAny in annotations: {own} on our own objects, {json} in JSON bodies")
    assert own < MAX_ANY_ON_OWN_OBJECTS, (
        f"{own} Any on our own objects (the ceiling is below {MAX_ANY_ON_OWN_OBJECTS}): type "
        "the new ones"
    )


def test_the_counters_classify() -> None:
    """The package map and the Any classifier on made-up inputs."""
    assert package_of("serve.sessions.actor") == "serve.sessions"
    assert package_of("serve.settings") == "serve.settings"
    assert package_of("acp.rpc") == "acp"
    assert package_of("serve.workspaces.files.paths") == "serve.workspaces.files"
    assert package_of("serve.workspaces.runtimes") == "serve.workspaces.runtimes"
    source = (
        "def f(a: Any, b: dict[str, Any], c: 'list[Mapping[str, Any]]') -> tuple[Any, int]:\n"
        "    x: typing.Any = 1\n"
    )
    assert count_any(source) == (3, 2)


def report() -> str:
    """The figures ``scripts/check`` prints: cycles, package cycles, Any, module sizes."""
    module_graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for imp in IMPORTS:
        if imp.target in MODULES and imp.target != imp.source:
            module_graph[imp.source].add(imp.target)
    packages = {a: set(targets) for a, targets in package_graph().items()}
    package_cycles = strongly_connected(packages)
    own, json = any_counts()
    big = sorted(((n, p) for p, n in module_lines().items() if n > MAX_MODULE_LINES), reverse=True)
    return "\n".join(
        [
            f"module cycles: {len(strongly_connected(module_graph))}",
            f"package cycles: {len(package_cycles)}"
            + (
                f" ({' + '.join(str(len(c)) for c in package_cycles)} packages)"
                if package_cycles
                else ""
            )
            + f" with every edge, none without the {len(KNOWN_BACK_EDGES)} known back-edges",
            f"Any in annotations: {own} on our own objects, {json} in JSON bodies",
            f"modules over {MAX_MODULE_LINES} lines: {len(big)}: "
            + ", ".join(f"{p} {n}" for n, p in big),
        ]
    )


if __name__ == "__main__":
    print(report())
