"""The jobs app's calls to the chain, named in one file (the ledger's client does the RPC).

Reads that decide whether an action is still due go to the contract itself (``participant``,
``job_state``), so a task never acts twice even when the event mirror lags behind.
"""

from __future__ import annotations

import time

from django.db import IntegrityError

from backend.jobs.context import NodeContext
from backend.jobs.driver.timing import CHAIN_READ, CHAIN_TX, part
from backend.ledger import errors as ledger_errors
from backend.ledger.resources import (
    JobSpec,
    JobState,
    JobStatus,
    ParticipantInfo,
    RoundPhase,
    SpendKind,
    TxReceipt,
)

__all__ = [
    "ledger_errors",
    "JobSpec",
    "JobState",
    "JobStatus",
    "ParticipantInfo",
    "RoundPhase",
    "SpendKind",
    "TxReceipt",
]


def _hex32(value: str) -> bytes:
    return bytes.fromhex(value.removeprefix("0x"))


def propose_job(ctx: NodeContext, spec: JobSpec) -> TxReceipt:
    return ctx.ledger.client.transact(ctx.ledger.fl.encode("proposeJob", spec.as_abi()))


def join(ctx: NodeContext, job_id: int, dataset_id: int) -> TxReceipt:
    """Join with a dataset, committing to this node's draw secret for the job (derived from its key)."""
    return ctx.ledger.fl.join(job_id, dataset_id)


def start(ctx: NodeContext, job_id: int) -> TxReceipt:
    """Close the joins; the participants then reveal their draw secrets (reveal_draw_secret), and
    the first committee is drawn from them (JobStarted names it)."""
    return ctx.ledger.fl.start_job(job_id)


def reveal_draw_secret(ctx: NodeContext, job_id: int) -> TxReceipt:
    """This node's draw secret for the job; the reveal that completes the set draws the committee."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.reveal_draw_secret(job_id)


def draw_committee(ctx: NodeContext, job_id: int) -> TxReceipt:
    """After the reveal deadline: draw the first committee from the participants that revealed."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.draw_committee(job_id)


def allows_small_committees(ctx: NodeContext) -> bool:
    """Whether this deployment is a development one that accepts committees of 1, 2 or an even
    size (FederatedLearning's immutable allowSmallCommittees; read when a job is created)."""
    with part(CHAIN_READ):
        return ctx.ledger.fl.allow_small_committees()


def cancel(ctx: NodeContext, job_id: int) -> TxReceipt:
    return ctx.ledger.fl.cancel(job_id)


def spend_privacy(
    ctx: NodeContext, job_id: int, round_: int, micro_epsilon: int, kind: SpendKind, steps: int = 0
) -> TxReceipt:
    """This node's privacy spend for one release in ``round_`` (before the release is published);
    ``kind``: an update, scores or a withheld update; ``steps``: a training release's local steps."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.spend_privacy(job_id, round_, micro_epsilon, kind, steps)


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
    ctx: NodeContext, job_id: int, round_: int, scores: dict[str, int], base_score: int, salt: bytes
) -> TxReceipt:
    """The last member's commitment and its reveal in one transaction (its salt enters the draws)."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.commit_and_reveal_scores(job_id, round_, scores, base_score, salt)


def finalize(ctx: NodeContext, job_id: int, round_: int) -> TxReceipt:
    with part(CHAIN_TX):
        return ctx.ledger.fl.finalize_round(job_id, round_)


def vote_model(ctx: NodeContext, job_id: int, round_: int, reference: str, model_hash: str) -> TxReceipt:
    """This member's vote for the (model hash, reference) pair it recomputed."""
    with part(CHAIN_TX):
        return ctx.ledger.fl.vote_global_model(job_id, round_, _hex32(reference), _hex32(model_hash))


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
        latest_timestamp = ctx.ledger.client.block_timestamp("latest")
    return max(int(latest_timestamp), int(time.time()))


def contract_now(ctx: NodeContext, job: JobState) -> int:
    """What the contract compares the job's deadlines with: a block number or seconds."""
    return ctx.ledger.client.block_number() if job.use_blocks else chain_time(ctx)


# How long an API call waits for its own transaction's block to be confirmed (sync_mirror).
CONFIRMATION_WAIT_S = 120.0


def sync_mirror(ctx: NodeContext, head: int | None = None, *, through_block: int | None = None) -> None:
    """Run the event indexer once (it alone writes the mirror tables); ``head``: see EventIndexer.sync.

    ``through_block``: the block of a transaction this node just sent; first wait (at most
    CONFIRMATION_WAIT_S) until it has the node's confirmations, so the mirror holds its events
    when this returns: the API reads its own writes from the mirror (a job it created, a join).
    """
    from backend.ledger.indexer import EventIndexer

    if through_block is not None and ctx.confirmations:
        deadline = time.monotonic() + CONFIRMATION_WAIT_S
        while ctx.ledger.client.block_number() < through_block + ctx.confirmations:
            if time.monotonic() > deadline:
                break  # the mirror catches up later; the caller reports what it holds now
            time.sleep(0.2)

    indexer = EventIndexer(ctx.ledger.client, ctx.ledger.deployment, confirmations=ctx.confirmations)
    try:
        result = indexer.sync(head)
    except IntegrityError:
        # Another process stored the same events at the same moment; the next pass resumes.
        return
    if result.unwound is not None:
        replan_unwound(ctx, result.unwound.rounds)


def replan_unwound(ctx: NodeContext, rounds: frozenset[tuple[int, int]]) -> int:
    """Forget this node's finished claims on the rounds a reorganisation unwound (and the rounds
    after them, which their events opened or seated), so the planner derives their actions
    again from the mirror as it is now; a claim in flight re-checks the contract itself."""
    from backend.jobs.models import RoundAction

    forgotten = 0
    for job_id, round_ in rounds:
        claims = RoundAction.objects.filter(node=ctx.address, job_id=job_id, round__in=(round_, round_ + 1))
        settled = claims.exclude(state__in=(RoundAction.State.QUEUED, RoundAction.State.RUNNING))
        forgotten += settled.delete()[0]
    return forgotten
