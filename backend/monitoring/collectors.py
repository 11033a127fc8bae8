"""The node's state as Prometheus metrics, read at scrape time from its database, mirror and chunk index.

Nothing here runs on the round driver's path: a scrape reads what the driver, the indexer, the
budget and the cluster already store (a few aggregate queries) and asks the chain for its head
once. Each part is read on its own: one that fails (the chain away, a table locked) is left out
and counted in ``defl_scrape_errors{part}``, so the rest of the scrape still answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from django.db.models import Count, F, Max, Min, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)
Metrics = Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]


def _chain() -> Metrics:
    from backend.ledger import access

    up = GaugeMetricFamily("defl_chain_up", "Whether the chain answered this scrape (1) or not (0).")
    ledger = access.node_ledger()
    if ledger is None:
        up.add_metric([], 0)
        yield up
        return
    try:
        head = ledger.client.block_number()
    except Exception as exc:  # the chain away: say so, the rest of the scrape goes on
        logger.info("metrics: chain head unavailable: %r", exc)
        up.add_metric([], 0)
        yield up
        return
    up.add_metric([], 1)
    yield up
    yield GaugeMetricFamily("defl_chain_head_block", "The chain's latest block.", value=head)
    indexed = access.indexed_block(ledger)
    if indexed is not None:
        yield GaugeMetricFamily(
            "defl_indexed_block", "The last block the event indexer mirrored.", value=indexed
        )
        yield GaugeMetricFamily(
            "defl_indexer_lag_blocks",
            "Blocks between the chain's head and the mirror.",
            value=max(head - indexed, 0),
        )


def _mirror() -> Metrics:
    from backend.ledger.models import Job, Node, RejectedEvent, Round

    jobs = GaugeMetricFamily("defl_jobs", "Jobs on chain, by status (the mirror).", labels=["status"])
    for status in Job.Status.values:
        jobs.add_metric([status], 0)
    for row in Job.objects.values("status").annotate(n=Count("id")):
        jobs.add_metric([row["status"]], row["n"])
    yield jobs
    current = GaugeMetricFamily(
        "defl_job_round", "The round a running job is in, and its planned rounds.", labels=["job", "of"]
    )
    for job in Job.objects.filter(status=Job.Status.RUNNING).only("job_id", "current_round", "rounds")[:1000]:
        current.add_metric([str(job.job_id), "current"], job.current_round)
        current.add_metric([str(job.job_id), "planned"], job.rounds)
    yield current
    rounds = GaugeMetricFamily(
        "defl_rounds", "Rounds of every job, by status (the mirror).", labels=["status"]
    )
    for status in Round.Status.values:
        rounds.add_metric([status], 0)
    for row in Round.objects.values("status").annotate(n=Count("id")):
        rounds.add_metric([row["status"]], row["n"])
    yield rounds
    blocks = Round.objects.filter(finalized_block__isnull=False).aggregate(
        n=Count("id"), total=Sum(F("finalized_block") - F("opened_block"))
    )
    yield SummaryMetricFamily(
        "defl_round_training_blocks",
        "Blocks from a round's opening to its finalization (its training and scoring).",
        count_value=blocks["n"] or 0,
        sum_value=blocks["total"] or 0,
    )
    members = GaugeMetricFamily("defl_members", "Nodes of the registry, by status.", labels=["status"])
    for row in Node.objects.values("status").annotate(n=Count("id")):
        members.add_metric([row["status"]], row["n"])
    yield members
    yield CounterMetricFamily(
        "defl_rejected_events",
        "Chain events the indexer could not store (skipped).",
        value=RejectedEvent.objects.count(),
    )


def _actions() -> Metrics:
    from backend.jobs.models import RoundAction

    states = GaugeMetricFamily(
        "defl_actions", "This node's round actions, by kind and state.", labels=["kind", "state"]
    )
    attempts = CounterMetricFamily(
        "defl_action_attempts", "Runs of this node's round actions, by kind.", labels=["kind"]
    )
    seconds = SummaryMetricFamily(
        "defl_action_duration_seconds",
        "Wall time of the last run of each round action, by kind.",
        labels=["kind"],
    )
    for kind in RoundAction.Kind.values:
        for state in RoundAction.State.values:
            states.add_metric([kind, state], 0)
    rows = RoundAction.objects.values("kind", "state").annotate(n=Count("id"), tries=Sum("attempts"))
    tries: dict[str, int] = {}
    for row in rows:
        states.add_metric([row["kind"], row["state"]], row["n"])
        tries[row["kind"]] = tries.get(row["kind"], 0) + (row["tries"] or 0)
    for kind, n in sorted(tries.items()):
        attempts.add_metric([kind], n)
    timed = (
        RoundAction.objects.filter(seconds__isnull=False)
        .values("kind")
        .annotate(n=Count("id"), total=Sum("seconds"))
    )
    for row in timed:
        seconds.add_metric([row["kind"]], count_value=row["n"], sum_value=row["total"] or 0.0)
    yield from (states, attempts, seconds)
    parts = CounterMetricFamily(
        "defl_action_part_seconds",
        "Where this node's round actions spent their time: training, swarm, chain, scoring, ...",
        labels=["part"],
    )
    totals: dict[str, float] = {}
    for timing in RoundAction.objects.exclude(parts={}).values_list("parts", flat=True).iterator():
        for name, value in (timing or {}).items():
            if isinstance(value, (int, float)):
                totals[str(name)[:32]] = totals.get(str(name)[:32], 0.0) + float(value)
    for name, value in sorted(totals.items()):
        parts.add_metric([name], value)
    yield parts
    spans = (
        RoundAction.objects.filter(started_at__isnull=False, seconds__isnull=False)
        .values("job_id", "round")
        .annotate(first=Min("started_at"), last=Max(F("started_at") + F("seconds")))
        .values_list("first", "last")
    )
    active = SummaryMetricFamily(
        "defl_round_active_seconds",
        "Per round: from this node's first action's start to its last action's end.",
    )
    durations = [last - first for first, last in spans if last is not None]
    active.add_metric([], count_value=len(durations), sum_value=sum(durations))
    yield active


def _privacy() -> Metrics:
    from backend.datasets.budget import budget_summary
    from backend.datasets.models import Dataset

    labels = ["dataset"]
    spent = GaugeMetricFamily(
        "defl_dataset_epsilon_spent", "Privacy spent per dataset (released + withheld).", labels=labels
    )
    reserved = GaugeMetricFamily(
        "defl_dataset_epsilon_reserved", "Privacy reserved per dataset, not yet settled.", labels=labels
    )
    cap = GaugeMetricFamily("defl_dataset_epsilon_cap", "Each dataset's privacy cap.", labels=labels)
    for dataset in Dataset.objects.order_by("id")[:500]:
        summary = budget_summary(dataset)
        spent.add_metric([str(dataset.pk)], summary["epsilon_spent"])
        reserved.add_metric([str(dataset.pk)], summary["epsilon_reserved"])
        cap.add_metric([str(dataset.pk)], summary["epsilon_cap"])
    yield from (spent, reserved, cap)


def _storage() -> Metrics:
    from backend.swarm.factory import local_store

    usage = local_store().usage()
    yield GaugeMetricFamily("defl_swarm_stored_chunks", "Chunks in this node's store.", value=usage.chunks)
    yield GaugeMetricFamily(
        "defl_swarm_stored_bytes", "Bytes of the chunks in this node's store.", value=usage.bytes
    )
    yield GaugeMetricFamily(
        "defl_swarm_pinned_chunks", "Chunks pinned by this node's blobs.", value=usage.pinned_chunks
    )


def _cluster() -> Metrics:
    from backend.cluster.models import DeviceSlot, Task, Worker
    from backend.cluster.registry import live_workers

    tasks = GaugeMetricFamily(
        "defl_cluster_tasks", "Local tasks, by state (queued: the queue's depth).", labels=["state"]
    )
    for state in Task.State.values:
        tasks.add_metric([state], 0)
    for row in Task.objects.values("state").annotate(n=Count("id")):
        tasks.add_metric([row["state"]], row["n"])
    yield tasks
    live = {w.pk for w in live_workers()}
    workers = GaugeMetricFamily(
        "defl_cluster_workers", "Workers, live (heartbeat fresh) or not.", labels=["live"]
    )
    workers.add_metric(["1"], len(live))
    workers.add_metric(["0"], Worker.objects.exclude(pk__in=live).count())
    yield workers
    labels = ["worker", "device", "kind"]
    capacity = GaugeMetricFamily(
        "defl_cluster_slot_capacity", "A live worker's device slot: cores or GPU MB.", labels=labels
    )
    used = GaugeMetricFamily("defl_cluster_slot_used", "What running tasks hold of the slot.", labels=labels)
    running = GaugeMetricFamily("defl_cluster_slot_tasks", "Tasks holding part of the slot.", labels=labels)
    for slot in DeviceSlot.objects.filter(worker__in=live).select_related("worker"):
        key = [slot.worker.name, slot.device_name, slot.kind]
        capacity.add_metric(key, slot.capacity)
        used.add_metric(key, slot.used)
        running.add_metric(key, slot.running)
    yield from (capacity, used, running)


PARTS: dict[str, Callable[[], Metrics]] = {
    "chain": _chain,
    "mirror": _mirror,
    "actions": _actions,
    "privacy": _privacy,
    "storage": _storage,
    "cluster": _cluster,
}


class NodeStateCollector(Collector):
    """Reads every part at scrape time; a failing part is skipped and counted, never the scrape."""

    def collect(self) -> Metrics:
        errors = GaugeMetricFamily(
            "defl_scrape_errors", "Parts of this scrape that failed (1).", labels=["part"]
        )
        clock = time.perf_counter()
        for name, part in PARTS.items():
            try:
                found = list(part())
            except Exception:
                logger.exception("metrics: the %s part failed", name)
                errors.add_metric([name], 1)
                continue
            errors.add_metric([name], 0)
            yield from found
        yield errors
        yield GaugeMetricFamily(
            "defl_scrape_seconds",
            "Time this scrape took to read the node's state.",
            value=time.perf_counter() - clock,
        )
