"""The OpenAPI schema of the whole project generates without warnings (``spectacular --fail-on-warn``).

Generation runs in a subprocess (drf-spectacular keeps its warnings in process-wide state), once
for the file: it prints its "Schema generation summary" exactly when it met a warning or an
error, which is what ``--fail-on-warn`` fails on, so one run without that flag answers both the
swarm's question and the whole project's, and still writes the schema when another app warns.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# A Django process of its own generating the whole schema (a minute under load): `make test` only;
# the fast tier keeps tests/backend/test_api_schema.py, the API's schema generated in this process.
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
# "<file>:<line>: Error [<View>]: ..." / "Warning [<View>]: ..."
_PROBLEM = re.compile(r"^(?P<file>/\S+?\.py):\d+: (?:Error|Warning) \[(?P<view>[^\]]+)\]", re.M)


_COLLISION = re.compile(r"^Warning: operationId .*$", re.M)


_SUMMARY = "Schema generation summary"  # drf-spectacular prints it iff a warning or error was met


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("schema") / "schema.yml"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backend.settings"}
    command = [sys.executable, "manage.py", "spectacular", "--validate", "--file", str(out)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    return result, out


def _problems(output: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for match in _PROBLEM.finditer(output):
        app = Path(match["file"]).relative_to(REPO_ROOT).parent.as_posix()
        found.setdefault(app, set()).add(match["view"])
    return found


def test_swarm_views_are_fully_described(generated):
    result, out = generated
    assert result.returncode == 0, result.stderr[-3000:]
    assert "backend/swarm" not in _problems(result.stderr + result.stdout), result.stderr[-3000:]
    assert "/api/swarm" not in "".join(_COLLISION.findall(result.stderr + result.stdout))
    schema = yaml.safe_load(out.read_text())
    upload = schema["paths"]["/api/swarm/blobs"]["post"]
    assert set(upload["requestBody"]["content"]) == {"application/octet-stream", "multipart/form-data"}
    download = schema["paths"]["/api/swarm/blobs/{reference}"]["get"]
    assert download["responses"]["200"]["content"]["application/octet-stream"]["schema"]["format"] == "binary"


def test_whole_project_schema_has_no_warnings(generated):
    result, _out = generated
    assert result.returncode == 0, (result.stderr + result.stdout)[-3000:]
    assert _SUMMARY not in result.stderr + result.stdout, (result.stderr + result.stdout)[-3000:]
