"""The new committee's part: aggregate the accepted updates, then propose the model or confirm it.

Every honest member computes the same bytes (fl_node.aggregate orders the updates by content
hash and is deterministic), so confirming is "recompute, compare the hash". Seat 0 proposes at
once; seat s proposes only when no proposal with its hash appeared within s fallback periods,
which lets the round finish when the first proposer has gone away.
"""

from __future__ import annotations

import logging
import time

from backend.jobs import blobs, chain, encodings
from backend.jobs.config import JobConfig
from backend.jobs.driver import state, timing, workspace
from backend.jobs.driver.state import ActionError, Outcome
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.codec import content_hash, decode_update, encode_model, update_spec

logger = logging.getLogger(__name__)

_results: dict[tuple[int, int], tuple[str, bytes]] = {}  # (job, round) -> (hash, bytes), this process


def aggregate(ctx, job: mirror.Job, config: JobConfig, round_: int) -> tuple[str, bytes]:
    """The round's new global model (hash, encoded bytes), computed once per process."""
    key = (job.job_id, round_)
    if key in _results:
        return _results[key]
    reference, model_hash = state.base_model(job, round_)
    _, global_state, server_state = workspace.global_model(ctx, reference, model_hash, config)
    accepted = list(job.accepted.filter(round=round_).order_by("position").values_list("trainer", flat=True))
    updates = {u.trainer: u for u in job.updates.filter(round=round_, trainer__in=accepted)}
    if len(updates) != len(accepted):
        raise ActionError("accepted updates are not all indexed yet")
    # A content hash counts once: keep the first in the fixed order (the contract refuses a copy, and
    # two updates with one id would make every member's aggregation fail, so no model is proposed).
    first_of_hash: dict[str, str] = {}
    for trainer in accepted:
        first_of_hash.setdefault(updates[trainer].content_hash.lower(), trainer)
    accepted = list(first_of_hash.values())
    bound = blobs.update_max_bytes(global_state)
    spec = update_spec(global_state)
    weighted = []
    for trainer in accepted:
        # One encoded update in memory at a time: each is decoded once fetched and its bytes dropped
        # (an update at full density of a large model is as large as the model).
        row = updates[trainer]
        blob = blobs.get_checked(ctx, row.reference, row.content_hash, max_bytes=bound)
        with timing.part(timing.AGGREGATE):
            weighted.append(WeightedUpdate(decode_update(blob, spec), int(row.samples), row.content_hash))
        del blob
    with timing.part(timing.AGGREGATE):
        if weighted:
            strategy = get_strategy(config.strategy, **config.strategy_params)
            new_state, new_server = strategy.aggregate(global_state, weighted, server_state or None)
        else:  # nothing accepted: the model stays as it was
            new_state, new_server = global_state, server_state
        data = encode_model(new_state, new_server or None)
    # What the trainers sent, per tensor (dense or delta arrays, fl_node.sparse), for the rounds API.
    encodings.record_received(
        ctx.address,
        job.job_id,
        round_,
        {updates[t].trainer: w.update for t, w in zip(accepted, weighted, strict=True)},
    )
    result = ("0x" + content_hash(data), data)
    workspace.remember_model(result[0], data)  # registering the fixed model needs no fetch
    _results.clear()  # one round at a time per job is all a node needs
    _results[key] = result
    return result


def propose_or_confirm(ctx, job: mirror.Job, config: JobConfig, round_: int, first_seen: float) -> Outcome:
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.round != round_ or on_chain.phase != chain.RoundPhase.AGGREGATING:
        return Outcome(True, "the round has moved on")
    # In the aggregating phase the contract keeps the aggregation deadline in score_deadline.
    if chain.contract_now(ctx, on_chain) > on_chain.score_deadline:
        return _skip(ctx, job, round_, first_seen)
    participant = chain.participant(ctx, job.job_id)
    if participant.committee_round != round_ + 1:
        return Outcome(False, "not on the committee; waiting for the aggregation deadline")
    if participant.vote_round == round_:
        return Outcome(True, "voted already")
    model_hash, data = aggregate(ctx, job, config, round_)
    proposals = {p.model_hash: p for p in job.proposals.filter(round=round_)}
    if model_hash in proposals:
        return _confirm(ctx, job, round_, model_hash, data)
    seat = participant.seat
    waited = time.time() - first_seen
    if seat > 0 and waited < seat * ctx.proposer_fallback_s:
        others = "a different proposal" if proposals else "no proposal"
        return Outcome(
            False, f"seat {seat}: {others} yet, proposing after {seat * ctx.proposer_fallback_s:.0f}s"
        )
    reference = blobs.put(ctx, data)
    try:
        receipt = chain.propose_model(ctx, job.job_id, round_, reference, model_hash)
    except ledger_errors.ProposalExists:
        return _confirm(ctx, job, round_, model_hash, data)  # a fellow member proposed it meanwhile
    return Outcome(True, f"proposed {model_hash[:12]}…", receipt.tx_hash)


def _skip(ctx, job: mirror.Job, round_: int, first_seen: float) -> Outcome:
    """The aggregation deadline passed with no model fixed: skip the aggregation on chain.

    One node sends at once, the first seat of the committee that scored the round (it has just
    shown it is alive); every other node only after ``proposer_fallback_s``, if still needed.
    """
    waited = time.time() - first_seen
    designated = (state.seats(job, round_) or [""])[0] == ctx.address
    if not designated and waited < ctx.proposer_fallback_s:
        return Outcome(
            False,
            f"aggregation overdue; skipping after {ctx.proposer_fallback_s:.0f}s if still open",
            recheck_s=ctx.proposer_fallback_s - waited,
        )
    try:
        receipt = chain.skip_aggregation(ctx, job.job_id, round_)
    except (ledger_errors.WrongPhase, ledger_errors.WrongRound, ledger_errors.JobNotRunning):
        return Outcome(True, "the round moved on without this skip")
    except ledger_errors.AggregationNotOverdue:
        return Outcome(False, "the aggregation deadline has not passed on chain yet")
    return Outcome(True, "aggregation skipped: the previous model carried forward", receipt.tx_hash)


def _confirm(ctx, job: mirror.Job, round_: int, model_hash: str, data: bytes) -> Outcome:
    blobs.put(ctx, data)  # content-addressed: one more full copy of the model, at no cost to others
    try:
        receipt = chain.confirm_model(ctx, job.job_id, round_, model_hash)
    except (ledger_errors.WrongPhase, ledger_errors.WrongRound):
        return Outcome(True, "the model was fixed without this vote")
    return Outcome(True, f"confirmed {model_hash[:12]}…", receipt.tx_hash)
