"""Which actions are due for this node: derived from the mirrored chain state alone.

Nothing here acts or remembers; a restarted node re-derives the same list from the chain,
and every action re-checks the contract before it sends anything.

    job Drawing (started), me a participant that has not revealed its draw secret             -> REVEAL
    job Drawing, the reveal deadline passed (any participant; the proposer first)             -> DRAW
    round r Training, me not on r's committee, no update from me, before the update deadline -> TRAIN
    round r Training, me on r's committee, not scored, an update in or update deadline passed -> SCORE
    round r Training, the score deadline passed with scores missing                           -> FINALIZE
    round r Aggregating (RoundFinalized), me on the next committee, not voted                 -> AGGREGATE (vote)
    round r Aggregating, its aggregation deadline passed (any participant)                  -> AGGREGATE (skip)
    round r Aggregating, me not on the next committee, r < rounds, speculating              -> TRAIN r+1
    GlobalModelFixed for round r, not served here yet                                         -> REGISTER
    GlobalModelFixed for round r, no metrics of mine for r, not scoring round r+1             -> MEASURE

Serving and measuring a fixed model run beside the agent, nicer than training (tasks.dispatch),
as no round waits for them. Measuring (a pass over the validation data) is held back while
this node scores the next round: it would share the process, and its interpreter lock, with
the scoring the round waits for. A trainer plans it after its own update went out (the agent
is busy training until then), when the round's other trainers may still use the CPU; it then
takes mostly what they leave (nice 19 against their 10).
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.jobs.driver import state
from backend.jobs.models import RoundAction, RoundMetric
from backend.ledger import models as mirror
from backend.serving.models import GlobalModel as ServedModel

Kind = RoundAction.Kind


@dataclass(frozen=True)
class Due:
    job_id: int
    round: int
    kind: str


def due_actions(address: str, now: float, *, speculate: bool = False) -> list[Due]:
    """``speculate``: trainers of round r+1 start as soon as round r is finalized (see trainer.py)."""
    due: list[Due] = []
    jobs = list(mirror.Job.objects.filter(participants__node=address).distinct())
    for job in jobs:
        if job.status == mirror.Job.Status.RUNNING:
            due += _round_actions(job, address, now, speculate)
        elif job.status == mirror.Job.Status.DRAWING:
            due += _draw_actions(job, address, now)
    due += _fixed_model_actions(address, jobs)
    return due


def _draw_actions(job: mirror.Job, address: str, now: float) -> list[Due]:
    if job.draw_deadline is not None and now > job.draw_deadline:
        return [Due(job.job_id, 0, Kind.DRAW)]
    me = job.participants.filter(node=address).first()
    return [Due(job.job_id, 0, Kind.REVEAL)] if me is not None and not me.drawn else []


def _round_actions(job: mirror.Job, address: str, now: float, speculate: bool) -> list[Due]:
    number = job.current_round
    round_ = job.rounds_set.filter(number=number).first()
    if round_ is None:
        return []
    if round_.status == mirror.Round.Status.AGGREGATING:
        next_committee = state.seats(job, number + 1)
        overdue = round_.aggregate_deadline is not None and now > round_.aggregate_deadline
        if overdue:
            # No model fixed in time: any participant may skip the aggregation (the round keeps
            # the previous model and a drawn committee takes over); aggregator.vote
            # sends it. A member that voted already has its action done, the others do it.
            return [Due(job.job_id, number, Kind.AGGREGATE)]
        if address in next_committee:
            voted = address in state.voters(job.job_id, number)
            return [] if voted else [Due(job.job_id, number, Kind.AGGREGATE)]
        if speculate and next_committee and number < job.rounds:
            # The accepted updates and the next committee are on chain: the next round's
            # model is determined, so its trainers need not wait for it to be fixed.
            return [Due(job.job_id, number + 1, Kind.TRAIN)]
        return []
    if round_.status != mirror.Round.Status.TRAINING:
        return []
    due = []
    committee = state.seats(job, number)
    scored = state.scorers(job.job_id, number)
    if address not in committee:
        submitted = job.updates.filter(round=number, trainer=address).exists()
        if not submitted and now <= round_.update_deadline:
            due.append(Due(job.job_id, number, Kind.TRAIN))
    elif address not in scored and now <= round_.score_deadline:
        # Each update is scored as it arrives, and the scores go on chain once all are in (or the
        # update deadline passed), see committee.score_round.
        trainers = job.participants.filter(drawn=True).count() - job.committee_size
        updates = job.updates.filter(round=number).count()
        if updates >= trainers or now > round_.update_deadline or updates > _scored(address, job, number):
            due.append(Due(job.job_id, number, Kind.SCORE))
    # The scores that complete the set finalize the round in their own transaction, and the
    # indexer stores whole blocks at once: the mirror does not show a round in training with
    # every member scored. FINALIZE is for the deadline path (committee.finalize_round); the
    # first condition only keeps a safeguard.
    if len(scored) >= job.committee_size or now > round_.score_deadline:
        due.append(Due(job.job_id, number, Kind.FINALIZE))
    return due


def _scored(address: str, job: mirror.Job, number: int) -> int:
    """How many of the round's updates this member has scored so far (its score action's count)."""
    claim = RoundAction.objects.filter(node=address, job_id=job.job_id, round=number, kind=Kind.SCORE)
    return claim.values_list("scored", flat=True).first() or 0


def _fixed_model_actions(address: str, jobs: list[mirror.Job]) -> list[Due]:
    """REGISTER and MEASURE for the fixed models not served, or not measured, here yet.

    Three small indexed reads compared here: correlated NOT EXISTS subqueries over the fixed
    models cost three times as much, on every planning tick of every node.
    """
    by_pk = {job.pk: job for job in jobs}
    fixed = list(mirror.GlobalModel.objects.filter(job_id__in=by_pk).values_list("job_id", "round"))
    if not fixed:
        return []
    ids = {by_pk[pk].job_id for pk, _ in fixed}
    served = set(ServedModel.objects.filter(job__in=[str(i) for i in ids]).values_list("job", "round"))
    measured = set(RoundMetric.objects.filter(node=address, job_id__in=ids).values_list("job_id", "round"))
    due: list[Due] = []
    for pk, number in sorted(fixed):
        job = by_pk[pk]
        if (str(job.job_id), number) not in served:
            due.append(Due(job.job_id, number, Kind.REGISTER))
        if (job.job_id, number) not in measured and not _scoring(job, number + 1, address):
            due.append(Due(job.job_id, number, Kind.MEASURE))
    return due


def _scoring(job: mirror.Job, round_: int, address: str) -> bool:
    """Whether this node is on round ``round_``'s committee while that round is being scored."""
    if job.status != mirror.Job.Status.RUNNING or job.current_round != round_:
        return False
    if not job.rounds_set.filter(number=round_, status=mirror.Round.Status.TRAINING).exists():
        return False
    return address in state.seats(job, round_) and address not in state.scorers(job.job_id, round_)
