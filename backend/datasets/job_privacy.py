"""A participant's privacy in a job, from public values only: its plan, and its epsilon.

Every member computes the same figure for every participant, this node included: the plan
follows from the job's config, the dataset's size and public hold-out flag (on chain) and the
committee's score count (``fl_node.job.plan.participant_plan``), and the spends a participant recorded on
chain (each a kind and a number of steps) say which releases it made. The figure is the job's
OWN releases composed at the JOB's delta: not the rise of the dataset's whole budget (other
jobs share that), and not at the dataset's delta.
"""

from __future__ import annotations

from collections.abc import Iterable

from fl_node.job.config import JobConfig
from fl_node.job.plan import participant_plan, scores_per_round
from fl_node.privacy_plan import PrivacyPlan, job_epsilon


def participant_epsilon(plan: PrivacyPlan, spends: Iterable[tuple[int, int]]) -> float:
    """The participant's epsilon in the job (at the job's delta) from its recorded (kind, steps)."""
    return job_epsilon(plan, spends)


# The chain takes at most this many spends per participant and round (an update or a withheld
# speculation and its retrain, scores, one more for an attempt lost in a crash).
MAX_SPENDS_PER_ROUND = 3


def recorded_spends(job_id: int, dataset_id: int, spender: str, *, rounds: int) -> list[tuple[int, int]]:
    """(kind, steps) of every spend ``spender`` recorded on chain for ``job_id`` on ``dataset_id``,
    in chain order, from the indexer's mirror; at most what the chain lets a job's rounds hold."""
    from backend.ledger import models as mirror

    rows = (
        mirror.PrivacyRecord.objects.filter(
            job_id=job_id, dataset__dataset_id=dataset_id, spender__iexact=spender
        )
        .order_by("block", "log_index")
        .values_list("kind", "steps")
    )
    return [(int(kind), int(steps)) for kind, steps in rows[: MAX_SPENDS_PER_ROUND * (rounds + 1)]]


def registered_facts(dataset_id: int) -> tuple[int, bool] | None:
    """(records, public hold-out declared?) of a dataset as the chain registered it; None when the
    mirror does not know it (yet)."""
    from backend.ledger import models as mirror

    dataset = mirror.Dataset.objects.filter(dataset_id=dataset_id).first()
    if dataset is None:
        return None
    event = mirror.ChainEvent.objects.filter(
        name="DatasetRegistered", args__datasetId=int(dataset_id)
    ).first()
    holdout = str((event.args or {}).get("publicHoldoutHash", "")) if event is not None else ""
    return int(dataset.samples), bool(holdout.removeprefix("0x").strip("0"))


def chain_epsilon(
    config: JobConfig,
    *,
    job_id: int,
    rounds: int,
    participants: int,
    committee_size: int,
    dataset_id: int,
    spender: str,
) -> float | None:
    """A participant's epsilon in a job from the chain's records alone (None: its dataset is not
    indexed yet): its public plan, composed over its recorded spends, at the job's delta.

    Raises ``Unplannable`` for a participant no plan exists for: its dataset's registered size
    (the registrant's own declaration, up to DataRegistry's MAX_SAMPLES) puts the job's delta
    above 1/(10 n). No honest node joins so; a hostile member may, and its figure is then no
    epsilon at all, never an error on every member's job page."""
    facts = registered_facts(dataset_id)
    if facts is None:
        return None
    samples, public = facts
    try:
        plan = participant_plan(
            config,
            samples=samples,
            public_holdout=public,
            scores_per_round=scores_per_round(participants, committee_size),
        )
    except ValueError as exc:
        raise Unplannable(str(exc)) from None
    return participant_epsilon(plan, recorded_spends(job_id, dataset_id, spender, rounds=rounds))


class Unplannable(ValueError):
    """A participant's registered dataset admits no privacy plan for the job (its reason)."""
