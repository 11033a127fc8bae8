"""Following the canonical chain: the events of dropped blocks leave the mirror.

A chain of validators forks (two Clique sealers out of turn at once) and settles on one branch;
a development chain can be rewound (anvil's ``evm_revert``, ``anvil_reorg``). The mirror is a
function of the events alone, so the indexer (indexer.py) checks, before it reads new blocks,
that the events it stored for the last ``window`` blocks are exactly the events the chain has
there now (one eth_getLogs): blocks replaced by others with the same events change nothing,
and no block hash needs to be kept. Where they differ, or the chain is now shorter than what was
indexed, the mirror is unwound to the block before the first difference: the events above it
(stored or rejected) are deleted, the mirror tables are derived again from the events kept (they
are projections of them, in block order), and the cursor moves back, so the blocks above are
indexed again from the canonical chain. The (job, round) pairs of the dropped events are
reported, so the round driver plans their actions again (jobs/chain.py).

A fork deeper than the window goes unseen: choose it above the chain's deepest reorganisation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import models, transaction

from . import projections
from .abi import DecodedEvent
from .models import ChainEvent, IndexerCursor, RejectedEvent

logger = logging.getLogger(__name__)

# Ledger tables that are not derived from events: the events themselves, the cursor, and this
# node's own secrets (its score commitments). Every other ledger table is the mirror, rebuilt on
# an unwind (tests/ledger/test_reorgs.py checks each is written by projections.py).
NOT_DERIVED = frozenset({"ChainEvent", "RejectedEvent", "IndexerCursor", "ScoreCommitment"})

EventKey = tuple[str, int, int]  # (tx hash, log index, block number)


@dataclass(frozen=True)
class Unwind:
    """What an unwind took out of the mirror."""

    fork_block: int  # the last block whose events the mirror keeps
    dropped: int  # events deleted (stored or rejected)
    rounds: frozenset[tuple[int, int]]  # (job id, round) named by the dropped events


def log_key(log: Any) -> EventKey:
    tx_hash = log["transactionHash"]
    tx = tx_hash if isinstance(tx_hash, str) else "0x" + bytes(tx_hash).hex()
    return tx.lower(), int(log["logIndex"]), int(log["blockNumber"])


def stored_keys(addresses: Sequence[str], low: int, high: int) -> set[EventKey]:
    """The events the mirror holds for blocks low..high, stored or rejected."""
    keys: set[EventKey] = set()
    for model in (ChainEvent, RejectedEvent):
        rows = model.objects.filter(address__in=addresses, block_number__gte=low, block_number__lte=high)
        keys.update(
            (tx.lower(), index, block)
            for tx, index, block in rows.values_list("tx_hash", "log_index", "block_number")
        )
    return keys


def fork_point(stored: set[EventKey], canonical: Iterable[EventKey], indexed: int, head: int) -> int | None:
    """The last block both agree on, or None when the mirror matches the chain.

    ``stored``: the mirror's events of the checked blocks; ``canonical``: the chain's events of
    the same blocks up to ``head``; ``indexed``: the last block the mirror covers.
    """
    differing = stored.symmetric_difference(canonical)
    first = min((block for _, _, block in differing), default=None)
    if indexed > head:  # the chain is now shorter than what was indexed
        first = head + 1 if first is None else min(first, head + 1)
    return None if first is None else first - 1


def unwind(cursor_key: str, addresses: Sequence[str], fork_block: int) -> Unwind:
    """Take the events above ``fork_block`` out of the mirror and derive the tables again (one
    transaction, holding the cursor's row as the indexer's batches do)."""
    with transaction.atomic():
        IndexerCursor.objects.select_for_update().filter(key=cursor_key).first()
        dropped_events = ChainEvent.objects.filter(address__in=addresses, block_number__gt=fork_block)
        rounds = frozenset(_rounds(dropped_events.values_list("args", flat=True)))
        stored, _ = dropped_events.delete()
        rejected, _ = RejectedEvent.objects.filter(
            address__in=addresses, block_number__gt=fork_block
        ).delete()
        if stored:
            rebuild_mirror()
        IndexerCursor.objects.filter(key=cursor_key, last_block__gt=fork_block).update(last_block=fork_block)
    logger.warning(
        "chain reorganised above block %s: %s events unwound from the mirror", fork_block, stored + rejected
    )
    return Unwind(fork_block=fork_block, dropped=stored + rejected, rounds=rounds)


def derived_models() -> list[type[models.Model]]:
    """The mirror's tables: every ledger model but NOT_DERIVED."""
    return [m for m in apps.get_app_config("ledger").get_models() if m.__name__ not in NOT_DERIVED]


def rebuild_mirror() -> int:
    """Empty the mirror's tables and apply every stored event again, in block order (the
    projections' own order when they were first applied); the number of events applied."""
    for model in reversed(derived_models()):  # dependents (declared later) before what they name
        model._default_manager.all().delete()
    applied = 0
    for row in ChainEvent.objects.order_by("block_number", "log_index").iterator():
        projections.apply(
            DecodedEvent(
                contract=row.contract,
                name=row.name,
                args=row.args,
                address=row.address,
                block_number=row.block_number,
                tx_hash=row.tx_hash,
                log_index=row.log_index,
            )
        )
        applied += 1
    return applied


def _rounds(all_args: Iterable[Any]) -> Iterable[tuple[int, int]]:
    for args in all_args:
        if isinstance(args, dict) and "jobId" in args:
            yield int(args["jobId"]), int(args.get("round", 0))
