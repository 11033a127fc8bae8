"""Upgrade the previous release's database to this release's schema (run as a script).

    python -m tests.upgrade.migrate_scenario sqlite|mariadb

``previous_release/node.sqlite`` is org-a's database at the end of the previous release's life
(tests/upgrade/make_previous_release.py). On SQLite a copy of that file is migrated in place. On
MariaDB an empty database is migrated to exactly the migrations the snapshot recorded (its
schema), the snapshot's rows are loaded into it, and it is then migrated like the SQLite copy.

Checked after the upgrade:
- every row of every table of the old schema is still there with the same values in every column
  that still exists (a migration that transforms a column on purpose lists it in TRANSFORMED, one
  that drops a table or a column in DROPPED, each with its reason);
- the API answers as the old node's did (api.json, recorded by the old node): the operator logs in
  with the old password, the job, its rounds, its models and the dataset's privacy budget.

Prints one JSON object on its last line: the mismatches found (none when the upgrade kept the data).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).resolve().parent / "previous_release"
MARIADB = "mysql://root:@127.0.0.1:3306"

# (table, column) -> why a later migration changes its values on purpose.
TRANSFORMED: dict[tuple[str, str], str] = {}
# table or (table, column) -> why a later migration removes it.
DROPPED: dict[str | tuple[str, str], str] = {}
# (table, column) -> (its new name, why a later migration renames it): the value must be there.
RENAMED: dict[tuple[str, str], tuple[str, str]] = {
    ("ledger_dataset", "content_hash"): (
        "commitment",
        "contracts v2 (issue 33): the mirror holds the dataset's on-chain commitment, keyed by its "
        "owner's node on new registrations; a carried dataset keeps the hash it had",
    ),
}
# API answer (a name in _api_problems' checks) -> why this release answers it differently on purpose
# (e.g. an accounting change that recomputes every dataset's spent epsilon from the same releases).
CHANGED_ANSWERS: dict[str, str] = {
    "dataset epsilon": "issue 33: every release is accounted under replace-one adjacency (docs/PRIVACY.md), "
    "so the previous release's recorded releases compose to a larger epsilon than it reported",
    "job epsilon": "the same (issue 33)",
}
# Of those, the epsilons: an upgrade may account a release more conservatively, never less.
NEVER_LOWER = {"dataset epsilon", "job epsilon"}
# Rows that the upgrade itself adds or rewrites (Django's bookkeeping), not data of the node.
BOOKKEEPING = {"django_migrations", "django_content_type", "auth_permission"}


def _environment(workdir: Path, database_url: str, node_key: str) -> None:
    os.environ.update(
        DEFL_NODE_KEY=node_key,  # org-a's (a throwaway development key): the node answers as org-a
        DJANGO_SETTINGS_MODULE="backend.settings",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DEFL_DATA_DIR=str(workdir),
        DATABASE_URL=database_url,
        DJANGO_ALLOWED_HOSTS="localhost",
        DEFL_CONTRACTS_FILE=str(workdir / "contracts.json"),  # none: the API answers from the mirror
        DEFL_CHAIN_URL="",
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def _snapshot_rows() -> dict[str, tuple[list[str], list[tuple]]]:
    with sqlite3.connect(SNAPSHOT / "node.sqlite") as connection:
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        found = {}
        for table in tables:
            cursor = connection.execute(f'SELECT * FROM "{table}"')
            found[table] = ([d[0] for d in cursor.description], cursor.fetchall())
    return found


def _build_old_schema_on_mariadb(leaves: dict[str, str]) -> list[str]:
    """Migrate the empty database to the recorded migrations and load the snapshot's rows.

    Returns the schema differences from the snapshot (none unless an old migration was edited)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate(list(leaves.items()))
    rows = _snapshot_rows()
    problems = []
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
        if tables != set(rows):
            problems.append(f"tables differ from the snapshot's: {sorted(tables ^ set(rows))}")
        cursor.execute("SET FOREIGN_KEY_CHECKS=0")
        for table, (columns, values) in rows.items():
            if table not in tables:
                continue
            present = [c.name for c in connection.introspection.get_table_description(cursor, table)]
            if set(present) != set(columns):
                problems.append(
                    f"{table}: columns differ from the snapshot's: {sorted(set(present) ^ set(columns))}"
                )
                continue
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
            if values:
                names = ", ".join(connection.ops.quote_name(c) for c in columns)
                marks = ", ".join(["%s"] * len(columns))
                cursor.executemany(
                    f"INSERT INTO {connection.ops.quote_name(table)} ({names}) VALUES ({marks})", values
                )
        cursor.execute("SET FOREIGN_KEY_CHECKS=1")
    return problems


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def _dump() -> dict[str, dict[str, dict[str, Any]]]:
    """Every table's rows by primary key: {table: {pk: {column: value}}}."""
    from django.db import connection

    dump: dict[str, dict[str, dict[str, Any]]] = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            columns = [c.name for c in connection.introspection.get_table_description(cursor, table)]
            keys = connection.introspection.get_primary_key_columns(cursor, table) or columns
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            rows = {}
            for row in cursor.fetchall():
                record = {c: _plain(v) for c, v in zip(columns, row, strict=True)}
                rows[json.dumps([record[k] for k in keys])] = record
            dump[table] = rows
    return dump


def _compare(before: dict, after: dict) -> list[str]:
    problems = []
    for table, rows in before.items():
        if table in BOOKKEEPING:
            continue
        if table not in after:
            if table not in DROPPED:
                problems.append(f"table {table} ({len(rows)} rows) is gone")
            continue
        for key, old in rows.items():
            new = after[table].get(key)
            if new is None:
                problems.append(f"{table} row {key} is gone")
                continue
            for column, value in old.items():
                if column not in new and (table, column) in RENAMED:
                    renamed = RENAMED[table, column][0]
                    if new.get(renamed) != value:
                        problems.append(f"{table} row {key}: {column}, now {renamed}, was {value!r}")
                    continue
                if column not in new:
                    if (table, column) not in DROPPED:
                        problems.append(f"{table}.{column} is gone")
                    continue
                if new[column] != value and (table, column) not in TRANSFORMED:
                    problems.append(f"{table} row {key}: {column} was {value!r}, is {new[column]!r}")
    return problems[:50]


def _api_problems(record: dict) -> list[str]:
    """Log in as the old operator and ask what the old node was asked; compare the lasting fields."""
    from django.test import Client

    expected = json.loads((SNAPSHOT / "api.json").read_text())
    client = Client(SERVER_NAME="localhost")
    login = client.post(
        "/api/auth/login",
        {"username": record["operator"], "password": record["password"]},
        content_type="application/json",
    )
    if login.status_code != 200:
        return [f"the operator cannot log in: {login.status_code} {login.content[:200]!r}"]
    headers = {"HTTP_AUTHORIZATION": f"Token {login.json()['token']}"}
    job, dataset = record["job"], record["datasets"][0]
    paths = {
        "dataset": f"/api/datasets/{dataset}",
        "job": f"/api/jobs/{job}",
        "rounds": f"/api/jobs/{job}/rounds",
        "models": "/api/models",
        "jobs": "/api/jobs",
    }
    got = {}
    problems = []
    for name, path in paths.items():
        response = client.get(path, **headers)
        if response.status_code != 200:
            problems.append(f"GET {path}: {response.status_code} {response.content[:200]!r}")
            continue
        got[name] = response.json()
    if problems:
        return problems
    checks = {
        "dataset budget": lambda a: (
            a["dataset"]["budget"]["epsilon_cap"],
            [(j["job"], j["rounds"]) for j in a["dataset"]["budget"]["spent_by_jobs"]],
        ),
        "dataset epsilon": lambda a: (
            [a["dataset"]["budget"][k] for k in ("epsilon_spent", "epsilon_reserved")]
            + [j["epsilon"] for j in a["dataset"]["budget"]["spent_by_jobs"]]
        ),
        "dataset": lambda a: {
            k: a["dataset"][k] for k in ("name", "num_samples", "content_hash", "onchain_id", "status")
        },
        "job": lambda a: {
            **{k: a["job"][k] for k in ("status", "current_round", "rounds", "config_hash", "proposer")},
            # the old answer's fields of each participant (a later release may add more)
            "participants": [
                {k: p[k] for k in ("dataset", "index", "node")} for p in a["job"]["participants"]
            ],
        },
        "job epsilon": lambda a: [a["job"]["privacy"]["epsilon_max"]],
        "rounds": lambda a: [
            (
                r["round"],
                r["phase"],
                (r["global_model"] or {}).get("hash"),
                [u["accepted"] for u in r["updates"]],
                (r["metrics"] or {}).get("accuracy"),
            )
            for r in a["rounds"]
        ],
        "models": lambda a: sorted((m["job"], m["round"], m["content_hash"]) for m in a["models"]["results"]),
        "jobs": lambda a: sorted((j["id"], j["status"]) for j in a["jobs"]),
    }
    for name, pick in checks.items():
        if name in NEVER_LOWER and any(
            new < old - 1e-9 for old, new in zip(pick(expected), pick(got), strict=True)
        ):
            problems.append(
                f"{name}: the upgraded node reports less than the old one: {pick(got)!r} < {pick(expected)!r}"
            )
        if pick(expected) != pick(got) and name not in CHANGED_ANSWERS:
            problems.append(f"{name}: the old node said {pick(expected)!r}, the upgraded one {pick(got)!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("backend", choices=["sqlite", "mariadb"])
    args = parser.parse_args(argv)
    record = json.loads((SNAPSHOT / "migrations.json").read_text())
    workdir = Path(tempfile.mkdtemp(prefix="defl-upgrade-"))
    database = f"defl_upgrade_{os.getpid()}_{secrets.token_hex(3)}"
    schema_problems: list[str] = []
    if args.backend == "sqlite":
        shutil.copyfile(SNAPSHOT / "node.sqlite", workdir / "db.sqlite3")
        _environment(workdir, f"sqlite:///{workdir / 'db.sqlite3'}", record.get("node_key", "0x" + "11" * 32))
    else:
        from tests.mariadb_scenario import mariadb

        mariadb(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
        _environment(workdir, f"{MARIADB}/{database}", record.get("node_key", "0x" + "11" * 32))
    try:
        from django.core.management import call_command
        from django.db import connection

        if args.backend == "mariadb":
            schema_problems = _build_old_schema_on_mariadb(record["migrations"])
        before = _dump()
        clock = time.perf_counter()
        call_command("migrate", verbosity=0, interactive=False)
        seconds = time.perf_counter() - clock
        after = _dump()
        result = {
            "backend": args.backend,
            "tables": len(before),
            "rows": sum(len(rows) for rows in before.values()),
            "migrate_s": round(seconds, 2),
            "schema_problems": schema_problems,
            "data_problems": _compare(before, after),
            "api_problems": _api_problems(record),
        }
        connection.close()
    finally:
        if args.backend == "mariadb":
            from django.db import connections

            connections.close_all()
            from tests.mariadb_scenario import mariadb

            mariadb(f"DROP DATABASE IF EXISTS `{database}`")
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
