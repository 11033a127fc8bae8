"""Backing a node up while it runs, and restoring it (`manage.py node backup DIR` / `node restore DIR`).

A node's state that nothing else holds:

- its database: users and tokens, datasets and their privacy releases (the budget), the job
  records, the round actions, this node's score salts (commit-reveal) and the keys of its sealed
  updates, the cluster's tasks; the chain's mirror too (the indexer could rebuild it);
- its key: the keystore (or DEFL_NODE_KEY, kept by the operator) and DJANGO_SECRET_KEY, from which
  the keyed record hashes that tie overlapping datasets to one budget derive;
- its contracts file, naming the consortium's deployment;
- its chunk index (which chunks it held and pinned); the chunks themselves only with
  ``--with-chunks``: peers hold replicas, and a restore fetches back what the index lists. The
  swarm store copies and puts back its own files (``Swarm.backup`` / ``Swarm.restore``).

The copy is consistent while the node runs: SQLite's online backup API (one snapshot of the
database, then one of the chunk index), or ``mysqldump --single-transaction`` on MariaDB/MySQL.
Every file's SHA-256 is in ``manifest.json``; a restore checks them before it touches anything.
The backup holds secrets (the key's keystore and the secret key): its directory and files are
readable by their owner only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from backend.ledger.deployment import load_deployment
from backend.ledger.errors import LedgerConfigError

FORMAT = 1
MANIFEST = "manifest.json"
SQLITE_FILE = "db.sqlite3"
SQL_DUMP = "db.sql"
SECRET_FILE = "secret.json"
KEYSTORE_FILE = "keystore.json"
CONTRACTS_FILE = "contracts.json"
CHUNKS_DIR = "swarm"  # the chunk index, and the chunks with --with-chunks (Swarm.backup)
DUMP_TIMEOUT_S = 3600


class BackupError(Exception):
    """A backup or restore that cannot go on; the message is one sentence for the operator."""


@dataclass(frozen=True)
class BackupReport:
    directory: Path
    files: int
    bytes: int
    chunks: int
    seconds: float


@dataclass(frozen=True)
class RestoreReport:
    files: int
    migrated: bool
    chunks_missing: int
    chunks_fetched: int
    chunks_unavailable: int
    seconds: float


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(stat.S_IRWXU)


def _private_file(path: Path) -> None:
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _database() -> Any:
    return settings.DATABASES["default"]


def _is_sqlite() -> bool:
    return _database()["ENGINE"].endswith("sqlite3")


def _mysql_arguments(program: str) -> tuple[list[str], dict[str, str]]:
    """The client's command line and environment (the password goes in MYSQL_PWD, not argv)."""
    db = _database()
    found = shutil.which(program) or shutil.which(program.replace("mysql", "mariadb"))
    if found is None:
        raise BackupError(
            f"{program} is not installed: install the MariaDB/MySQL client (apt-get install mariadb-client)"
        )
    argv = [
        found,
        f"--host={db.get('HOST') or '127.0.0.1'}",
        f"--port={db.get('PORT') or 3306}",
        f"--user={db.get('USER') or 'root'}",
    ]
    env = dict(os.environ, MYSQL_PWD=str(db.get("PASSWORD") or ""))
    return argv, env


def _dump_database(target: Path) -> None:
    if _is_sqlite():
        source = sqlite3.connect(_database()["NAME"], timeout=60)
        copy = sqlite3.connect(target / SQLITE_FILE)
        try:
            source.backup(copy)  # one consistent snapshot, writers go on meanwhile
        finally:
            copy.close()
            source.close()
        _private_file(target / SQLITE_FILE)
        return
    argv, env = _mysql_arguments("mysqldump")
    argv += [
        "--single-transaction",
        "--skip-lock-tables",
        "--no-tablespaces",
        "--hex-blob",
        _database()["NAME"],
    ]
    with open(target / SQL_DUMP, "wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, env=env, timeout=DUMP_TIMEOUT_S)
    _private_file(target / SQL_DUMP)
    if done.returncode != 0:
        raise BackupError(f"mysqldump failed: {done.stderr.decode(errors='replace').strip()[:300]}")


def _migration_leaves() -> dict[str, str]:
    from django.db.migrations.recorder import MigrationRecorder

    leaves: dict[str, str] = {}
    for app, name in MigrationRecorder(connection).applied_migrations():
        leaves[app] = max(leaves.get(app, name), name)
    return leaves


def backup(directory: Path, *, with_chunks: bool = False) -> BackupReport:
    """Write a consistent backup of this node into ``directory`` (new or empty)."""
    from backend.identity.key import node_account
    from backend.swarm.api import backup_store
    from backend.swarm.factory import local_store

    clock = time.perf_counter()
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise BackupError(f"{directory} is not empty: back up into a new directory")
    _private_dir(directory)
    _dump_database(directory)
    chunks = backup_store(local_store(), directory / CHUNKS_DIR, with_chunks=with_chunks)
    keystore = Path(settings.DEFL_KEYSTORE_PATH)
    if not settings.DEFL_NODE_KEY and keystore.exists():
        shutil.copyfile(keystore, directory / KEYSTORE_FILE)
        _private_file(directory / KEYSTORE_FILE)
    contracts = Path(settings.DEFL_CONTRACTS_FILE)
    if contracts.exists():
        shutil.copyfile(contracts, directory / CONTRACTS_FILE)
    (directory / SECRET_FILE).write_text(json.dumps({"DJANGO_SECRET_KEY": settings.SECRET_KEY}))
    _private_file(directory / SECRET_FILE)
    try:
        address: str | None = node_account().address
    except Exception:
        address = None
    files = {
        str(p.relative_to(directory)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_relative_to(directory / CHUNKS_DIR / "chunks")
    }
    manifest = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "node": address,
        "node_key": "keystore.json"
        if KEYSTORE_FILE in files
        else "DEFL_NODE_KEY (not in this backup: keep it)",
        "database": connection.vendor,
        "migrations": _migration_leaves(),
        "chunks": chunks,
        "files": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return BackupReport(directory, len(files) + 1 + chunks, size, chunks, time.perf_counter() - clock)


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{path} is missing or unreadable: not a node backup ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(
            f"{path} is backup format {manifest.get('format')!r}; this release reads format {FORMAT}"
        )
    for name, expected in manifest.get("files", {}).items():
        file = Path(directory) / name
        if not file.is_file() or _sha256(file) != expected["sha256"]:
            raise BackupError(f"{file} is missing or changed since the backup (its SHA-256 differs)")
    return manifest


def _holds_state() -> bool:
    """Whether this node's database already has a node's data (a restore would overwrite it)."""
    tables = set(connection.introspection.table_names())
    with connection.cursor() as cursor:
        for table in ("auth_user", "ledger_indexercursor", "datasets_dataset"):
            if table in tables:
                cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
                if cursor.fetchone()[0]:
                    return True
    return False


def _restore_database(directory: Path, manifest: dict) -> None:
    if manifest["database"] != connection.vendor:
        raise BackupError(
            f"the backup is of a {manifest['database']} database and this node runs on {connection.vendor}: "
            "restore it on the same kind of database"
        )
    if _is_sqlite():
        target = Path(_database()["NAME"])
        connection.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(directory / SQLITE_FILE, target)
        return
    argv, env = _mysql_arguments("mysql")
    with connection.cursor() as cursor:  # the dump recreates every table it holds; others go first
        cursor.execute("SET FOREIGN_KEY_CHECKS=0")
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"DROP TABLE {connection.ops.quote_name(table)}")
        cursor.execute("SET FOREIGN_KEY_CHECKS=1")
    connection.close()
    with open(directory / SQL_DUMP, "rb") as dump:
        done = subprocess.run(
            [*argv, _database()["NAME"]], stdin=dump, stderr=subprocess.PIPE, env=env, timeout=DUMP_TIMEOUT_S
        )
    if done.returncode != 0:
        raise BackupError(f"loading the dump failed: {done.stderr.decode(errors='replace').strip()[:300]}")


def upgraded_since(backed_up: Path) -> bool:
    """The node's contracts file names the backup's deployment as its ``previous``: the consortium
    moved to new contracts after the backup (docs/OPERATIONS.md, Upgrades), and a restore keeps
    the node on them rather than putting the old file back."""
    try:
        current, old = load_deployment(settings.DEFL_CONTRACTS_FILE), load_deployment(backed_up)
    except LedgerConfigError:  # an unreadable file here: the backup's replaces it
        return False
    return (
        current is not None
        and old is not None
        and current.previous is not None
        and (current.previous.chain_id, current.previous.addresses) == (old.chain_id, old.addresses)
    )


def restore(directory: Path, *, force: bool = False, fetch_chunks: bool = True) -> RestoreReport:
    """Restore this node from ``directory``; the node's processes must be stopped meanwhile."""
    from django.core.management import call_command

    from backend.swarm import factory
    from backend.swarm.api import restore_store

    clock = time.perf_counter()
    directory = Path(directory)
    manifest = read_manifest(directory)
    secret = json.loads((directory / SECRET_FILE).read_text())["DJANGO_SECRET_KEY"]
    if secret != settings.SECRET_KEY:
        raise BackupError(
            f"this node's DJANGO_SECRET_KEY is not the backup's: set it to the value in {directory / SECRET_FILE} "
            "first (the datasets' keyed record hashes derive from it)"
        )
    if _holds_state() and not force:
        raise BackupError(
            "this node's database holds data: restore into an empty one, or give --force to replace it"
        )
    keystore = Path(settings.DEFL_KEYSTORE_PATH)
    if (directory / KEYSTORE_FILE).exists():
        if keystore.exists() and _sha256(keystore) != _sha256(directory / KEYSTORE_FILE) and not force:
            raise BackupError(
                f"{keystore} holds another key than the backup's: move it away, or give --force"
            )
    _restore_database(directory, manifest)
    if (directory / KEYSTORE_FILE).exists():
        keystore.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(directory / KEYSTORE_FILE, keystore)
        _private_file(keystore)
    if (directory / CONTRACTS_FILE).exists() and not upgraded_since(directory / CONTRACTS_FILE):
        Path(settings.DEFL_CONTRACTS_FILE).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(directory / CONTRACTS_FILE, settings.DEFL_CONTRACTS_FILE)
    for cached in (factory.node_swarm, factory.local_store, factory.peer_directory):
        cached.cache_clear()
    restore_store(factory.local_store(), directory / CHUNKS_DIR)
    for cached in (factory.node_swarm, factory.local_store, factory.peer_directory):
        cached.cache_clear()  # the store reopens the restored index
    call_command("migrate", interactive=False, verbosity=0)  # a backup of an older release
    migrated = manifest.get("migrations") != _migration_leaves()
    missing = fetched = unavailable = 0
    if fetch_chunks:
        try:
            report = factory.node_swarm().refill()
            missing, fetched, unavailable = report.missing, report.fetched, report.unavailable
        except Exception as exc:  # no peer or chain now: the scheduled repairs bring them back later
            raise BackupError(
                f"restored, but the chunks missing here could not be fetched from peers now ({exc}); "
                "start the node: the peers' scheduled repairs bring them back"
            ) from exc
    return RestoreReport(
        len(manifest["files"]), migrated, missing, fetched, unavailable, time.perf_counter() - clock
    )
