"""The committee's part of a round: score every update on this node's validation data.

Scores go on chain by commit and reveal (see score_round). The reveal that completes the
committee's set finalizes the round on chain in the same transaction; a separate finalize is
sent only when a deadline ends the scoring.

A malformed update, or one whose bytes do not match the hash on chain, scores 0; it is
never an error (fl_node.score guarantees that for the bytes themselves).

Scores are releases of this node's validation records: unless its dataset declared the
hold-out public, each is a noisy count (``fl_node.score``, noise from a secret stream) and the
round's set of scores is reserved in the dataset's budget before the first one is computed
(one release of ``scores_per_round`` noisy counts, the plan's score noise), its spendPrivacy
awaited before the scores go on chain, and marked released when they do.
"""

from __future__ import annotations

import secrets
import time

import torch

from backend.jobs import blobs, chain
from backend.jobs.config import JobConfig
from backend.jobs.driver import privacy as round_privacy
from backend.jobs.driver import state, timing, workspace
from backend.jobs.driver.state import Outcome
from backend.jobs.models import RoundAction
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from backend.swarm.errors import SwarmError
from fl_node.score import score_update_int

# (node, job, round) -> {(trainer, content hash): score}: updates scored as they arrived, this process.
_scored: dict[tuple[str, int, int], dict[tuple[str, str], int]] = {}
# (node, job, round) -> the spendPrivacy of the round's score release (None: nothing owed on chain).
_score_spends: dict[tuple[str, int, int], object] = {}
# the key under which ``_scored`` keeps this member's score of the round's base model
BASE = ("base", "base")


def score_round(ctx, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction) -> Outcome:
    """Score the round's updates as they arrive; commit to the scores once all are in, and reveal
    them once every member committed (or the commit deadline passed).

    Commit-reveal: no member sees another's scores before it is bound to its own, so the last
    scorer cannot tailor its scores and a lazy member cannot copy. The salt and the exact scores
    committed are kept in the database (ScoreCommitment) before the commitment is sent: a
    restarted node reveals what it committed (noisy scores are never recomputed). If this reveal
    completes the set, the contract finalizes the round in the same transaction (its receipt
    carries RoundFinalized, or JobFailed).

    Scoring an update while the other trainers still train takes it off the round's critical
    path: when the last update arrives only that one is left to score. The scores are kept by
    (trainer, content hash) in this process; a restarted node scores again what it lost.
    """
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.round != round_ or on_chain.phase != chain.RoundPhase.TRAINING:
        return Outcome(True, "the round has moved on")
    committed = mirror.ScoreCommitment.objects.filter(
        node=ctx.address, job_id=job.job_id, round=round_
    ).first()
    if committed is not None:
        return _commit_or_reveal(ctx, job, round_, on_chain, committed)
    updates = list(job.updates.filter(round=round_).order_by("index"))
    if len(updates) < on_chain.update_count:
        return Outcome(False, "waiting for the event mirror to catch up with the updates")
    workspace.keep_round(_scored, ctx.address, job.job_id, round_)
    workspace.keep_round(_score_spends, ctx.address, job.job_id, round_)
    known = _scored.setdefault((ctx.address, job.job_id, round_), {})
    dataset = state.my_dataset(job, ctx.address)
    _score_new(ctx, job, config, round_, updates, known, claim, dataset)
    RoundAction.objects.filter(pk=claim.pk).update(scored=len(updates))  # the planner's cue
    expected = on_chain.participant_count - on_chain.committee_size
    if on_chain.update_count < expected and chain.contract_now(ctx, on_chain) <= on_chain.update_deadline:
        return Outcome(
            False, f"scored {len(updates)} of {expected} updates as they came; waiting for the rest"
        )
    key = (ctx.address, job.job_id, round_)
    if key in _score_spends:  # the chain records the scores' cost before it sees them
        with timing.part(timing.PRIVACY):
            round_privacy.await_spend(claim, _score_spends[key])
    committed, _ = mirror.ScoreCommitment.objects.get_or_create(
        node=ctx.address,
        job_id=job.job_id,
        round=round_,
        defaults=dict(
            salt="0x" + secrets.token_hex(32),
            scores=[[u.trainer, known[(u.trainer, u.content_hash)]] for u in updates],
            base_score=known.get(BASE, 0),
        ),
    )
    _scored.pop(key, None)
    _score_spends.pop(key, None)
    return _commit_or_reveal(ctx, job, round_, on_chain, committed)


def _commit_or_reveal(ctx, job: mirror.Job, round_: int, on_chain, committed) -> Outcome:
    """Send the commitment if it is not on chain yet, else the reveal once reveals are open."""
    scores = {trainer: int(score) for trainer, score in committed.scores}
    salt = bytes.fromhex(committed.salt.removeprefix("0x"))
    me = chain.participant(ctx, job.job_id)
    now = chain.contract_now(ctx, on_chain)
    commit_deadline = on_chain.score_deadline - on_chain.score_period // 2
    if me.commit_round != round_:
        try:
            receipt = chain.commit_scores(ctx, job.job_id, round_, scores, committed.base_score, salt)
        except ledger_errors.ScoringNotOpen:
            return Outcome(False, "scoring is not open yet (updates still due)")
        except ledger_errors.DeadlinePassed:
            return Outcome(True, "the commit deadline passed: this member is absent this round")
        on_chain = chain.job_state(ctx, job.job_id)
        if on_chain.commit_count < on_chain.committee_size:
            return Outcome(
                False, "committed to the scores; revealing once every member committed", receipt.tx_hash
            )
        # the last commitment: reveal at once (a committee of one loses no tick to commit-reveal)
    elif me.score_round == round_:
        return Outcome(True, "scores already revealed")
    if on_chain.commit_count < on_chain.committee_size and now <= commit_deadline:
        return Outcome(False, f"waiting for {on_chain.committee_size - on_chain.commit_count} commitments")
    dataset = state.my_dataset(job, ctx.address)
    try:
        receipt = chain.reveal_scores(ctx, job.job_id, round_, scores, committed.base_score, salt)
    except ledger_errors.RevealNotOpen:
        return Outcome(False, "reveals are not open yet")
    except ledger_errors.DuplicateScores:  # sent by an attempt that died before it recorded so
        round_privacy.released(dataset, job.job_id, round_, "score_count")
        return Outcome(True, "scores already on chain")
    except ledger_errors.DeadlinePassed:
        return Outcome(True, "the score deadline passed before the reveal: this member is absent")
    round_privacy.released(dataset, job.job_id, round_, "score_count")
    detail = f"revealed {len(scores)} scores"
    events = {e.name: e for e in receipt.events}
    if "RoundFinalized" in events:  # this reveal completed the set
        detail += "; round finalized with the scores"
    elif "JobFailed" in events:  # completed the set, but too few updates arrived
        failed = events["JobFailed"].args
        detail += (
            f"; job failed with the scores ({failed['updates']} updates, {failed['minTrainers']} needed)"
        )
    return Outcome(True, detail, receipt.tx_hash)


def _score_new(
    ctx, job, config: JobConfig, round_: int, updates, known: dict, claim: RoundAction, dataset
) -> None:
    """Score the updates not scored yet, on this node's validation data (of ``dataset``), into ``known``."""
    new = [u for u in updates if (u.trainer, u.content_hash) not in known]
    if not new and BASE in known:
        return
    with timing.part(timing.PREPARE):
        plan = round_privacy.node_plan(job, config, dataset)
        round_key = (ctx.address, job.job_id, round_)
        release = plan.score_release(plan.scores_per_round)
        if release is not None and round_key not in _score_spends:
            # Before the first noisy score of the round: the whole set is one release.
            with timing.part(timing.PRIVACY):
                _score_spends[round_key] = round_privacy.reserve(claim, dataset, job.job_id, round_, release)
        _, val = workspace.local_split(dataset, config)
        reference, model_hash = state.base_model(job, round_)
        _, global_state, _ = workspace.global_model(ctx, reference, model_hash, config)
        bound = blobs.update_max_bytes(global_state)
        scratch = workspace.scratch_model(config)
        x_val, y_val = val.tensors()

    def score(update) -> int:
        with timing.part(timing.SCORE):
            return score_update_int(
                scratch,
                global_state,
                update,
                x_val,
                y_val,
                metric=config.score_metric,
                noise_multiplier=plan.score_noise_multiplier,
            )

    if BASE not in known:
        # The unchanged global model, scored like an update (a zero one) in the same release:
        # the contract accepts only updates whose median beats the base median by the margin.
        known[BASE] = score(
            {name: torch.zeros_like(t) for name, t in global_state.items() if t.is_floating_point()}
        )
    for update in new:
        key = (update.trainer, update.content_hash)
        try:
            blob = blobs.get_checked(ctx, update.reference, update.content_hash, max_bytes=bound)
        except (blobs.BlobMismatch, SwarmError, ValueError):
            known[key] = 0  # unavailable or altered: nobody can aggregate it either
            continue
        known[key] = score(blob)


def finalize_round(ctx, job: mirror.Job, round_: int, first_seen: float) -> Outcome:
    """Finalize a round whose score deadline passed with scores missing.

    A round whose scores are all in needs nothing here: the scores that complete the set
    finalize it on chain in the same transaction (see score_round), so the mirror shows it
    aggregating as soon as it shows the last scores. When the deadline ends the scoring
    instead, one node sends the finalize, not every node at once (all but one would revert):
    seat 0 of the committee. Every other node, and a designated one that went away, is a
    fallback: it sends only once ``proposer_fallback_s`` passed since it first saw the round
    finalizable, if the round is still open then.
    """
    if job.rounds_set.filter(number=round_).exclude(status=mirror.Round.Status.TRAINING).exists():
        return Outcome(True, "round finalized already")
    seats = state.seats(job, round_)
    all_scored = len(state.scorers(job.job_id, round_)) >= job.committee_size
    designated = not all_scored and bool(seats) and seats[0] == ctx.address
    waited = time.time() - first_seen
    if not designated and waited < ctx.proposer_fallback_s:
        return Outcome(
            False,
            f"standing by; finalizing after {ctx.proposer_fallback_s:.0f}s if still open",
            recheck_s=ctx.proposer_fallback_s - waited,
        )
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.round != round_ or on_chain.phase != chain.RoundPhase.TRAINING:
        return Outcome(True, "another node finalized the round")
    return _send_finalize(ctx, job.job_id, round_)


def _send_finalize(ctx, job_id: int, round_: int) -> Outcome:
    try:
        receipt = chain.finalize(ctx, job_id, round_)
    except ledger_errors.RoundNotFinalizable:
        return Outcome(False, "scores still due")
    except (ledger_errors.WrongPhase, ledger_errors.WrongRound, ledger_errors.JobNotRunning):
        return Outcome(True, "another node finalized the round")
    return Outcome(True, "round finalized", receipt.tx_hash)
