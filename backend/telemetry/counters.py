"""What a node's processes count as it happens: transactions and gas, swarm bytes, repairs, requests.

Everything else a scrape reports is read from the node's database and chunk index at scrape time
(``collectors.py``). These few figures exist only as events in some process (the agent sends
most transactions, the web server some, a Celery worker the actions'), so they are Prometheus
counters in the client library's multiprocess mode: each process writes its own file under
``DEFL_METRICS_DIR`` (the settings point PROMETHEUS_MULTIPROC_DIR there before anything imports
the library) and a scrape of the web server sums them all. A counter of a process that ended
stays in its file, so totals survive restarts of the node's processes.

Plain Python without Django: the ledger's and the swarm's factories hand these functions to their
clients as observers, so neither client imports this module.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TRANSACTIONS = Counter(
    "defl_transactions",
    "Transactions this node sent, by contract function and outcome (mined, reverted, failed).",
    ["function", "outcome"],
)
GAS_USED = Counter("defl_transaction_gas_used", "Gas used by this node's mined transactions.", ["function"])
SWARM_BYTES = Counter(
    "defl_swarm_peer_bytes",
    "Chunk bytes this node exchanged with peers: sent (pushes) and received (fetches).",
    ["direction"],
)
REPAIR_RUNS = Counter(
    "defl_swarm_repair_runs", "Scheduled repairs of this node's chunks, by outcome.", ["outcome"]
)
REPAIR_COPIES = Counter(
    "defl_swarm_repair_copies_added", "Replicas the repairs found missing (or corrupt) and put back."
)
REPAIR_LOST = Gauge(
    "defl_swarm_chunks_lost",
    "Chunks the last repair found no good copy of on any live node.",
    multiprocess_mode="mostrecent",
)
REQUESTS = Counter(
    "defl_http_requests", "HTTP requests served, by method and status class.", ["method", "status"]
)
REQUEST_SECONDS = Histogram(
    "defl_http_request_duration_seconds",
    "Time to answer an HTTP request (the response's headers, not a streamed body).",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


def transaction_sent(function: str, gas_used: int | None, outcome: str) -> None:
    """The ledger client's observer: one transaction ended (``gas_used`` once it was mined)."""
    TRANSACTIONS.labels(function=function, outcome=outcome).inc()
    if gas_used:
        GAS_USED.labels(function=function).inc(gas_used)


def swarm_transfer(direction: str, size: int) -> None:
    """The peer client's observer: ``size`` chunk bytes went out ("sent") or came in ("received")."""
    if size > 0:
        SWARM_BYTES.labels(direction=direction).inc(size)


def repair_finished(report: object | None) -> None:
    """The repair schedule's observer: a run's report (a swarm RepairReport), None when it failed."""
    if report is None:
        REPAIR_RUNS.labels(outcome="failed").inc()
        return
    REPAIR_RUNS.labels(outcome="done").inc()
    added = int(getattr(report, "copies_added", 0))
    if added:
        REPAIR_COPIES.inc(added)
    REPAIR_LOST.set(int(getattr(report, "lost", 0)))
