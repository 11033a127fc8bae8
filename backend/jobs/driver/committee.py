"""The committee's part of a round: score every update on this node's validation data, then finalize.

A malformed update, or one whose bytes do not match the hash on chain, scores 0; it is
never an error (fl_node.score guarantees that for the bytes themselves).
"""

from __future__ import annotations

from backend.jobs import blobs, chain
from backend.jobs.config import JobConfig
from backend.jobs.driver import state, timing, workspace
from backend.jobs.driver.state import Outcome
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from backend.swarm.errors import SwarmError
from fl_node.score import score_update_int


def score_round(ctx, job: mirror.Job, config: JobConfig, round_: int) -> Outcome:
    if chain.participant(ctx, job.job_id).score_round == round_:
        return Outcome(True, "scores already on chain")
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.round != round_ or on_chain.phase != chain.RoundPhase.TRAINING:
        return Outcome(True, "the round has moved on")
    updates = list(job.updates.filter(round=round_).order_by("index"))
    if len(updates) < on_chain.update_count:
        return Outcome(False, "waiting for the event mirror to catch up with the updates")
    with timing.part(timing.PREPARE):
        dataset = state.my_dataset(job, ctx.address)
        _, val = workspace.local_split(dataset, config)
        reference, model_hash = state.base_model(job, round_)
        _, global_state, _ = workspace.global_model(ctx, reference, model_hash)
        scratch = workspace.scratch_model(config)
        x_val, y_val = val.tensors()
    scores = {}
    for update in updates:
        try:
            blob = blobs.get_checked(ctx, update.reference, update.content_hash)
        except (blobs.BlobMismatch, SwarmError, ValueError):
            scores[update.trainer] = 0  # unavailable or altered: nobody can aggregate it either
            continue
        with timing.part(timing.SCORE):
            scores[update.trainer] = score_update_int(
                scratch, global_state, blob, x_val, y_val, metric=config.score_metric
            )
    try:
        receipt = chain.submit_scores(ctx, job.job_id, round_, scores)
    except ledger_errors.ScoringNotOpen:
        return Outcome(False, "scoring is not open yet (updates still due)")
    except ledger_errors.UnknownUpdate:
        return Outcome(False, "an update is not on chain yet; rescoring with the indexed set")
    return Outcome(True, f"scored {len(scores)} updates", receipt.tx_hash)


def finalize_round(ctx, job: mirror.Job, round_: int) -> Outcome:
    if job.rounds_set.filter(number=round_).exclude(status=mirror.Round.Status.TRAINING).exists():
        return Outcome(True, "round finalized already")
    try:
        receipt = chain.finalize(ctx, job.job_id, round_)
    except ledger_errors.RoundNotFinalizable:
        return Outcome(False, "scores still due")
    except (ledger_errors.WrongPhase, ledger_errors.WrongRound, ledger_errors.JobNotRunning):
        return Outcome(True, "another node finalized the round")
    return Outcome(True, "round finalized", receipt.tx_hash)
