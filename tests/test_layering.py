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


def test_the_sources_are_found() -> None:
    # Guards the tests below against passing on an empty walk.
    assert len(_sources("fl_node")) > 20 and len(_sources("backend")) > 100


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


def test_only_the_swarm_touches_chunks() -> None:
    offending = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _under(n, ("backend.swarm",)) and n not in SWARM_PUBLIC
        )
        for path in _sources("backend") + _sources("fl_node")
        if "swarm" not in path.relative_to(ROOT).parts
    }
    assert {path: names for path, names in offending.items() if names} == {}


@pytest.mark.parametrize("source", ["import web3\n", "from backend.swarm.store import ChunkStore\n"])
def test_the_walk_sees_imports_inside_functions(tmp_path: Path, source: str) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f():\n    " + source)
    assert _imports(path) & {"web3", "backend.swarm.store"}
