"""Two indexers of one MariaDB database storing the same blocks at once (run as a script).

A node's agent and its web server both run the event indexer on one database. After a database
restart they resume together, and both read, then store, the same batch of blocks. Indexer A
stores the batch in a transaction held open (it has not committed yet); indexer B starts on the
same batch and must wait for A (a lock wait, seen in InnoDB's transaction list) before A commits.
B then finds the batch stored: it stores nothing, refuses nothing, and logs no refusal.

Prints one JSON object on its last line: what B returned and logged, and the rows stored.
Needs MariaDB on ``--mariadb`` (creates, migrates and drops a database of its own).
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time

from tests.mariadb_scenario import mariadb, throwaway_database

LOCK_WAIT_S = 30.0  # below InnoDB's lock wait timeout (50 s)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((threading.current_thread().name, f"{record.levelname} {record.getMessage()}"))


def race(database: str) -> dict:
    from django.db import connection, transaction

    from backend.ledger.indexer import EventIndexer
    from backend.ledger.models import ChainEvent, IndexerCursor, Node, RejectedEvent
    from tests.ledger.conftest import make_federation

    ledgers = make_federation(members=3, seed=f"indexer-race-{database}")
    client, deployment = ledgers[0].client, ledgers[0].deployment
    head = client.block_number()
    logs = client.get_logs(list(deployment.addresses.values()), deployment.block, head)
    # The node has indexed before (its cursor exists): the first blocks are stored already.
    earlier = int(logs[len(logs) // 2 - 1]["blockNumber"])
    EventIndexer(client, deployment).store_logs(
        [x for x in logs if int(x["blockNumber"]) <= earlier], earlier
    )
    logs = [x for x in logs if int(x["blockNumber"]) > earlier]
    assert logs, "no later block holds an event"
    records = _Records()
    logging.getLogger("backend.ledger").addHandler(records)
    logging.getLogger("backend.ledger").setLevel(logging.DEBUG)

    a_stored, a_commit = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def indexer_a() -> None:
        try:
            with transaction.atomic():  # held open: the batch is stored, not yet committed
                results["a"] = EventIndexer(client, deployment).store_logs(logs, head)
                a_stored.set()
                a_commit.wait(LOCK_WAIT_S * 2)
        finally:
            a_stored.set()
            connection.close()

    def indexer_b() -> None:
        try:
            results["b"] = EventIndexer(client, deployment).store_logs(logs, head)
        except Exception as exc:  # reported, not raised: the JSON says what happened
            results["b_error"] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    first = threading.Thread(target=indexer_a, name="indexer-a")
    first.start()
    a_stored.wait(LOCK_WAIT_S)
    second = threading.Thread(target=indexer_b, name="indexer-b")
    second.start()
    # B waits on A's locks (the cursor's row, or the rows A inserted): a statement of B's stays
    # in progress on this database while A, idle, holds its transaction open.
    waited = False
    deadline = time.monotonic() + LOCK_WAIT_S
    while time.monotonic() < deadline and second.is_alive():
        rows = mariadb(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
            f"WHERE db = '{database}' AND info IS NOT NULL AND time >= 1"
        )
        if rows[0][0]:
            waited = True
            break
        time.sleep(0.05)
    a_commit.set()
    first.join()
    second.join()
    b = results.get("b")
    return {
        "logs": len(logs),
        "a_new_events": getattr(results.get("a"), "new_events", None),
        "b_waited_for_a": waited,
        "b_new_events": getattr(b, "new_events", None),
        "b_rejected": getattr(b, "rejected", None),
        "b_error": results.get("b_error", ""),
        "b_logged": [line for name, line in records.lines if name == "indexer-b"],
        "warnings": [line for _name, line in records.lines if line.startswith(("WARNING", "ERROR"))],
        "chain_events": ChainEvent.objects.count(),
        "rejected_events": RejectedEvent.objects.count(),
        "nodes": Node.objects.count(),
        "cursor": IndexerCursor.objects.get().last_block,
        "head": head,
        "vendor": connection.vendor,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mariadb", default="mysql://root@127.0.0.1:3306", help="server URL, no database")
    options = parser.parse_args()
    with throwaway_database("defl_race", options.mariadb, apps=("ledger",)) as database:
        report = race(database)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
