"""What the jobs API shows, read from the mirror of the chain (and this node's own records).

Rounds, committees, updates, scores and transactions come from the event indexer's tables
only, so the API's history of a job is exactly the chain's.
"""

from __future__ import annotations

from collections import defaultdict

from backend.datasets import budget, job_privacy
from backend.datasets.models import Dataset, PrivacyRelease
from backend.jobs.encodings import round_encodings
from backend.jobs.models import JobRecord, Membership, RoundAction, RoundMetric
from backend.jobs_api.gas import transaction_gas
from backend.ledger import models as mirror
from backend.ledger.contributions import contributions
from fl_node.job.config import JobConfig

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


def node_names(addresses) -> dict[str, str]:
    """Registered names of these nodes (lower-case address -> name): pages name nodes, not addresses."""
    wanted = {a.lower() for a in addresses if a}
    rows = mirror.Node.objects.values_list("address", "name")
    return {address.lower(): name for address, name in rows if address.lower() in wanted}


def job_payload(
    job: mirror.Job, record: JobRecord | None, node: str, *, ledger=None, with_gas: bool = False
) -> dict:
    """A job as this node sees it; ``with_gas`` adds every transaction's gas (receipts: the detail only)."""
    config = record.config if record else {}
    membership = Membership.objects.filter(node=node, job_id=job.job_id).select_related("dataset").first()
    latest = job.global_models.order_by("-round").first()
    participants = list(job.participants.order_by("index"))
    committee = _seats(job, job.current_round)
    names = node_names([job.proposer, *(p.node for p in participants), *committee])
    own_names = dict(Dataset.objects.exclude(onchain_id="").values_list("onchain_id", "name"))
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
        "margin_bp": job.margin,
        "join_deadline": job.join_deadline,
        "proposer_name": names.get(job.proposer.lower(), ""),
        "names": names,
        "participants": [
            {
                "node": p.node,
                "name": names.get(p.node.lower(), ""),
                "dataset": p.dataset_id,
                # a dataset's name is known to its owner only: this node names its own
                "dataset_name": own_names.get(str(p.dataset_id), "")
                if p.node.lower() == node.lower()
                else "",
                "index": p.index,
            }
            for p in participants
        ],
        "committee": committee,
        "global_model": {"round": latest.round, "hash": latest.model_hash, "reference": latest.reference}
        if latest
        else None,
        "privacy": privacy_payload(job, config, node),
        # each participant's accepted updates, committee work and share (from the chain's events)
        "contributions": contributions(job),
        "gas": gas_payload(job, ledger) if with_gas else None,
        "joined": {
            "dataset": membership.dataset_id,
            "dataset_name": membership.dataset.name,
            "onchain_dataset": int(membership.dataset.onchain_id) if membership.dataset.onchain_id else None,
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
    """The job's privacy per participant, every figure from records any member can check.

    A participant's ``epsilon_spent`` is the job's OWN releases composed at the JOB's delta,
    recomputed from public values alone (backend.datasets.job_privacy.chain_epsilon: its plan from
    the job's config and its dataset's size and hold-out flag on chain, its releases from the
    spends it recorded): every member shows the same figure for every participant, this node
    included. For this node ``epsilon_local`` is the same figure from its own records (they differ
    only if a release could not be recorded on chain) and ``epsilon_reserved`` what its releases
    not yet settled add. ``final`` only once the job ended and none of this node's releases is
    still reserved.
    """
    dp = config.get("dp") or {}
    plan_config = _job_config(config)
    participants = []
    open_releases = False
    count = job.participants.count()
    for participant in job.participants.order_by("index"):
        unplannable = False
        try:
            spent = (
                job_privacy.chain_epsilon(
                    plan_config,
                    job_id=job.job_id,
                    rounds=job.rounds,
                    participants=count,
                    committee_size=job.committee_size,
                    dataset_id=int(participant.dataset_id),
                    spender=participant.node,
                )
                if plan_config is not None
                else None
            )
        except job_privacy.Unplannable:
            spent, unplannable = None, True
        # a job recorded before spends carried their kind (contracts v1) cannot be recomputed from
        # the chain: its figures are the node's own records where it has them ("legacy")
        legacy = (
            not mirror.PrivacyRecord.objects.filter(job_id=job.job_id, spender=participant.node).exists()
            and mirror.PrivacySpend.objects.filter(
                job_id=job.job_id, dataset__dataset_id=participant.dataset_id
            ).exists()
        )
        figures: dict = {
            "epsilon_spent": spent or 0.0,
            "epsilon_reserved": 0.0,
            "source": "unplannable" if unplannable else "legacy" if legacy else "chain",
        }
        dataset = _local_dataset(job, participant, node)
        if dataset is not None and plan_config is not None:
            local = budget.job_spend(
                dataset, job.job_id, delta=plan_config.dp.delta, adjacency=plan_config.dp.adjacency
            )
            open_releases |= dataset.releases.filter(
                job=str(job.job_id), status=PrivacyRelease.Status.RESERVED
            ).exists()
            figures |= {"epsilon_local": local.spent, "epsilon_reserved": local.reserved}
        participants.append({"node": participant.node, "dataset": participant.dataset_id, **figures})
    return {
        "target_epsilon": dp.get("target_epsilon"),
        "delta": dp.get("delta"),
        "epsilon_max": max(
            (max(p["epsilon_spent"], p.get("epsilon_local", 0.0)) for p in participants), default=0.0
        ),
        "final": job.status in _ENDED and not open_releases,
        "participants": participants,
    }


def _job_config(config: dict) -> JobConfig | None:
    """The job's config as the plan needs it; None for a job this node holds no valid config of."""
    if not config:
        return None
    try:
        parsed = JobConfig.from_dict(config)
    except (TypeError, ValueError, KeyError):
        return None
    return parsed if parsed.dp.private else None


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


# Arguments of a job's events that name the node that sent the transaction.
_ACTORS = ("trainer", "member", "proposer", "node", "spender", "caller")


def _actor(args: dict) -> str:
    return next((str(args[key]) for key in _ACTORS if args.get(key)), "")


def job_transactions(job: mirror.Job) -> list[dict]:
    """Every transaction of the job, once, in chain order: its first FederatedLearning event names
    it (proposeJob's JobProposed, a join's ParticipantJoined, an update's UpdateSubmitted after the
    DataRegistry's PrivacySpent of its folded spend...), with its round if any."""
    seen: dict[str, dict] = {}
    events = mirror.ChainEvent.objects.filter(args__jobId=job.job_id).order_by("block_number", "log_index")
    for event in events:
        entry = seen.get(event.tx_hash)
        if entry is None:
            seen[event.tx_hash] = {
                "name": event.name,
                "named_by_call": event.contract == "FederatedLearning",
                "tx_hash": event.tx_hash,
                "block": event.block_number,
                "round": event.args.get("round"),
                "actor": _actor(event.args),
                "events": [event.name],
            }
        else:
            entry["events"].append(event.name)
            if not entry["named_by_call"] and event.contract == "FederatedLearning":
                entry["name"], entry["named_by_call"] = event.name, True
            if entry["round"] is None:
                entry["round"] = event.args.get("round")
    for entry in seen.values():
        del entry["named_by_call"]
    return list(seen.values())


def gas_payload(job: mirror.Job, ledger) -> dict:
    """The job's gas: every transaction's (proposal, joins, start, updates, scores, votes...) and the total."""
    transactions = job_transactions(job)
    gas = transaction_gas(ledger, (t["tx_hash"] for t in transactions))
    known = [gas[t["tx_hash"]] for t in transactions if gas.get(t["tx_hash"]) is not None]
    return {
        "total": sum(g for g in known if g is not None),
        "transactions": len(transactions),
        "unknown": len(transactions) - len(known),
        "setup": [
            {**_without_round(t), "gas": gas.get(t["tx_hash"])} for t in transactions if t["round"] is None
        ],
    }


def _without_round(transaction: dict) -> dict:
    return {key: transaction[key] for key in ("name", "tx_hash", "block", "actor")}


def _percent(bp: int | None) -> str:
    return "—" if bp is None else f"{bp / 100:.1f}%"


def decision(
    update: mirror.Update, scores: dict[str, int], round_: mirror.Round, job: mirror.Job, committee: int
) -> dict:
    """Accepted or rejected and why, in the committee rule's own terms (fl_node.committee):
    accepted are the top_k best whose median beats the base model's median by more than the margin."""
    threshold = (round_.base_median or 0) + job.margin
    margin = f" + margin {_percent(job.margin)}" if job.margin else ""
    if round_.finalized_block is None:
        got = len(scores)
        state = "pending"
        reason = (
            f"scored by {got} of {committee} committee member(s) so far; decided when the round is finalized"
            if got
            else "waiting for the committee's scores"
        )
        return {"state": state, "reason": reason, "threshold": None}
    median = update.median or 0
    base = f"the base model's {_percent(round_.base_median)}{margin}"
    if update.accepted:
        rank = (update.rank or 0) + 1
        reason = f"its median {_percent(median)} beat {base}; ranked {rank} of the top {job.top_k}"
        return {"state": "accepted", "reason": reason, "threshold": threshold}
    if not scores:
        reason = "no committee member's score came in: its median counts as 0%"
    elif median <= threshold:
        reason = (
            f"its median {_percent(median)} did not beat {base} (it needed more than {_percent(threshold)})"
        )
        if median == 0:
            reason += "; a score of 0 means the update did not open, decode or fit its bounds for that member"
    else:
        reason = f"its median {_percent(median)} beat {base} but {job.top_k} better update(s) took the top {job.top_k}"
    return {"state": "rejected", "reason": reason, "threshold": threshold}


def rounds_payload(job: mirror.Job, ctx) -> list[dict]:
    """Every round with its decisions and their reasons, its transactions with their gas, and this
    node's own records (metrics, timings, privacy releases, encodings). ``ctx``: the NodeContext."""
    node = ctx.address
    all_transactions = job_transactions(job)
    gas = transaction_gas(ctx.ledger, (t["tx_hash"] for t in all_transactions))
    transactions: defaultdict[int, list[dict]] = defaultdict(list)
    update_tx = {}
    for t in all_transactions:
        if t["round"] is None:
            continue
        transactions[t["round"]].append({**_without_round(t), "gas": gas.get(t["tx_hash"])})
    base_scores: defaultdict[int, dict[str, int]] = defaultdict(dict)
    events = mirror.ChainEvent.objects.filter(
        contract="FederatedLearning", args__jobId=job.job_id, name__in=("UpdateSubmitted", "ScoresSubmitted")
    )
    for event in events.order_by("block_number", "log_index"):
        number = event.args.get("round")
        if event.name == "UpdateSubmitted":
            update_tx[(number, event.args["trainer"])] = (event.tx_hash, event.block_number)
        elif event.args.get("baseScore") is not None:
            base_scores[number][event.args["member"]] = int(event.args["baseScore"])
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
        committee = _seats(job, number)
        round_transactions = transactions.get(number, [])
        out.append(
            {
                "round": number,
                "phase": _phase(round_, job),
                "base_median": round_.base_median,
                "base_scores": base_scores.get(number, {}),
                "margin": job.margin,
                "top_k": job.top_k,
                "gas": sum(t["gas"] or 0 for t in round_transactions),
                "committee": committee,
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
                        "accepted": u.accepted if round_.finalized_block is not None else None,
                        "decision": decision(
                            u, scores.get((number, u.trainer), {}), round_, job, len(committee)
                        ),
                        "tx_hash": update_tx.get((number, u.trainer), ("", None))[0],
                        "block": update_tx.get((number, u.trainer), ("", None))[1],
                        "encodings": sent["updates"].get(u.trainer.lower(), {}),
                    }
                    for u in job.updates.filter(round=number).order_by("index")
                ],
                "transactions": round_transactions,
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
