"""Celery wrappers of the store's maintenance functions (eager when no broker is configured)."""

from __future__ import annotations

from celery import shared_task

from backend.swarm import factory


@shared_task(name="swarm.repair")
def repair_task(reference: str | None = None) -> dict[str, int]:
    """Re-replicate one blob's chunks, or everything this node holds (no reference)."""
    report = factory.node_swarm().repair(reference)
    return report.__dict__.copy()


@shared_task(name="swarm.gc")
def gc_task(grace_s: float = 3600.0) -> dict[str, int]:
    result = factory.node_swarm().gc(grace_s=grace_s)
    return result.__dict__.copy()
