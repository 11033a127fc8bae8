"""Liveness and readiness of a node, for orchestrators (compose health checks, Kubernetes probes).

Liveness: the web process answers (it takes no lock and asks nothing), so an orchestrator
restarts only a process that hangs. Readiness: the node can do its work now; each check says in
one sentence what is not ready:

- database: a query answers;
- chain: the chain answers, the contracts are deployed where the node's contracts file says, and
  they speak a protocol version this node speaks (``backend.ledger.versions``);
- broker: with CELERY_BROKER_URL set, the broker answers (without it, actions run in-process);
- swarm: enough nodes answer for an upload's quorum (a majority of R copies), this one included.

A check that cannot run because an earlier one failed (no database, no chain) says so.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from django.conf import settings
from django.db import connection

from backend.api.exception_handler import scrub

logger = logging.getLogger(__name__)
BROKER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


def _timed(name: str, probe) -> Check:
    clock = time.perf_counter()
    try:
        ok, detail = probe()
    except Exception as exc:  # any failure is the answer: not ready, and why (no secrets)
        logger.info("readiness %s: %r", name, exc)
        ok, detail = False, scrub(str(exc)) or type(exc).__name__
    return Check(name, ok, detail, round(time.perf_counter() - clock, 4))


def _database() -> tuple[bool, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return True, f"{connection.vendor} answers"


def _chain() -> tuple[bool, str]:
    from backend.ledger import access
    from backend.ledger.versions import check_deployment

    ledger = access.node_ledger()
    if ledger is None:
        return False, access.LEDGER_MISSING + " (no contracts file: run `manage.py ledger deploy` or copy it)"
    head = ledger.client.block_number()
    problem = check_deployment(ledger)
    if problem:
        return False, problem
    indexed = access.indexed_block(ledger)
    lag = f", the mirror {head - indexed} blocks behind" if indexed is not None else ", nothing mirrored yet"
    return True, f"block {head}{lag}"


def _broker() -> tuple[bool, str]:
    url = settings.CELERY_BROKER_URL
    if not url:
        return True, "no broker: actions run in this node's agent"
    from kombu import Connection

    with Connection(url, connect_timeout=BROKER_TIMEOUT_S) as broker:
        broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
    return True, "the broker answers"


def _swarm() -> tuple[bool, str]:
    from backend.swarm.factory import node_swarm

    network = node_swarm().network
    network.refresh()
    up = len(network.probe())
    needed = network.min_replicas
    text = f"{up} of {len(network.nodes)} nodes answer; an upload needs {needed}"
    return up >= needed, text


def liveness() -> dict:
    return {"status": "alive"}


def readiness() -> tuple[bool, dict]:
    """(ready, body): every check with its sentence; ``not_ready`` names the failing ones."""
    checks = [_timed("database", _database)]
    if checks[0].ok:
        checks.append(_timed("chain", _chain))
    else:
        checks.append(Check("chain", False, "not checked: the database does not answer", 0.0))
    checks.append(_timed("broker", _broker))
    if checks[1].ok:
        checks.append(_timed("swarm", _swarm))
    else:
        checks.append(Check("swarm", False, "not checked: the chain (the peers' registry) is not ready", 0.0))
    failing = [c.name for c in checks if not c.ok]
    described = {c.name: {k: v for k, v in asdict(c).items() if k != "name"} for c in checks}
    body = {"status": "ready" if not failing else "not ready", "not_ready": failing, "checks": described}
    return not failing, body
