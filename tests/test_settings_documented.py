"""Every setting a node reads from the environment is documented in README and .env.example."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READERS = {"env", "env_bool", "env_int", "env_list", "env_float", "getenv", "get"}


def _environment_names(path: Path) -> set[str]:
    """First string argument of env()/env_int()/os.environ.get()/os.getenv() calls."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        first = node.args[0]
        if name in READERS and isinstance(first, ast.Constant) and isinstance(first.value, str):
            if first.value.isupper() and "_" in first.value:
                names.add(first.value)
    return names


def test_the_settings_module_reads_the_environment() -> None:
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "DEFL_CHAIN_URL"} <= _environment_names(
        ROOT / "backend/settings.py"
    )


def test_every_setting_is_in_the_readme_and_the_example_env() -> None:
    names = _environment_names(ROOT / "backend/settings.py")
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / ".env.example").read_text()
    assert sorted(n for n in names if n not in readme) == []
    assert sorted(n for n in names if n not in example) == []
