"""Every setting a node reads from the environment is documented in docs/OPERATIONS.md (its
"Configuration" section; not in the README) and in .env.example."""

from __future__ import annotations

import ast
import re
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


def _configuration_section() -> str:
    """docs/OPERATIONS.md from its "Configuration" heading to the next section of its level."""
    text = (ROOT / "docs/OPERATIONS.md").read_text()
    start = re.search(r"^## .*Configuration$", text, re.M)
    assert start, 'docs/OPERATIONS.md has no "## ... Configuration" section'
    end = re.search(r"^## ", text[start.end() :], re.M)
    return text[start.start() : start.end() + end.start()] if end else text[start.start() :]


def test_every_setting_is_in_the_operations_guide_and_the_example_env() -> None:
    names = _environment_names(ROOT / "backend/settings.py")
    configuration = _configuration_section()
    example = (ROOT / ".env.example").read_text()
    assert sorted(n for n in names if f"`{n}`" not in configuration) == []
    assert sorted(n for n in names if n not in example) == []
