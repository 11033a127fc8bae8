"""Migrations from the previous release's schema, with its data in it, on SQLite and on MariaDB.

The snapshot (tests/upgrade/previous_release, made by make_previous_release.py) is a node's
database after a finished DP job, grants, users of every role and an open job. The scenario
(migrate_scenario.py, a script with a database of its own) upgrades it to this release's schema
and reports every row or value that did not survive, and every API answer that changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _upgrade(backend: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.upgrade.migrate_scenario", backend],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_kept(result: dict) -> None:
    assert result["tables"] > 30 and result["rows"] > 300  # the snapshot holds a node's real life
    assert result["schema_problems"] == []
    assert result["data_problems"] == []
    assert result["api_problems"] == []


@pytest.mark.slow
def test_sqlite_database_of_the_previous_release_upgrades_with_its_data():
    _assert_kept(_upgrade("sqlite"))


@pytest.mark.slow
@pytest.mark.integration
def test_mariadb_database_of_the_previous_release_upgrades_with_its_data():
    _assert_kept(_upgrade("mariadb"))
