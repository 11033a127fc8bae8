"""The import graph between the backend's apps, read from the source with `ast`.

Every import counts, module-level or inside a function. Prints each app-to-app edge with the
importing files (and whether the import is hidden in a function), then the cycles, then one
JSON object on the last line: {"edges": N, "function_level": N, "cycles": [[app, ...], ...]}.

    .venv/bin/python scripts/app_imports.py [--edges]
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKEND = ROOT / "backend"


def app_of(module: str) -> str | None:
    """`backend.jobs.driver.agent` -> `jobs`; a top-level backend module is its own app."""
    parts = module.split(".")
    if parts[0] != "backend" or len(parts) < 2:
        return None
    return parts[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function?) for every absolute or relative import in a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join(base + ([child.module] if child.module else []))
                if child.module is None:  # from . import x: each name may be a module
                    found.extend((f"{module}.{alias.name}", in_function) for alias in child.names)
                else:
                    found.append((module, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def sources() -> list[Path]:
    return sorted(p for p in BACKEND.rglob("*.py") if "migrations" not in p.parts)


def app_edges() -> dict[tuple[str, str], list[tuple[str, str, bool]]]:
    """(from app, to app) -> [(file, imported module, inside a function?)]."""
    edges: dict[tuple[str, str], list[tuple[str, str, bool]]] = defaultdict(list)
    for path in sources():
        source_app = app_of(_module_name(path))
        for module, in_function in imports_of(path):
            target_app = app_of(module)
            if source_app and target_app and target_app != source_app:
                edges[(source_app, target_app)].append((str(path.relative_to(ROOT)), module, in_function))
    return dict(edges)


def cycles(edges: dict[tuple[str, str], object]) -> list[list[str]]:
    """The strongly connected components with more than one app (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="list every importing file")
    args = parser.parse_args()
    edges = app_edges()
    for (a, b), rows in sorted(edges.items()):
        hidden = sum(1 for row in rows if row[2])
        print(f"{a} -> {b}: {len(rows)} imports ({hidden} inside functions)")
        if args.edges:
            for file, module, in_function in rows:
                print(f"    {file}: {module}{'  [function]' if in_function else ''}")
    found = cycles(edges)
    for component in found:
        print("cycle:", " ".join(component))
    function_level = sum(1 for rows in edges.values() for row in rows if row[2])
    print(json.dumps({"edges": len(edges), "function_level": function_level, "cycles": found}))


if __name__ == "__main__":
    main()
