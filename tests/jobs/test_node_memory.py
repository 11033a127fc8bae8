"""A node's driver state lives in its context's memory (backend.jobs.driver.memory), never in a module.

Read from the source, as tests/test_layering.py reads the import directions: a module-level
container or lock in the driver (or the blobs and sealed modules it uses) would be state that
every node of a process shares and that ``DriverMemory.clear()`` (a restart) does not forget.
"""

from __future__ import annotations

import ast
import dataclasses
import threading
from pathlib import Path

from backend.jobs.driver.memory import DriverMemory, Lru

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    sorted((ROOT / "backend/jobs/driver").glob("*.py"))
    + sorted((ROOT / "backend/jobs/sealed").glob("*.py"))
    + [
        ROOT / "backend/jobs/blobs.py",
        ROOT / "backend/jobs/chain.py",
        ROOT / "backend/jobs/discovery.py",
        ROOT / "backend/jobs_api/services.py",
        ROOT / "backend/jobs/context.py",
    ]
)
SERVING = sorted((ROOT / "backend/serving").glob("*.py"))
# The composition root: the one module of the above that reads Django settings (current_node()).
ROOT_MODULE = ROOT / "backend/jobs/context.py"
CONTAINERS = {"dict", "set", "list"}  # and any class called (its name capitalized): an object
ALLOWED = {
    # Process resources, not a node's memory: the key threads keep nothing between requests.
    ("key_gathering.py", "_pool"),
    ("key_gathering.py", "_pool_lock"),
    # The action's timing collector: a context variable, its value the running action's own.
    ("timing.py", "_current"),
    # The serving app's loaded modules (ModelCache): a memo of the database's GlobalModel rows, each
    # checked against its content hash, so no node's own; per process, as the web views that read
    # it sit below the jobs app (no NodeContext there); the registrar only warms it.
    ("services.py", "model_cache"),
}


def _module_state(path: Path, root: Path = ROOT) -> list[str]:
    """Names rebound by a function (``global``), or bound at module level to a mutable container or an
    object (a lock, a cache), UPPER_CASE constants aside."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # A module variable a function rebinds (``global``) is state too, whatever its type.
    found = [
        f"{path.relative_to(root)}: {name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Global)
        for name in node.names
        if (path.name, name) not in ALLOWED
    ]
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        mutable = isinstance(value, ast.Dict | ast.Set | ast.List | ast.DictComp | ast.SetComp | ast.ListComp)
        if isinstance(value, ast.Call):
            func = value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            mutable = name in CONTAINERS or name.lstrip("_")[:1].isupper()
        for target in targets:
            name = getattr(target, "id", "")
            if (
                mutable
                and not name.isupper()
                and not name.startswith("__")
                and (path.name, name) not in ALLOWED
            ):
                found.append(f"{path.relative_to(root)}: {name}")
    return found


def test_the_modules_are_found() -> None:
    assert len(MODULES) > 15 and all(path.exists() for path in MODULES)


def test_the_driver_keeps_no_module_state() -> None:
    assert [name for path in MODULES + SERVING for name in _module_state(path)] == []


def _reads_settings(path: Path) -> bool:
    """Whether the module imports Django's settings (anywhere in it, a function's import too)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "django.conf":
            if any(alias.name == "settings" for alias in node.names):
                return True
        elif isinstance(node, ast.Import) and any(
            alias.name.startswith("django.conf") for alias in node.names
        ):
            return True
    return False


def test_only_the_composition_root_reads_settings(tmp_path) -> None:
    # What the driver, the services, the chain and key calls and the serving app need of the
    # settings is on the node's context, built from them once (context.current_node()).
    assert _reads_settings(ROOT_MODULE)
    assert [
        str(p.relative_to(ROOT)) for p in MODULES + SERVING if p != ROOT_MODULE and _reads_settings(p)
    ] == []
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from django.conf import settings\n    return settings.X\n")
    assert _reads_settings(sample)


def test_the_check_sees_module_state(tmp_path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import threading\n_cache: dict = {}\n_lock = threading.Lock()\nLIMITS = {1}\n_size = 0\n"
        "def grow():\n    global _size\n    _size += 1\n"
    )
    assert _module_state(sample, tmp_path) == ["sample.py: _size", "sample.py: _cache", "sample.py: _lock"]


def _fill(record) -> int:
    """Put one entry into every container of ``record``; returns how many it filled."""
    filled = 0
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, dict):
            value[(1, 1, "x")] = 1.0
        elif isinstance(value, set):
            value.add(1)
        elif isinstance(value, list):
            value.append((1, 1))
        elif isinstance(value, Lru):
            value.put("k", "v")
        elif field.name == "size":
            setattr(record, field.name, 5)
        else:
            assert isinstance(value, type(threading.Lock())), f"{type(record).__name__}.{field.name}"
            continue
        filled += 1
    return filled


def _empty(record) -> list[str]:
    left = []
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, Lru):
            value = value.items
        if isinstance(value, dict | set | list) and value or (field.name == "size" and value):
            left.append(f"{type(record).__name__}.{field.name}")
    return left


def test_clear_forgets_everything_a_node_remembers() -> None:
    memory = DriverMemory()
    records = [getattr(memory, field.name) for field in dataclasses.fields(memory)]
    assert sum(_fill(record) for record in records) >= 20
    assert _empty(memory.trainer) == ["TrainerMemory.waiting", "TrainerMemory.attempts"]
    memory.clear()
    assert [name for record in records for name in _empty(record)] == []


def test_each_node_has_its_own_memory() -> None:
    first, second = DriverMemory(), DriverMemory()
    for field in dataclasses.fields(first):
        assert getattr(first, field.name) is not getattr(second, field.name)
    first.aggregator.results[(1, 1)] = ("0xab", b"model")
    assert second.aggregator.results == {}
