"""The allowed import directions (docs/ARCHITECTURE.md, section 2), read from the source.

Every import counts, module-level or inside a function: an import hidden in a function is
still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What code outside backend/swarm may import from it: the store's public API, its errors, the
# factory that builds it, and the pure placement maths (a node's overlay address).
SWARM_PUBLIC = {"backend.swarm", "backend.swarm.api", "backend.swarm.errors", "backend.swarm.factory"}
SWARM_PUBLIC |= {"backend.swarm.placement", "backend.swarm.reference", "backend.swarm.repair_schedule"}
CHAIN_LIBRARIES = ("web3", "eth_tester")
HARNESS = "devnet"  # the development harness, apart from the product

# The backend's apps (and its top-level modules) in layers, lowest first: an app imports only
# apps of lower layers, never one of its own layer or above, so the app graph has no cycle
# (docs/ARCHITECTURE.md, section 2). A new app or module must be placed here to pass.
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer)
    for layer in (
        {"identity", "peers", "celery", "environ_config"},  # leaves: import no other app
        {"api", "telemetry"},  # cross-cutting API pieces (reads roles); metric counters and log format
        {"ledger"},  # the only code talking to the chain (signs with the node key)
        {"swarm"},  # the only code touching chunks (its peer routes sit behind peers)
        {"datasets", "nodes", "serving"},  # datasets and grants; users and registration; models
        {"cluster"},  # workers, slots and the tasks the driver's actions run as
        {"jobs"},  # the protocol engine: the round driver, sealed updates, its agent, the `node` command
        {"jobs_api", "monitoring"},  # the jobs REST API over the engine; /metrics and health over every app
        {"web", "api_urls", "settings", "wsgi"},  # dashboard, routes, entry points
        {"urls"},
    )
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def _under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def _module_of(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute_imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file imports, relative imports resolved, inside functions or not."""
    package = _module_of(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names if node.module is None)
    return names


def _app(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "backend" and len(parts) > 1 else None


def _layer(app: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if app in layer)


def _upward(edges: set[tuple[str, str, str]]) -> list[str]:
    """The (file, from app, to app) imports that do not go to a lower layer."""
    return sorted(f"{file}: {a} -> {b}" for file, a, b in edges if _layer(b) >= _layer(a))


def _app_edges() -> set[tuple[str, str, str]]:
    edges = set()
    for path in _sources("backend"):
        source = _app(_module_of(path))
        for name in _absolute_imports(path):
            target = _app(name)
            if source and target and target != source:
                edges.add((str(path.relative_to(ROOT)), source, target))
    return edges


def _file_imports(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The modules of ``known`` a file imports, every import counted (module level, in a function,
    under TYPE_CHECKING): ``from a.b import c`` is a.b.c where that is a module, else a.b; and
    each package above an imported module (importing a.b.c runs a and a.b first)."""
    package = _module_of(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    with_parents = {".".join(name.split(".")[:i]) for name in found for i in range(1, name.count(".") + 2)}
    return with_parents & known


def _file_graph(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, set[str]]:
    paths = {
        _module_of(p, root): p
        for package in packages
        for p in (root / package).rglob("*.py")
        if "migrations" not in p.parts
    }
    known = set(paths)
    return {module: _file_imports(path, known, root) - {module} for module, path in paths.items()}


def _file_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, targets = work[-1]
            w = next(targets, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_sources_are_found() -> None:
    # Guards the tests below against passing on an empty walk.
    assert len(_sources("fl_node")) > 20 and len(_sources("backend")) > 100
    assert len(_sources(HARNESS)) >= 5


def test_the_product_never_imports_the_dev_harness() -> None:
    # devnet/ (anvil, development keys, node processes, the local federation, the demo) serves
    # the demo, the tests and the benchmarks; a production node runs without it.
    offending = {
        str(path.relative_to(ROOT)): sorted(n for n in _absolute_imports(path) if _under(n, (HARNESS,)))
        for path in _sources("backend") + _sources("fl_node")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_fl_node_never_imports_django_or_the_backend() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _under(n, ("django", "rest_framework", "backend"))
        )
        for path in _sources("fl_node")
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_only_the_ledger_talks_to_the_chain() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(n for n in _imports(path) if _under(n, CHAIN_LIBRARIES))
        for path in _sources("backend") + _sources("fl_node")
        if "ledger" not in path.relative_to(ROOT).parts
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_only_the_ledger_reaches_web3_through_a_client() -> None:
    # Importing web3 is the ledger's alone (above); so is reaching it through a ledger object's
    # ``w3`` attribute: every other module asks the ledger's typed classes (ChainClient's
    # block_number, block_timestamp, call, transact...; the contract classes).
    offending = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _sources("backend") + _sources("fl_node") + _sources(HARNESS)
        if "ledger" not in path.relative_to(ROOT).parts
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "w3"
    )
    assert offending == []


def test_only_the_swarm_touches_chunks() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _under(n, ("backend.swarm",)) and n not in SWARM_PUBLIC
        )
        for path in _sources("backend") + _sources("fl_node")
        if "swarm" not in path.relative_to(ROOT).parts
    }
    assert {path: names for path, names in offending.items() if names} == {}


def test_peer_auth_is_a_leaf() -> None:
    # backend/peers (request signing, dialable endpoints, the peer routes' guard) is shared by the
    # swarm's routes and the jobs' key route; it imports nothing else from the backend.
    offending = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _under(n, ("backend",)) and not _under(n, ("backend.peers",))
        )
        for path in _sources("backend/peers")
    }
    assert len(offending) >= 4
    assert {path: names for path, names in offending.items() if names} == {}


def test_every_app_has_one_layer() -> None:
    apps = {p.name for p in (ROOT / "backend").iterdir() if (p / "__init__.py").exists()}
    apps |= {p.stem for p in (ROOT / "backend").glob("*.py") if p.stem != "__init__"}
    placed = [app for layer in LAYERS for app in layer]
    assert len(placed) == len(set(placed))
    assert apps == set(placed)


def test_apps_import_only_lower_layers() -> None:
    edges = _app_edges()
    assert len(edges) > 60  # the walk found the apps' imports (guards an empty walk)
    assert _upward(edges) == []


@pytest.mark.parametrize(
    ("source", "upward"),
    [
        ("from backend.jobs.models import RoundAction\n", True),  # the ledger importing a job
        ("from backend.identity.key import node_account\n", False),
        ("from ..nodes import overview\n", True),  # relative, across apps
        ("from .factory import get_ledger\n", False),
    ],
)
def test_an_upward_import_is_refused(tmp_path: Path, source: str, upward: bool) -> None:
    package = tmp_path / "backend" / "ledger"
    package.mkdir(parents=True)
    path = package / "m.py"
    path.write_text("def f():\n    " + source)
    names = {name for name in _absolute_imports(path, tmp_path) if _app(name) not in (None, "ledger")}
    edges = {("backend/ledger/m.py", "ledger", _app(name)) for name in names}
    assert bool(_upward(edges)) is upward


@pytest.mark.parametrize(
    "source", ["import web3\n", "from backend.swarm.store import ChunkStore\n", "from devnet import anvil\n"]
)
def test_the_walk_sees_imports_inside_functions(tmp_path: Path, source: str) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    " + source)
    assert _imports(path) & {"web3", "backend.swarm.store", "devnet"}


def test_no_file_imports_itself_through_others() -> None:
    # Beside the app layers: no circle of files either, inside an app or across, counting imports
    # in functions and under TYPE_CHECKING (a type-only import is still a dependency to read).
    graph = _file_graph(("backend", "fl_node", HARNESS))
    assert len(graph) > 230 and sum(map(len, graph.values())) > 1000  # guards an empty walk
    assert _file_cycles(graph) == []


@pytest.mark.parametrize(
    ("b_source", "circle"),
    [
        ("from p import a\n", True),
        ("def f():\n    from p.a import X\n", True),  # inside a function
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n", True),
        ("from p import c\n", False),
    ],
)
def test_the_file_walk_sees_every_circle(tmp_path: Path, b_source: str, circle: bool) -> None:
    package = tmp_path / "p"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from p.b import Y\nX = 1\n")
    (package / "b.py").write_text(b_source + "Y = 2\n")
    (package / "c.py").write_text("Z = 3\n")
    cycles = _file_cycles(_file_graph(("p",), tmp_path))
    assert cycles == ([["p.a", "p.b"]] if circle else [])
