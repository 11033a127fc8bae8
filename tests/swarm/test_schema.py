"""The OpenAPI schema of the whole project generates without warnings (``spectacular --fail-on-warn``).

Generation runs in a subprocess: drf-spectacular keeps its warnings in process-wide state.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
# "<file>:<line>: Error [<View>]: ..." / "Warning [<View>]: ..."
_PROBLEM = re.compile(r"^(?P<file>/\S+?\.py):\d+: (?:Error|Warning) \[(?P<view>[^\]]+)\]", re.M)


_COLLISION = re.compile(r"^Warning: operationId .*$", re.M)


def _generate(out: Path, *, fail_on_warn: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backend.settings"}
    command = [sys.executable, "manage.py", "spectacular", "--validate", "--file", str(out)]
    command += ["--fail-on-warn"] if fail_on_warn else []
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def _problems(output: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for match in _PROBLEM.finditer(output):
        app = Path(match["file"]).relative_to(REPO_ROOT).parent.as_posix()
        found.setdefault(app, set()).add(match["view"])
    return found


def test_swarm_views_are_fully_described(tmp_path):
    out = tmp_path / "schema.yml"
    result = _generate(out, fail_on_warn=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backend/swarm" not in _problems(result.stderr + result.stdout), result.stderr[-3000:]
    assert "/api/swarm" not in "".join(_COLLISION.findall(result.stderr + result.stdout))
    schema = yaml.safe_load(out.read_text())
    upload = schema["paths"]["/api/swarm/blobs"]["post"]
    assert set(upload["requestBody"]["content"]) == {"application/octet-stream", "multipart/form-data"}
    download = schema["paths"]["/api/swarm/blobs/{reference}"]["get"]
    assert download["responses"]["200"]["content"]["application/octet-stream"]["schema"]["format"] == "binary"


def test_whole_project_schema_has_no_warnings(tmp_path):
    result = _generate(tmp_path / "schema.yml", fail_on_warn=True)
    assert result.returncode == 0, (result.stderr + result.stdout)[-3000:]
