"""EventIndexer: mirrors the contracts' events into the database.

It reads logs in block batches up to ``head - confirmations``; each batch is one database
transaction that stores the ChainEvent rows, applies the projections of the new ones and moves
the cursor, so a crash resumes at the last committed block and a replay changes nothing.
Several indexers of one database (a node's agent and web server) take turns on the cursor's row:
a batch another one stored meanwhile is skipped, never inserted twice.

It follows the canonical chain: before each pass it checks that the events it mirrored for the
last ``reorg_window`` blocks are the chain's events there now, and unwinds the mirror to the
block before the first difference if not (reorgs.py), so a block dropped by a reorganisation
leaves no trace; ``confirmations`` only keeps it behind the head, so that the common one-block
fork of a validator chain is never mirrored at all (DEFL_CONFIRMATIONS).

No event can stop it. Anyone can emit events (a name that is not UTF-8, a job id near 2^200),
so each event is mirrored on its own: one that cannot be decoded, is out of bounds
(projections.bounded, projections.Rejected) or that the database refuses is recorded as a
RejectedEvent with its reason and skipped, and the cursor moves on. The batch is first stored
as before (one insert, then the projections: the queries of the happy path did not change); only
if that fails is it stored again an event at a time, each in its own savepoint. Errors of the
database itself (connection lost, lock wait, deadlock) are not the event's fault: they abort the
batch, which is retried on the next pass.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import DatabaseError, DataError, IntegrityError, OperationalError, transaction
from web3.exceptions import Web3RPCError

from . import projections, reorgs
from .abi import DecodedEvent
from .client import ChainClient
from .models import ChainEvent, IndexerCursor, RejectedEvent
from .resources import Deployment

logger = logging.getLogger(__name__)

# MariaDB/MySQL errors about a value (raised as OperationalError by mysqlclient), not the server:
# incorrect string value, data too long, out of range, truncated, illegal mix of collations.
_VALUE_ERROR_CODES = frozenset({1264, 1265, 1266, 1267, 1292, 1366, 1406, 3140})


class StoredElsewhere(IntegrityError):
    """Another process (a node's agent and worker both index) stored this event meanwhile: not
    the event's fault; the batch is abandoned and the next pass finds the event stored."""


def is_event_fault(exc: BaseException) -> bool:
    """True when storing an event failed because of the event (reject it), False when the
    database or this process is at fault (keep the cursor, retry the batch later)."""
    if isinstance(exc, StoredElsewhere):
        return False
    if isinstance(exc, projections.Rejected | DataError | IntegrityError):
        return True
    if isinstance(exc, OperationalError):
        code = exc.args[0] if exc.args else None
        return isinstance(code, int) and code in _VALUE_ERROR_CODES
    if isinstance(exc, DatabaseError):
        return False
    return isinstance(
        exc, ObjectDoesNotExist | ValidationError | ValueError | TypeError | KeyError | OverflowError
    )


@dataclass(frozen=True)
class Rejection:
    """A log the indexer skips, and why (becomes a RejectedEvent row)."""

    log: Any
    reason: str
    event: DecodedEvent | None = None

    def row(self) -> RejectedEvent:
        log, event = self.log, self.event
        reason = self.reason[: RejectedEvent.MAX_REASON]
        if log is None:  # refused when stored: its decoded event says where it was
            if event is None:
                raise ValueError("a rejection carries its log, its decoded event, or both")
            return RejectedEvent(
                contract=event.contract,
                address=event.address[:42],
                name=event.name,
                block_number=event.block_number,
                tx_hash=event.tx_hash,
                log_index=event.log_index,
                reason=reason,
                topics=[],
                data="0x",
                data_size=0,
            )
        data = bytes(log["data"])
        tx_hash = log["transactionHash"]
        return RejectedEvent(
            contract=event.contract if event else "",
            address=str(log["address"])[:42],
            name=event.name if event else "",
            block_number=int(log["blockNumber"]),
            tx_hash=tx_hash if isinstance(tx_hash, str) else "0x" + bytes(tx_hash).hex(),
            log_index=int(log["logIndex"]),
            reason=reason,
            topics=["0x" + bytes(t).hex() for t in log["topics"][:4]],
            data=("0x" + data[: RejectedEvent.MAX_DATA // 2].hex())[: RejectedEvent.MAX_DATA],
            data_size=len(data),
        )


@dataclass(frozen=True)
class IndexResult:
    from_block: int
    to_block: int
    events: int  # events seen in the range
    new_events: int  # events not stored before
    rejected: int = 0  # events skipped in the range (RejectedEvent rows)
    unwound: reorgs.Unwind | None = None  # what a reorganisation took out of the mirror first


# Blocks below the cursor whose events are re-checked on each pass: deeper than any fork of a
# Clique consortium (settled within a rotation of its validators) and cheap to read (one request).
DEFAULT_REORG_WINDOW = 64


class EventIndexer:
    def __init__(
        self,
        client: ChainClient,
        deployment: Deployment,
        *,
        confirmations: int = 0,
        batch_blocks: int = 2_000,
        max_logs: int = 10_000,
        reorg_window: int | None = None,
    ):
        self.client = client
        self.deployment = deployment
        self.confirmations = confirmations
        # Blocks below the cursor re-checked against the chain on every pass (reorgs.py); the
        # in-process EVM never reorganises. At least the confirmations: they are where forks live.
        if reorg_window is None:
            reorg_window = 0 if client.in_process else DEFAULT_REORG_WINDOW
        self.reorg_window = max(reorg_window, confirmations + 1) if reorg_window else 0
        self.batch_blocks = batch_blocks
        # Anyone who pays the gas can fill blocks with events: a range that returned more than
        # ``max_logs`` logs, or that the RPC refused to answer whole, is halved for the next
        # request (down to one block), and grows back while ranges are quiet, so a flood costs
        # the attacker gas and the node only time.
        self.max_logs = max_logs
        self._span = batch_blocks
        self._most = batch_blocks  # below the smallest range the RPC refused to answer
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
        chain_head = self.client.block_number() if head is None else head
        unwound = self.follow_canonical(chain_head)
        start = self.last_block() + 1
        head = chain_head - self.confirmations
        seen = new = rejected = 0
        block = start
        while block <= head:
            end = min(head, block + self._span - 1)
            try:
                logs = self.client.get_logs(self.addresses, block, end)
            except (Web3RPCError, ValueError):
                if self._span == 1:
                    raise
                # A provider's limit on one answer ("more than 10000 results", "range too
                # large"): ask for half the range rather than fail on it forever.
                self._span = self._most = max(1, (end - block + 1) // 2)
                continue
            if len(logs) > self.max_logs:
                self._span = max(1, self._span // 2)
            elif len(logs) <= self.max_logs // 4:
                self._span = min(self._most, self._span * 2)
            batch = self.store_logs(logs, end)
            seen, new, rejected = seen + batch.events, new + batch.new_events, rejected + batch.rejected
            block = end + 1
        return IndexResult(start, max(head, start - 1), seen, new, rejected, unwound)

    def follow_canonical(self, chain_head: int) -> reorgs.Unwind | None:
        """Unwind the mirror where its last ``reorg_window`` blocks no longer match the chain."""
        indexed = self.last_block()
        if not self.reorg_window or indexed < self.deployment.block:
            return None
        low = max(self.deployment.block, indexed - self.reorg_window + 1)
        high = min(indexed, chain_head)
        logs = self.client.get_logs(self.addresses, low, high) if high >= low else []
        canonical = {reorgs.log_key(log) for log in logs if self._mirrors(log)}
        stored = reorgs.stored_keys(self.addresses, low, indexed)
        fork = reorgs.fork_point(stored, canonical, indexed, chain_head)
        if fork is None:
            return None
        return reorgs.unwind(self.cursor_key, self.addresses, fork)

    def follow(
        self,
        *,
        interval: float = 2.0,
        stop: threading.Event | None = None,
        on_result: Callable[[IndexResult], None] | None = None,
    ) -> None:
        """Sync forever (or until ``stop`` is set), sleeping ``interval`` between passes.

        No event raises here (they are rejected); what does is the chain or the database being
        away, or another process storing the same batch: logged, and the next pass retries.
        """
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                result = self.sync()
            except Exception:
                logger.exception(
                    "indexing failed at block %s; retrying in %ss", self.last_block() + 1, interval
                )
            else:
                if on_result:
                    on_result(result)
            stop.wait(interval)

    def _mirrors(self, log: Any) -> bool:
        """Whether store_logs keeps a row for this log (stored or rejected): all but the logs of
        events no ABI of ours knows, which it passes over."""
        try:
            return self.client.decoder.decode(log) is not None
        except Exception:  # noqa: BLE001 - undecodable: store_logs rejects it, a row all the same
            return True

    def store_logs(self, logs: list[Any], last_block: int) -> IndexResult:
        """Mirror these logs (of blocks up to ``last_block``) and move the cursor to ``last_block``.

        Logs of other contracts are ignored; a log that cannot be decoded or bounded is rejected
        before anything is stored.
        """
        events: list[DecodedEvent] = []
        rejections: list[Rejection] = []
        raw: dict[tuple[str, int], Any] = {}  # each event's log, kept for its rejection
        for log in logs:
            event = None
            try:
                event = self.client.decoder.decode(log)
                if event is not None and (event.tx_hash, event.log_index) not in raw:
                    events.append(projections.bounded(event))
                    raw[(event.tx_hash, event.log_index)] = log
            except Exception as exc:  # noqa: BLE001 - whatever a log holds, it is that log's fault
                rejections.append(Rejection(log, _reason(exc, "cannot decode it: "), event))
        events.sort(key=lambda e: (e.block_number, e.log_index))
        self._ensure_cursor()
        try:
            with transaction.atomic():
                new, rejected = self._store(events, rejections, raw, last_block, one_by_one=False)
        except Exception as exc:
            if not is_event_fault(exc):
                raise
            logger.warning(
                "blocks up to %s: an event was refused (%s); storing one at a time", last_block, exc
            )
            with transaction.atomic():
                new, rejected = self._store(events, rejections, raw, last_block, one_by_one=True)
        first = min((int(log["blockNumber"]) for log in logs), default=last_block)
        return IndexResult(first, last_block, len(events) + len(rejections), new, rejected)

    def _store(
        self,
        events: list[DecodedEvent],
        rejections: list[Rejection],
        raw: dict[tuple[str, int], Any],
        last_block: int,
        *,
        one_by_one: bool,
    ) -> tuple[int, int]:
        # One query for the batch's stored events and one insert for the new ones: an event at a
        # time (a select, a savepoint, an insert) made indexing a block the largest part of an
        # agent's tick, and every node indexes each block the moment it is mined. That is the
        # slow path, taken only when the batch holds an event that cannot be stored.
        # Indexers of one node (its agent, its web server's lifecycle calls) take turns on the
        # cursor's row: the second waits for the first to commit, then reads the events stored
        # (a replay: nothing is new), instead of inserting the same rows and meeting a duplicate
        # key. SQLite's writers take turns anyway (IMMEDIATE transactions).
        IndexerCursor.objects.select_for_update().filter(key=self.cursor_key).first()
        known = self._known({e.tx_hash for e in events})
        fresh = [e for e in events if (e.tx_hash, e.log_index) not in known]
        refused = list(rejections)
        stored = 0
        if not one_by_one:
            ChainEvent.objects.bulk_create([_row(e) for e in fresh])
            for event in fresh:
                projections.apply(event)
            stored = len(fresh)
        else:
            for event in fresh:
                try:
                    with transaction.atomic():
                        _insert(event)
                        projections.apply(event)
                    stored += 1
                except Exception as exc:
                    if not is_event_fault(exc):
                        raise
                    log = raw.get((event.tx_hash, event.log_index))
                    refused.append(Rejection(log, _reason(exc, "cannot store it: "), event))
        if refused:
            rows = [r.row() for r in refused]
            RejectedEvent.objects.bulk_create(rows, ignore_conflicts=True)
            for row in rows:
                logger.warning("skipped %s", row)
        if not IndexerCursor.objects.filter(key=self.cursor_key).update(last_block=last_block):
            IndexerCursor.objects.create(key=self.cursor_key, last_block=last_block)
        return stored, len(refused)

    def _ensure_cursor(self) -> None:
        """The cursor's row exists before a batch locks it (two indexers may create it at once)."""
        if not IndexerCursor.objects.filter(key=self.cursor_key).exists():
            try:
                with transaction.atomic():
                    IndexerCursor.objects.get_or_create(
                        key=self.cursor_key, defaults={"last_block": self.deployment.block - 1}
                    )
            except IntegrityError:  # created by the other one meanwhile
                pass

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


def _insert(event: DecodedEvent) -> None:
    # The chain gives each log one (tx hash, log index), and store_logs drops repeats: a
    # conflict on it is a concurrent indexer's row, not something this event did.
    try:
        with transaction.atomic():
            _row(event).save(force_insert=True)
    except IntegrityError as exc:
        raise StoredElsewhere(f"{event.tx_hash}:{event.log_index} stored by another process") from exc


def _row(e: DecodedEvent) -> ChainEvent:
    return ChainEvent(
        tx_hash=e.tx_hash,
        log_index=e.log_index,
        contract=e.contract,
        address=e.address,
        name=e.name,
        block_number=e.block_number,
        args=e.args,
    )


def _reason(exc: BaseException, context: str) -> str:
    if isinstance(exc, projections.Rejected):
        return str(exc)
    message = str(exc)
    if isinstance(exc, DatabaseError):  # shown to every role: not the database's or tables' names
        message = re.sub(r"`[^`]*`(\.`[^`]*`)*", "a column", message)
    return f"{context}{type(exc).__name__}: {message}"
