"""Event -> typed tables. One handler per event; each is called once per event (the indexer only
calls it when the ChainEvent row is new), inside the indexer's transaction."""

from __future__ import annotations

from collections.abc import Callable

from .abi import DecodedEvent
from .models import (
    AcceptedUpdate,
    CommitteeSeat,
    Dataset,
    GlobalModel,
    GlobalModelProposal,
    Grant,
    Job,
    Node,
    Participant,
    PrivacySpend,
    Round,
    Score,
    Update,
)


def _job(args) -> Job:
    return Job.objects.get(job_id=args["jobId"])


def node_applied(e: DecodedEvent) -> None:
    a = e.args
    Node.objects.update_or_create(
        address=a["node"],
        defaults=dict(
            name=a["name"],
            endpoint=a["endpoint"],
            pubkey=a["pubkey"],
            overlay=a["overlay"],
            status=Node.Status.APPLIED,
            updated_block=e.block_number,
        ),
    )


def _node_status(status: str) -> Callable[[DecodedEvent], None]:
    def handler(e: DecodedEvent) -> None:
        Node.objects.filter(address=e.args["node"]).update(status=status, updated_block=e.block_number)

    return handler


def endpoint_updated(e: DecodedEvent) -> None:
    Node.objects.filter(address=e.args["node"]).update(
        endpoint=e.args["endpoint"], updated_block=e.block_number
    )


def job_proposed(e: DecodedEvent) -> None:
    s = e.args["spec"]
    Job.objects.update_or_create(
        job_id=e.args["jobId"],
        defaults=dict(
            proposer=e.args["proposer"],
            config_hash=s["configHash"],
            initial_model_ref=s["initialModelRef"],
            initial_model_hash=s["initialModelHash"],
            rounds=s["rounds"],
            committee_size=s["committeeSize"],
            top_k=s["topK"],
            min_trainers=s["minTrainers"],
            use_blocks=s["useBlocks"],
            join_deadline=s["joinDeadline"],
            train_period=s["trainPeriod"],
            score_period=s["scorePeriod"],
            status=Job.Status.OPEN,
            model_hash=s["initialModelHash"],
            proposed_block=e.block_number,
        ),
    )


def participant_joined(e: DecodedEvent) -> None:
    a = e.args
    Participant.objects.get_or_create(
        job=_job(a), node=a["node"], defaults=dict(dataset_id=a["datasetId"], index=a["index"])
    )


def job_started(e: DecodedEvent) -> None:
    Job.objects.filter(job_id=e.args["jobId"]).update(status=Job.Status.RUNNING)


def round_opened(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    job.current_round = a["round"]
    job.save(update_fields=["current_round"])
    Round.objects.update_or_create(
        job=job,
        number=a["round"],
        defaults=dict(
            status=Round.Status.TRAINING,
            base_model_hash=a["modelHash"],
            update_deadline=a["updateDeadline"],
            score_deadline=a["scoreDeadline"],
            opened_block=e.block_number,
        ),
    )
    for seat, member in enumerate(a["committee"]):
        CommitteeSeat.objects.update_or_create(
            job=job, round=a["round"], seat=seat, defaults={"member": member}
        )


def update_submitted(e: DecodedEvent) -> None:
    a = e.args
    Update.objects.get_or_create(
        job=_job(a),
        round=a["round"],
        trainer=a["trainer"],
        defaults=dict(
            index=a["index"], reference=a["modelRef"], content_hash=a["contentHash"], samples=a["samples"]
        ),
    )


def scores_submitted(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    Score.objects.bulk_create(
        [
            Score(job=job, round=a["round"], member=a["member"], trainer=trainer, score=score)
            for trainer, score in zip(a["trainers"], a["scores"], strict=True)
        ],
        ignore_conflicts=True,
    )


def round_finalized(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    Round.objects.filter(job=job, number=a["round"]).update(
        status=Round.Status.AGGREGATING, finalized_block=e.block_number
    )
    accepted = set(a["accepted"])
    for rank, (trainer, median) in enumerate(zip(a["ranking"], a["medians"], strict=True)):
        Update.objects.filter(job=job, round=a["round"], trainer=trainer).update(
            median=median, rank=rank, accepted=trainer in accepted
        )
    AcceptedUpdate.objects.bulk_create(
        [
            AcceptedUpdate(job=job, round=a["round"], position=position, trainer=trainer)
            for position, trainer in enumerate(a["accepted"])
        ],
        ignore_conflicts=True,
    )
    # the elected committee sits on the next round (it aggregates this one, then scores that one)
    for seat, member in enumerate(a["nextCommittee"]):
        CommitteeSeat.objects.update_or_create(
            job=job, round=a["round"] + 1, seat=seat, defaults={"member": member}
        )


def global_model_proposed(e: DecodedEvent) -> None:
    a = e.args
    GlobalModelProposal.objects.get_or_create(
        job=_job(a),
        round=a["round"],
        model_hash=a["modelHash"],
        defaults=dict(proposer=a["proposer"], reference=a["modelRef"]),
    )


def global_model_confirmed(e: DecodedEvent) -> None:
    a = e.args
    GlobalModelProposal.objects.filter(job=_job(a), round=a["round"], model_hash=a["modelHash"]).update(
        votes=a["votes"]
    )


def global_model_fixed(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    proposal = GlobalModelProposal.objects.get(job=job, round=a["round"], model_hash=a["modelHash"])
    GlobalModel.objects.get_or_create(
        job=job,
        round=a["round"],
        defaults=dict(
            model_hash=a["modelHash"],
            reference=proposal.reference,
            proposer=a["proposer"],
            fixed_block=e.block_number,
        ),
    )
    job.model_hash = a["modelHash"]
    job.save(update_fields=["model_hash"])
    Round.objects.filter(job=job, number=a["round"]).update(status=Round.Status.DONE)


def _job_status(status: str) -> Callable[[DecodedEvent], None]:
    def handler(e: DecodedEvent) -> None:
        Job.objects.filter(job_id=e.args["jobId"]).update(status=status)
        if status == Job.Status.FAILED:
            Round.objects.filter(job__job_id=e.args["jobId"], number=e.args["round"]).update(
                status=Round.Status.FAILED
            )

    return handler


def dataset_registered(e: DecodedEvent) -> None:
    a = e.args
    Dataset.objects.get_or_create(
        dataset_id=a["datasetId"],
        defaults=dict(
            owner=a["owner"],
            content_hash=a["contentHash"],
            swarm_ref=a["swarmRef"],
            schema_hash=a["schemaHash"],
            samples=a["samples"],
            privacy_cap=a["privacyCap"],
            registered_block=e.block_number,
        ),
    )


def access_granted(e: DecodedEvent) -> None:
    a = e.args
    Grant.objects.update_or_create(
        dataset=Dataset.objects.get(dataset_id=a["datasetId"]),
        grantee=a["grantee"],
        defaults=dict(
            wrapped_key=a["wrappedKey"], active=True, granted_block=e.block_number, revoked_block=None
        ),
    )


def access_revoked(e: DecodedEvent) -> None:
    a = e.args
    Grant.objects.filter(dataset__dataset_id=a["datasetId"], grantee=a["grantee"]).update(
        active=False, revoked_block=e.block_number
    )


def privacy_spent(e: DecodedEvent) -> None:
    a = e.args
    dataset = Dataset.objects.get(dataset_id=a["datasetId"])
    dataset.privacy_spent = a["datasetTotal"]
    dataset.save(update_fields=["privacy_spent"])
    PrivacySpend.objects.update_or_create(
        dataset=dataset, job_id=a["jobId"], defaults={"spent": a["jobTotal"]}
    )


def _ignore(e: DecodedEvent) -> None:
    """Votes: kept in ChainEvent only."""


HANDLERS: dict[str, Callable[[DecodedEvent], None]] = {
    "NodeApplied": node_applied,
    "AdmissionVoted": _ignore,
    "NodeAdmitted": _node_status(Node.Status.MEMBER),
    "EndpointUpdated": endpoint_updated,
    "NodeLeft": _node_status(Node.Status.LEFT),
    "RemovalVoted": _ignore,
    "NodeRemoved": _node_status(Node.Status.REMOVED),
    "JobProposed": job_proposed,
    "ParticipantJoined": participant_joined,
    "JobStarted": job_started,
    "RoundOpened": round_opened,
    "UpdateSubmitted": update_submitted,
    "ScoresSubmitted": scores_submitted,
    "RoundFinalized": round_finalized,
    "GlobalModelProposed": global_model_proposed,
    "GlobalModelConfirmed": global_model_confirmed,
    "GlobalModelFixed": global_model_fixed,
    "JobFinished": _job_status(Job.Status.FINISHED),
    "JobFailed": _job_status(Job.Status.FAILED),
    "JobCancelled": _job_status(Job.Status.CANCELLED),
    "DatasetRegistered": dataset_registered,
    "AccessGranted": access_granted,
    "AccessRevoked": access_revoked,
    "PrivacySpent": privacy_spent,
}


def apply(event: DecodedEvent) -> None:
    HANDLERS[event.name](event)
