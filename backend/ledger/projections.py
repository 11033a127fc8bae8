"""Event -> typed tables. One handler per event; each is called once per event (the indexer only
calls it when the ChainEvent row is new), inside the indexer's transaction.

Events are input from whoever sent the transaction. ``bounded`` (pure, no query) runs before
anything is stored: it clips strings and refuses oversized events. The handlers refuse values
their columns cannot hold and references to rows that do not exist by raising ``Rejected``; the
indexer then records the event as rejected and skips it (see indexer.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable

from django.db import models
from eth_utils import keccak

from .abi import DecodedEvent
from .artifacts import all_artifacts
from .models import (
    AcceptedUpdate,
    BudgetSource,
    CommitteeSeat,
    Dataset,
    GlobalModel,
    GlobalModelProposal,
    Grant,
    Job,
    Node,
    Participant,
    PrivacyRecord,
    PrivacySpend,
    Round,
    Score,
    Update,
)

MAX_TEXT = 1024  # characters kept of any string argument (a name may be megabytes of log data)
MAX_ARGS_JSON = 256 * 1024  # an event's arguments as JSON (2,000 trainers' ranking fit)
MAX_SMALL = 2**31 - 1  # PositiveIntegerField's bound on every database
MAX_WRAPPED_KEY_HEX = 2 + 2 * 4096  # a wrapped 32-byte key is ~150 bytes; the contract allows 512
REPLACEMENT = "\ufffd"


class Rejected(Exception):
    """An event this node will not mirror; the message is the reason shown to operators."""


@functools.cache
def _string_args() -> dict[str, frozenset[str]]:
    """Event name -> its arguments of ABI type string (free text; bytes arrive as 0x-hex)."""
    found: dict[str, set[str]] = {}
    for artifact in all_artifacts():
        for item in artifact.abi:
            if item["type"] == "event":
                names = {i["name"] for i in item["inputs"] if i["type"] == "string"}
                found.setdefault(item["name"], set()).update(names)
    return {name: frozenset(args) for name, args in found.items()}


def bounded(event: DecodedEvent) -> DecodedEvent:
    """The event with its strings clipped to MAX_TEXT characters (NUL replaced: not every
    database stores it); Rejected if its arguments are still over MAX_ARGS_JSON."""
    texts = _string_args().get(event.name, frozenset())
    args = event.args
    if texts:
        args = {
            k: v[:MAX_TEXT].replace("\x00", REPLACEMENT) if k in texts and isinstance(v, str) else v
            for k, v in args.items()
        }
    size = len(json.dumps(args))
    if size > MAX_ARGS_JSON:
        raise Rejected(f"arguments of {size} bytes as JSON exceed {MAX_ARGS_JSON}")
    return dataclasses.replace(event, args=args) if texts else event


def _small(value: int, what: str) -> int:
    if not 0 <= value <= MAX_SMALL:
        raise Rejected(f"{what} {value} is out of range (0..{MAX_SMALL})")
    return value


def _fits(model: type[models.Model], field: str, value: str) -> str:
    """An exact value (hex, URL) that must fit its column whole: a cut one would be wrong."""
    limit = _max_length(model, field)
    if limit is not None and len(value) > limit:
        raise Rejected(f"{field} longer than {limit} characters")
    return value


def _label(model: type[models.Model], field: str, value: str) -> str:
    """A display string (a node's name): cut to its column."""
    limit = _max_length(model, field)
    return value[:limit] if limit is not None else value


def _max_length(model: type[models.Model], field: str) -> int | None:
    column = model._meta.get_field(field)
    return column.max_length if isinstance(column, models.Field) else None


def _job(args) -> Job:
    job = Job.objects.filter(job_id=args["jobId"]).first()
    if job is None:
        raise Rejected(f"unknown job {args['jobId']}")
    return job


def _dataset(dataset_id: int) -> Dataset:
    dataset = Dataset.objects.filter(dataset_id=dataset_id).first()
    if dataset is None:
        raise Rejected(f"unknown dataset {dataset_id}")
    return dataset


def node_applied(e: DecodedEvent) -> None:
    a = e.args
    Node.objects.update_or_create(
        address=a["node"],
        defaults=dict(
            name=_label(Node, "name", a["name"]),
            endpoint=_fits(Node, "endpoint", a["endpoint"]),
            pubkey=_fits(Node, "pubkey", a["pubkey"]),
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
        endpoint=_fits(Node, "endpoint", e.args["endpoint"]), updated_block=e.block_number
    )


def job_proposed(e: DecodedEvent) -> None:
    s = e.args["spec"]
    Job.objects.update_or_create(
        job_id=e.args["jobId"],
        defaults=dict(
            proposer=e.args["proposer"],
            config_hash=s["configHash"],
            initial_model_ref=_fits(Job, "initial_model_ref", s["initialModelRef"]),
            initial_model_hash=s["initialModelHash"],
            rounds=_small(s["rounds"], "rounds"),
            committee_size=_small(s["committeeSize"], "committeeSize"),
            top_k=_small(s["topK"], "topK"),
            min_trainers=_small(s["minTrainers"], "minTrainers"),
            use_blocks=s["useBlocks"],
            join_deadline=s["joinDeadline"],
            train_period=s["trainPeriod"],
            score_period=s["scorePeriod"],
            max_spend_per_round=s.get("maxSpendPerRound", 0),
            margin=_small(s.get("margin", 0), "margin"),
            status=Job.Status.OPEN,
            model_hash=s["initialModelHash"],
            proposed_block=e.block_number,
        ),
    )


def participant_joined(e: DecodedEvent) -> None:
    a = e.args
    Participant.objects.get_or_create(
        job=_job(a),
        node=a["node"],
        defaults=dict(dataset_id=a["datasetId"], index=_small(a["index"], "index")),
    )


def draw_opened(e: DecodedEvent) -> None:
    Job.objects.filter(job_id=e.args["jobId"]).update(
        status=Job.Status.DRAWING, draw_deadline=e.args["deadline"]
    )


def draw_secret_revealed(e: DecodedEvent) -> None:
    Participant.objects.filter(job=_job(e.args), node=e.args["node"]).update(drawn=True)


def job_started(e: DecodedEvent) -> None:
    Job.objects.filter(job_id=e.args["jobId"]).update(status=Job.Status.RUNNING)


def round_opened(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    job.current_round = _small(a["round"], "round")
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
        round=_small(a["round"], "round"),
        trainer=a["trainer"],
        defaults=dict(
            index=_small(a["index"], "index"),
            reference=_fits(Update, "reference", a["modelRef"]),
            content_hash=a["contentHash"],
            samples=a["samples"],
        ),
    )


def scores_submitted(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    Score.objects.bulk_create(
        [
            Score(
                job=job,
                round=_small(a["round"], "round"),
                member=a["member"],
                trainer=trainer,
                score=_small(score, "score"),
            )
            for trainer, score in zip(a["trainers"], a["scores"], strict=True)
        ],
        ignore_conflicts=True,
    )


def round_finalized(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    _small(a["round"] + 1, "round")  # the next committee's round must fit too
    Round.objects.filter(job=job, number=a["round"]).update(
        status=Round.Status.AGGREGATING,
        finalized_block=e.block_number,
        base_median=_small(a["baseMedian"], "baseMedian"),
        aggregate_deadline=a["aggregateDeadline"],
        seed=a["seed"],
    )
    rank = {trainer: position for position, trainer in enumerate(a["accepted"])}
    for trainer, median in zip(a["trainers"], a["medians"], strict=True):
        Update.objects.filter(job=job, round=a["round"], trainer=trainer).update(
            median=_small(median, "median"), rank=rank.get(trainer), accepted=trainer in rank
        )
    AcceptedUpdate.objects.bulk_create(
        [
            AcceptedUpdate(job=job, round=a["round"], position=position, trainer=trainer)
            for position, trainer in enumerate(a["accepted"])
        ],
        ignore_conflicts=True,
    )
    # the drawn committee sits on the next round (it aggregates this one, then scores that one)
    for seat, member in enumerate(a["nextCommittee"]):
        CommitteeSeat.objects.update_or_create(
            job=job, round=a["round"] + 1, seat=seat, defaults={"member": member}
        )


def scores_withheld(e: DecodedEvent) -> None:
    Participant.objects.filter(job=_job(e.args), node=e.args["member"]).update(banned=True)


def global_model_voted(e: DecodedEvent) -> None:
    a = e.args
    proposal, _ = GlobalModelProposal.objects.get_or_create(
        job=_job(a),
        round=_small(a["round"], "round"),
        model_hash=a["modelHash"],
        reference=_fits(GlobalModelProposal, "reference", a["modelRef"]),
        defaults=dict(proposer=a["member"]),
    )
    proposal.votes = _small(a["votes"], "votes")
    proposal.save(update_fields=["votes"])


def _proposal(job: Job, round_: int, model_hash: str, reference_digest: str) -> GlobalModelProposal | None:
    """The voted pair of ``model_hash`` whose reference hashes to ``reference_digest``: a hash may be
    voted with several references (a hijacked one among them), each pair its own votes."""
    for proposal in GlobalModelProposal.objects.filter(job=job, round=round_, model_hash=model_hash):
        if _ref_digest(proposal.reference) == reference_digest.lower():
            return proposal
    return None


def _ref_digest(reference: str) -> str:
    return "0x" + keccak(bytes.fromhex(reference.removeprefix("0x"))).hex()


def global_model_fixed(e: DecodedEvent) -> None:
    a = e.args
    job = _job(a)
    proposal = _proposal(job, a["round"], a["modelHash"], a["referenceDigest"])
    if proposal is None:
        raise Rejected(
            f"no vote for {a['modelHash']} with that reference in round {a['round']} of job {a['jobId']}"
        )
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


def aggregation_skipped(e: DecodedEvent) -> None:
    # the model stays the previous one (no GlobalModel row); RoundOpened that follows seats the
    # drawn committee for the next round
    Round.objects.filter(job=_job(e.args), number=e.args["round"]).update(status=Round.Status.SKIPPED)


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
    source, created = BudgetSource.objects.get_or_create(
        source_id=a["sourceId"], defaults=dict(owner=a["owner"], cap=a["privacyCap"])
    )
    if not created and int(a["privacyCap"]) < int(source.cap):  # the most restrictive cap wins
        source.cap = a["privacyCap"]
        source.save(update_fields=["cap"])
    dataset, created = Dataset.objects.get_or_create(
        dataset_id=a["datasetId"],
        defaults=dict(
            owner=a["owner"],
            commitment=a["commitment"],
            swarm_ref=a["swarmRef"],
            schema_hash=a["schemaHash"],
            samples=a["samples"],
            privacy_cap=a["privacyCap"],
            privacy_spent=source.spent,
            registered_block=e.block_number,
            source=source,
            disjoint=a["disjoint"],
        ),
    )
    initial_spend = int(a.get("initialSpend") or 0)  # absent from events of contracts before it
    if created and initial_spend:
        # the release its registration made (samples: a DP count) counts into the source's spend;
        # once per dataset, so a replay adds nothing
        source.spent = int(source.spent) + initial_spend
        source.save(update_fields=["spent"])
        Dataset.objects.filter(source=source).update(privacy_spent=source.spent)
    if not created and dataset.source_id is None and dataset.owner.lower() == str(a["owner"]).lower():
        # a dataset of the previous contracts (no sources), carried over with the same id
        # (docs/OPERATIONS.md, Upgrades): it joins the source the new contracts gave it
        dataset.source, dataset.privacy_spent, dataset.disjoint = source, source.spent, a["disjoint"]
        dataset.save(update_fields=["source", "privacy_spent", "disjoint"])


def access_granted(e: DecodedEvent) -> None:
    a = e.args
    if len(a["wrappedKey"]) > MAX_WRAPPED_KEY_HEX:
        raise Rejected(f"wrappedKey of {len(a['wrappedKey'])} hex characters exceeds {MAX_WRAPPED_KEY_HEX}")
    Grant.objects.update_or_create(
        dataset=_dataset(a["datasetId"]),
        grantee=a["grantee"],
        defaults=dict(
            wrapped_key=a["wrappedKey"],
            active=True,
            cap=a["cap"],
            granted_block=e.block_number,
            revoked_block=None,
        ),
    )


def access_revoked(e: DecodedEvent) -> None:
    a = e.args
    Grant.objects.filter(dataset__dataset_id=a["datasetId"], grantee=a["grantee"]).update(
        active=False, revoked_block=e.block_number
    )


def dataset_key_rotated(e: DecodedEvent) -> None:
    Dataset.objects.filter(dataset_id=e.args["datasetId"]).update(swarm_ref=e.args["swarmRef"])


def privacy_spent(e: DecodedEvent) -> None:
    a = e.args
    dataset = _dataset(a["datasetId"])
    if dataset.source_id is not None:  # every dataset of the source shows the source's spend
        BudgetSource.objects.filter(pk=dataset.source_id).update(spent=a["sourceTotal"])
        Dataset.objects.filter(source_id=dataset.source_id).update(privacy_spent=a["sourceTotal"])
    PrivacySpend.objects.update_or_create(
        dataset=dataset, job_id=a["jobId"], defaults={"spent": a["jobTotal"]}
    )
    PrivacyRecord.objects.get_or_create(
        block=e.block_number,
        log_index=e.log_index,
        defaults=dict(
            dataset=dataset,
            job_id=a["jobId"],
            round=_small(a["round"], "round"),
            spender=a["spender"],
            amount=a["amount"],
            kind=_small(a["kind"], "kind"),
            steps=_small(a["steps"], "steps"),
        ),
    )


def privacy_carried(e: DecodedEvent) -> None:
    """What the previous contracts recorded on a carried dataset, counted into its source."""
    a = e.args
    BudgetSource.objects.filter(source_id=a["sourceId"]).update(spent=a["sourceTotal"])
    Dataset.objects.filter(source__source_id=a["sourceId"]).update(privacy_spent=a["sourceTotal"])


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
    "DrawOpened": draw_opened,
    "DrawSecretRevealed": draw_secret_revealed,
    "JobStarted": job_started,
    "RoundOpened": round_opened,
    "UpdateSubmitted": update_submitted,
    "ScoresSubmitted": scores_submitted,
    "ScoresWithheld": scores_withheld,
    "RoundFinalized": round_finalized,
    "AggregationSkipped": aggregation_skipped,
    "GlobalModelVoted": global_model_voted,
    "GlobalModelFixed": global_model_fixed,
    "JobFinished": _job_status(Job.Status.FINISHED),
    "JobFailed": _job_status(Job.Status.FAILED),
    "JobCancelled": _job_status(Job.Status.CANCELLED),
    "DatasetRegistered": dataset_registered,
    "AccessGranted": access_granted,
    "AccessRevoked": access_revoked,
    "DatasetKeyRotated": dataset_key_rotated,
    "PrivacySpent": privacy_spent,
    "SpenderWired": _ignore,  # DataRegistry's one-time wiring to FederatedLearning at deployment
    "PrivacyCarried": privacy_carried,
    # an upgrade's import (docs/OPERATIONS.md, Upgrades): kept in ChainEvent only
    "DataImportWired": _ignore,
    "ImportConfirmVoted": _ignore,
    "ImportClosed": _ignore,
}


def apply(event: DecodedEvent) -> None:
    """Project one event; events no handler knows (new ones of a newer contract) stay in ChainEvent."""
    HANDLERS.get(event.name, _ignore)(event)
