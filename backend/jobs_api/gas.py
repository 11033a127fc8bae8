"""The gas each of a job's transactions used, read from its receipt once and kept.

A receipt never changes once its block is final, so each transaction's gas is asked of the
chain once per node (kept in the node's shared cache, which all its processes read) and every
later page of the job reads it from there. Transactions of every member count: the chain's
events name them, the receipts say what each cost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.core.cache import cache

logger = logging.getLogger(__name__)

KEY = "defl:gas:{}"
# Receipts read in one request at most: a long job's first page load asks the rest on its next poll.
MAX_READS_PER_CALL = 200


def transaction_gas(ledger, tx_hashes: Iterable[str]) -> dict[str, int | None]:
    """tx hash -> gas used (None: not known yet, or no receipt on this chain)."""
    hashes = sorted({h for h in tx_hashes if h})
    known = cache.get_many([KEY.format(h) for h in hashes])
    found: dict[str, int | None] = {h: known.get(KEY.format(h)) for h in hashes}
    missing = [h for h, gas in found.items() if gas is None][:MAX_READS_PER_CALL]
    if ledger is None or not missing:
        return found
    fresh: dict[str, int] = {}
    for tx_hash in missing:
        try:
            gas = ledger.client.gas_used(tx_hash)
        except Exception as exc:  # the chain unreachable: the page shows the gas on a later poll
            logger.warning("gas of %s unreadable: %r", tx_hash, exc)
            break
        if gas is not None:
            fresh[KEY.format(tx_hash)] = gas
            found[tx_hash] = gas
    if fresh:
        cache.set_many(fresh, timeout=None)
    return found
