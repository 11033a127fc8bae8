"""`manage.py node backup` / `node restore` on a node's own database (processes, no federation).

The restore of a node destroyed mid-job, with its peers and a chain, is the e2e test
tests/e2e/test_restore_mid_job.py; here: what a backup holds, and the restores that are refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mariadb_scenario import mariadb

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _node(data_dir: Path, **extra: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEFL_", "DATABASE_URL", "DJANGO_"))}
    env.update(
        DEFL_DATA_DIR=str(data_dir), DJANGO_SECRET_KEY="backup-test-secret", DEFL_NODE_KEY="0x" + "3c" * 32
    )
    env.update(DJANGO_SETTINGS_MODULE="backend.settings", **extra)

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    return manage


def _users(manage) -> list[str]:
    out = manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; print(sorted(User.objects.values_list('username', flat=True)))",
    )
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own list literal


def _round_trip(tmp_path: Path, manage, wipe) -> None:
    assert manage("migrate", "-v0").returncode == 0
    assert manage("node", "adduser", "alice", "--role", "operator").returncode == 0
    backup = tmp_path / "backup"
    done = manage("node", "backup", str(backup))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((backup / "manifest.json").read_text())
    assert manifest["migrations"]["datasets"] and "secret.json" in manifest["files"]
    assert (backup / "secret.json").stat().st_mode & 0o777 == 0o600 and backup.stat().st_mode & 0o777 == 0o700
    refused = manage("node", "restore", str(backup))
    assert refused.returncode == 1 and "holds data" in refused.stderr  # not over a live database

    wipe()
    done = manage("node", "restore", str(backup))
    assert done.returncode == 0, done.stderr
    assert _users(manage) == ["alice"]


def test_a_sqlite_node_backed_up_wiped_and_restored_has_its_data(tmp_path):
    data = tmp_path / "node"
    manage = _node(data)

    def wipe():
        import shutil

        shutil.rmtree(data)

    _round_trip(tmp_path, manage, wipe)


@pytest.mark.integration
def test_a_mariadb_node_backed_up_dropped_and_restored_has_its_data(tmp_path):
    name = f"defl_backup_{os.getpid()}"
    mariadb(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    manage = _node(tmp_path / "node", DATABASE_URL=f"mysql://root:@127.0.0.1:3306/{name}")

    def wipe():
        mariadb(f"DROP DATABASE `{name}`")
        mariadb(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")

    try:
        _round_trip(tmp_path, manage, wipe)
    finally:
        mariadb(f"DROP DATABASE IF EXISTS `{name}`")


def test_a_restore_refuses_another_secret_key_and_a_changed_file(tmp_path):
    manage = _node(tmp_path / "node")
    assert manage("migrate", "-v0").returncode == 0
    backup = tmp_path / "backup"
    assert manage("node", "backup", str(backup)).returncode == 0
    other = _node(tmp_path / "other", DJANGO_SECRET_KEY="another-secret")
    refused = other("node", "restore", str(backup))
    assert refused.returncode == 1 and "DJANGO_SECRET_KEY is not the backup's" in refused.stderr
    with open(backup / "db.sqlite3", "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    refused = _node(tmp_path / "third")("node", "restore", str(backup))
    assert refused.returncode == 1 and "changed since the backup" in refused.stderr
    assert manage("node", "backup", str(backup)).returncode == 1  # never into a non-empty directory
