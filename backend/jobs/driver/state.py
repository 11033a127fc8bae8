"""Questions about a job's mirrored chain state that several driver steps ask."""

from __future__ import annotations

from dataclasses import dataclass

from backend.cluster.errors import ActionError  # the driver's actions run as cluster tasks
from backend.datasets.budget import job_epsilon as spent_by_job
from backend.datasets.models import Dataset
from backend.ledger import models as mirror
from fl_node.job.config import JobConfig


@dataclass(frozen=True)
class Outcome:
    """How an action ended: done (never run again) or not yet (re-planned), with a sentence why."""

    done: bool
    detail: str
    tx_hash: str = ""
    work_seconds: float | None = None
    # Not done, and nothing will change before this many seconds (a stand-by's fallback delay):
    # the agent does not re-run it sooner. None: re-run at the next tick.
    recheck_s: float | None = None


def seats(job: mirror.Job, round_: int) -> list[str]:
    return list(job.committee_seats.filter(round=round_).order_by("seat").values_list("member", flat=True))


def base_model(job: mirror.Job, round_: int) -> tuple[str, str]:
    """(reference, hash) of the global model that round ``round_`` starts from: the model fixed for
    the round before, or, where that round's aggregation was skipped, the one it carried forward.
    A round after a skipped one that never opened (void: the contract voids it with its early
    updates, trained on a model never fixed) carries it forward too."""
    statuses = dict(job.rounds_set.filter(number__lt=round_).values_list("number", "status"))
    skipped = mirror.Round.Status.SKIPPED

    def carried(number: int) -> bool:
        status = statuses.get(number)
        return status == skipped or (status is None and statuses.get(number - 1) == skipped)

    while round_ > 1 and carried(round_ - 1):
        round_ -= 1
    if round_ <= 1:
        return job.initial_model_ref, job.initial_model_hash
    fixed = job.global_models.filter(round=round_ - 1).first()
    if fixed is None:
        raise ActionError(f"the global model of round {round_ - 1} is not indexed yet")
    return fixed.reference, fixed.model_hash


def fl_events(job_id: int, name: str, round_: int):
    return mirror.ChainEvent.objects.filter(
        contract="FederatedLearning", name=name, args__jobId=job_id, args__round=round_
    )


def scorers(job_id: int, round_: int) -> set[str]:
    return {e.args["member"] for e in fl_events(job_id, "ScoresSubmitted", round_)}


def voters(job_id: int, round_: int) -> set[str]:
    return {e.args["member"] for e in fl_events(job_id, "GlobalModelVoted", round_)}


def my_dataset(job: mirror.Job, address: str) -> Dataset:
    participant = job.participants.filter(node=address).first()
    if participant is None:
        raise ActionError(f"this node is not a participant of job {job.job_id}")
    dataset = Dataset.objects.filter(onchain_id=str(participant.dataset_id)).first()
    if dataset is None:
        raise ActionError(f"dataset {participant.dataset_id} of job {job.job_id} is not on this node")
    return dataset


def participant_index(job: mirror.Job, address: str) -> int:
    return job.participants.get(node=address).index


def job_epsilon(dataset: Dataset, job_id: int, config: JobConfig) -> float:
    """Privacy this job spent on the dataset so far (its own history, RDP)."""
    if not config.dp.private:
        return 0.0
    return spent_by_job(dataset, job_id, delta=config.dp.delta, adjacency=config.dp.adjacency)


def first_open_round(job: mirror.Job) -> int:
    """The first round of ``job`` whose outputs (updates, scores) may still be published.

    Every round before it is closed on chain: finalized (it takes no update or score any more),
    or the job ended. A speculative update of round r + 1 while r aggregates is not closed.
    """
    if job.status in (mirror.Job.Status.OPEN, mirror.Job.Status.DRAWING):
        return 0
    if job.status != mirror.Job.Status.RUNNING:
        return 2**31 - 1  # every round (the releases' round column's bound)
    current = job.rounds_set.filter(number=job.current_round).first()
    if current is not None and current.status == mirror.Round.Status.TRAINING:
        return job.current_round
    return job.current_round + 1


def published(job: mirror.Job, address: str, round_: int, kind: str) -> bool:
    """Whether the chain shows this node's output of a release of ``kind`` in ``round_``."""
    if kind == "score_count":
        return address in scorers(job.job_id, round_)
    return job.updates.filter(round=round_, trainer=address).exists()
