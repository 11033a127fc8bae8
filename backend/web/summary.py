"""What the dashboard's own read endpoints compute (backend/web/api.py serves them).

- ``overview``: is this node fine and what is it doing: its jobs with their phase and latest
  accuracy, the indexer's lag, storage and replication, and warnings as sentences.
- ``join_candidates``: which members can join a new job and with which datasets (their
  on-chain privacy budget left), so the job wizard never proposes an unstartable job.
- ``granted_datasets``: the datasets other nodes granted to this node.
- ``model_catalog``: the model registry with the job's name, the round's accuracy on this
  node's validation data, and which version a job serves now.

All of it is read from the chain's mirror and this node's tables: nothing here writes.
"""

from __future__ import annotations

import logging

from django.conf import settings

from backend.datasets.models import Dataset as LocalDataset
from backend.jobs.models import JobRecord, Membership, RoundMetric
from backend.ledger import access as ledger_access
from backend.ledger import models as mirror
from backend.nodes import overview as node_overview
from backend.serving.models import GlobalModel
from fl_node.job.limits import MICRO_EPSILON

logger = logging.getLogger(__name__)
ACTIVE_JOBS = (mirror.Job.Status.OPEN, mirror.Job.Status.DRAWING, mirror.Job.Status.RUNNING)
LAG_WARNING_BLOCKS = 20
BUDGET_WARNING_SHARE = 0.9


def _epsilon(micro: int | None) -> float | None:
    return None if micro is None else micro / MICRO_EPSILON


def job_phase(job: mirror.Job) -> str:
    """The phase an operator cares about: the latest round's, with 'scoring' split off training."""
    if job.status != mirror.Job.Status.RUNNING:
        return job.status
    latest = job.rounds_set.order_by("-number").first()
    if latest is None:
        return "starting"
    if latest.status == mirror.Round.Status.TRAINING:
        scored = job.scores.filter(round=latest.number).exists()
        return "scoring" if scored else "training"
    return latest.status


def member_names() -> dict[str, str]:
    """Every registered node's name by its address (lower-case): how the pages name a node."""
    return {address.lower(): name for address, name in mirror.Node.objects.values_list("address", "name")}


def _job_row(job: mirror.Job, me: str | None, names: dict[int, str], nodes: dict[str, str]) -> dict:
    metric = RoundMetric.objects.filter(node=me, job_id=job.job_id).order_by("-round").first() if me else None
    joined = Membership.objects.filter(node=me, job_id=job.job_id).first() if me else None
    return {
        "id": job.job_id,
        "name": names.get(job.job_id, ""),
        "status": job.status,
        "phase": job_phase(job),
        "current_round": job.current_round,
        "rounds": job.rounds,
        "participants": job.participants.count(),
        "needed": job.committee_size + job.min_trainers,
        "proposer": job.proposer,
        "proposer_name": nodes.get(job.proposer.lower(), ""),
        "mine": bool(me and job.proposer.lower() == me.lower()),
        "joined": joined is not None,
        "prepared": bool(joined and joined.prepared_at),
        "latest_accuracy": metric.accuracy if metric else None,
        "latest_metric_round": metric.round if metric else None,
    }


def _job_names(ids) -> dict[int, str]:
    return dict(JobRecord.objects.filter(onchain_id__in=list(ids)).values_list("onchain_id", "name"))


def overview() -> dict:
    """Everything the overview page shows but peers and events, in one request: the page's
    cards come from ``node`` (the same shape as GET /api/node), computed once here."""
    ident = node_overview.identity()
    me = ident["address"]
    chain = node_overview.chain_status()
    storage = node_overview.storage_status()
    jobs = list(mirror.Job.objects.filter(status__in=ACTIVE_JOBS).order_by("-job_id")[:50])
    names = _job_names(job.job_id for job in jobs)
    nodes = member_names()
    swarm = _swarm_nodes()
    warnings = _warnings(me, chain, storage, swarm)
    node = {
        **ident,
        "name": settings.DEFL_NODE_NAME,
        "endpoint": settings.DEFL_NODE_ENDPOINT,
        "chain": chain,
        "storage": storage,
        "workers": node_overview.workers_status(),
        "device": node_overview.device(),
    }
    return {
        "address": me,
        "node": node,
        "jobs": [_job_row(job, me, names, nodes) for job in jobs],
        "chain": {key: chain.get(key) for key in ("available", "block", "indexed_block", "lag", "error")},
        "storage": storage,
        "replication": swarm,
        "warnings": warnings,
    }


def _swarm_nodes() -> dict:
    try:
        from backend.swarm.factory import node_swarm

        stat = node_swarm().node_stat()
    except Exception as exc:  # the overview must render without the store
        return {
            "available": False,
            "factor": None,
            "nodes": None,
            "up": None,
            "error": str(exc) or type(exc).__name__,
        }
    up = sum(1 for node in stat.nodes if node["up"])
    return {"available": True, "factor": stat.replication, "nodes": len(stat.nodes), "up": up, "error": None}


def _warnings(me: str | None, chain: dict, storage: dict, swarm: dict) -> list[dict]:
    out: list[dict] = []

    def warn(kind: str, text: str, level: str = "warning") -> None:
        out.append({"kind": kind, "level": level, "text": text})

    if me is None:
        warn("identity", "This node has no key: it cannot sign transactions or peer requests.", "error")
    if not chain.get("available"):
        warn("chain", f"The chain cannot be reached: {chain.get('error') or 'unknown error'}.", "error")
    elif chain.get("lag") is not None and chain["lag"] > LAG_WARNING_BLOCKS:
        warn(
            "indexer", f"The event indexer is {chain['lag']} blocks behind the chain: pages show older state."
        )
    if not storage.get("available"):
        warn(
            "storage", f"The swarm store is unavailable: {storage.get('error') or 'unknown error'}.", "error"
        )
    if swarm.get("available") and swarm["factor"] and swarm["up"] < min(swarm["factor"], swarm["nodes"]):
        warn(
            "replication",
            f"Only {swarm['up']} of {swarm['nodes']} storage nodes answer: new blobs cannot get "
            f"their {swarm['factor']} copies.",
        )
    rejected = _rejected_events()
    if rejected:
        warn(
            "rejected-events",
            f"The indexer rejected {rejected} chain event(s) it could not mirror; see the events list.",
        )
    local_names = dict(LocalDataset.objects.exclude(onchain_id="").values_list("onchain_id", "name"))
    for dataset in mirror.Dataset.objects.filter(owner__iexact=me or "")[:200]:
        if dataset.privacy_cap and dataset.privacy_spent >= BUDGET_WARNING_SHARE * dataset.privacy_cap:
            name = local_names.get(str(dataset.dataset_id))
            label = f'"{name}" (#{dataset.dataset_id})' if name else f"#{dataset.dataset_id}"
            warn(
                "budget",
                f"Dataset {label} has spent ε {_epsilon(dataset.privacy_spent):.2f} of its "
                f"cap {_epsilon(dataset.privacy_cap):.2f}: new jobs cannot use it much longer.",
            )
    failed = list(mirror.Job.objects.filter(status=mirror.Job.Status.FAILED).order_by("-job_id")[:3])
    job_names = _job_names(job.job_id for job in failed)
    for job in failed:
        name = job_names.get(job.job_id)
        label = f'"{name}" (#{job.job_id})' if name else f"#{job.job_id}"
        warn("job-failed", f"Job {label} failed: a round got too few updates.", "info")
    return out


def _rejected_events() -> int:
    # Logs the indexer could not decode or store (it skips them and keeps indexing); the table
    # arrives with the indexer's rejection change: count it only where it exists.
    rejected = getattr(mirror, "RejectedEvent", None)
    return rejected.objects.count() if rejected is not None else 0


def allows_small_committees() -> bool | None:
    """Whether the deployment takes committees of 1, 2 or an even size (a development chain), read
    once per deployment; None while the chain cannot say (the job form then assumes it does not)."""
    ledger = ledger_access.node_ledger()
    if ledger is None:
        return None
    key = ledger.deployment.addresses.get("FederatedLearning", "")
    if key not in _SMALL_COMMITTEES:
        try:
            _SMALL_COMMITTEES[key] = ledger.fl.allow_small_committees()
        except Exception as exc:  # the chain unreachable: unknown now, asked again next time
            logger.warning("allowSmallCommittees unreadable: %r", exc)
            return None
    return _SMALL_COMMITTEES[key]


# FederatedLearning address -> its immutable allowSmallCommittees (a process-wide memo of chain
# data that never changes for a deployment).
_SMALL_COMMITTEES: dict[str, bool] = {}


def join_candidates() -> dict:
    """Every member and the datasets it may join with (its own and those granted to it), and
    whether the deployment takes small committees: the job form fits its defaults to both."""
    me = node_overview.identity()["address"]
    members = list(mirror.Node.objects.filter(status=mirror.Node.Status.MEMBER).order_by("name"))
    datasets = list(mirror.Dataset.objects.all()[:5000])
    local_names = dict(LocalDataset.objects.exclude(onchain_id="").values_list("onchain_id", "name"))
    granted: dict[str, set[int]] = {}
    for grant in mirror.Grant.objects.filter(active=True).select_related("dataset")[:20000]:
        granted.setdefault(grant.grantee.lower(), set()).add(grant.dataset.dataset_id)
    rows = []
    for node in members:
        address = node.address.lower()
        usable = [
            {
                "id": d.dataset_id,
                "name": local_names.get(str(d.dataset_id), "")
                if d.owner.lower() == (me or "").lower()
                else "",
                "owned": d.owner.lower() == address,
                "samples": d.samples,
                "schema_hash": d.schema_hash,
                "epsilon_cap": _epsilon(d.privacy_cap),
                "epsilon_left": _epsilon(max(d.privacy_cap - d.privacy_spent, 0)),
            }
            for d in datasets
            if d.owner.lower() == address or d.dataset_id in granted.get(address, set())
        ]
        rows.append(
            {
                "address": node.address,
                "name": node.name,
                "self": bool(me) and address == me.lower(),
                "datasets": usable,
            }
        )
    return {"address": me, "members": rows, "allow_small_committees": allows_small_committees()}


def granted_datasets() -> list[dict]:
    me = node_overview.identity()["address"]
    if not me:
        return []
    names = dict(mirror.Node.objects.values_list("address", "name"))
    names = {address.lower(): name for address, name in names.items()}
    grants = mirror.Grant.objects.filter(grantee__iexact=me).select_related("dataset")
    return [
        {
            "dataset": grant.dataset.dataset_id,
            "owner": grant.dataset.owner,
            "owner_name": names.get(grant.dataset.owner.lower(), ""),
            "samples": grant.dataset.samples,
            "epsilon_cap": _epsilon(grant.dataset.privacy_cap),
            "epsilon_spent": _epsilon(grant.dataset.privacy_spent),
            "epsilon_left": _epsilon(max(grant.dataset.privacy_cap - grant.dataset.privacy_spent, 0)),
            "state": "active" if grant.active else "revoked",
            "granted_block": grant.granted_block,
            "revoked_block": grant.revoked_block,
        }
        for grant in grants.order_by("-granted_block")[:1000]
    ]


def model_catalog() -> list[dict]:
    me = node_overview.identity()["address"]
    models = list(GlobalModel.objects.order_by("-created", "-id")[:500])
    job_ids = {int(m.job) for m in models if str(m.job).isdigit()}
    names = _job_names(job_ids)
    newest: dict[str, int] = {}
    for model in models:
        newest[model.job] = max(newest.get(model.job, 0), model.round)
    metrics = {
        (m.job_id, m.round): m for m in RoundMetric.objects.filter(node=me or "", job_id__in=list(job_ids))
    }
    out = []
    for model in models:
        job_id = int(model.job) if str(model.job).isdigit() else None
        metric = metrics.get((job_id, model.round)) if job_id is not None else None
        out.append(
            {
                "id": model.id,
                "job": model.job,
                "job_name": names.get(job_id, "") if job_id is not None else "",
                "round": model.round,
                "architecture": model.architecture,
                "input_shape": model.input_shape,
                "num_classes": model.num_classes,
                "content_hash": model.content_hash,
                "onchain_hash": model.onchain_hash,
                "created": model.created,
                "accuracy": metric.accuracy if metric else None,
                "loss": metric.loss if metric else None,
                "served": newest.get(model.job) == model.round,
            }
        )
    return out
