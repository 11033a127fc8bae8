"""Celery tasks of the cluster: a probe that measures a slot (``manage.py cluster probe``)."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.db import close_old_connections

from backend.cluster import runner
from backend.cluster.models import Task

logger = logging.getLogger(__name__)
MAX_PROBE_S = 30.0


def _probe(seconds: float) -> float:
    """Multiply small matrices for ``seconds`` on the CPU; returns GFLOP/s (logged)."""
    import torch

    size, flops, started = 256, 0, time.perf_counter()
    a = torch.randn(size, size)
    while True:
        a = torch.tanh(a @ a)
        flops += 2 * size**3
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    rate = flops / elapsed / 1e9
    logger.info("probe: %.2f GFLOP/s over %.2f s", rate, elapsed)
    return rate


@shared_task(name="cluster.probe", ignore_result=True)
def probe(round_: int, seconds: float = 0.5) -> str:
    """Run probe task ``round_`` (job 0) on this worker."""
    seconds = min(max(float(seconds), 0.0), MAX_PROBE_S)
    try:
        rate = runner.run(0, round_, _probe, seconds, kind=Task.Kind.PROBE)
        return f"{rate:.2f} GFLOP/s"
    except runner.TaskCancelled:
        return "cancelled"
    finally:
        close_old_connections()
