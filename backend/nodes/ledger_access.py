"""The one place where the nodes, datasets and serving apps get this node's ``Ledger``.

The ledger builds its facade (client + deployed contracts) from the settings in its
own factory; until that factory exists in a build, ``node_ledger()`` returns None
and callers skip or degrade their chain steps with a clear message. Tests replace
this function to run against an in-process chain.
"""

from __future__ import annotations

LEDGER_MISSING = "the ledger is not available on this node"


class LedgerMissing(RuntimeError):
    """This build has no ledger factory; chain steps are skipped where that is allowed."""


def node_ledger():
    try:
        from backend.ledger.factory import get_ledger
    except ImportError:
        return None
    return get_ledger()


def indexed_block(ledger) -> int | None:
    """The last block the ledger's event indexer has mirrored into the database."""
    try:
        from backend.ledger.factory import get_indexer
    except ImportError:
        return None
    return get_indexer(ledger).last_block()


def require_ledger():
    ledger = node_ledger()
    if ledger is None:
        raise LedgerMissing(LEDGER_MISSING)
    return ledger
