"""Celery worker hooks: a worker declares its device slots when it is ready and heartbeats until it stops."""

from __future__ import annotations

import logging

from celery.signals import worker_ready, worker_shutdown
from django.db import close_old_connections

from backend.cluster import registry

logger = logging.getLogger(__name__)
_beating: dict[str, registry.Heartbeat] = {}


@worker_ready.connect
def _declare(sender=None, **_kwargs) -> None:
    name = getattr(sender, "hostname", None) or registry.local_name()
    try:
        registry.register(name, queue=name)  # its direct queue (worker_direct) is named after it
        registry.set_current(name)
        _beating[name] = registry.Heartbeat(name).start()
    except Exception:  # a worker without its database still runs; it joins the view on its next beat
        logger.exception("worker %s could not declare its slots", name)
        _beating[name] = registry.Heartbeat(name).start()
    finally:
        close_old_connections()


@worker_shutdown.connect
def _stopped(sender=None, **_kwargs) -> None:
    name = getattr(sender, "hostname", None) or ""
    beating = _beating.pop(name, None)
    if beating is not None:
        beating.stop()
    try:
        registry.stopped(name)
    except Exception:
        logger.warning("worker %s could not record its stop", name, exc_info=True)
