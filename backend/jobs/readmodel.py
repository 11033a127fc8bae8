"""What the jobs API shows, read from the mirror of the chain (and this node's own records).

Rounds, committees, updates, scores and transactions come from the event indexer's tables
only, so the API's history of a job is exactly the chain's.
"""

from __future__ import annotations

from collections import defaultdict

from backend.datasets import budget
from backend.datasets.chain import MICRO_EPSILON
from backend.datasets.models import Dataset, PrivacyRelease
from backend.jobs.encodings import round_encodings
from backend.jobs.models import JobRecord, Membership, RoundAction, RoundMetric
from backend.ledger import models as mirror
from backend.ledger.contributions import contributions

CONFIG_FIELDS = (
    "model",
    "rounds",
    "local_epochs",
    "batch_size",
    "lr",
    "strategy",
    "dp",
    "committee_size",
    "top_k",
    "min_trainers",
    "round_timeout_s",
    "score_timeout_s",
    "input_shape",
    "num_classes",
)


def job_payload(job: mirror.Job, record: JobRecord | None, node: str) -> dict:
    config = record.config if record else {}
    membership = Membership.objects.filter(node=node, job_id=job.job_id).first()
    latest = job.global_models.order_by("-round").first()
    return {
        "id": job.job_id,
        "onchain_id": job.job_id,
        "name": record.name if record else "",
        "status": job.status,
        "current_round": job.current_round,
        **{name: config.get(name) for name in CONFIG_FIELDS},
        "rounds": job.rounds,
        "committee_size": job.committee_size,
        "top_k": job.top_k,
        "min_trainers": job.min_trainers,
        "proposer": job.proposer,
        "config_hash": job.config_hash,
        "config": config or None,
        "tx_hash": record.tx_hash if record else "",
        "created": record.created.isoformat() if record else None,
        "participants": [
            {"node": p.node, "dataset": p.dataset_id, "index": p.index}
            for p in job.participants.order_by("index")
        ],
        "committee": _seats(job, job.current_round),
        "global_model": {"round": latest.round, "hash": latest.model_hash, "reference": latest.reference}
        if latest
        else None,
        "privacy": privacy_payload(job, config, node),
        # each participant's accepted updates, committee work and share (from the chain's events)
        "contributions": contributions(job),
        "joined": {
            "dataset": membership.dataset_id,
            "tx_hash": membership.tx_hash,
            # This node has the first round ready (data decrypted, model fetched, DP calibrated).
            "prepared": membership.prepared_at is not None,
        }
        if membership
        else None,
    }


_ENDED = (mirror.Job.Status.FINISHED, mirror.Job.Status.CANCELLED, mirror.Job.Status.FAILED)


def _local_dataset(job: mirror.Job, participant: mirror.Participant, node: str) -> Dataset | None:
    """This node's dataset of a participant that is this node (None for other members)."""
    if participant.node.lower() != node.lower():
        return None
    membership = Membership.objects.filter(node=node, job_id=job.job_id).select_related("dataset").first()
    if membership is not None:
        return membership.dataset
    return Dataset.objects.filter(onchain_id=str(participant.dataset_id)).first()


def privacy_payload(job: mirror.Job, config: dict, node: str) -> dict:
    """The job's privacy per participant: this node's from its own records, the others' from chain.

    A participant's figure is what this job's releases cost its dataset (RDP-composed at the
    dataset's delta; the dataset's own page shows its whole budget). Other members' figures are
    what they recorded with spendPrivacy (micro-epsilon / 1e6), which this node cannot check.
    ``final`` only once the job ended and none of this node's releases is still reserved.
    """
    dp = config.get("dp") or {}
    participants = []
    open_releases = False
    on_chain = dict(
        mirror.PrivacySpend.objects.filter(job_id=job.job_id).values_list("dataset__dataset_id", "spent")
    )
    for participant in job.participants.order_by("index"):
        dataset = _local_dataset(job, participant, node)
        if dataset is not None:
            spend = budget.job_spend(dataset, job.job_id)
            open_releases |= dataset.releases.filter(
                job=str(job.job_id), status=PrivacyRelease.Status.RESERVED
            ).exists()
            figures = {"epsilon_spent": spend.spent, "epsilon_reserved": spend.reserved, "source": "local"}
        else:
            spent = int(on_chain.get(int(participant.dataset_id), 0)) / MICRO_EPSILON
            figures = {"epsilon_spent": spent, "epsilon_reserved": 0.0, "source": "chain"}
        participants.append({"node": participant.node, "dataset": participant.dataset_id, **figures})
    return {
        "target_epsilon": dp.get("target_epsilon"),
        "delta": dp.get("delta"),
        "epsilon_max": max((p["epsilon_spent"] for p in participants), default=0.0),
        "final": job.status in _ENDED and not open_releases,
        "participants": participants,
    }


def _round_releases(job: mirror.Job, node: str) -> dict[int, list[dict]]:
    """This node's releases in each round of the job: the mechanism as charged, for an auditor."""
    membership = Membership.objects.filter(node=node, job_id=job.job_id).first()
    if membership is None:
        return {}
    out: dict[int, list[dict]] = defaultdict(list)
    releases = PrivacyRelease.objects.filter(
        dataset_id=membership.dataset_id, job=str(job.job_id), round__isnull=False
    ).order_by("id")
    for release in releases:
        assert release.round is not None  # round__isnull=False above
        out[release.round].append(
            {
                "kind": release.kind,
                "noise_multiplier": release.noise_multiplier,
                "sample_rate": release.sample_rate,
                "steps": release.steps,
                "delta": release.delta,
                "epsilon_after": release.epsilon_after,
                "status": release.status,
            }
        )
    return out


def _seats(job: mirror.Job, round_: int) -> list[str]:
    return list(job.committee_seats.filter(round=round_).order_by("seat").values_list("member", flat=True))


def committee_payload(job: mirror.Job) -> list[dict]:
    by_round = defaultdict(list)
    for seat in job.committee_seats.order_by("round", "seat"):
        by_round[seat.round].append(seat.member)
    return [{"round": number, "members": members} for number, members in sorted(by_round.items())]


def _phase(round_: mirror.Round, job: mirror.Job) -> str:
    if round_.status == mirror.Round.Status.TRAINING:
        if job.status == mirror.Job.Status.CANCELLED:
            return "cancelled"
        return "training"
    return round_.status


def rounds_payload(job: mirror.Job, node: str) -> list[dict]:
    events = mirror.ChainEvent.objects.filter(contract="FederatedLearning", args__jobId=job.job_id)
    transactions = defaultdict(list)
    update_tx = {}
    for event in events.order_by("block_number", "log_index"):
        number = event.args.get("round")
        if number is None:
            continue
        transactions[number].append(
            {"name": event.name, "tx_hash": event.tx_hash, "block": event.block_number}
        )
        if event.name == "UpdateSubmitted":
            update_tx[(number, event.args["trainer"])] = (event.tx_hash, event.block_number)
    scores: defaultdict[tuple[int, str], dict[str, int]] = defaultdict(dict)
    for score in job.scores.all():
        scores[(score.round, score.trainer)][score.member] = score.score
    models = {m.round: m for m in job.global_models.all()}
    metrics = {m.round: m for m in RoundMetric.objects.filter(node=node, job_id=job.job_id)}
    timings = _timings(job.job_id, node)
    releases = _round_releases(job, node)
    encodings = round_encodings(node, job.job_id)
    out = []
    for round_ in job.rounds_set.order_by("number"):
        number = round_.number
        fixed = models.get(number)
        metric = metrics.get(number)
        sent = encodings.get(number, {"updates": {}, "tensors": {}})
        out.append(
            {
                "round": number,
                "phase": _phase(round_, job),
                "committee": _seats(job, number),
                "next_committee": _seats(job, number + 1) if round_.finalized_block else [],
                "update_deadline": round_.update_deadline,
                "score_deadline": round_.score_deadline,
                "global_model": {
                    "reference": fixed.reference,
                    "hash": fixed.model_hash,
                    "proposer": fixed.proposer,
                }
                if fixed
                else None,
                "metrics": {"accuracy": metric.accuracy, "loss": metric.loss, "epsilon": metric.epsilon}
                if metric
                else None,
                "updates": [
                    {
                        "trainer": u.trainer,
                        "index": u.index,
                        "reference": u.reference,
                        "content_hash": u.content_hash,
                        "samples": u.samples,
                        "scores": scores.get((number, u.trainer), {}),
                        "median": u.median,
                        "rank": u.rank,
                        "accepted": u.accepted,
                        "tx_hash": update_tx.get((number, u.trainer), ("", None))[0],
                        "block": update_tx.get((number, u.trainer), ("", None))[1],
                        "encodings": sent["updates"].get(u.trainer.lower(), {}),
                    }
                    for u in job.updates.filter(round=number).order_by("index")
                ],
                "transactions": transactions.get(number, []),
                "timings": timings.get(number, {}),
                "privacy": releases.get(number, []),
                "encodings": sent["tensors"],
            }
        )
    return out


def _timings(job_id: int, node: str) -> dict[int, dict]:
    """This node's seconds per action and round, for the overhead benchmark.

    ``seconds`` is the last run's wall time, ``work_seconds`` its local training; ``parts``
    splits it (driver.timing: swarm, chain_tx, chain_read, score, aggregate, ...), and
    ``started`` / ``finished`` (Unix time) line the actions of several nodes up.
    """
    out: dict[int, dict] = defaultdict(dict)
    for action in RoundAction.objects.filter(node=node, job_id=job_id, seconds__isnull=False):
        started, seconds = action.started_at, action.seconds
        assert seconds is not None  # seconds__isnull=False above
        out[action.round][action.kind] = {
            "seconds": seconds,
            "work_seconds": action.work_seconds,
            "parts": action.parts or {},
            "state": action.state,
            "started": started,
            "finished": started + seconds if started is not None else None,
        }
    return out
