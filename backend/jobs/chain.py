"""The jobs app's calls to the chain, named in one file (the ledger's client does the RPC).

Reads that decide whether an action is still due go to the contract itself (``participant``,
``job_state``), so a task never acts twice even when the event mirror lags behind.
"""

from __future__ import annotations

import math
import time

from django.db import IntegrityError

from backend.jobs.context import NodeContext
from backend.jobs.driver.timing import CHAIN_READ, CHAIN_TX, part
from backend.ledger import errors as ledger_errors
from backend.ledger.resources import JobSpec, JobState, JobStatus, ParticipantInfo, RoundPhase, TxReceipt
from backend.limits import MAX_SPEND_PER_ROUND_MICRO, MICRO_EPSILON

__all__ = ["ledger_errors", "JobSpec", "JobState", "JobStatus", "ParticipantInfo", "RoundPhase", "TxReceipt"]

# FederatedLearning.MAX_SPEND_PER_ROUND (= DataRegistry.MAX_PRIVACY_CAP): epsilon 100.
MAX_SPEND_PER_ROUND = MAX_SPEND_PER_ROUND_MICRO
# One release may charge at most this many times the job's whole target epsilon (see below).
SPEND_BOUND_FACTOR = 2


def planned_spend_bound(config) -> int:
    """The job's on-chain ``maxSpendPerRound`` (micro-epsilon) computed from its configuration.

    0 for a job without DP (the chain then accepts no spend and needs none before an update).
    Otherwise twice the job's target epsilon, capped at the contract's limit: an honest release
    charges a dataset at most what the whole job was planned to spend (a round's increase of the
    dataset's composed RDP epsilon is below the job's total at the job's delta); the factor leaves
    room for a dataset whose own delta is smaller than the job's. Anything above it is no release
    this job planned, and the chain refuses it.
    """
    dp = config.dp
    if not dp.private or not dp.target_epsilon:
        return 0
    bound = math.ceil(SPEND_BOUND_FACTOR * float(dp.target_epsilon) * MICRO_EPSILON)
    return max(1, min(bound, MAX_SPEND_PER_ROUND))


def _hex32(value: str) -> bytes:
    return bytes.fromhex(value.removeprefix("0x"))


def propose_job(ctx: NodeContext, spec: JobSpec) -> TxReceipt:
    return ctx.ledger.client.transact(ctx.ledger.fl.encode("proposeJob", spec.as_abi()))


def join(ctx: NodeContext, job_id: int, dataset_id: int) -> TxReceipt:
    return ctx.ledger.fl.join(job_id, dataset_id)


def start(ctx: NodeContext, job_id: int) -> TxReceipt:
    """Start the job; the contract draws the first committee (JobStarted names it)."""
    return ctx.ledger.fl.start_job(job_id)


def allows_small_committees(ctx: NodeContext) -> bool:
    """Whether this deployment is a development one that accepts committees of 1, 2 or an even
    size (FederatedLearning's immutable allowSmallCommittees; read when a job is created)."""
    with part(CHAIN_READ):
        return ctx.ledger.fl.allow_small_committees()


def cancel(ctx: NodeContext, job_id: int) -> TxReceipt:
    return ctx.ledger.fl.cancel(job_id)


def spend_privacy(ctx: NodeContext, job_id: int, round_: int, micro_epsilon: int) -> TxReceipt:
    """This node's privacy spend for one release in ``round_`` (before the release is published)."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.spend_privacy(job_id, round_, micro_epsilon)


def submit_update(
    ctx: NodeContext,
    job_id: int,
    round_: int,
    reference: str,
    content_hash: str,
    samples: int,
    spend: int = 0,
) -> TxReceipt:
    """``spend``: the release's privacy spend recorded in the same transaction (0: sent already)."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.submit_update(
            job_id, round_, _hex32(reference), _hex32(content_hash), samples, spend
        )


def commit_scores(
    ctx: NodeContext, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
) -> TxReceipt:
    """The member's commitment to its scores and base score (only the hash goes on chain)."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.commit_scores(job_id, round_, scores, base_score, salt)


def reveal_scores(
    ctx: NodeContext, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
) -> TxReceipt:
    """The committed scores and base score (the margin rule's base), with the commitment's salt."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.reveal_scores(job_id, round_, scores, base_score, salt)


def commit_and_reveal_scores(
    ctx: NodeContext, job_id: int, round_: int, scores: dict[str, int], base_score: int
) -> TxReceipt:
    """The last member's commitment and its reveal in one transaction."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.commit_and_reveal_scores(job_id, round_, scores, base_score)


def finalize(ctx: NodeContext, job_id: int, round_: int) -> TxReceipt:
    with part(CHAIN_TX):
        return ctx.ledger.fl.finalize_round(job_id, round_)


def propose_model(ctx: NodeContext, job_id: int, round_: int, reference: str, model_hash: str) -> TxReceipt:
    with part(CHAIN_TX):
        return ctx.ledger.fl.propose_global_model(job_id, round_, _hex32(reference), _hex32(model_hash))


def confirm_model(ctx: NodeContext, job_id: int, round_: int, model_hash: str, reference: str) -> TxReceipt:
    """Confirm the proposal of this (model hash, reference) pair, both recomputed by this node."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.confirm_global_model(job_id, round_, _hex32(model_hash), _hex32(reference))


def skip_aggregation(ctx: NodeContext, job_id: int, round_: int) -> TxReceipt:
    with part(CHAIN_TX):
        return ctx.ledger.fl.skip_aggregation(job_id, round_)


def participant(ctx: NodeContext, job_id: int) -> ParticipantInfo:
    with part(CHAIN_READ):
        return ctx.ledger.fl.get_participant(job_id, ctx.address)


def job_state(ctx: NodeContext, job_id: int) -> JobState:
    with part(CHAIN_READ):
        return ctx.ledger.fl.get_job(job_id)


def chain_time(ctx: NodeContext, latest_timestamp: int | None = None) -> int:
    """Seconds as the contract will see them: the latest block's timestamp, or the clock when later.

    A chain that mines only on transactions (anvil, eth-tester) has an old latest block while
    idle; the next block takes the wall clock, which is what a deadline check will meet.
    ``latest_timestamp``: the latest block's, when the caller has it (a newHeads notification).
    """
    if latest_timestamp is None:
        block = ctx.ledger.client.read(lambda: ctx.ledger.client.w3.eth.get_block("latest"))
        latest_timestamp = int(block["timestamp"])
    return max(int(latest_timestamp), int(time.time()))


def contract_now(ctx: NodeContext, job: JobState) -> int:
    """What the contract compares the job's deadlines with: a block number or seconds."""
    return ctx.ledger.client.block_number() if job.use_blocks else chain_time(ctx)


def sync_mirror(ctx: NodeContext, head: int | None = None) -> None:
    """Run the event indexer once (it alone writes the mirror tables); ``head``: see EventIndexer.sync."""
    from backend.ledger.indexer import EventIndexer

    indexer = EventIndexer(ctx.ledger.client, ctx.ledger.deployment, confirmations=ctx.confirmations)
    try:
        indexer.sync(head)
    except IntegrityError:
        # Another process stored the same events at the same moment; the next pass resumes.
        pass
