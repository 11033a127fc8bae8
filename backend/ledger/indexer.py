"""EventIndexer: mirrors the contracts' events into the database.

It reads logs in block batches up to ``head - confirmations``; each batch is one database
transaction that stores the ChainEvent rows, applies the projections of the new ones and moves
the cursor, so a crash resumes at the last committed block and a replay changes nothing.
Reorganisations deeper than ``confirmations`` are not handled: choose it for your chain.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from . import projections
from .abi import DecodedEvent
from .client import ChainClient
from .models import ChainEvent, IndexerCursor
from .resources import Deployment


@dataclass(frozen=True)
class IndexResult:
    from_block: int
    to_block: int
    events: int  # events seen in the range
    new_events: int  # events not stored before


class EventIndexer:
    def __init__(
        self,
        client: ChainClient,
        deployment: Deployment,
        *,
        confirmations: int = 0,
        batch_blocks: int = 2_000,
    ):
        self.client = client
        self.deployment = deployment
        self.confirmations = confirmations
        self.batch_blocks = batch_blocks
        self.addresses = list(deployment.addresses.values())
        self.cursor_key = f"{deployment.chain_id}:{deployment.address('NodeRegistry')}"

    def last_block(self) -> int:
        cursor = IndexerCursor.objects.filter(key=self.cursor_key).first()
        return cursor.last_block if cursor else self.deployment.block - 1

    def sync(self, head: int | None = None) -> IndexResult:
        """Index every confirmed block not indexed yet.

        ``head``: the chain's latest block number when the caller knows it already (from a
        newHeads notification of the same endpoint); else it is asked for.
        """
        start = self.last_block() + 1
        head = (self.client.block_number() if head is None else head) - self.confirmations
        seen = new = 0
        block = start
        while block <= head:
            end = min(head, block + self.batch_blocks - 1)
            events = [
                e
                for e in map(self.client.decoder.decode, self.client.get_logs(self.addresses, block, end))
                if e
            ]
            events.sort(key=lambda e: (e.block_number, e.log_index))
            new += self._store(events, end)
            seen += len(events)
            block = end + 1
        return IndexResult(start, max(head, start - 1), seen, new)

    def follow(
        self,
        *,
        interval: float = 2.0,
        stop: threading.Event | None = None,
        on_result: Callable[[IndexResult], None] | None = None,
    ) -> None:
        """Sync forever (or until ``stop`` is set), sleeping ``interval`` between passes."""
        stop = stop or threading.Event()
        while not stop.is_set():
            result = self.sync()
            if on_result:
                on_result(result)
            stop.wait(interval)

    @transaction.atomic
    def _store(self, events: list[DecodedEvent], last_block: int) -> int:
        # One query for the batch's stored events and one insert for the new ones: an event at a
        # time (a select, a savepoint, an insert) made indexing a block the largest part of an
        # agent's tick, and every node indexes each block the moment it is mined.
        known = self._known({e.tx_hash for e in events})
        fresh = [e for e in events if (e.tx_hash, e.log_index) not in known]
        ChainEvent.objects.bulk_create(
            [
                ChainEvent(
                    tx_hash=e.tx_hash,
                    log_index=e.log_index,
                    contract=e.contract,
                    address=e.address,
                    name=e.name,
                    block_number=e.block_number,
                    args=e.args,
                )
                for e in fresh
            ]
        )
        for event in fresh:
            projections.apply(event)
        if not IndexerCursor.objects.filter(key=self.cursor_key).update(last_block=last_block):
            IndexerCursor.objects.create(key=self.cursor_key, last_block=last_block)
        return len(fresh)

    @staticmethod
    def _known(tx_hashes: set[str]) -> set[tuple[str, int]]:
        known: set[tuple[str, int]] = set()
        hashes = sorted(tx_hashes)
        for i in range(0, len(hashes), 500):  # within any database's limit on query parameters
            rows = ChainEvent.objects.filter(tx_hash__in=hashes[i : i + 500]).values_list(
                "tx_hash", "log_index"
            )
            known.update(rows)
        return known
