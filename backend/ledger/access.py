"""The one place where the other apps get this node's ``Ledger``.

The ledger builds its facade (client + deployed contracts) from the settings in its own
factory; callers go through ``node_ledger()`` so tests can point them at an in-process
chain, and ``require_ledger()`` where a chain step cannot be skipped.
"""

from __future__ import annotations

from backend.ledger.factory import get_indexer, get_ledger

LEDGER_MISSING = "the ledger is not available on this node"


class LedgerMissing(RuntimeError):
    """No ledger is configured for this node; chain steps are skipped where that is allowed."""


def node_ledger():
    return get_ledger()


def indexed_block(ledger) -> int | None:
    """The last block the ledger's event indexer has mirrored into the database."""
    return get_indexer(ledger).last_block()


def require_ledger():
    ledger = node_ledger()
    if ledger is None:
        raise LedgerMissing(LEDGER_MISSING)
    return ledger
