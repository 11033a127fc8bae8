"""The new committee's part: aggregate the accepted updates, then vote for the model.

Every honest member computes the same bytes (fl_node.aggregate orders the updates by content
hash and is deterministic), and stores them unencrypted, so their swarm reference is the same
too (a content address of the bytes). A vote binds both on chain and counts only toward its own
(hash, reference) pair: a member that votes the right hash with a bogus or oversized reference
gathers no honest vote. Every member votes as soon as it has recomputed the pair, all in the
same block when they are quick, so a model is fixed one block after the round is finalized.
"""

from __future__ import annotations

import logging
import os
import time

from backend.jobs import blobs, chain, encodings
from backend.jobs.context import NodeContext
from backend.jobs.driver import adaptive_work, state, timing, workspace
from backend.jobs.driver.state import ActionError, Outcome
from backend.jobs.sealed import key_gathering, reader
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from backend.swarm.errors import SwarmError
from fl_node.aggregate import WeightedUpdate
from fl_node.codec import CodecError, content_hash, decode_update, encode_model, update_spec
from fl_node.job import aggregation
from fl_node.job.config import JobConfig
from fl_node.robust import (
    RoundDefense,
    aggregation_clip_norm,
    defended_aggregate,
    update_norm,
    vote_roles,
    vote_signs,
    within_norm_bound,
)

logger = logging.getLogger(__name__)

# The round's aggregate (hash, bytes), the reference it was stored under and the updates this member
# failed to read for the vote are the node's memory (``ctx.memory.aggregator``: results, references,
# unreadable).
# A robust job's submission that may vote but cannot be read (no key, the store failing) is waited
# for at most this long after this member first failed to read it, then left out of the vote: one
# hostile member's score above 0 for an update nobody can read must not hold the aggregation.
VOTE_READ_WAIT_S = 30.0


def aggregate(ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int) -> tuple[str, bytes]:
    """The round's new global model (hash, encoded bytes), computed once by this node."""
    key = (job.job_id, round_)
    memory = ctx.memory.aggregator
    if key in memory.results:
        return memory.results[key]
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
    weighted, steps = [], {}
    # The keys not prefetched, asked for all at once; each is checked as its update is read.
    key_gathering.gather_keys(ctx, job.job_id, round_, [updates[trainer] for trainer in accepted])
    for trainer in accepted:
        # One encoded update in memory at a time: each is decoded once fetched and its bytes dropped
        # (an update at full density of a large model is as large as the model).
        row = updates[trainer]
        # Sealed (backend.jobs.sealed): the key from this node's rows, the trainer or a relay;
        # KeyUnavailable (an ActionError) retries the action.
        blob = reader.read_update(ctx, job.job_id, round_, row, max_bytes=bound)
        with timing.part(timing.AGGREGATE):
            weighted.append(WeightedUpdate(decode_update(blob, spec), int(row.samples), row.content_hash))
            steps[row.content_hash] = adaptive_work.claimed_steps(blob, config)  # adaptive work only
        del blob
    # The job's aggregation and its defenses (fl_node.job.aggregation), the simulator's too.
    defense = aggregation.round_defense(config)
    clip_norm, voters, witnesses, backers = _round_votes(ctx, job, round_, defense, bound, spec)
    with timing.part(timing.AGGREGATE):
        strategy = aggregation.strategy(config, steps)
        # Nothing accepted (or nothing within the norm bound): the model stays as it was.
        new_state, new_server = defended_aggregate(
            strategy,
            global_state,
            weighted,
            defense=defense,
            server_state=(server_state or None) if weighted else server_state,
            clip_norm=clip_norm,
            voters=voters,
            witnesses=witnesses,
            backers=backers,
        )
        data = encode_model(new_state, new_server or None)
    # What the trainers sent, per tensor (dense or delta arrays, fl_node.sparse), for the rounds API.
    encodings.record_received(
        ctx.address,
        job.job_id,
        round_,
        {updates[t].trainer: w.update for t, w in zip(accepted, weighted, strict=True)},
    )
    result = ("0x" + content_hash(data), data)
    workspace.remember_model(ctx, result[0], data)  # registering the fixed model needs no fetch
    memory.results.clear()  # one round at a time per job is all a node needs
    memory.unreadable.clear()
    memory.references.clear()  # a stored reference belongs to the result it was stored for
    memory.results[key] = result
    return result


def _round_votes(
    ctx: NodeContext, job: mirror.Job, round_: int, defense: RoundDefense, bound: int, spec
) -> tuple:
    """(clip norm, votes, witness votes, backers) of the round for :func:`fl_node.robust.defended_aggregate`:
    from every submission (the first of each content hash, in the chain's order) that some committee
    member scored above 0, within the norm bound, split by fl_node.robust.vote_roles on the chain's
    medians, base median and margin. Only on chain data and blobs: every honest member gets the same.

    Scored above 0 by someone, not merely submitted: an honest member scores 0 what it could not read
    (a withheld key); a scorer holds the key and relays it (backend.jobs.sealed). One that still cannot
    be read VOTE_READ_WAIT_S after the first try (a hostile scorer's pick nobody else can read) is left
    out, so it cannot hold the aggregation to its deadline. The simulator lets every submission within the bound vote; the two
    differ only where every seat scored a readable update 0 (a committee wholly captured). A submission
    whose blob does not decode, or whose content does not match its hash, does not vote: the same for
    every member. One decoded update in memory at a time (a vote is int8), except under the backed
    magnitude, whose coordinate median needs the voting submissions themselves: those are kept, decoded,
    until the round is aggregated."""
    if not defense.needs_votes:
        return None, [], [], []
    rows = list(job.updates.filter(round=round_).order_by("index"))
    scored = set(
        mirror.Score.objects.filter(job=job, round=round_, score__gt=0).values_list("trainer", flat=True)
    )
    first: dict[str, mirror.Update] = {}
    for row in rows:
        first.setdefault(row.content_hash.lower(), row)
    norms, votes, kept = {}, {}, {}
    for row in first.values():
        if row.trainer not in scored:
            continue
        try:
            blob = reader.read_update(ctx, job.job_id, round_, row, max_bytes=bound)
        except (blobs.BlobMismatch, ValueError):
            continue  # its content is not what the chain names, or too large: the same for every member
        except (ActionError, SwarmError) as exc:  # no key yet, or the store failing: wait a while
            unreadable = ctx.memory.aggregator.unreadable
            since = unreadable.setdefault((job.job_id, round_, row.trainer), time.monotonic())
            if time.monotonic() - since < VOTE_READ_WAIT_S:
                raise ActionError(f"waiting to read {row.trainer}'s update for the vote: {exc}") from exc
            logger.warning("round %s: %s's update left out of the vote: %s", round_, row.trainer, exc)
            continue
        try:
            update = decode_update(blob, spec)
        except CodecError:
            continue
        del blob
        if not within_norm_bound(update, defense.norm_bound):
            continue
        with timing.part(timing.AGGREGATE):
            norms[row.trainer] = update_norm(update)
            votes[row.trainer] = vote_signs(update)
        if defense.backed_magnitude:
            kept[row.trainer] = update
        del update
    round_row = job.rounds_set.get(number=round_)
    medians = {row.trainer: int(row.median or 0) for row in rows}
    voting, witnessing = vote_roles(
        list(norms), medians, base_median=int(round_row.base_median or 0), margin=int(job.margin)
    )
    clip_norm = aggregation_clip_norm([norms[t] for t in voting], [norms[t] for t in witnessing])
    return (
        clip_norm,
        [votes[t] for t in voting if votes[t] is not None],
        [votes[t] for t in witnessing if votes[t] is not None],
        # the backed magnitude's median over voters and witnesses alike (fl_node.simulate does the same)
        [kept[t] for t in (*voting, *witnessing)] if defense.backed_magnitude else [],
    )


def vote(ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int, first_seen: float) -> Outcome:
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
    reference = _store(ctx, job.job_id, round_, model_hash, data)
    _held_while_the_test_asks(ctx)
    try:
        receipt = chain.vote_model(ctx, job.job_id, round_, reference, model_hash)
    except ledger_errors.AlreadyVoted:
        return Outcome(True, "voted already")
    except (ledger_errors.WrongRound, ledger_errors.WrongPhase, ledger_errors.JobNotRunning):
        return Outcome(True, "the round moved on without this vote")
    return Outcome(True, f"voted for {model_hash[:12]}…", receipt.tx_hash)


def _held_while_the_test_asks(ctx: NodeContext) -> None:
    """Test hook (``DEFL_HOLD_PROPOSALS_FILE``, never set in production): every member of the
    aggregating committee waits here, its aggregate stored and no vote sent, while that file
    exists. Votes are symmetric (any two of three fix the model), so a fault test that kills one
    member before its vote holds them all: the kill then lands before any vote, whatever the
    machine's load, and the others vote once the file is gone."""
    while ctx.hold_proposals_file and os.path.exists(ctx.hold_proposals_file):
        time.sleep(0.05)


def _store(ctx: NodeContext, job_id: int, round_: int, model_hash: str, data: bytes) -> str:
    """Store and pin the aggregate (unencrypted: its reference is the content address of the bytes,
    the same on every honest member) once by this node; its reference."""
    key = (job_id, round_, model_hash)
    references = ctx.memory.aggregator.references
    if key not in references:
        references[key] = blobs.put(ctx, data)
    return references[key]


def _skip(ctx: NodeContext, job: mirror.Job, round_: int, first_seen: float) -> Outcome:
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
