"""A scenario script's own MariaDB database: created, made this process's Django database, dropped.

The fault and hostile-event scenarios run Django in a process of their own (a script the test
starts), on a throwaway database of the local MariaDB server, so their locks, charsets and
errors are MariaDB's and nothing they do reaches the test database.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mariadb(statement: str) -> list[tuple]:
    """Run one statement on the server (no database selected) and return its rows."""
    import MySQLdb

    connection = MySQLdb.connect(host="127.0.0.1", port=3306, user="root", passwd="")
    try:
        cursor = connection.cursor()
        cursor.execute(statement)
        return list(cursor.fetchall())
    finally:
        connection.close()


@contextmanager
def throwaway_database(
    prefix: str, server_url: str, *, charset: str = "utf8mb4", apps: tuple[str, ...] = ()
) -> Iterator[str]:
    """A fresh database ``{prefix}_{pid}_{hex}`` as this process's Django database: environment
    set, created, Django set up and migrated (``apps``: their migrations only, all if empty);
    its name is yielded. Connections are closed and the database dropped after, whatever happened."""
    database = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
    os.environ.update(
        DATABASE_URL=f"{server_url}/{database}",
        DJANGO_SETTINGS_MODULE="backend.settings",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DEFL_DATA_DIR=os.environ.get("DEFL_DATA_DIR", f"/tmp/{database}"),
    )
    mariadb(f"CREATE DATABASE `{database}` CHARACTER SET {charset}")
    try:
        import django
        from django.core.management import call_command

        sys.path.insert(0, str(ROOT))
        django.setup()
        call_command("migrate", *apps, verbosity=0, skip_checks=True)
        yield database
    finally:
        from django.db import connections

        connections.close_all()
        mariadb(f"DROP DATABASE IF EXISTS `{database}`")
