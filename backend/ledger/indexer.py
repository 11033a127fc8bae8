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

    def sync(self) -> IndexResult:
        """Index every confirmed block not indexed yet."""
        start = self.last_block() + 1
        head = self.client.block_number() - self.confirmations
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
        new = 0
        for event in events:
            _, created = ChainEvent.objects.get_or_create(
                tx_hash=event.tx_hash,
                log_index=event.log_index,
                defaults=dict(
                    contract=event.contract,
                    address=event.address,
                    name=event.name,
                    block_number=event.block_number,
                    args=event.args,
                ),
            )
            if created:
                projections.apply(event)
                new += 1
        IndexerCursor.objects.update_or_create(key=self.cursor_key, defaults={"last_block": last_block})
        return new
